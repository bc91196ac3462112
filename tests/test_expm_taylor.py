"""expm's `fast` piece by piece, on tiny stacks (seconds: the mutation run's selection for
expm.py, docs/mutation.md): the degree-12 polynomial is the Taylor sum of exp, each matrix gets
the fewest squarings that bring its bound under theta, and both forms match scipy in float64."""
import math

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import expm as expm_lib


def _skew(seed, block, radius):
  """A stack of random skew-symmetric matrices [3, b, b], each scaled to spectral radius
  `radius` (float64)."""
  g = np.random.default_rng(seed).normal(size=(3, block, block))
  a = g - np.swapaxes(g, -1, -2)
  return a * (radius / np.abs(np.linalg.eigvals(a)).max(axis=-1))[:, None, None]


def _planes(angles, block=4):
  """Rotation generators [len(angles), b, b]: angle t in every 2 x 2 plane, so a^4 = t^4 I
  and the bound ||a^4||_1^(1/4) is t exactly."""
  a = np.zeros((len(angles), block, block), np.float32)
  for i in range(0, block, 2):
    a[:, i, i + 1], a[:, i + 1, i] = angles, -np.asarray(angles)
  return a


@pytest.mark.parametrize('radius', [1.0, 0.25])
def test_the_polynomial_is_exp_s_taylor_sum_to_degree_12_on_the_radii_it_is_used_at(radius):
  # theta = 1: the polynomial sees spectral radii up to 1, where its terms x^8..x^11 still
  # weigh 1/8!..1/11! (2.5e-5..2.5e-8): a coefficient off by one degree shows.
  x = _skew(0, 6, radius)
  taylor = expm_lib.TAYLOR12
  got = np.asarray(taylor.polynomial(taylor.powers(jnp.asarray(x, jnp.float32))))
  want, term = np.zeros_like(x), np.broadcast_to(np.eye(6), x.shape)
  for k in range(13):
    want = want + term
    term = term @ x / (k + 1)
  np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
  assert taylor.theta == 1.0


@pytest.mark.parametrize('theta,cap', [(1.0, 24), (0.5, 24), (1.0, 3)])
def test_each_matrix_gets_the_fewest_squarings_that_bring_its_bound_under_theta(theta, cap):
  angles = [0., 0.3, 0.9, 1.5, 3.0, 100., 5e7]  # 5e7 > 2**24: past the cap.
  a = jnp.asarray(_planes(angles))
  s = expm_lib._squarings(expm_lib.TAYLOR12.powers(a), theta, cap)
  want = []
  for t in angles:
    n = 0
    while t / 2**n > theta and n < cap:
      n += 1
    want.append(n)
  assert s.dtype == jnp.int32 and s.tolist() == want, (s, want)


@pytest.mark.parametrize('form', ['cond', 'select'])
def test_both_forms_match_scipy_on_small_and_large_matrices(form, block=5):
  # Small radii alone (no squaring at all), then a stack from 0.05 to 40: `cond` scales the
  # whole chunk by its largest, `select` each matrix by its own. One shape: one compile.
  for radii in ([0.05, 0.1, 0.2, 0.3], [0.05, 0.7, 3.0, 40.0]):
    a = np.concatenate([_skew(i, block, r)[:1] for i, r in enumerate(radii)])
    got = np.asarray(expm_lib.fast_expm(jnp.asarray(a, jnp.float32), form=form))
    want = np.stack([scipy.linalg.expm(m) for m in a])
    np.testing.assert_allclose(got, want, atol=2e-6 * max(1, math.sqrt(max(radii))), rtol=0)
