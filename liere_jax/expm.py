"""Matrix exponential of stacks of skew-symmetric matrices, the core of LieRE.

`expm(a, numerics)` computes exp(a) as the plan says (liere_jax.numerics; `form` names what
runs): blocks of 2 in closed form; the Pallas kernel where the plan takes it and the kernel takes
the blocks (liere_jax.kernels.expm); otherwise scaling and squaring in XLA, from a
spectral-radius bound, a Taylor polynomial (liere_jax.taylor) and a final Newton-Schulz step:
  cond    one scale a chunk (`Numerics.chunk_bytes`, chunks one after another in lax.map), the
          squarings lax.cond branches up to 2^MAX_SQUARINGS.
  loop    one scale for the stack, its squarings a fori_loop of dynamic trip count (no cap).
  select  a scale a matrix, SELECT_CAP squarings kept by select: no control flow (a GPU copies
          every predicate to the host); past the cap the result is wrong.
  scipy   jax.scipy.linalg.expm under vmap at HIGHEST: the reference (its gradient JAX's).
Each XLA form's VJP (a custom_vjp) is taylor.py's adjoint for skew-symmetric a: abar =
skew(L(a, W) R0^{-1}), W = skew(R^T G), L carried forward through the squarings at 2 products a
level. cond and loop keep a and R and recompute their squarings (3 products a level; a loop of
dynamic trip count cannot keep its levels), select keeps its squarings' inputs (2 a level):
docs/decisions/027-expm-adjoint.md.
Products run at `Numerics.products`, blocks up to `Numerics.elementwise_blocks` as float32
multiply-adds. Why each platform runs its form: docs/decisions/.
"""
import functools

import jax
import jax.numpy as jnp

from liere_jax import dots as dots_lib, taylor as taylor_lib
from liere_jax.kernels import expm as expm_kernel
from liere_jax.numerics import Numerics
from liere_jax.taylor import TAYLORS, Algebra

MAX_SQUARINGS = 24  # cond: scaled norms up to 2**24, far beyond any position range in use.
# select: every matrix pays for SELECT_CAP squarings. 16 covers spectral radii up to 2**16: the
# init's largest is 2**11 for LieRE64 at 4x the position range of our configs, and 2**9 at it.
# Beyond the cap the squarings stop there and the error grows (tests/test_expm.py).
SELECT_CAP = 16
# select without remat while its residuals (`select_residuals`: SELECT_CAP + 5 stacks of the
# input's size) fit this: ImageNet LieRE64's lattice exponentials (16,848 of 64x64: 276 MB a
# stack) keep 5.8 GB, which an 80 GB accelerator holds beside ViT-B/16's batch of 128 (37 GB).
REMAT_ABOVE_BYTES = 16 * 2**30


def form(numerics: Numerics, block: int) -> str:
  """What `expm` runs for blocks of `block` under `numerics`: 'closed form', 'kernel' or the
  plan's XLA form."""
  if numerics.expm == 'scipy':
    return 'scipy'
  if block == 2:
    return 'closed form'
  if numerics.expm_kernel and expm_kernel.supported(block, numerics.platform):
    return 'kernel'
  return numerics.expm


def expm(a: jax.Array, numerics: Numerics) -> jax.Array:
  """exp(a) for a: [..., b, b] skew-symmetric; returns float32 [..., b, b] rotations."""
  a = jnp.asarray(a, jnp.float32)
  b = a.shape[-1]
  if a.shape[-2] != b:
    raise ValueError(f'expm needs square matrices, got shape {a.shape}.')
  flat = a.reshape(-1, b, b)
  if not flat.shape[0]:  # Nothing to exponentiate (e.g. every position at the origin).
    return a
  how = form(numerics, b)
  if how == 'closed form':
    return _rotation_2x2(flat).reshape(a.shape)
  with jax.named_scope('liere_expm'):
    if how == 'kernel':
      out = expm_kernel.expm_pallas(flat, numerics)
    elif how == 'scipy':
      with jax.default_matmul_precision('highest'):
        out = jax.vmap(jax.scipy.linalg.expm)(flat)
    else:
      out = _FORMS[how](numerics, flat)
  return out.reshape(a.shape)


def _rotation_2x2(a):
  """exp([[0, t], [-t, 0]]) = [[cos t, sin t], [-sin t, cos t]]; a: [m, 2, 2]."""
  t = a[:, 0, 1]
  c, s = jnp.cos(t), jnp.sin(t)
  return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)


def xla_algebra(d: dots_lib.Dots, elementwise_blocks: int = 0, plain=None) -> Algebra:
  """XLA's algebra: products at d (with a VJP at d.backward), or the plain product `plain`
  (forward-mode differentiation goes through it: 'loop'); blocks up to elementwise_blocks as
  float32 multiply-adds."""
  product = plain or functools.partial(_matmul, d)

  def matmul(x, y):
    return _multiply_adds(x, y) if x.shape[-1] <= elementwise_blocks else product(x, y)
  return taylor_lib.stacked(matmul)


