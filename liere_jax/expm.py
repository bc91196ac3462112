"""Matrix exponential of stacks of skew-symmetric matrices, the core of LieRE.

`expm(a, method)` is the entry point (liere_jax.rotations calls it for the exponentials it needs):
  scipy:       `jax.vmap(jax.scipy.linalg.expm)`, the reference. Under vmap its norm-dependent
               Pade order and squarings become selects, so every matrix pays for all of them,
               and its backward pass keeps every intermediate.
  scipy_remat: the same under `jax.checkpoint`, per chunk of 16 MiB of matrices inside
               `lax.map`: recomputed in the backward pass, which then holds one chunk's
               intermediates rather than the whole stack's.
  fast:        b = 2 in closed form (a rotation by the angle a[0, 1]); otherwise scaling and
               squaring with ONE scale per chunk of matrices (a scalar, so the squarings are real
               branches, not selects) from a spectral-radius bound, a degree-12 Taylor
               polynomial in 5 matmuls (Paterson-Stockmeyer), a final Newton-Schulz step, chunks
               under `jax.checkpoint` inside `lax.map` so the backward pass holds one chunk's
               intermediates at a time. On CPU the chunks are small (64 KiB of matrices, e.g. 4
               of 64x64, so the working set stays in cache and the scale fits each chunk);
               elsewhere 16 MiB (accelerators want large batches).
All matmuls run in float32 at HIGHEST precision: a bf16 pass breaks orthogonality.

`fast_expm(a, taylor)` is `fast` with another Taylor scheme (a `Taylor`; liere_jax.bench times
one), and `chunks` / `squarings` say how `fast` splits a stack and scales each chunk.
"""

import functools
from typing import Callable, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

METHODS = ('fast', 'scipy', 'scipy_remat')
_HI = jax.lax.Precision.HIGHEST
_MAX_SQUARINGS = 24  # Scaled norms up to 2**24: far beyond any position range in use.
_CHUNK_BYTES = 16 * 2**20  # Matrices per chunk of the fast path, in bytes (GPU, TPU).
_CHUNK_BYTES_CPU = 2**16  # On CPU: small enough that a chunk's intermediates stay in cache.
_TAYLOR = [1.0 / float(np.prod(np.arange(1, k + 1))) for k in range(13)]  # 1/k!, k <= 12.


class Taylor(NamedTuple):
  """A polynomial for `fast`'s scaling and squaring.

  powers: a [c, b, b] -> {k: a^k}, k = 1 included; the highest power bounds the spectral
    radius (rho(a) <= ||a^k||_1^(1/k)).
  polynomial: the scaled powers {k: x^k} -> the Taylor polynomial of exp at x.
  theta: the largest scaled spectral radius the polynomial is used at.
  products: matrix products per matrix in powers and polynomial together.
  """
  powers: Callable[[jax.Array], Dict[int, jax.Array]]
  polynomial: Callable[[Dict[int, jax.Array]], jax.Array]
  theta: float
  products: int


def expm(a: jax.Array, method: str = 'fast') -> jax.Array:
  """exp(a) for a: [..., b, b] skew-symmetric; returns float32 [..., b, b] rotations."""
  if method not in METHODS:
    raise ValueError(f"expm method={method!r} is unknown; use one of {METHODS} "
                     "(e.g. --config.model.pe.expm=fast).")
  if method == 'fast':
    return fast_expm(a)
  flat, shape = _stack(a)
  fn = jax.vmap(jax.scipy.linalg.expm)
  with jax.default_matmul_precision('highest'):
    out = (_map_chunks(jax.checkpoint(fn), flat, _CHUNK_BYTES) if method == 'scipy_remat'
           else fn(flat))
  return out.reshape(shape)


def fast_expm(a: jax.Array, taylor: Optional[Taylor] = None) -> jax.Array:
  """expm(a, 'fast') with the Taylor scheme `taylor` (default: TAYLOR12, the library's)."""
  flat, shape = _stack(a)
  if shape[-1] == 2:
    return _rotation_2x2(flat).reshape(shape)
  chunk_expm = jax.checkpoint(functools.partial(_chunk_expm, taylor or TAYLOR12))
  return _map_chunks(chunk_expm, flat, _fast_budget()).reshape(shape)


def _stack(a):
  """a [..., b, b] as float32 [m, b, b], and a's shape."""
  a = jnp.asarray(a, jnp.float32)
  b, b2 = a.shape[-2:]
  if b != b2:
    raise ValueError(f'expm needs square matrices, got shape {a.shape}.')
  return a.reshape(-1, b, b), a.shape


def _rotation_2x2(a):
  """exp([[0, t], [-t, 0]]) = [[cos t, sin t], [-sin t, cos t]]; a: [m, 2, 2]."""
  t = a[:, 0, 1]
  c, s = jnp.cos(t), jnp.sin(t)
  return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)


def _fast_budget():
  return _CHUNK_BYTES_CPU if jax.default_backend() == 'cpu' else _CHUNK_BYTES


def chunks(a: jax.Array) -> jax.Array:
  """a [m, b, b] as `fast` splits it: [n_chunks, chunk, b, b], the last chunk zero-padded."""
  return _chunked(a, _fast_budget())


