"""Rotations from positions: LieRE generators and the RoPE angle maps, as pure functions.

A token at position p in R^n gets R(p) = expm(sum_i p_i A_i), with A_i block-diagonal
skew-symmetric (blocks of size b on contiguous head dims; dims past the last whole block stay
unrotated). Every rotation is stored as its blocks, [..., T, n_blocks, b, b], and applied
blockwise, so LieRE8 costs O(d * 8) per token instead of O(d^2). RoPE is the b = 2 case
with angles instead of generators. On a patch grid only the primitive lattice points need an
exponential (R(m q) = R(q)^m, `lattice_plan`), and on a mesh each device computes 1/n of them
(`split_over_data`); where a TPU's rotation kernel reads them, each device its tokens', left split
(`liere_rotations`' split_tokens).
"""

import dataclasses
import functools
from typing import Callable, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from liere_jax import expm_kernel, switches
from liere_jax.expm import METHODS as EXPM_METHODS, expm, matmul, per_platform
from liere_jax.platforms import PLATFORMS

# The exponentials model.pe.expm names: liere_jax.expm's, and its Pallas kernel (expm_kernel).
METHODS = EXPM_METHODS + ('pallas',)


def exponential(a: jax.Array, method: str = 'fast', precision='auto') -> jax.Array:
  """exp(a) for a: [..., b, b] skew-symmetric by `method` (METHODS): 'pallas' is
  expm_kernel.expm_pallas, every other name liere_jax.expm.expm, but 'fast' on a platform whose
  row takes the kernel (liere_jax.platforms' expm_kernel: a TPU) is the kernel where it takes the
  blocks (fast_loop, by name, keeps XLA's there)."""
  pallas = lambda a: expm_kernel.expm_pallas(a, precision)
  if method == 'pallas':
    return pallas(a)
  on = _kernel_platforms(a.shape[-1]) if method == 'fast' else []
  if not on:
    return expm(a, method, precision)
  forms = {p: pallas if p in on else (lambda a: expm(a, method, precision)) for p in PLATFORMS}
  return _per_platform(forms, a)


def _kernel_platforms(block: int):
  """The platforms where model.pe.expm='fast' is the Pallas exponential for blocks of b."""
  return [p for p, row in PLATFORMS.items()
          if row.expm_kernel and expm_kernel.supported(block, p)]


def _per_platform(forms, *args):
  return jax.lax.platform_dependent(*args, cpu=forms['cpu'], tpu=forms['tpu'],
                                    default=forms['cuda'])


def num_free(block: int) -> int:
  """Free parameters of one b x b skew-symmetric block: its strict upper triangle."""
  return block * (block - 1) // 2


def skew(params: jax.Array, block: int) -> jax.Array:
  """[..., b(b-1)/2] strict-upper-triangle entries -> [..., b, b] skew-symmetric A = U - U^T."""
  rows, cols = np.triu_indices(block, k=1)
  u = jnp.zeros(params.shape[:-1] + (block, block), params.dtype).at[..., rows, cols].set(params)
  return u - jnp.swapaxes(u, -1, -2)