def _multiply_adds(x, y):
  """x @ y for small blocks in float32 on the vector units: b multiply-adds an entry, no dot (a
  dot of 8 x 8 tiles fills a fraction of a tensor core or an MXU). Exact float32 products."""
  x, y = x.astype(jnp.float32), y.astype(jnp.float32)
  return jnp.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _matmul(d: dots_lib.Dots, x, y):
  """x @ y with d.forward, and a VJP whose products use d.backward.

  The VJP needs x^T g; XLA folds the transpose into the dot as a contraction over the lhs's
  row axis, which on CPU runs several times slower than x @ y for small batched matrices.
  Materialising x^T first (d.barrier: the barrier keeps XLA from folding it back) restores the
  fast form there.
  """
  return d.forward(x, y)


def _matmul_fwd(d, x, y):
  return _matmul(d, x, y), (x, y)


def _matmul_bwd(d, res, g):
  x, y = res
  xt = jnp.swapaxes(x, -1, -2)
  if d.barrier:
    xt = jax.lax.optimization_barrier(xt)
  return d.backward(g, jnp.swapaxes(y, -1, -2)), d.backward(xt, g)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def chunked(a, budget):
  """[m, b, b] -> [n_chunks, chunk, b, b] of about `budget` bytes each, zero-padded (exp(0) =
  I; the padding is sliced off after)."""
  m, b, _ = a.shape
  n_chunks = -(-m // max(1, min(m, budget // (4 * b * b))))
  chunk = -(-m // n_chunks)  # Balanced: fewer than n_chunks padding matrices.
  return jnp.pad(a, ((0, n_chunks * chunk - m), (0, 0), (0, 0))).reshape(n_chunks, chunk, b, b)


def _map_chunks(fn, budget, *arrays):
  """fn over chunks of about `budget` bytes of arrays [m, b, b] (all alike; fn takes a chunk of
  each and returns one), one after another (lax.map)."""
  a = arrays[0]
  if not a.shape[0]:
    return a
  parts = [chunked(x, budget) for x in arrays]
  if parts[0].shape[0] == 1:
    return fn(*arrays)
  out = jax.lax.map(lambda xs: fn(*xs), tuple(parts))
  return out.reshape(-1, *a.shape[1:])[:a.shape[0]]


def _backward_algebra(d: dots_lib.Dots, elementwise_blocks: int) -> Algebra:
  """The VJPs' algebra: products at d.backward (multiply-adds up to elementwise_blocks), each
  transpose materialised where d.barrier (as _matmul's VJP: XLA CPU's folded transposes are
  slow)."""
  alg = xla_algebra(d, elementwise_blocks, plain=d.backward)
  if not d.barrier:
    return alg
  return alg._replace(
      transpose=lambda x: jax.lax.optimization_barrier(jnp.swapaxes(x, -1, -2)))


def _cond(numerics, a):
  return _scaled(numerics, 'cond', a)


def _cond_squared(alg, p, s):
  """cond's squarings of p, s a scalar: lax.cond branches up to MAX_SQUARINGS (each runs one)."""
  for i in range(MAX_SQUARINGS):
    p = jax.lax.cond(i < s, lambda y: alg.matmul(y, y), lambda y: y, p)
  return p


def _loop(numerics, a):
  return _scaled(numerics, 'loop', a)


def _loop_squared(alg, p, s):
  """loop's squarings of p, s a scalar: a while loop (on a TPU it runs on the device; on a GPU
  each trip's predicate goes to the host)."""
  return jax.lax.fori_loop(0, s, lambda _, y: alg.matmul(y, y), p)


_SQUARED = {'cond': _cond_squared, 'loop': _loop_squared}
_CAPS = {'cond': MAX_SQUARINGS, 'loop': None}


def _piece_squarings(form, powers):
  """The squarings of a piece (a chunk; loop's stack off the CPU): its largest matrix's."""
  return jnp.max(taylor_lib.squarings(powers, TAYLORS[form].theta, _CAPS[form]))


def _in_chunks(numerics, expm_form, fn, *arrays):
  """fn over `expm_form`'s pieces of arrays [m, b, b]: cond's chunks, and loop's on the CPU (a
  stack elsewhere)."""
  if expm_form == 'cond' or numerics.platform == 'cpu':
    return _map_chunks(fn, numerics.chunk_bytes, *arrays)
  return fn(*arrays)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _scaled(numerics, expm_form, a):
  """'cond' or 'loop' on a [m, b, b], a piece (`_in_chunks`) at a time, one scale a piece:
  NS(p(a 2^-s)^(2^s)); its VJP is taylor.py's adjoint, which keeps a and R alone (R is the
  output) and recomputes each piece's squarings beside its own levels
  (docs/decisions/027-expm-adjoint.md)."""
  return _in_chunks(numerics, expm_form, functools.partial(_scaled_piece, numerics, expm_form), a)


def _scaled_fwd(numerics, expm_form, a):
  r = _scaled(numerics, expm_form, a)
  return r, (a, r)


def _scaled_bwd(numerics, expm_form, res, g):
  return _in_chunks(numerics, expm_form, functools.partial(_scaled_piece_vjp, numerics, expm_form),
                    *res, g),


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def _scaled_piece(numerics, expm_form, a):
  d, taylor = numerics.products, TAYLORS[expm_form]
  alg = xla_algebra(d, numerics.elementwise_blocks, plain=d.forward)
  powers = taylor.powers(alg, a)
  s = _piece_squarings(expm_form, powers)
  r0 = _SQUARED[expm_form](alg, taylor_lib.scaled_polynomial(alg, taylor, powers, s), s)
  return taylor_lib.newton_schulz(alg, r0)


def _scaled_piece_vjp(numerics, expm_form, a, r, g):
  """The cotangent of a piece a for the cotangent g of its R: the piece's squarings as
  _scaled_piece runs them (so R0 = p(x)^(2^s) is R's), 3 products a level with taylor.py's."""
  alg = _backward_algebra(numerics.products, numerics.elementwise_blocks)
  taylor = TAYLORS[expm_form]
  powers = taylor.powers(alg, a)
  s = _piece_squarings(expm_form, powers)
  w = taylor_lib.skew_cotangent(alg, r, g)
  scale = jnp.exp2(-s.astype(jnp.float32)).reshape(1, 1)  # As scaled_polynomial shapes it.
  e, m = taylor_lib.adjoint_base(alg, taylor, powers, scale, w)
  e, m = jax.lax.fori_loop(0, s, lambda _, c: taylor_lib.adjoint_level(alg, *c), (e, m))
  return taylor_lib.adjoint_end(alg, m, r, e, s > 0)


def select_residuals() -> int:
  """The stacks of the input's size select's VJP keeps: a, a^2, a^4, the SELECT_CAP squarings'
  inputs, R0 and R."""
  return SELECT_CAP + 5


def select_remat(n_matrices: int, block: int, limit: int = REMAT_ABOVE_BYTES) -> bool:
  """Whether select chunks and recomputes a stack: its residuals past `limit` bytes."""
  return select_residuals() * n_matrices * block**2 * 4 > limit


def _select(numerics, a, limit=REMAT_ABOVE_BYTES):
  fn = functools.partial(_select_piece, numerics)
  if select_remat(*a.shape[:2], limit):
    return _map_chunks(jax.checkpoint(fn), numerics.chunk_bytes, a)
  return fn(a)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _select_piece(numerics, a):
  """select on a [c, b, b]: a scale per matrix, SELECT_CAP squarings kept by select; the VJP
  keeps each squaring's input and runs taylor.py's adjoint on them (2 products a level, no
  control flow)."""
  return _select_piece_fwd(numerics, a)[0]


def _select_piece_fwd(numerics, a):
  d, taylor = numerics.products, TAYLORS['select']
  alg = xla_algebra(d, numerics.elementwise_blocks, plain=d.forward)
  powers = taylor.powers(alg, a)
  s = taylor_lib.squarings(powers, taylor.theta, SELECT_CAP)
  r0 = taylor_lib.scaled_polynomial(alg, taylor, powers, s)
  levels = []
  for i in range(SELECT_CAP):
    levels.append(r0)
    r0 = jnp.where((i < s)[:, None, None], alg.matmul(r0, r0), r0)
  r = taylor_lib.newton_schulz(alg, r0)
  return r, (powers, s, levels, r0, r)


def _select_piece_bwd(numerics, res, g):
  powers, s, levels, r0, r = res
  alg = _backward_algebra(numerics.products, numerics.elementwise_blocks)
  w = taylor_lib.skew_cotangent(alg, r, g)
  scale = jnp.exp2(-s.astype(jnp.float32)).reshape(s.shape + (1, 1))
  _, m = taylor_lib.adjoint_base(alg, TAYLORS['select'], powers, scale, w)
  for i, e in enumerate(levels):
    m = jnp.where((i < s)[:, None, None], 0.5 * (alg.matmul(e, m) + alg.matmul(m, e)), m)
  return taylor_lib.adjoint_end(alg, m, r, r0, (s > 0)[:, None, None]),


_select_piece.defvjp(_select_piece_fwd, _select_piece_bwd)


_FORMS = {'cond': _cond, 'loop': _loop, 'select': _select}


def chunks(a: jax.Array, numerics: Numerics) -> jax.Array:
  """a [m, b, b] as the plan's form splits it into pieces of one scale each: [n_chunks, chunk,
  b, b], the last chunk zero-padded (bench's FLOP counts)."""
  if numerics.expm == 'loop' and numerics.platform != 'cpu':
    return a[None]
  return chunked(a, numerics.chunk_bytes)


def squarings(chunk: jax.Array, expm_form: str = 'cond') -> jax.Array:
  """The squarings `expm_form` ('cond' or 'loop') applies to a chunk [c, b, b] (`chunks`)."""
  taylor = TAYLORS[expm_form]
  cap = MAX_SQUARINGS if expm_form == 'cond' else None
  powers = taylor.powers(taylor_lib.stacked(jnp.matmul), chunk)
  return jnp.max(taylor_lib.squarings(powers, taylor.theta, cap))