def _chunked(a, budget):
  """[m, b, b] -> [n_chunks, chunk, b, b] of about `budget` bytes each, zero-padded (exp(0) =
  I; the padding is sliced off after)."""
  m, b, _ = a.shape
  n_chunks = -(-m // max(1, min(m, budget // (4 * b * b))))
  chunk = -(-m // n_chunks)  # Balanced: fewer than n_chunks padding matrices.
  return jnp.pad(a, ((0, n_chunks * chunk - m), (0, 0), (0, 0))).reshape(n_chunks, chunk, b, b)


def _map_chunks(fn, a, budget):
  """fn over chunks of about `budget` bytes of a [m, b, b], one after another (lax.map)."""
  if not a.shape[0]:  # Nothing to exponentiate (e.g. every position at the origin).
    return a
  parts = _chunked(a, budget)
  if parts.shape[0] == 1:
    return fn(a)
  out = jax.lax.map(fn, parts)
  return out.reshape(-1, *a.shape[1:])[:a.shape[0]]


def squarings(chunk: jax.Array, taylor: Optional[Taylor] = None) -> jax.Array:
  """The squarings `fast` (with `taylor`, default TAYLOR12) applies to a chunk [c, b, b]."""
  taylor = taylor or TAYLOR12
  return _squarings(taylor.powers(chunk), taylor.theta)


def _squarings(powers, theta):
  """Squarings for a chunk, from the highest power a^k of its unscaled matrices (a scalar):
  the scaled spectral radius ends at most theta."""
  # A skew-symmetric matrix is normal: the Taylor remainder at x is bounded through rho(x) in
  # the 2-norm, and rho(a) <= ||a^k||_1^(1/k) <= ||a||_1 (tighter than the 1-norm, and free:
  # the powers are needed anyway).
  k = max(powers)
  norm = jax.lax.stop_gradient(jnp.max(jnp.sum(jnp.abs(powers[k]), axis=-2))) ** (1 / k) / theta
  return jnp.clip(jnp.ceil(jnp.log2(jnp.maximum(norm, 1e-30))), 0,
                  _MAX_SQUARINGS).astype(jnp.int32)


@jax.custom_vjp
def _mm(x, y):
  """Batched x @ y at HIGHEST precision, with a VJP that avoids XLA CPU's slow form.

  The VJP needs x^T g; XLA folds the transpose into the dot as a contraction over the lhs's
  row axis, which on CPU runs several times slower than x @ y for small batched matrices.
  Materialising x^T first (the barrier keeps XLA from folding it back) restores the fast form.
  Other backends keep XLA's own choice.
  """
  return jnp.matmul(x, y, precision=_HI)


def _mm_fwd(x, y):
  return _mm(x, y), (x, y)


def _mm_bwd(res, g):
  x, y = res
  xt = jnp.swapaxes(x, -1, -2)
  if jax.default_backend() == 'cpu':
    xt = jax.lax.optimization_barrier(xt)
  return (jnp.matmul(g, jnp.swapaxes(y, -1, -2), precision=_HI),
          jnp.matmul(xt, g, precision=_HI))


_mm.defvjp(_mm_fwd, _mm_bwd)
matmul = _mm  # For liere_jax.rotations' lattice powers and other Taylor schemes.


def _chunk_expm(taylor, a):
  """Scaling and squaring with one scale for the whole chunk; a: [c, b, b]."""
  powers = taylor.powers(a)
  s = _squarings(powers, taylor.theta)
  scale = jnp.exp2(-s.astype(jnp.float32))
  r = taylor.polynomial({k: p * scale**k for k, p in powers.items()})
  for i in range(_MAX_SQUARINGS):  # s is a scalar: each cond runs one branch.
    r = jax.lax.cond(i < s, lambda y: _mm(y, y), lambda y: y, r)
  # One Newton-Schulz step to the nearest orthogonal matrix: squaring doubles the rounding
  # error each time, this removes the part of it that breaks orthogonality.
  return 1.5 * r - 0.5 * _mm(r, _mm(jnp.swapaxes(r, -1, -2), r))


def _powers12(a):
  a2 = _mm(a, a)
  return {1: a, 2: a2, 4: _mm(a2, a2)}


def _taylor12(x):
  """Degree 12 by Paterson-Stockmeyer from x, x^2, x^4 (one more product: x^3)."""
  x1, x2, x4 = x[1], x[2], x[4]
  eye = jnp.eye(x1.shape[-1], dtype=x1.dtype)
  x3 = _mm(x2, x1)
  c = _TAYLOR
  block = lambda j: c[j] * eye + c[j + 1] * x1 + c[j + 2] * x2 + c[j + 3] * x3
  r = block(8) + c[12] * x4
  r = block(4) + _mm(x4, r)
  return block(0) + _mm(x4, r)


# Degree 12 up to a scaled spectral radius of 1: remainder < 1/13! ~ 2e-10. Products: a^2, a^4,
# x^3 and 2 in the polynomial.
TAYLOR12 = Taylor(powers=_powers12, polynomial=_taylor12, theta=1.0, products=5)