def liere_rotations(generators: jax.Array, positions: jax.Array, block: int,
                    method: Union[str, Callable] = 'fast', lattice: bool = True,
                    precision='auto', split_tokens: bool = False) -> jax.Array:
  """R(p) per layer, head and token.

  Positions known at trace time (numpy, a concrete array, or a constant under jit) that lie on
  a lattice (integer multiples k of one step per axis, e.g. every grid mode of
  liere_jax.positions) take the lattice path (`lattice=False` turns it off): the generator is
  linear in p, so R(m q) = R(q)^m, and only the primitive points q (gcd of q's integer
  coordinates 1, first nonzero coordinate positive) need an exponential; every other point is
  one product of two earlier powers along its ray (m = 2^j + r, batched by ceil(log2 m)), a
  point -q is R(q)^T and p = 0 is I. b = 2 (closed form, cheap) and traced positions take the
  general path: every token's exponential. So does a platform whose exponential of these blocks
  is the Pallas kernel a matrix at a time (liere_jax.platforms' expm_kernel, a TPU; expm 'fast' or
  'pallas'; blocks of 16 and up).

  Args:
    generators: [L, H, n, n_blocks, b(b-1)/2] raw parameters (L, H may be 1 when shared).
    positions: [T, n] token positions.
    method: the exponential, one of METHODS, or a function [..., b, b] ->
      [..., b, b] (e.g. expm.fast_expm with another Taylor scheme).
    lattice: take the lattice path where the positions allow it.
    precision: of the exponential's and the lattice table's products (expm.per_platform).
    split_tokens: where the Pallas kernel runs the exponential (a TPU: its rotation kernel reads
      them), leave the result split over the context mesh's 'data' axis by tokens, the tokens
      padded to a multiple of its devices by identities: each device computes its tokens', and
      a consumer gathers a layer's where it reads them (liere_jax.rotation_kernel), its gradient
      reduce-scattered, instead of every layer's replicated and their gradient summed (v5e-8
      ImageNet LieRE64 cell: 101.5 -> 86.7 GB a step; docs/benchmarks.md, fourth round).
  Returns:
    [L, H, T, n_blocks, b, b] float32 rotations (T rounded up where split_tokens splits them).
  """
  exp = method if callable(method) else lambda a: exponential(a, method, precision)
  # Every token's exponential where the kernel takes the blocks a matrix at a time (the rotation
  # kernel's, 16 and up); smaller blocks keep the lattice, the kernel exponentiating its points.
  large = method in ('fast', 'pallas') and block >= expm_kernel.MIN_BLOCK
  on = _kernel_platforms(block) if large else []
  n = _data_devices() if split_tokens and on else 1
  pad = -len(positions) % n
  if pad:  # Position 0: the identity (numpy where known at trace time: the lattice's plan).
    known = concrete_positions(positions)
    xp, positions = (jnp, positions) if known is None else (np, known.astype(np.float32))
    positions = xp.concatenate([positions, xp.zeros((pad, positions.shape[1]), np.float32)])
  general = lambda g: (_split_tokens(exp, g, positions, block) if n > 1 else
                       split_over_data(exp, liere_generators(g, positions, block)))
  plan = lattice_plan(positions) if lattice and block > 2 else None
  lattice = lambda g: _lattice_rotations(g, plan, block, exp, precision)
  if plan is None:
    out = general(generators)
  elif not on:
    return lattice(generators)
  else:
    # Where each matrix's exponential is the Pallas kernel (one read, one write), every token's
    # costs less than the table's products and reads (v5e-8 ImageNet LieRE64 cell at bf375c2:
    # 101.5 GB a step against 112.5 with the table; docs/benchmarks.md).
    out = _per_platform({p: general if p in on else lattice for p in PLATFORMS}, generators)
  return out if n == 1 else jax.lax.with_sharding_constraint(out, _TOKENS)


_TOKENS = P(None, None, 'data')  # [L, H, T, ...] split by tokens.


def _split_tokens(exp, generators, positions, block):
  """exp of liere_generators, each device of 'data' its tokens' (T a multiple of its size); the
  result stays split."""
  run = lambda g, pos: exp(liere_generators(g, pos, block))
  return jax.shard_map(run, in_specs=(P(), P('data')), out_specs=_TOKENS,
                       check_vma=False)(generators, jnp.asarray(positions, jnp.float32))


@dataclasses.dataclass(frozen=True)
class LatticePlan:
  """Positions on a lattice as powers of primitive points (numpy, built at trace time).

  The table of rotations has slots 0 = I, 1..P = exp at the primitive points `primitives`
  [P, n], then one slot per product: level j multiplies slots lhs[j] @ rhs[j] (all from
  earlier levels). Token t reads slot token_slot[t], transposed where
  transpose[t] (p = -m q).
  """
  primitives: np.ndarray
  levels: tuple
  token_slot: np.ndarray
  transpose: np.ndarray

  @property
  def n_products(self):
    return sum(len(l) for l, _ in self.levels)


