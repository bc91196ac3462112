"""Token positions for 1D, 2D and 3D patch grids.

Positions are in the input's axis order ((row, col) for images, (time, row, col) for video),
row-major like the patch flattening. Three modes:
  normalized: i / (n_train - 1) per axis, the training grid spans [0, 1] and a larger grid keeps
              the spacing (positions beyond 1); the official LieRE code and paper Sec. 5.6.
  integer:    i, the patch index (naver-ai/rope-vit RoPE-Mixed / RoPE-Axial, ALiBi).
  rescaled:   the current grid squeezed into the training grid's span in the model's own mode
              (`base`): i / (n - 1) for normalized (always [0, 1]), i (n_train - 1) / (n - 1)
              for integer (always [0, n_train - 1]); the interpolation idea.
Training may jitter the patch positions (`model.pe.jitter`, ComRoPE's perturbation): offsets in
patch units, scaled like the indices.
"""
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

MODES = ('normalized', 'integer', 'rescaled')


def grid_positions(grid: Sequence[int], train_grid: Sequence[int], mode: str,
                   base: str = 'normalized') -> np.ndarray:
  """Patch positions: [prod(grid), len(grid)] float32, row-major over `grid`."""
  if mode not in MODES:
    raise ValueError(f'positions={mode!r} is unknown; use one of {MODES}.')
  if len(grid) != len(train_grid):
    raise ValueError(
        f'The input has a {len(grid)}D patch grid {tuple(grid)} but the model was built for '
        f'{len(train_grid)}D grids {tuple(train_grid)}; set model.patch to {len(grid)} entries.')
  step = patch_step(grid, train_grid, mode, base)
  mesh = np.meshgrid(*[np.arange(n) * s for n, s in zip(grid, step)], indexing='ij')
  return np.stack([m.reshape(-1) for m in mesh], axis=-1).astype(np.float32)


def patch_step(grid: Sequence[int], train_grid: Sequence[int], mode: str,
               base: str = 'normalized') -> np.ndarray:
  """The distance between neighbouring patches along each axis in a position mode: [n]
  (`base`: the model's own mode, which sets the span that 'rescaled' squeezes into)."""
  train_span = np.maximum(np.asarray(train_grid, np.float64) - 1, 1)
  if mode == 'normalized':
    return 1 / train_span
  if mode == 'rescaled':
    return (train_span if base == 'integer' else 1) / np.maximum(np.asarray(grid) - 1., 1)
  return np.ones(len(grid))


def jitter(key, grid: Sequence[int], intensity: float) -> jnp.ndarray:
  """ComRoPE's training perturbation, in patch units: clip(N(0, 1) * intensity / 2, -1/2,
  1/2) per patch and axis, [prod(grid), n]; one draw shared by the batch, as theirs. The time
  axis of a 3D grid is not perturbed (as theirs)."""
  noise = jnp.clip(jax.random.normal(key, (int(np.prod(grid)), len(grid))) * intensity / 2,
                   -0.5, 0.5)
  return noise.at[:, 0].set(0.) if len(grid) == 3 else noise


def with_prefix(positions, num_prefix: int):
  """Prepends `num_prefix` zero positions (CLS): [T, n] with T = num_prefix + patches.

  A zero position gets the identity rotation in every rotary encoding. Numpy positions stay
  numpy (known at trace time: LieRE's lattice path reads them).
  """
  xp = np if isinstance(positions, np.ndarray) else jnp
  zeros = xp.zeros((num_prefix, positions.shape[-1]), xp.float32)
  return xp.concatenate([zeros, xp.asarray(positions, xp.float32)], axis=0)
