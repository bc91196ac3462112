"""Matrix exponential of stacks of skew-symmetric matrices, the core of LieRE.

`expm(a, method)` is the one entry point; every rotation in the library goes through it.
  scipy:       `jax.vmap(jax.scipy.linalg.expm)`, the reference. Under vmap its norm-dependent
               Pade order and squarings become selects, so every matrix pays for all of them,
               and its backward pass keeps every intermediate.
  scipy_remat: the same under `jax.checkpoint`, per chunk of 16 MiB of matrices inside
               `lax.map`: recomputed in the backward pass, which then holds one chunk's
               intermediates (the whole stack under one checkpoint still needed all of them at
               once: 23 GB for 28,224 64x64 matrices).
  fast:        b = 2 in closed form (a rotation by the angle a[0, 1]); otherwise scaling and
               squaring with ONE scale per chunk of matrices (a scalar, so the squarings are real
               branches, not selects) from a spectral-radius bound, a degree-12 Taylor
               polynomial in 5 matmuls (Paterson-Stockmeyer), a final Newton-Schulz step, chunks
               under `jax.checkpoint` inside `lax.map` so the backward pass holds one chunk's
               intermediates at a time. On CPU the chunks are small (64 KiB of matrices, e.g. 4
               of 64x64: the working set stays in cache and the scale fits each chunk;
               forward+backward of 2,304 64x64 took 0.71 s against 1.02 s with 4 MiB chunks);
               elsewhere 16 MiB (accelerators want large batches).
All matmuls run in float32 at HIGHEST precision: a bf16 pass breaks orthogonality.
"""

import jax
import jax.numpy as jnp
import numpy as np

METHODS = ('fast', 'scipy', 'scipy_remat')
_HI = jax.lax.Precision.HIGHEST
_MAX_SQUARINGS = 24  # Scaled norms up to 2**24: far beyond any position range in use.
_CHUNK_BYTES = 16 * 2**20  # Matrices per chunk of the fast path, in bytes (GPU, TPU).
_CHUNK_BYTES_CPU = 2**16  # On CPU: small enough that a chunk's intermediates stay in cache.
_TAYLOR = [1.0 / float(np.prod(np.arange(1, k + 1))) for k in range(13)]  # 1/k!, k <= 12.


def expm(a: jax.Array, method: str = 'fast') -> jax.Array:
  """exp(a) for a: [..., b, b] skew-symmetric; returns float32 [..., b, b] rotations."""
  if method not in METHODS:
    raise ValueError(f"expm method={method!r} is unknown; use one of {METHODS} "
                     "(e.g. --config.model.pe.expm=fast).")
  a = jnp.asarray(a, jnp.float32)
  *batch, b, b2 = a.shape
  if b != b2:
    raise ValueError(f'expm needs square matrices, got shape {a.shape}.')
  flat = a.reshape(-1, b, b)
  if method == 'fast':
    out = _rotation_2x2(flat) if b == 2 else _fast(flat)
  else:
    fn = jax.vmap(jax.scipy.linalg.expm)
    with jax.default_matmul_precision('highest'):
      out = (_map_chunks(jax.checkpoint(fn), flat, _CHUNK_BYTES) if method == 'scipy_remat'
             else fn(flat))
  return out.reshape(*batch, b, b)


def _rotation_2x2(a):
  """exp([[0, t], [-t, 0]]) = [[cos t, sin t], [-sin t, cos t]]; a: [m, 2, 2]."""
  t = a[:, 0, 1]
  c, s = jnp.cos(t), jnp.sin(t)
  return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)


def _fast(a):
  return _map_chunks(_chunk_expm, a, _fast_budget())


def _fast_budget():
  return _CHUNK_BYTES_CPU if jax.default_backend() == 'cpu' else _CHUNK_BYTES


