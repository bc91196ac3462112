"""Token positions for 1D, 2D and 3D patch grids.

Positions are in the input's axis order ((row, col) for images, (time, row, col) for video),
row-major like the patch flattening. Three modes:
  normalized: i / (n_train - 1) per axis, the training grid spans [0, 1] and a larger grid keeps
              the spacing (positions beyond 1); the official LieRE code and paper Sec. 5.6.
  integer:    i, the patch index (naver-ai/rope-vit RoPE-Mixed / RoPE-Axial, ALiBi).
  rescaled:   i / (n - 1) on the current grid, always [0, 1] (the interpolation idea).
"""
from typing import Sequence

import jax.numpy as jnp
import numpy as np

MODES = ('normalized', 'integer', 'rescaled')


def grid_positions(grid: Sequence[int], train_grid: Sequence[int], mode: str) -> np.ndarray:
  """Patch positions: [prod(grid), len(grid)] float32, row-major over `grid`."""
  if mode not in MODES:
    raise ValueError(f'positions={mode!r} is unknown; use one of {MODES}.')
  if len(grid) != len(train_grid):
    raise ValueError(
        f'The input has a {len(grid)}D patch grid {tuple(grid)} but the model was built for '
        f'{len(train_grid)}D grids {tuple(train_grid)}; set model.patch to {len(grid)} entries.')
  axes = []
  for n, n_train in zip(grid, train_grid):
    i = np.arange(n, dtype=np.float64)
    if mode == 'normalized':
      i = i / max(n_train - 1, 1)
    elif mode == 'rescaled':
      i = i / max(n - 1, 1)
    axes.append(i)
  mesh = np.meshgrid(*axes, indexing='ij')
  return np.stack([m.reshape(-1) for m in mesh], axis=-1).astype(np.float32)


def with_prefix(positions: np.ndarray, num_prefix: int) -> jnp.ndarray:
  """Prepends `num_prefix` zero positions (CLS): [T, n] with T = num_prefix + patches.

  A zero position gets the identity rotation in every rotary encoding.
  """
  zeros = np.zeros((num_prefix, positions.shape[-1]), np.float32)
  return jnp.asarray(np.concatenate([zeros, positions], axis=0))
