"""Rotations from positions: LieRE generators and the RoPE angle maps, and their application
to queries and keys, as pure functions.

A token at position p in R^n gets R(p) = expm(sum_i p_i A_i), with A_i block-diagonal
skew-symmetric (blocks of size b on contiguous head dims; dims past the last whole block stay
unrotated). Every rotation is stored as its blocks, [..., T, n_blocks, b, b], and applied
blockwise (`rotate`), so LieRE8 costs O(d * 8) per token instead of O(d^2). RoPE is the b = 2
case with angles instead of generators. On a patch grid only the primitive lattice points need
an exponential (liere_jax.lattice), and on a mesh each device computes 1/n of them
(`split_over_data`). What runs is the `Numerics` plan's: `path` and `rotation_form` name it;
where a TPU's attention kernel rotates by every token's blocks they are made in its layout
(`liere_entries`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from liere_jax import lattice
from liere_jax.expm import expm, form as expm_form
from liere_jax.kernels import attention as attention_kernel, expm as expm_kernel
from liere_jax.numerics import Numerics


def num_free(block: int) -> int:
  """Free parameters of one b x b skew-symmetric block: its strict upper triangle."""
  return block * (block - 1) // 2


def skew(params: jax.Array, block: int) -> jax.Array:
  """[..., b(b-1)/2] strict-upper-triangle entries -> [..., b, b] skew-symmetric A = U - U^T."""
  rows, cols = np.triu_indices(block, k=1)
  u = jnp.zeros(params.shape[:-1] + (block, block), params.dtype).at[..., rows, cols].set(params)
  return u - jnp.swapaxes(u, -1, -2)


def path(numerics: Numerics, block: int, positions, lattice_ok: bool = True) -> str:
  """How liere_rotations computes R(p) for these positions: 'lattice' (exponentials of the
  primitive points, the rest their powers: liere_jax.lattice) or 'every token' (one exponential a
  token: traced positions, off a lattice, blocks of 2, or `every_token_kernel`)."""
  if (every_token_kernel(numerics, block, len(positions)) or not lattice_ok or block <= 2
      or lattice.lattice_plan(positions) is None):
    return 'every token'
  return 'lattice'


def every_token_kernel(numerics: Numerics, block: int, tokens: int) -> bool:
  """Whether every token's exponential is the Pallas kernel (a TPU's), each device of a mesh
  exponentiating its share of the tokens (`Numerics.every_token`): blocks of 16 and up (a
  matrix at a time; the rotation kernel reads them split), and blocks the attention kernel
  rotates by itself where it takes their band at these tokens on the plan's chip (LieRE8: its
  band built from each chip's share, docs/decisions/030). Elsewhere XLA rotates small blocks
  before attention, from the lattice's table (a table, replicated, costs XLA less than the
  shares' [.., b, b] gathered)."""
  if not (numerics.every_token and block >= 3 and expm_form(numerics, block) == 'kernel'):
    return False
  return (block >= expm_kernel.MIN_BLOCK
          or attention_kernel.takes_band(block, tokens, numerics.vmem))


def liere_rotations(generators: jax.Array, positions: jax.Array, block: int,
                    numerics: Numerics, lattice_ok: bool = True,
                    split_tokens: bool = False) -> jax.Array:
  """R(p) per layer, head and token, by `path`.

  Positions known at trace time (numpy, a concrete array, or a constant under jit) that lie on
  a lattice (integer multiples k of one step per axis, e.g. every grid mode of
  liere_jax.positions) take the lattice path unless `lattice_ok` is False.

  Args:
    generators: [L, H, n, n_blocks, b(b-1)/2] raw parameters (L, H may be 1 when shared).
    positions: [T, n] token positions.
    numerics: the plan (the exponential's form and products).
    lattice_ok: take the lattice path where the positions allow it.
    split_tokens: where every token's exponential is the Pallas kernel (a TPU: its rotation
      kernel reads them), leave the result split over the context mesh's 'data' axis by tokens,
      the tokens padded to a multiple of its devices by identities: each device computes its
      tokens', and a consumer gathers a layer's where it reads them (liere_jax.kernels.rotation),
      its gradient reduce-scattered, instead of every layer's replicated and their gradient
      summed.
  Returns:
    [L, H, T, n_blocks, b, b] float32 rotations (T rounded up where split_tokens splits them).
  """
  how = path(numerics, block, positions, lattice_ok)
  if how == 'lattice':
    return _lattice_rotations(generators, lattice.lattice_plan(positions), block, numerics)
  exp = lambda a: expm(a, numerics)
  if not (split_tokens and every_token_kernel(numerics, block, len(positions))):
    return split_over_data(exp, liere_generators(generators, positions, block))
  return _split_tokens(lambda g, pos: exp(liere_generators(g, pos, block)), generators,
                       positions)


