"""bench presets: the error of the exponential with its products at each dot-algorithm preset,
emulated on this CPU (liere_jax.dots), against float64 SciPy: forward max |R - exp(A)| and the
gradient's relative error (forward at one preset, backward at another), on the matrices of a
bench expm case with the largest norms, at 1x and 4x its position range. The CPU computes the
BF16 presets in float32 and refuses the TF32 ones.

  python -m liere_jax.bench presets [--case NAME] [--json]
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from liere_jax import dots, expm, numerics as numerics_lib
from liere_jax.bench.expm import case_inputs, parse_case
from liere_jax.bench.timing import fmt, table

# (forward, backward): float32, what 'auto' runs on GPU / TPU, and the alternatives.
PAIRS = (('F32', 'F32'), ('BF16_BF16_F32_X6', 'BF16_BF16_F32_X6'),
         ('BF16_BF16_F32_X6', 'BF16_BF16_F32_X3'), ('BF16_BF16_F32_X6', 'TF32_TF32_F32_X3'),
         ('TF32_TF32_F32_X3', 'TF32_TF32_F32_X3'), ('BF16_BF16_F32_X3', 'BF16_BF16_F32_X3'),
         ('TF32_TF32_F32', 'TF32_TF32_F32'), ('BF16_BF16_F32', 'BF16_BF16_F32'))


def largest(case: str, n: int, range_scale: float = 1.0):
  """The n matrices of a case with the largest norms (at range_scale x its position range),
  and cotangents, as numpy."""
  a, g = _largest(case, n)  # Scaling keeps the order of the norms.
  return a * np.float32(range_scale), g


@functools.lru_cache(maxsize=4)
def _largest(case: str, n: int):
  a, g = case_inputs(parse_case(case))  # All of ImageNet LieRE64: seconds, hence the cache.
  idx = np.argsort(np.abs(a).sum(-2).max(-1))[-n:]
  return a[idx], g[idx]


def errors(a, g, forward: str, backward: str, form: str = 'loop'):
  """(forward max abs error, gradient relative error) of XLA's exponential in `form` with its
  products at the emulated presets, against float64; the gradient of sum(R * G) on its skew part
  (None for g None: the forward alone)."""
  import scipy.linalg
  numerics = numerics_lib.plan('cpu').replace(
      expm=form, products=dots.emulated_dots(forward, backward))
  fn = lambda x: expm.expm(x, numerics)
  a64 = a.astype(np.float64)
  ref = np.stack([scipy.linalg.expm(x) for x in a64])
  if g is None:
    return float(np.abs(np.asarray(jax.jit(fn)(a), np.float64) - ref).max()), None
  r, grad = jax.jit(lambda x: (fn(x), jax.grad(lambda y: jnp.sum(fn(y) * g))(x)))(a)
  g64 = g.astype(np.float64)
  gref = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                   for x, y in zip(a64, g64)])
  skew = lambda x: x - np.swapaxes(x, -1, -2)
  gerr = np.abs(skew(np.asarray(grad, np.float64)) - skew(gref)).max() / np.abs(skew(gref)).max()
  return float(np.abs(np.asarray(r, np.float64) - ref).max()), float(gerr)


def bench_presets(case: str = 'imagenet_vitb16_liere64', pairs=PAIRS, range_scales=(1, 4),
                  n: int = 32, log=print):
  rows = []
  for scale in range_scales:
    a, g = largest(case, n, scale)
    for forward, backward in pairs:
      log(f'[{case} x{scale}] {forward} / {backward}')
      err, gerr = errors(a, g, forward, backward)
      rows.append(dict(case=case, range_scale=scale, forward=forward, backward=backward,
                       n_matrices=n, max_abs_err=err, grad_rel_err=gerr))
  return rows


def presets_table(rows) -> str:
  head = f"{'range':>5s} {'forward':18s} {'backward':18s} {'max err':>8s} {'grad rel':>8s}"
  return table(head, [f"{r['range_scale']:>4}x {r['forward']:18s} {r['backward']:18s} "
                      f"{fmt(r['max_abs_err'], '8.1e')} {fmt(r['grad_rel_err'], '8.1e')}"
                      for r in rows])
