"""expm's `fast` piece by piece, on tiny stacks (seconds: the mutation run's selection for
expm.py, docs/mutation.md): each Taylor scheme is exp's Taylor polynomial, each matrix gets the
fewest squarings that bring its bound under theta, and every form matches scipy in float64."""
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


@pytest.mark.parametrize('name,degree', [('TAYLOR12_PS', 12), ('TAYLOR12', 12), ('TAYLOR18', 18)])
def test_each_scheme_is_exp_s_taylor_polynomial_coefficient_by_coefficient(name, degree):
  # On the shift matrix J (ones above the diagonal), p(J) = sum_k c_k J^k: row 0 holds c_0..c_18,
  # each checked against 1/k! to float32's resolution (a published coefficient off in its 6th
  # digit, or a lost term, shows); nothing past the degree.
  taylor = getattr(expm_lib, name)
  shift = jnp.asarray(np.eye(19, k=1, dtype=np.float32))
  got = np.asarray(taylor.polynomial(taylor.powers(shift)), np.float64)[0]
  want = [1 / math.factorial(k) if k <= degree else 0. for k in range(19)]
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


def test_the_squarings_thresholds_are_the_published_float32_ones():
  assert (expm_lib.TAYLOR12_PS.theta, expm_lib.TAYLOR12.theta, expm_lib.TAYLOR18.theta) == (
      1.0, 1.461661507209034, 3.010066362817634)
  assert (expm_lib.TAYLOR12.products, expm_lib.TAYLOR18.products) == (4, 5)


@pytest.mark.parametrize('theta,cap', [(1.0, 24), (0.5, 24), (1.0, 3), (1.46, None)])
@pytest.mark.parametrize('name', ['TAYLOR12_PS', 'TAYLOR12'])
def test_each_matrix_gets_the_fewest_squarings_that_bring_its_bound_under_theta(name, theta, cap):
  # 5e7 > 2**24: past the cond form's cap; 1e12: a^4 overflows float32 (the bound falls back
  # to ||a||_1, here the same); no cap (fast_loop): every matrix its own count.
  angles = [0., 0.3, 0.9, 1.5, 3.0, 100., 5e7, 1e12]
  a = jnp.asarray(_planes(angles))
  s = expm_lib._squarings(getattr(expm_lib, name).powers(a), theta, cap)
  want = []
  for t in angles:
    n = 0
    while t / 2**n > theta and (cap is None or n < cap):
      n += 1
    want.append(n)
  assert s.dtype == jnp.int32 and s.tolist() == want, (s, want)


def test_a_non_finite_matrix_gets_no_squarings():
  # fast_loop's trip count: a NaN or infinite bound must not become a huge or endless loop.
  a = jnp.asarray(_planes([1.0, np.nan, np.inf, 4.0]))
  s = expm_lib._squarings(expm_lib.TAYLOR12.powers(a), expm_lib.TAYLOR12.theta)
  assert s.tolist() == [0, 0, 0, 2], s


@pytest.mark.parametrize('form', ['loop', 'cond', 'select'])
def test_each_form_matches_scipy_on_small_and_large_matrices(form, block=5):
  # Small radii alone (no squaring at all), then a stack from 0.05 to 40: `loop` and `cond`
  # scale the whole piece by its largest, `select` each matrix by its own. One shape: one
  # compile.
  for radii in ([0.05, 0.1, 0.2, 0.3], [0.05, 0.7, 3.0, 40.0]):
    a = np.concatenate([_skew(i, block, r)[:1] for i, r in enumerate(radii)])
    got = np.asarray(expm_lib.fast_expm(jnp.asarray(a, jnp.float32), form=form))
    want = np.stack([scipy.linalg.expm(m) for m in a])
    np.testing.assert_allclose(got, want, atol=2e-6 * max(1, math.sqrt(max(radii))), rtol=0)
