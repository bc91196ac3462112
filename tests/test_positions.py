"""positions.py: grid_positions' values, entry by entry, in each mode on grids whose axes differ
(a mix-up of axes, order or scale shows), and its refusals. Every test here is marked `numerics`:
the numerics scope's selection for positions.py in the mutation runs (docs/mutation.md)."""
import itertools

import numpy as np
import pytest

from liere_jax.positions import grid_positions

pytestmark = pytest.mark.numerics


def _row_major(grid, step):
  """[prod(grid), n]: index (i, j, ...) * step, the last axis fastest."""
  return np.array([[i * s for i, s in zip(idx, step)]
                   for idx in itertools.product(*[range(n) for n in grid])])


@pytest.mark.parametrize('grid,train', [((3, 5), (4, 6)), ((2, 3, 4), (3, 5, 2))])
def test_each_mode_gives_the_index_times_its_step_row_major_in_float32(grid, train):
  span = [t - 1 for t in train]
  squeeze = [n - 1 for n in grid]
  cases = {
      ('normalized', 'normalized'): [1 / s for s in span],
      ('integer', 'normalized'): [1.] * len(grid),
      ('rescaled', 'normalized'): [1 / q for q in squeeze],  # always [0, 1]
      ('rescaled', 'integer'): [s / q for s, q in zip(span, squeeze)],  # [0, n_train - 1]
  }
  for (mode, base), step in cases.items():
    got = grid_positions(grid, train, mode, base)
    assert got.dtype == np.float32 and got.shape == (np.prod(grid), len(grid)), (mode, base)
    np.testing.assert_allclose(got, _row_major(grid, step), rtol=1e-6, err_msg=f'{mode} {base}')
  np.testing.assert_array_equal(grid_positions(grid, train, 'rescaled'),
                                grid_positions(grid, train, 'rescaled', 'normalized'))


def test_a_one_patch_axis_sits_at_zero_in_every_mode():
  for mode in ('normalized', 'integer', 'rescaled'):
    np.testing.assert_array_equal(grid_positions((1, 2), (1, 3), mode)[:, 0], [0., 0.])


def test_an_unknown_mode_or_a_grid_of_other_dimensions_is_refused_naming_both():
  with pytest.raises(ValueError, match=r"positions='nomalized' is unknown; use one of"):
    grid_positions((2, 2), (2, 2), 'nomalized')
  with pytest.raises(ValueError, match=r'3D patch grid \(2, 2, 2\) .* 2D grids \(4, 4\); set '
                     r'model.patch to 3 entries'):
    grid_positions((2, 2, 2), (4, 4), 'normalized')
