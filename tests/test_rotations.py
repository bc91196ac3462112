"""The exponential and the rotations: orthogonality, float64 agreement, gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import rotations
from liere_jax.expm import expm
from liere_jax.positions import grid_positions

BLOCKS = (2, 3, 4, 8, 16, 32, 48, 64)


def _coeffs(block, seed=0):
  """Generator combinations at positions up to 4x the training range ([0, 1] -> [0, 4]).

  Realistic LieRE: 2D, U[0, 2 pi) init, 64 head dims, a 33x33 grid evaluated on an 8x8
  training grid (normalized positions reach 4 per axis).
  """
  rng = np.random.default_rng(seed)
  gens = rng.uniform(0, 2 * np.pi, (1, 1, 2, 64 // block, rotations.num_free(block)))
  pos = grid_positions((33, 33), (9, 9), 'normalized')[::37]  # 30 positions incl. (4, 4)
  pos = np.concatenate([pos, [[4., 4.]]]).astype(np.float32)
  return np.einsum('tn,lhnkf->lhtkf', pos, gens).astype(np.float32)


@pytest.mark.parametrize('block', BLOCKS)
def test_rotations_orthogonal_and_match_float64(block):
  # jax.scipy.linalg.expm in float32 itself reaches 1.4e-5 at b=32 here: the bench reports it.
  a = np.asarray(rotations.skew(jnp.asarray(_coeffs(block)), block))
  r = np.asarray(expm(jnp.asarray(a)))
  eye = np.eye(block)
  orth = np.abs(np.einsum('...ji,...jk->...ik', r, r) - eye).max()
  ref = np.stack([scipy.linalg.expm(x) for x in a.reshape(-1, block, block).astype(np.float64)])
  err = np.abs(r.reshape(ref.shape) - ref).max()
  assert orth <= 1e-5, f'b={block}: ||R^T R - I|| = {orth:.2e}'
  assert err <= 1e-5, f'b={block}: max |R - R_float64| = {err:.2e}'


def test_skew_uses_strict_upper_triangle():
  p = jnp.arange(1., 7.)
  a = np.asarray(rotations.skew(p, 4))
  np.testing.assert_array_equal(a, -a.T)
  np.testing.assert_array_equal(a[np.triu_indices(4, 1)], np.arange(1., 7.))


@pytest.mark.parametrize('block', [2, 8, 64])
def test_fast_gradient_matches_float64(block):
  """d/dc sum(expm(skew(c)) * G) against SciPy's float64 Frechet derivative.

  The gradient of sum(exp(A) * G) in A is L(A^T, G); the raw parameters c feed the strict
  upper triangle with + and the lower with -. (jax.scipy.linalg.expm's own gradient is off by
  1.5% at angle 30 even in float64, so it is not the reference.)
  """
  rng = np.random.default_rng(1)
  c = _coeffs(block, seed=1)
  g = rng.normal(size=c.shape[:-1] + (block, block))
  fast = jax.grad(lambda c: jnp.sum(expm(rotations.skew(c, block)) * g))(jnp.asarray(c))
  a = np.asarray(rotations.skew(jnp.asarray(c, jnp.float32), block), np.float64)
  a, gf = a.reshape(-1, block, block), g.reshape(-1, block, block)
  grad_a = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                     for x, y in zip(a, gf)])
  rows, cols = np.triu_indices(block, 1)
  ref = (grad_a[:, rows, cols] - grad_a[:, cols, rows]).reshape(c.shape)
  rel = np.abs(np.asarray(fast) - ref).max() / np.abs(ref).max()
  assert rel <= 1e-4, f'b={block}: gradient relative error {rel:.2e}'


def test_identity_at_zero_and_many_chunks():
  a = jnp.zeros((70_000, 8, 8))  # several chunks of the fast path, padded at the end
  r = expm(a)
  assert r.shape == a.shape
  np.testing.assert_array_equal(np.asarray(r[-1]), np.eye(8))


def test_bad_method_names_the_fix():
  with pytest.raises(ValueError, match=r"method='pade'.*fast"):
    expm(jnp.zeros((1, 4, 4)), 'pade')


def test_fast_flops_counts_squarings_from_the_spectral_radius():
  from liere_jax.expm import fast_flops
  b = 8
  # A rotation generator by angle 5 in the (0, 1) plane: rho = 5 (its 1-norm is also 5), and
  # ||a^4||_1^(1/4) = 5 exactly -> ceil(log2 5) = 3 squarings, 7 + 3 products of 2 b^3 FLOPs.
  a = np.zeros((3, b, b), np.float32)
  a[:, 0, 1], a[:, 1, 0] = 5.0, -5.0
  assert fast_flops(a) == 3 * 10 * 2 * b**3
  # The all-ones skew matrix (upper +1, lower -1): ||a||_1 = 7, rho 5.03, bound 5.32.
  u = np.triu(np.ones((b, b), np.float32), 1)
  a = np.stack([u - u.T] * 2)
  rho = np.abs(np.linalg.eigvals(a[0].astype(np.float64))).max()
  bound = np.abs(np.linalg.matrix_power(a[0].astype(np.float64), 4)).sum(0).max() ** 0.25
  assert rho <= bound < 7
  assert fast_flops(a) == 2 * (7 + int(np.ceil(np.log2(bound)))) * 2 * b**3
  assert fast_flops(np.zeros((4, 2, 2), np.float32)) == 0  # closed form