def entries_path(numerics: Numerics, block: int, tokens: int) -> bool:
  """Whether LieRE's rotations go to the attention kernel as its entries (`liere_entries`): the
  every-token exponential of blocks the kernel rotates by itself (`every_token_kernel`), under a
  plan that attends by the kernel."""
  return (numerics.attention == 'kernel' and block < expm_kernel.MIN_BLOCK
          and every_token_kernel(numerics, block, tokens))


def liere_entries(generators: jax.Array, positions: jax.Array, block: int, head_dim: int,
                  numerics: Numerics, dtype) -> jax.Array:
  """R(p) of every token as the attention kernel reads them (`entries_path`; its entries,
  liere_jax.kernels.attention.entries): [L, b, T', H d] in dtype, E[l, m, t, h d + c b + i] =
  R[i, m] of block c of head h at token t (dims past the blocks: the identity's).

  The generators' sums are made, exponentiated (kernels.expm.expm_entries) and handed on laid
  out entries first, and their dims interleaved by a product with a permutation (exact: bf16
  parts of x against 0 and 1, float32 sums): no array of [.., b, b] minor dimensions, which a
  TPU pads to 128 lanes (docs/decisions/031). On a mesh each device of 'data' makes
  its share of the tokens (T' the tokens padded to a multiple of its devices by position 0, the
  identity) and the result stays split by tokens (axis 2): the attention kernel gathers a
  layer's.
  """
  run = functools.partial(_entries, block=block, head_dim=head_dim, numerics=numerics,
                          dtype=dtype)
  return _split_tokens(run, generators, positions)


def _entries(generators, positions, block, head_dim, numerics, dtype):
  """liere_entries of these tokens."""
  l, h, n, k, _ = generators.shape
  b, t = block, positions.shape[0]
  gens = skew(jnp.asarray(generators, jnp.float32), b)  # [L, H, n, k, b, b]
  gens = jnp.transpose(gens, (4, 5, 0, 2, 1, 3)).reshape(b * b * l, n, h * k)
  a = jnp.einsum('tn,xny->xty', positions, gens, precision=jax.lax.Precision.HIGHEST)
  r = expm_kernel.expm_entries(a.reshape(b, b, -1), numerics)  # [i, j, L T H k]
  x = jnp.transpose(r.reshape(b, b, l, t, h * k), (2, 1, 3, 0, 4))  # [L, j, T, i, H k]
  out = _interleave(x.reshape(l, b, t, b * h * k), (b, h, k, head_dim), jnp.dtype(dtype))
  if k * b < head_dim:  # The identity's entries past the blocks.
    rest = np.zeros((b, h, head_dim), np.float32)
    rest[:, :, k * b:] = np.arange(k * b, head_dim) % b == np.arange(b)[:, None, None]
    out = out + jnp.asarray(rest.reshape(1, b, 1, h * head_dim), dtype)
  return out


@functools.lru_cache(maxsize=None)
def _permutation(b, h, k, head_dim):
  """[b h k, h head_dim]: entry (i, h, c) of a token's rows to dim c b + i of head h."""
  perm = np.zeros((b, h, k, h, head_dim), np.float32)
  i, hh, c = np.meshgrid(np.arange(b), np.arange(h), np.arange(k), indexing='ij')
  perm[i, hh, c, hh, c * b + i] = 1
  return perm.reshape(b * h * k, h * head_dim)


def _permute(x, perm):
  """x [.., n] @ perm [n, m] (0s and 1s) exactly, in float32: x's bf16 parts (one for bf16,
  three for float32: 8 bits of the significand each) against bf16 0s and 1s, float32 sums."""
  perm, out = jnp.asarray(perm, jnp.bfloat16), 0
  for _ in range(1 if x.dtype == jnp.bfloat16 else 3):
    part = x.astype(jnp.bfloat16)
    out = out + jnp.dot(part, perm, preferred_element_type=jnp.float32)
    x = x - part.astype(x.dtype)
  return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _interleave(x, dims, dtype):
  """x [.., (i, h, c)] (float32) -> [.., (h, c b + i)] in dtype (`_permutation`); its transpose
  the inverse permutation of the cotangent, exact in its dtype."""
  return _permute(x, _permutation(*dims)).astype(dtype)


def _interleave_fwd(x, dims, dtype):
  return _interleave(x, dims, dtype), None


def _interleave_bwd(dims, dtype, _, g):
  del dtype
  return _permute(g, _permutation(*dims).T),


_interleave.defvjp(_interleave_fwd, _interleave_bwd)


_TOKENS = P(None, None, 'data')  # [L, H or b, T, ...] split by tokens.


def _split_tokens(fn, generators, positions):
  """fn(generators, positions) for positions [T, n], each device of the context mesh's 'data'
  axis its share of the tokens (T padded to a multiple of its devices by position 0, the
  identity); the result [L, ., T, ...] stays split by tokens."""
  n = _data_devices()
  pad = -len(positions) % n
  if pad:
    known = lattice.concrete_positions(positions)
    xp, positions = (jnp, positions) if known is None else (np, known.astype(np.float32))
    positions = xp.concatenate([positions, xp.zeros((pad, positions.shape[1]), np.float32)])
  positions = jnp.asarray(positions, jnp.float32)
  if n == 1:
    return fn(generators, positions)
  out = jax.shard_map(fn, in_specs=(P(), P('data')), out_specs=_TOKENS,
                      check_vma=False)(generators, positions)
  return jax.lax.with_sharding_constraint(out, _TOKENS)