def concrete_positions(positions):
  """positions as float64 numpy if known at trace time (also a constant under jit), else None."""
  if isinstance(positions, jax.core.Tracer):
    # A jit constant (jnp.asarray of numpy) has its value; other tracers give None.
    positions = getattr(positions, 'get_const', lambda: None)()
    if positions is None:
      return None
  try:
    return np.asarray(positions, np.float64)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def lattice_plan(positions, tol: float = 1e-5, max_multiple: int = 2**16):
  """The LatticePlan of positions [T, n], or None (traced, off a lattice, or nothing to gain).

  Step per axis: its smallest nonzero |p|; the positions must be integer multiples of it within
  tol (relative; float32 grids are within 2e-7). The primitive points are q * step, the float32
  positions they stand for within float32 rounding.
  """
  pos = concrete_positions(positions)
  if pos is None or pos.ndim != 2 or not np.all(np.isfinite(pos)):
    return None
  mags = np.abs(pos)
  steps = np.array([m[m > 0].min() if np.any(m > 0) else 1. for m in mags.T])
  k = pos / steps
  ki = np.rint(k)
  if np.any(np.abs(k - ki) > tol * np.maximum(1., np.abs(ki))) or np.abs(ki).max(
      initial=0) > max_multiple:
    return None
  ki = ki.astype(np.int64)
  mult = np.gcd.reduce(np.abs(ki), axis=1)  # 0 for p = 0.
  nonzero = mult > 0
  q = np.zeros_like(ki)
  q[nonzero] = ki[nonzero] // mult[nonzero, None]
  first = np.take_along_axis(q, np.argmax(q != 0, axis=1)[:, None], 1)[:, 0]
  transpose = first < 0  # R(-q) = R(q)^T.
  q[transpose] *= -1
  dirs, inv = np.unique(q[nonzero], axis=0, return_inverse=True)
  inv = inv.reshape(-1)
  n_dirs = len(dirs)
  # Every needed power m >= 2 of a direction is m = h + r, h the largest power of 2 below m:
  # its level ceil(log2 m) exceeds both operands'. Close the set under that split.
  need = set(zip(inv.tolist(), mult[nonzero].tolist()))
  todo = [x for x in need if x[1] > 1]
  while todo:
    d, m = todo.pop()
    h = 1 << int(m - 1).bit_length() - 1
    for sub in ((d, h), (d, m - h)):
      if sub[1] > 1 and sub not in need:
        need.add(sub)
        todo.append(sub)
  level_of = lambda m: int(m - 1).bit_length()  # ceil(log2 m): 0 for the primitives.
  high = lambda m: 1 << level_of(m) - 1  # the largest power of 2 below m
  # By level, then by the level of the right operand (one source array per batched product).
  powers = sorted((x for x in need if x[1] > 1),
                  key=lambda x: (level_of(x[1]), level_of(x[1] - high(x[1])), x))
  if not n_dirs or (n_dirs + 1 >= len(pos) and not powers and not np.any(transpose)
                    and np.all(nonzero)):
    return None  # Every token at the origin, or its own primitive point: nothing to gain.
  slot = {(d, 1): 1 + d for d in range(n_dirs)}
  levels, cur, nxt = [], None, 1 + n_dirs
  for d, m in powers:
    if level_of(m) != cur:
      levels.append(([], []))
      cur = level_of(m)
    levels[-1][0].append(slot[(d, high(m))])
    levels[-1][1].append(slot[(d, m - high(m))])
    slot[(d, m)] = nxt
    nxt += 1
  token_slot = np.zeros(len(pos), np.int64)
  token_slot[nonzero] = [slot[(d, m)] for d, m in zip(inv.tolist(), mult[nonzero].tolist())]
  return LatticePlan(primitives=(dirs * steps).astype(np.float32),
                     levels=tuple((np.array(l), np.array(r)) for l, r in levels),
                     token_slot=token_slot, transpose=transpose)