def _chunked(a, budget):
  """[m, b, b] -> [n_chunks, chunk, b, b] of about `budget` bytes each, zero-padded (exp(0) =
  I; the padding is sliced off after)."""
  m, b, _ = a.shape
  n_chunks = -(-m // max(1, min(m, budget // (4 * b * b))))
  chunk = -(-m // n_chunks)  # Balanced: fewer than n_chunks padding matrices.
  return jnp.pad(a, ((0, n_chunks * chunk - m), (0, 0), (0, 0))).reshape(n_chunks, chunk, b, b)


def _map_chunks(fn, a, budget):
  """fn over chunks of about `budget` bytes of a [m, b, b], one after another (lax.map)."""
  chunks = _chunked(a, budget)
  if chunks.shape[0] == 1:
    return fn(a)
  out = jax.lax.map(fn, chunks)
  return out.reshape(-1, *a.shape[1:])[:a.shape[0]]


def fast_flops(a) -> int:
  """Forward FLOPs of expm(a, 'fast') (XLA's cost analysis counts a lax.map body once):
  per matrix 7 fixed products (degree 12: a^2, a^4, x^3, 2 Paterson-Stockmeyer; degree 18:
  a^2, a^3, a^6, 2 more; both: 2 Newton-Schulz) plus its chunk's squarings, 2 b^3 FLOPs each,
  padding of the last chunk included (it is computed)."""
  a = jnp.asarray(a, jnp.float32)
  b = a.shape[-1]
  if b == 2 or a.size == 0:
    return 0
  chunks = _chunked(a.reshape(-1, b, b), _fast_budget())
  if _DEGREE == 18:
    bound = lambda x: _squarings(_a6(x), 6, _THETA[18])
  else:
    bound = lambda x: _squarings(_mm(_mm(x, x), _mm(x, x)), 4, _THETA[12])
  s = jax.jit(lambda c: jax.lax.map(bound, c))(chunks)
  return int((7 + np.asarray(s, np.int64)).sum()) * chunks.shape[1] * 2 * b**3


def _a6(x):
  x3 = _mm(_mm(x, x), x)
  return _mm(x3, x3)


def _squarings(a4, root=4, theta=1.0):
  """Squarings for a chunk, from a^root (a^4 or a^6) of its unscaled matrices (a scalar): the
  scaled spectral radius ends at most theta."""
  # A skew-symmetric matrix is normal: the degree-12 Taylor remainder at x is at most
  # rho(x)^13 / 13! in the 2-norm, and rho(a) <= ||a^4||_1^(1/4) <= ||a||_1 (0.7 squarings
  # fewer than the 1-norm on LieRE's generators, for free: a^2 and a^4 are needed anyway).
  norm = jax.lax.stop_gradient(jnp.max(jnp.sum(jnp.abs(a4), axis=-2))) ** (1 / root) / theta
  return jnp.clip(jnp.ceil(jnp.log2(jnp.maximum(norm, 1e-30))), 0,
                  _MAX_SQUARINGS).astype(jnp.int32)


@jax.custom_vjp
def _mm(x, y):
  """Batched x @ y at HIGHEST precision, with a VJP that avoids XLA CPU's slow form.

  The VJP needs x^T g; XLA folds the transpose into the dot as a contraction over the lhs's
  row axis, which on CPU runs 2-7x slower than x @ y for small batched matrices (8x8: 10 ms vs
  1.4 ms for 18k matrices). Materialising x^T first (the barrier keeps XLA from folding it
  back) restores the fast form. Other backends keep XLA's own choice.
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
matmul = _mm  # For liere_jax.rotations' lattice powers.


# Taylor degree of `fast` (read at trace time; `bench rotations` sets 18 to compare) and the
# largest scaled spectral radius it is used at. Degree 12 in 5
# products (Paterson-Stockmeyer: a^2, a^4, a^3 and 2 more); degree 18 in 5 products (Bader,
# Blanes, Casas 2019, coefficients solved here for that scheme's structure) at up to 3.0 saves
# ~1.6 squarings but is dropped: its float32 cancellation leaves 2-7e-6 before any squaring
# (degree 12: 6e-8), which the squarings then double (README / bench: 1e-5 fails at 4x range).
_DEGREE = 12
_THETA = {12: 1.0, 18: 3.0}
# T18 = B2 + (B3 + A9) A9, A9 = B1 B5 + B4; each B a combination of (I, A, A^2, A^3[, A^6]).
_B18 = dict(
    b1=(-0.03972234290870274, 0.4592669618428011, 0.03674135694742408, 0.0040823729941582305),
    b5=(1.2556627441679866, -0.3537439410937628, -0.08089101398254882, 0.014931171112628186,
        3.0613769468148936e-06),
    b4=(0.19404316037174738, 1.0172625235272112, 0.2471577146175959, 0.061934010098643244,
        -3.193066231659192e-05),
    b3=(-22.38749070489626, -1.2669451770537645, 0.03976319816519053, 0.02519350036276881,
        -2.1923838013825762e-05),
    b2=(4.206715553371252, 36.718065296131634, 2.9080863878591137, 0.19848404329836158,
        0.00017616841326770723))


def _chunk_expm(a):
  return _chunk_expm_18(a) if _DEGREE == 18 else _chunk_expm_12(a)


def _finish(r, s):
  for i in range(_MAX_SQUARINGS):  # s is a scalar: each cond runs one branch.
    r = jax.lax.cond(i < s, lambda y: _mm(y, y), lambda y: y, r)
  # One Newton-Schulz step to the nearest orthogonal matrix: squaring doubles the rounding
  # error each time, this removes the part of it that breaks orthogonality.
  return 1.5 * r - 0.5 * _mm(r, _mm(jnp.swapaxes(r, -1, -2), r))


@jax.checkpoint
def _chunk_expm_12(a):
  """Scaling and squaring with one scale for the whole chunk; a: [c, b, b]."""
  a2 = _mm(a, a)
  a4 = _mm(a2, a2)
  s = _squarings(a4, 4, _THETA[12])
  scale = jnp.exp2(-s.astype(jnp.float32))  # rho(x) <= 1: Taylor-12 error < 1/13! ~ 2e-10.
  x, x2, x4 = a * scale, a2 * scale**2, a4 * scale**4
  eye = jnp.eye(a.shape[-1], dtype=a.dtype)
  x3 = _mm(x2, x)
  c = _TAYLOR
  block = lambda j: c[j] * eye + c[j + 1] * x + c[j + 2] * x2 + c[j + 3] * x3
  r = block(8) + c[12] * x4
  r = block(4) + _mm(x4, r)
  r = block(0) + _mm(x4, r)
  return _finish(r, s)


@jax.checkpoint
def _chunk_expm_18(a):
  """As _chunk_expm_12 with the degree-18 scheme; the bound from a^6 (rho <= ||a^6||^(1/6))."""
  a2 = _mm(a, a)
  a3 = _mm(a2, a)
  a6 = _mm(a3, a3)
  s = _squarings(a6, 6, _THETA[18])
  scale = jnp.exp2(-s.astype(jnp.float32))
  x, x2, x3, x6 = a * scale, a2 * scale**2, a3 * scale**3, a6 * scale**6
  eye = jnp.eye(a.shape[-1], dtype=a.dtype)
  comb = lambda c: (c[0] * eye + c[1] * x + c[2] * x2 + c[3] * x3
                    + (c[4] * x6 if len(c) > 4 else 0.))
  a9 = _mm(comb(_B18['b1']), comb(_B18['b5'])) + comb(_B18['b4'])
  return _finish(comb(_B18['b2']) + _mm(comb(_B18['b3']) + a9, a9), s)