def _data_devices():
  """Devices on the context mesh's 'data' axis (`jax.set_mesh`; 1 without a mesh)."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty or 'data' not in mesh.axis_names else mesh.shape['data']


def _lattice_rotations(generators, plan: lattice.LatticePlan, block: int, numerics):
  """The lattice path of liere_rotations: a table for each block of each layer and head. On a
  mesh each device of 'data' computes 1/n of the tables: their primitive points' exponentials
  (1/n of those, matrix by matrix, where the tables do not split evenly over the devices), then
  the powers."""
  g = liere_generators(generators, plan.primitives, block)  # [L, H, P, k, b, b]
  l, h, n_prim, k = g.shape[:4]
  exp = lambda a: expm(a, numerics)
  tables = lambda rot: lattice.table(rot, plan, numerics)
  # Stacks of one block each (G = L H k, not L H with k blocks an item): on a mesh each device
  # takes 1/n of them, which a TPU lays out with the stacks on its lanes.
  g = jnp.moveaxis(g, 3, 2).reshape(l * h * k, n_prim, block, block)
  if (l * h * k) % _data_devices() == 0:  # Each device its stacks' exponentials and tables.
    out = split_over_data(lambda g: tables(exp(g)), g, item_dims=3)
  else:  # Stacks that do not split evenly: exponentials one by one.
    out = split_over_data(tables, split_over_data(exp, g), item_dims=3)
  out = lattice.take_static(out, plan.token_slot)  # [G, T, b b]
  if np.any(plan.transpose):
    flip = jnp.asarray(plan.transpose)[None, :, None]
    out = jnp.where(flip, out[..., np.arange(block**2).reshape(block, block).T.reshape(-1)], out)
  out = out.reshape(l, h, k, len(plan.token_slot), block, block)
  return jnp.moveaxis(out, 2, 3)


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


def rotation_form(numerics: Numerics, block: int) -> str:
  """How `rotate` applies blocks of `block` outside a kernel: 'einsum' above 2, else the plan's
  `pairs` ('swap_matmul', 'swap_roll': on x's own layout; 'blocks': x as [..., k, 2] pairs)."""
  return 'einsum' if block > 2 else numerics.pairs


@jax.named_scope('pe_rotate')  # Its part of a step: liere_jax.bench.compile.SCOPES.
def rotate(x: jax.Array, rot: jax.Array, numerics: Numerics) -> jax.Array:
  """Applies per-token block rotations to queries or keys, in `rotation_form`.

  Args:
    x: [B, T, H, d].
    rot: [H or 1, T, k, b, b] float32; the first k * b dims of each head rotate, the rest pass
      through.
    numerics: the plan (its `pairs`).
  Returns:
    x rotated (x' = R x per block), in x's dtype, with float32 products and sums (bf16 models
    rotate by bf16-rounded rotations).
  """
  rot = jnp.swapaxes(rot, 0, 1).astype(x.dtype)  # [T, H or 1, k, b, b]
  how = rotation_form(numerics, rot.shape[-1])
  if how == 'einsum':
    return _rotate_blocks(x, rot, _apply_einsum)
  if how == 'blocks':
    return _rotate_blocks(x, rot, _elementwise)
  return _rotate_pairs(x, rot, how.removeprefix('swap_'))


def _rotate_blocks(x, rot, apply):
  """x [B, T, H, d] as [..., k, b] blocks times rot [T, H or 1, k, b, b] by `apply`."""
  k, b = rot.shape[-3], rot.shape[-1]
  xr = x[..., :k * b].reshape(*x.shape[:-1], k, b)  # [B, T, H, k, b]
  out = apply(xr, rot).reshape(*x.shape[:-1], k * b).astype(x.dtype)
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
  # The sum over j unrolled, not a reduce: jax 0.10.2's XLA:CPU YNNPACK fusion of a reduce
  # with the bf16 convert after it gave wrong sums from 16 x 65 x 3 x 64 bf16 elements up
  # (tests/test_rotations.py; --xla_cpu_experimental_ynn_fusion_type= avoided it too).
  rot, xr = rot.astype(jnp.float32), xr.astype(jnp.float32)
  return sum(rot[..., j] * xr[..., j, None] for j in range(rot.shape[-1]))


def _apply_einsum(xr, rot):
  """The blocks applied as one batched product, the rotations on the left, float32
  accumulation."""
  precision = jax.lax.Precision.HIGHEST if xr.dtype == jnp.float32 else None
  rot = jnp.broadcast_to(rot, xr.shape[1:] + xr.shape[-1:])
  return jnp.einsum('thkij,bthkj->bthki', rot, xr, precision=precision,
                    preferred_element_type=jnp.float32)