def _data_devices():
  """Devices on the context mesh's 'data' axis (`jax.set_mesh`; 1 without a mesh)."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty or 'data' not in mesh.axis_names else mesh.shape['data']


def _lattice_rotations(generators, plan: LatticePlan, block: int, exp, precision):
  """The lattice path of liere_rotations: a table for each block of each layer and head. On a
  mesh each device of 'data' computes 1/n of the tables: their primitive points' exponentials
  (1/n of those, matrix by matrix, where the tables do not split evenly over the devices), then
  the powers."""
  g = liere_generators(generators, plan.primitives, block)  # [L, H, P, k, b, b]
  l, h, n_prim, k = g.shape[:4]
  # Slot ranges of the parts of the table: I, the primitives, then one part per level.
  bounds = np.cumsum([0, 1, n_prim] + [len(lhs) for lhs, _ in plan.levels])

  def table(rot):  # [G, P, b, b] -> [G, n_slots, b, b]: the table of every slot
    parts = [jnp.broadcast_to(jnp.eye(block, dtype=rot.dtype), rot[:, :1].shape), rot]
    for lhs, rhs in plan.levels:
      # No growing table (its copies and their backward cost more than the products at small
      # b): each operand is read from one earlier part; lhs (d, 2^(j-1)) all from the last.
      src_l = np.searchsorted(bounds, lhs, 'right') - 1
      src_r = np.searchsorted(bounds, rhs, 'right') - 1
      assert np.all(src_l == src_l[0]), 'lhs operands come from one part'
      left = take_static(parts[src_l[0]], lhs - bounds[src_l[0]])
      out = []
      for src in np.unique(src_r):  # contiguous: the plan sorts by the rhs part
        sel = np.flatnonzero(src_r == src)
        out.append(matmul(left[:, sel[0]:sel[-1] + 1],
                          take_static(parts[src], rhs[sel] - bounds[src])))
      parts.append(jnp.concatenate(out, axis=1) if len(out) > 1 else out[0])
    return jnp.concatenate(parts, axis=1)

  @jax.named_scope('liere_lattice')
  def tables(rot):  # [G, P, b, b] -> [G, n_slots, b b]
    out = per_platform(lambda _: table, precision, rot)
    # Flat before it is gathered and read: a TPU lays [..., b, b] out in 8 x 128 tiles (16x an
    # 8 x 8 block), [..., b b] in 2x.
    return out.reshape(out.shape[:2] + (block * block,))

  # Stacks of one block each (G = L H k, not L H with k blocks an item): on a mesh each device
  # takes 1/n of them, whose tables a TPU lays out with the stacks on its lanes (v5e-8 ImageNet
  # LieRE8 cell: 74.55 -> 72.52 GB a step; with [L H / n, P, k, b, b] a chip, 18 wide, there).
  g = jnp.moveaxis(g, 3, 2).reshape(l * h * k, n_prim, block, block)
  if (l * h * k) % _data_devices() == 0:  # Each device its stacks' exponentials and tables.
    out = split_over_data(lambda g: tables(exp(g)), g, item_dims=3)
  else:  # Stacks that do not split evenly: exponentials one by one.
    out = split_over_data(tables, split_over_data(exp, g), item_dims=3)
  out = take_static(out, plan.token_slot)  # [G, T, b b]
  if np.any(plan.transpose):
    flip = jnp.asarray(plan.transpose)[None, :, None]
    out = jnp.where(flip, out[..., np.arange(block**2).reshape(block, block).T.reshape(-1)], out)
  out = out.reshape(l, h, k, len(plan.token_slot), block, block)
  return jnp.moveaxis(out, 2, 3)


@jax.named_scope('liere_lattice')  # Reading the table: the lattice path's traffic.
def take_static(x: jax.Array, idx: np.ndarray) -> jax.Array:
  """x[:, idx] for static numpy indices, whose backward is gathers, not one scatter-add over
  every index (a serial loop on CPU): one of every slot's first reader, masked where none reads
  it (no padded copy of the cotangent); further readers (a slot read twice: the identity by CLS
  and the origin) by a gather of those alone, added at their few slots."""
  idx = np.asarray(idx, np.int64)
  n = x.shape[1]
  # inv[c, s]: the c-th index position reading slot s, or -1 if none.
  order = np.argsort(idx, kind='stable')
  rank = np.empty_like(order)
  counts = np.bincount(idx, minlength=n)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  rank[order] = np.arange(len(idx)) - starts[idx[order]]
  inv = np.full((max(int(counts.max(initial=0)), 1), n), -1, np.int64)
  inv[rank, idx] = np.arange(len(idx))

  @jax.custom_vjp
  def take(x):
    return jnp.take(x, idx, axis=1)

  def bwd(_, g):
    def gather(row):  # [G, n, ...]: g at row's positions, 0 where -1
      got = jnp.take(g, np.maximum(row, 0), axis=1)
      if np.any(row < 0):
        got = jnp.where((row >= 0).reshape((1, n) + (1,) * (g.ndim - 2)), got, 0)
      return got
    out = gather(inv[0])
    for row in inv[1:]:
      cols = np.flatnonzero(row >= 0)
      if 4 * len(cols) < n:
        out = out.at[:, cols].add(jnp.take(g, row[cols], axis=1))
      else:
        out = out + gather(row)
    return (out,)

  take.defvjp(lambda x: (take(x), None), bwd)
  return take(x)


def liere_generators(generators: jax.Array, positions: jax.Array, block: int) -> jax.Array:
  """sum_i p_i A_i per layer, head and token: [L, H, T, n_blocks, b, b] skew-symmetric."""
  # Each generator's matrix once, then the product with the positions: no scatter into every
  # token's matrices (a TPU lays their [..., b (b - 1) / 2] entries out badly for it).
  gens = skew(jnp.asarray(generators, jnp.float32), block)
  return jnp.einsum('tn,lhnkij->lhtkij', jnp.asarray(positions, jnp.float32), gens,
                    precision=jax.lax.Precision.HIGHEST)


def split_over_data(fn, a: jax.Array, item_dims: int = 2) -> jax.Array:
  """fn over a stack of items [..., *item] (matrices: item_dims=2), each device of the context
  mesh's 'data' axis (`jax.set_mesh`) computing 1/n of the items (and of their backward), then
  all-gathered. fn maps [m, *item] -> [m, *out_item], item by item; zero items pad the stack.

  The rotations depend only on replicated parameters and positions: without this, data
  parallelism has every device compute all of them. Without a mesh, or with one device, it is
  fn(a).
  """
  n = _data_devices()
  if n == 1:
    return fn(a)
  lead = a.shape[:a.ndim - item_dims]
  flat = a.reshape((-1,) + a.shape[a.ndim - item_dims:])
  pad = -flat.shape[0] % n
  flat = jnp.pad(flat, ((0, pad),) + ((0, 0),) * item_dims)  # expm(0) = I: a few products.
  out = jax.shard_map(fn, in_specs=P('data'), out_specs=P('data'), check_vma=False)(flat)
  # Replicated by a sharding constraint, not an all_gather in the shard_map: its transpose hands
  # each device its rows of the cotangent (an all_gather to a replicated output transposes to a
  # pass dividing the whole cotangent by n, then a reduce-scatter of n equal copies).
  out = jax.lax.with_sharding_constraint(out, P())
  return out[:out.shape[0] - pad].reshape(lead + out.shape[1:])


def angle_rotations(angles: jax.Array) -> jax.Array:
  """[..., k] angles -> [..., k, 2, 2] rotations [[cos, -sin], [sin, cos]] (complex x * e^{it})."""
  c, s = jnp.cos(angles), jnp.sin(angles)
  return jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)


APPLY = switches.Switch('apply', ('einsum', 'direct'), "rotate's form for blocks above 2: "
                        "'einsum' (one einsum, the rotations on the left; every platform), "
                        "'direct' (elementwise up to 8, x on the left above; A/B only).")
PAIRS = switches.Switch('pairs', ('auto', 'swap', 'blocks'), "rotate's form for blocks of 2: "
                        "'auto' (liere_jax.platforms), 'swap' (on x's own layout), 'blocks' (x "
                        'as [..., k, 2] pairs times [2, 2] blocks) on every platform (A/B).')
SWAP = switches.Switch('swap', ('auto', 'matmul', 'roll'), "how pairs=swap exchanges each "
                       "pair's dims: 'auto' (liere_jax.platforms: roll on a TPU, matmul "
                       'elsewhere), or one form on every platform (A/B).')


@jax.named_scope('pe_rotate')  # Its part of a step: liere_jax.bench.compile.SCOPES.
def rotate(x: jax.Array, rot: jax.Array) -> jax.Array:
  """Applies per-token block rotations to queries or keys.

  Args:
    x: [B, T, H, d].
    rot: [H or 1, T, k, b, b] float32; the first k * b dims of each head rotate, the rest pass
      through.
  Returns:
    x rotated (x' = R x per block), in x's dtype, with float32 products and sums (bf16 models
    rotate by bf16-rounded rotations).

  Each platform takes its form (`forms`: liere_jax.platforms, one `platform_dependent`; a TPU's
  attention kernel applies blocks up to 8 itself, liere_jax.attention_kernel, and its rotation
  kernel blocks of 16 to 128 before it, liere_jax.rotation_kernel). Blocks of 2 (every RoPE)
  rotate on x's own [B, T, H, d] layout (`_rotate_pairs`; CPU and TPU) or as [..., k, 2] pairs
  times [2, 2] blocks (a GPU: 1.11x faster on the H200's rope_mixed
  step), other blocks by one einsum with the rotations on the left. 'direct' (APPLY) applies
  blocks up to 8 elementwise: it made the LieRE8 train step 1.2x slower on the CPU and 1.35x
  slower on an H200 (docs/benchmarks.md).
  """
  rot = jnp.swapaxes(rot, 0, 1).astype(x.dtype)  # [T, H or 1, k, b, b]
  form = forms(rot.shape[-1])
  fns = {p: _FORMS[f] for p, f in form.items()}
  if len(set(form.values())) == 1:
    return fns['cpu'](x, rot)
  return jax.lax.platform_dependent(x, rot, cpu=fns['cpu'], tpu=fns['tpu'], default=fns['cuda'])


def forms(block: int):
  """{platform: the form of rotate}: each platform's row (liere_jax.platforms) unless a switch
  (PAIRS, SWAP, APPLY) names one form for all. Blocks of 2: 'blocks' or the swap ('matmul' |
  'roll') of the form on x's layout; above 2: APPLY's."""
  pairs, swap = PAIRS.get(), SWAP.get()

  def form(row):
    if block > 2:
      return APPLY.get()
    if (row.pairs if pairs == 'auto' else pairs) == 'blocks':
      return 'blocks'
    return row.pair_swap if swap == 'auto' else swap
  return {p: form(row) for p, row in PLATFORMS.items()}


def _rotate_blocks(x, rot, form):
  """x [B, T, H, d] as [..., k, b] blocks times rot [T, H or 1, k, b, b], in APPLY's form (blocks
  of 2 always elementwise)."""
  k, b = rot.shape[-3], rot.shape[-1]
  xr = x[..., :k * b].reshape(*x.shape[:-1], k, b)  # [B, T, H, k, b]
  out = {'einsum': _apply_einsum, 'direct': _apply_direct}[form](xr, rot)
  out = out.reshape(*x.shape[:-1], k * b).astype(x.dtype)
  return jnp.concatenate([out, x[..., k * b:]], axis=-1) if k * b < x.shape[-1] else out


def _rotate_pairs(x, rot, swap):
  """x [B, T, H, d] by 2 x 2 blocks rot [T, H or 1, k, 2, 2] on x's own layout: x' = c0 x +
  c1 swap(x), swap exchanging the two dims of each pair in the given form, coefficients
  [T, H or 1, d] made once per call (pass-through dims: 1 and 0). Nothing of size 2 is a minor
  dimension (a TPU pads it to 128 lanes)."""
  d, k = x.shape[-1], rot.shape[-3]
  r = rot.astype(jnp.float32)

  def per_dim(even, odd, fill):  # [T, H, k] each -> [T, H, d], interleaved
    flat = jnp.stack([even, odd], -1).reshape(*even.shape[:-1], 2 * k)
    rest = jnp.full(flat.shape[:-1] + (d - 2 * k,), fill, jnp.float32)
    return jnp.concatenate([flat, rest], -1) if 2 * k < d else flat

  c0 = per_dim(r[..., 0, 0], r[..., 1, 1], 1.)
  c1 = per_dim(r[..., 0, 1], r[..., 1, 0], 0.)
  return _pairs(x, c0, c1, swap)


def _swap(x, form):
  """x [..., d] with the dims of each pair (2j, 2j + 1) exchanged (the last of odd d stays), exact
  in x's dtype and on x's own layout (a reshape to [..., d/2, 2] would make 2 the minor
  dimension): 'matmul', a product with the permutation; 'roll', each dim from its neighbour (two
  lane shifts and a select, which fuse into the rotation's own elementwise pass)."""
  return _SWAPS[form](x)


def _swap_matmul(x):
  swap = jnp.asarray(np.eye(x.shape[-1])[_pair_swap(x.shape[-1])], x.dtype)
  precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
  return jnp.matmul(x, swap, precision=precision)


def _swap_roll(x):
  d = x.shape[-1]
  perm, idx = _pair_swap(d), np.arange(d)
  up, down = jnp.roll(x, -1, axis=-1), jnp.roll(x, 1, axis=-1)  # x[i + 1], x[i - 1]
  return jnp.where(perm > idx, up, jnp.where(perm < idx, down, x))


_SWAPS = {'matmul': _swap_matmul, 'roll': _swap_roll}


def _pair_swap(d):
  perm = np.arange(d) ^ 1
  perm[perm >= d] = d - 1
  return perm


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _pairs(x, c0, c1, swap):
  """c0 x + c1 swap(x) in float32, in x's dtype; c0, c1 [T, H or 1, d] against x [B, T, H, d]."""
  return (c0 * x.astype(jnp.float32) + c1 * _swap(x, swap).astype(jnp.float32)).astype(x.dtype)


def _pairs_fwd(x, c0, c1, swap):
  return _pairs(x, c0, c1, swap), (x, c0, c1)


def _pairs_bwd(swap, res, g):
  """One pass over g and x: dx = c0 g + swap(c1) swap(g) (swap is its own transpose), dc = sums
  over the batch. Only x (the projection's output, kept anyway) is saved, not a float32 copy;
  every swap is of x's dtype."""
  x, c0, c1 = res
  f32 = lambda a: a.astype(jnp.float32)
  dx = (c0 * f32(g) + c1[..., _pair_swap(x.shape[-1])] * f32(_swap(g, swap))).astype(x.dtype)

  def over_batch(y, c):  # [B, T, H, d] -> c's [T, H or 1, d]
    return jnp.sum(y, (0, 2) if c.shape[1] < y.shape[2] else 0).reshape(c.shape)
  return dx, over_batch(f32(g) * f32(x), c0), over_batch(f32(g) * f32(_swap(x, swap)), c1)


_pairs.defvjp(_pairs_fwd, _pairs_bwd)


def _elementwise(xr, rot):
  return jnp.sum(rot.astype(jnp.float32) * xr.astype(jnp.float32)[..., None, :], axis=-1)


def _product(spec, xr, rot, rot_first):
  """The blocks applied as one batched product, float32 accumulation."""
  precision = jax.lax.Precision.HIGHEST if xr.dtype == jnp.float32 else None
  rot = jnp.broadcast_to(rot, xr.shape[1:] + xr.shape[-1:])
  return jnp.einsum(spec, *((rot, xr) if rot_first else (xr, rot)), precision=precision,
                    preferred_element_type=jnp.float32)


def _apply_einsum(xr, rot):
  return _product('thkij,bthkj->bthki', xr, rot, rot_first=True)


def _apply_direct(xr, rot):
  if xr.shape[-1] <= 8:
    return _elementwise(xr, rot)
  return _product('bthkj,thkij->bthki', xr, rot, rot_first=False)


_FORMS = {'blocks': functools.partial(_rotate_blocks, form='direct'),
          'matmul': functools.partial(_rotate_pairs, swap='matmul'),
          'roll': functools.partial(_rotate_pairs, swap='roll'),
          'einsum': functools.partial(_rotate_blocks, form='einsum'),
          'direct': functools.partial(_rotate_blocks, form='direct')}
