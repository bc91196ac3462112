"""Matrix exponential of stacks of skew-symmetric matrices, the core of LieRE.

`expm(a, numerics)` computes exp(a) as the plan says (liere_jax.numerics; `form` names what
runs): blocks of 2 in closed form; the Pallas kernel where the plan takes it and the kernel takes
the blocks (liere_jax.kernels.expm); otherwise scaling and squaring in XLA, from a
spectral-radius bound, a Taylor polynomial (liere_jax.taylor) and a final Newton-Schulz step:
  cond    one scale a chunk (`Numerics.chunk_bytes`, chunks under jax.checkpoint in lax.map), the
          squarings lax.cond branches up to 2^MAX_SQUARINGS.
  loop    one scale for the stack, its squarings a fori_loop of dynamic trip count (no cap); its
          VJP runs the polynomial and squarings forward on a^T: it stores a and s alone.
  select  a scale a matrix, SELECT_CAP squarings kept by select: no control flow (a GPU copies
          every predicate to the host); past the cap the result is wrong.
  scipy   jax.scipy.linalg.expm under vmap at HIGHEST: the reference.
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
# select without remat while its residuals (about SELECT_CAP + 15 stacks of the input's size)
# fit this: ImageNet LieRE64's lattice exponentials (16,848 of 64x64: 276 MB a stack) keep
# 8.6 GB, which an 80 GB accelerator holds beside ViT-B/16's batch of 128 (37 GB).
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


def _map_chunks(fn, a, budget):
  """fn over chunks of about `budget` bytes of a [m, b, b], one after another (lax.map)."""
  if not a.shape[0]:
    return a
  parts = chunked(a, budget)
  if parts.shape[0] == 1:
    return fn(a)
  out = jax.lax.map(fn, parts)
  return out.reshape(-1, *a.shape[1:])[:a.shape[0]]


def _cond(numerics, a):
  alg = xla_algebra(numerics.products, numerics.elementwise_blocks)
  fn = jax.checkpoint(functools.partial(_cond_expm, alg, TAYLORS['cond']))
  return _map_chunks(fn, a, numerics.chunk_bytes)


def _cond_expm(alg, taylor, a):
  """cond on one chunk a [c, b, b]: one scale for the whole chunk."""
  powers = taylor.powers(alg, a)
  s = jnp.max(taylor_lib.squarings(powers, taylor.theta, MAX_SQUARINGS))
  r = taylor_lib.scaled_polynomial(alg, taylor, powers, s)
  for i in range(MAX_SQUARINGS):  # s is a scalar: each cond runs one branch.
    r = jax.lax.cond(i < s, lambda y: alg.matmul(y, y), lambda y: y, r)
  return taylor_lib.newton_schulz(alg, r)


def _loop(numerics, a):
  d, eb = numerics.products, numerics.elementwise_blocks
  fn = lambda x: taylor_lib.newton_schulz(xla_algebra(d, eb), _squared_taylor(d, eb, x))
  return _map_chunks(fn, a, numerics.chunk_bytes) if numerics.platform == 'cpu' else fn(a)


def _taylor_squared(alg, powers, s):
  """p(a 2^-s)^(2^s) from a's powers, s a scalar: the squarings a while loop (on a TPU it runs
  on the device; on a GPU each trip's predicate goes to the host)."""
  p = taylor_lib.scaled_polynomial(alg, TAYLORS['loop'], powers, s)
  return jax.lax.fori_loop(0, s, lambda _, y: alg.matmul(y, y), p)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _squared_taylor(d, elementwise_blocks, a):
  """a [c, b, b] -> p(a 2^-s)^(2^s) with s the stack's squarings, products at d (multiply-adds
  up to elementwise_blocks), with a VJP that keeps a and s alone.

  p and the squarings make a polynomial q in a, and the adjoint of a polynomial's derivative at
  a is its derivative at a^T: the VJP of cotangent g is jvp(q, a^T, g), the same program run
  forward on a^T with g as tangent (3 products a product, nothing stored; reverse mode would
  keep every intermediate, and cannot go through a loop of unknown trip count).
  """
  return _squared_taylor_fwd(d, elementwise_blocks, a)[0]


def _squared_taylor_fwd(d, elementwise_blocks, a):
  alg = xla_algebra(d, elementwise_blocks, plain=d.forward)
  powers = TAYLORS['loop'].powers(alg, a)
  s = jnp.max(taylor_lib.squarings(powers, TAYLORS['loop'].theta))
  return _taylor_squared(alg, powers, s), (a, s)


def _squared_taylor_bwd(d, elementwise_blocks, res, g):
  a, s = res
  alg = xla_algebra(d, elementwise_blocks, plain=d.backward)
  q = lambda x: _taylor_squared(alg, TAYLORS['loop'].powers(alg, x), s)
  return jax.jvp(q, (jnp.swapaxes(a, -1, -2),), (g,))[1],


_squared_taylor.defvjp(_squared_taylor_fwd, _squared_taylor_bwd)


def _select_expm(alg, taylor, a):
  """select on a [c, b, b]: a scale per matrix, SELECT_CAP squarings kept by select."""
  powers = taylor.powers(alg, a)
  s = taylor_lib.squarings(powers, taylor.theta, SELECT_CAP)
  r = taylor_lib.scaled_polynomial(alg, taylor, powers, s)
  for i in range(SELECT_CAP):
    r = jnp.where((i < s)[:, None, None], alg.matmul(r, r), r)
  return taylor_lib.newton_schulz(alg, r)


def select_remat(n_matrices: int, block: int, limit: int = REMAT_ABOVE_BYTES) -> bool:
  """Whether select chunks and recomputes a stack: its residuals past `limit` bytes."""
  return (TAYLORS['select'].products + SELECT_CAP + 10) * n_matrices * block**2 * 4 > limit


def _select(numerics, a, limit=REMAT_ABOVE_BYTES):
  alg = xla_algebra(numerics.products, numerics.elementwise_blocks)
  fn = functools.partial(_select_expm, alg, TAYLORS['select'])
  if select_remat(*a.shape[:2], limit):
    return _map_chunks(jax.checkpoint(fn), a, numerics.chunk_bytes)
  return fn(a)


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
