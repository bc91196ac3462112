"""Counted forward FLOPs of the fast exponential and of a model's LieRE rotations.

XLA's cost analysis counts the body of a loop once, so it undercounts the chunked exponential
(a `lax.map`) and its data-dependent squarings; these count them from the inputs instead.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np

from liere_jax import expm, lattice, numerics as numerics_lib, rotations
from liere_jax.taylor import TAYLORS

_NEWTON_SCHULZ = 2  # Products of the final orthogonalisation step.


def fast_flops(a, form: str = 'auto') -> int:
  """Forward FLOPs of XLA's exponential of a in `form` ('cond', 'loop', 'select'; 'auto': this
  backend's plan, liere_jax.numerics): per matrix the form's fixed products, the Newton-Schulz
  step's and the squarings ('loop', 'cond': its piece's, `expm.chunks`, padding included;
  'select': SELECT_CAP), 2 b^3 FLOPs each. 0 for b = 2 (closed form)."""
  a = jnp.asarray(a, jnp.float32)
  b = a.shape[-1]
  if b == 2 or a.size == 0:
    return 0
  numerics = numerics_lib.plan()
  form = numerics.expm if form == 'auto' else form
  fixed = TAYLORS[form].products + _NEWTON_SCHULZ
  if form == 'select':
    return (fixed + expm.SELECT_CAP) * (a.size // b**2) * 2 * b**3
  chunks = expm.chunks(a.reshape(-1, b, b), numerics.replace(expm=form))
  s = jax.jit(lambda c: jax.lax.map(lambda x: expm.squarings(x, form), c))(chunks)
  return int((fixed + np.asarray(s, np.int64)).sum()) * chunks.shape[1] * 2 * b**3


def liere_flops(generators, positions, block: int, n_devices: int = 1, lattice_ok: bool = True,
                form: str = 'auto'):
  """Forward FLOPs of rotations.liere_rotations in XLA's exponential: the exponentials (fast_flops)
  plus, on the lattice path, 2 b^3 per power product. Returns (per device, on one device): the
  largest device's share when split over n_devices as rotations.split_over_data splits them,
  and the whole on one device."""
  gens = np.asarray(generators, np.float32)
  plan = lattice.lattice_plan(positions) if lattice_ok and block > 2 else None
  a = np.asarray(rotations.liere_generators(gens, plan.primitives if plan else positions, block))
  groups, k = a.shape[0] * a.shape[1], a.shape[3]
  a = a.reshape(-1, block, block)
  per_group = 2 * block**3 * k * (plan.n_products if plan else 0)
  whole = fast_flops(a, form) + groups * per_group
  if n_devices == 1:
    return whole, whole
  share = -(-a.shape[0] // n_devices)
  largest = max(fast_flops(a[i:i + share], form) for i in range(0, a.shape[0], share))
  return largest + -(-groups // n_devices) * per_group, whole


def model_flops(spec, batch: int, train: bool = True) -> float:
  """FLOPs of the ViT's matrix products from its shapes (a ModelSpec): patch embedding, q/k/v,
  attention scores and values, output projection, MLP and head, 2 per multiply-add; a train
  step is 3x the forward (the backward pass is two products per forward one). What MFU counts
  (as in PaLM's appendix B, MaxText and big_vision): nothing for the position encoding, norms or
  softmax, so an encoding's extra work lowers the MFU. ViT-B/16 at 224: 35.1 GFLOP forward."""
  grid = math.prod(spec.train_grid)
  tokens = grid + spec.num_prefix
  d, m = spec.width, spec.mlp_dim
  block = 2 * tokens * d * (3 * d + d + 2 * m) + 2 * 2 * tokens * tokens * d
  embed = 2 * grid * math.prod(spec.patch) * spec.channels * d
  forward = embed + spec.depth * block + 2 * d * spec.num_classes
  return float(batch * forward * (3 if train else 1))
