"""Every option a config accepts changes what it says (issue 31).

OPTION_TESTS maps each field of the model, data, optimizer and loop sections (the config
builders in liere_jax/config_lib.py) to the tests that show its behaviour; a field without an
entry fails `test_every_config_field_has_a_behaviour_test`. The tests here are the sharp ones
that no other module had: init_scale sets the generators' range, each expm method is the one
called and agrees with the others, `fast` takes the fewest squarings that bring the scaled
spectral radius under its Taylor polynomial's theta, `rotate` applies R (not R^T), and timm
RandAugment clips its drawn magnitude at both ends.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import encodings, expm as expm_lib, rotations
from liere_jax import spec as spec_lib
from liere_jax.data import randaugment
from liere_jax.positions import grid_positions
from tests.helpers import tiny_model_config


def _liere(seed=0, **pe):
  spec = spec_lib.resolve(tiny_model_config('liere8', **pe))
  return encodings.build(spec, rngs=nnx.Rngs(seed)), spec


@pytest.mark.parametrize('init_scale', [0.25, 2 * math.pi, 20.0])
def test_init_scale_sets_the_range_of_the_liere_generators(init_scale):
  """Generators ~ U[0, 1) * init_scale: they fill [0, init_scale) and nothing past it."""
  enc, _ = _liere(init_scale=init_scale)
  g = np.asarray(enc.generators[...])
  assert g.size >= 200  # 2 layers x 2 heads x 2 axes x 2 blocks x 28 entries.
  assert g.min() >= 0 and g.max() < init_scale
  assert g.max() > 0.9 * init_scale and g.min() < 0.1 * init_scale
  assert abs(g.mean() / init_scale - 0.5) < 0.05


def test_each_expm_method_is_the_one_called_and_agrees_with_the_others(monkeypatch):
  """model.pe.expm reaches the exponential: a spy on the one rotations.py calls records the
  method of each config; rotations and their gradients agree across the methods."""
  called = []
  real = rotations.expm

  def spy(a, method='fast', *args, **kwargs):
    called.append(method)
    return real(a, method, *args, **kwargs)
  monkeypatch.setattr(rotations, 'expm', spy)
  pos = grid_positions((3, 3), (3, 3), 'normalized')
  results = {}
  for method in expm_lib.METHODS:
    enc, spec = _liere(expm=method)
    assert spec.pe.expm == method
    graphdef, state = nnx.split(enc)

    @jax.jit
    def rot_and_grad(state):
      def loss(state):
        rot = nnx.merge(graphdef, state).context(pos, 0).rot
        return jnp.sum(jnp.sin(rot)), rot
      return jax.grad(loss, has_aux=True)(state)
    called.clear()
    grad, rot = rot_and_grad(state)
    assert called and set(called) == {method}, (method, called)
    results[method] = np.asarray(rot), np.asarray(grad['generators'][...])
  ref_rot, ref_grad = results['scipy']
  for method, (rot, grad) in results.items():
    np.testing.assert_allclose(rot, ref_rot, atol=2e-5, err_msg=method)
    np.testing.assert_allclose(grad, ref_grad, atol=2e-4, rtol=1e-4, err_msg=method)


@pytest.mark.parametrize('angle', [0.6, 1.99, 5.0, 100.0])
def test_fast_takes_the_fewest_squarings_that_bring_the_radius_under_theta(angle):
  """`fast` evaluates its Taylor polynomial at A / 2^s with s the fewest squarings that bring
  the scaled spectral radius under theta = 1 (one squaring fewer is numerically harmless in
  float32, ~3x the error at the boundary, issue 31: so count what the polynomial sees). A
  rotation generator (angle t in each 2 x 2 plane) has rho = t exactly."""
  b = 4
  a = np.zeros((3, b, b), np.float32)
  for i in range(0, b, 2):
    a[:, i, i + 1], a[:, i + 1, i] = angle, -angle
  a[1] *= 0.5
  seen = []

  def polynomial(x):
    jax.debug.callback(lambda v: seen.append(float(v)), jnp.max(jnp.abs(x[1])))
    return expm_lib.TAYLOR12.polynomial(x)
  taylor = expm_lib.TAYLOR12._replace(polynomial=polynomial)
  r = np.asarray(jax.block_until_ready(expm_lib.fast_expm(jnp.asarray(a), taylor)))
  s = max(0, math.ceil(math.log2(angle / expm_lib.TAYLOR12.theta)))
  assert seen and max(seen) == pytest.approx(angle / 2**s, rel=1e-6), (seen, s)
  assert int(expm_lib.squarings(jnp.asarray(a))) == s
  c, sn = np.cos(np.float64(a[0, 0, 1])), np.sin(np.float64(a[0, 0, 1]))
  np.testing.assert_allclose(r[0, :2, :2], [[c, sn], [-sn, c]], atol=1e-6 * max(1, angle))


@pytest.mark.parametrize('block', [2, 4])
def test_rotate_applies_r_to_each_block_of_each_token(block):
  """x' = R x per block (not R^T x): a quarter turn takes e_1 to e_2 in the plane (0, 1), and
  a random orthogonal R gives numpy's R @ x, head by head and token by token."""
  quarter = rotations.angle_rotations(jnp.full((1, 1, 1), np.pi / 2))  # [H, T, k] -> 2 x 2
  x = jnp.asarray([[[[1.0, 0.0]]]])  # [B, T, H, d]
  np.testing.assert_allclose(rotations.rotate(x, quarter), [[[[0.0, 1.0]]]], atol=1e-7)
  rng = np.random.default_rng(0)
  heads, tokens, k = 2, 3, 2
  q = np.linalg.qr(rng.normal(size=(heads, tokens, k, block, block)))[0].astype(np.float32)
  x = rng.normal(size=(2, tokens, heads, k * block + 1)).astype(np.float32)  # 1 dim unrotated
  out = np.asarray(rotations.rotate(jnp.asarray(x), jnp.asarray(q)))
  xr = x[..., :k * block].reshape(2, tokens, heads, k, block)
  want = np.einsum('htkij,bthkj->bthki', q, xr).reshape(2, tokens, heads, k * block)
  np.testing.assert_allclose(out[..., :-1], want, atol=1e-5)
  np.testing.assert_array_equal(out[..., -1], x[..., -1])


@pytest.mark.parametrize('magnitude,end', [(10, 10.0), (0, 0.0)])
def test_timm_magnitudes_past_either_end_are_clipped_to_it(magnitude, end):
  """mstd 3 around m = 10 (or 0) draws past the end about half the time: each lands on the end
  itself, as timm's clip to [0, 10]; the op's argument follows (rotate: 3 degrees per level)."""
  plans = [randaugment.sample_timm_ops(np.random.default_rng(s),
                                       f'rand-m{magnitude}-n4-mstd3-p1') for s in range(300)]
  drawn = [(name, m, arg) for plan in plans for name, m, arg in plan]
  magnitudes = np.array([m for _, m, _ in drawn])
  assert magnitudes.min() >= 0 and magnitudes.max() <= 10
  assert 0.35 < np.mean(magnitudes == end) < 0.65
  assert np.any(magnitudes != end)
  for name, m, arg in drawn:
    if name == 'rotate':
      assert abs(arg) == pytest.approx(3 * m) and abs(arg) <= 30
