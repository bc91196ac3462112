"""Matrix exponential of stacks of skew-symmetric matrices, the core of LieRE.

`expm(a, method)` is the one entry point; every rotation in the library goes through it.
  scipy:       `jax.vmap(jax.scipy.linalg.expm)`, the reference. Under vmap its norm-dependent
               Pade order and squarings become selects, so every matrix pays for all of them,
               and its backward pass keeps every intermediate.
  scipy_remat: the same under `jax.checkpoint` (recomputed in the backward pass).
  fast:        b = 2 in closed form (a rotation by the angle a[0, 1]); otherwise scaling and
               squaring with ONE scale per chunk of matrices (a scalar, so the squarings are real
               branches, not selects), a degree-12 Taylor polynomial in 5 matmuls
               (Paterson-Stockmeyer), chunks under `jax.checkpoint` inside `lax.map` so the
               backward pass holds one chunk's intermediates at a time.
All matmuls run in float32 at HIGHEST precision: a bf16 pass breaks orthogonality.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

METHODS = ('fast', 'scipy', 'scipy_remat')
_HI = jax.lax.Precision.HIGHEST
_MAX_SQUARINGS = 24  # Scaled norms up to 2**24: far beyond any position range in use.
_CHUNK_BYTES = 16 * 2**20  # Per-chunk working set of the fast path.
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
    if method == 'scipy_remat':
      fn = jax.checkpoint(fn)
    with jax.default_matmul_precision('highest'):
      out = fn(flat)
  return out.reshape(*batch, b, b)


def _rotation_2x2(a):
  """exp([[0, t], [-t, 0]]) = [[cos t, sin t], [-sin t, cos t]]; a: [m, 2, 2]."""
  t = a[:, 0, 1]
  c, s = jnp.cos(t), jnp.sin(t)
  return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)


def _fast(a):
  m, b, _ = a.shape
  chunk = max(1, min(m, _CHUNK_BYTES // (4 * b * b)))
  n_chunks = -(-m // chunk)
  if n_chunks == 1:
    return _chunk_expm(a)
  pad = n_chunks * chunk - m  # zero matrices: exp(0) = I, sliced off below.
  chunks = jnp.pad(a, ((0, pad), (0, 0), (0, 0))).reshape(n_chunks, chunk, b, b)
  out = jax.lax.map(_chunk_expm, chunks)
  return out.reshape(n_chunks * chunk, b, b)[:m]


@jax.checkpoint
def _chunk_expm(a):
  """Scaling and squaring with one scale for the whole chunk; a: [c, b, b]."""
  mm = functools.partial(jnp.matmul, precision=_HI)
  norm = jax.lax.stop_gradient(jnp.max(jnp.sum(jnp.abs(a), axis=-2)))  # max 1-norm
  s = jnp.clip(jnp.ceil(jnp.log2(jnp.maximum(norm, 1e-30))), 0, _MAX_SQUARINGS).astype(jnp.int32)
  x = a * jnp.exp2(-s.astype(jnp.float32))  # ||x||_1 <= 1: Taylor-12 error < 1/13! ~ 2e-10.
  eye = jnp.eye(a.shape[-1], dtype=a.dtype)
  x2 = mm(x, x)
  x3 = mm(x2, x)
  x4 = mm(x2, x2)
  c = _TAYLOR
  block = lambda j: c[j] * eye + c[j + 1] * x + c[j + 2] * x2 + c[j + 3] * x3
  r = block(8) + c[12] * x4
  r = block(4) + mm(x4, r)
  r = block(0) + mm(x4, r)
  for i in range(_MAX_SQUARINGS):  # s is a scalar: each cond runs one branch.
    r = jax.lax.cond(i < s, lambda y: mm(y, y), lambda y: y, r)
  # One Newton-Schulz step to the nearest orthogonal matrix: squaring doubles the rounding
  # error each time, this removes the part of it that breaks orthogonality.
  return 1.5 * r - 0.5 * mm(r, mm(jnp.swapaxes(r, -1, -2), r))
