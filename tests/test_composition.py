"""Compositions 'a+b' (liere_jax.encodings.base.Composition): a rotary encoding rotates q and k,
then a lift (PaPE, PaPE-RI) widens them; each part as alone, the names refused in one line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import forward, pe_params_around_two_steps, tiny_model
from liere_jax import attention, encodings
from liere_jax.bench import plan as bench_plan
from liere_jax.configs import arrows
from liere_jax.model import create_encoding
from liere_jax.numerics import plan
from liere_jax.positions import grid_positions, with_prefix

H, HEAD, GRID = 2, 16, (4, 4)
HI = jax.lax.Precision.HIGHEST


def _encoding(pe, positions=None, **options):
  if positions:
    options['positions'] = positions
  return create_encoding(pe, grid=GRID, heads=H, head_dim=HEAD, depth=2, num_prefix=1,
                         rngs=nnx.Rngs(0), **options)


def _positions(mode, shift=0.):
  return with_prefix(grid_positions(GRID, GRID, mode) + shift, 1)


def _qk(t, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(keys[0], (2, t, H * HEAD))
  q, k = (jax.random.normal(key, (2, t, H, HEAD)) for key in keys[1:])
  return x, q, k


def _scores(q, k):
  return jnp.einsum('bqhd,bkhd->bhqk', q, k, precision=HI)


@pytest.mark.parametrize('pe,rotary,lift', [('liere8+pape', 'liere8', 'pape'),
                                            ('rope_mixed+pape_ri', 'rope_mixed', 'pape_ri')])
def test_a_composition_is_its_rotary_part_then_its_lift_each_as_alone(pe, rotary, lift):
  """Built from one seed, the rotary part draws what the encoding alone draws; the lift reads
  its own (integer) positions, converted from the rotary's mode; the scores are the lift's of
  the rotated q and k."""
  enc, alone_rotary, alone_lift = _encoding(pe), _encoding(rotary), _encoding(lift)
  for name, value in nnx.to_pure_dict(nnx.state(enc.rotary, nnx.Param)).items():
    np.testing.assert_array_equal(value, getattr(alone_rotary, name)[...])
  nnx.update(alone_lift, nnx.state(enc.lift, nnx.Param))
  mode = encodings.facts(rotary).positions
  ctx = enc.layer(enc.context(_positions(mode)), 1)
  rot = alone_rotary.layer(alone_rotary.context(_positions(mode)), 1)
  lifted = alone_lift.layer(alone_lift.context(_positions('integer')), 1)
  x, q, k = _qk(1 + 16)
  q1, k1, _ = ctx.attend(q, k, plan('cpu'))
  q2, k2, _ = rot.attend(q, k, plan('cpu'))
  np.testing.assert_allclose(q1, q2, atol=1e-6)
  np.testing.assert_allclose(_scores(*ctx.lift(x, q1, k1)), _scores(*lifted.lift(x, q2, k2)),
                             atol=1e-5)
  assert not np.allclose(q1, q)  # It rotates.


def test_rope_mixed_plus_pape_is_relative_a_shift_of_every_position_leaves_its_scores():
  """Both parts are functions of p_i - p_j: their composition is too (LieRE's generators do
  not commute, so liere<b>+pape is not exactly)."""
  enc = _encoding('rope_mixed+pape')
  x, q, k = _qk(1 + 16, seed=1)

  def scores(shift):
    ctx = enc.layer(enc.context(_positions('integer', shift)), 0)  # CLS stays at 0.
    q1, k1, _ = ctx.attend(q, k, plan('cpu'))
    return np.asarray(_scores(*ctx.lift(x, q1, k1)))[..., 1:, 1:]  # Patches only (CLS at 0).

  base, moved = scores(0.), scores(np.array([2.5, -1.25], np.float32))
  np.testing.assert_allclose(moved, base, atol=2e-3 * np.abs(base).max())


@pytest.mark.parametrize('name,message', [
    ('abs+pape', r"model.pe.name='abs\+pape': a composition is a rotary encoding, then a lift"),
    ('pape+liere8', 'e.g. liere8\\+pape'),
    ('liere8+pape+pape', 'rotary: .*liere<b>.*; lift: pape, pape_ri'),
    ('liere8+liere8', 'a rotary encoding, then a lift'),
    ('liere100+pape', r"block size 100 must be in \[2, head_dim=16\].*In model.pe.name="
                      r"'liere100\+pape'"),
    ('liere+pape', "'liere' needs a block size"),
])
def test_what_is_not_a_rotary_encoding_then_a_lift_is_refused_in_one_line(name, message):
  with pytest.raises(ValueError, match=message) as err:
    tiny_model(pe=name, heads=2)
  assert '\n' not in str(err.value)


def test_the_parameters_options_and_label():
  model = tiny_model(pe='liere8+pape', parabolas=3, share='heads')
  params = nnx.to_pure_dict(nnx.state(model.pe, nnx.Param))
  assert jax.tree.map(jnp.shape, params) == {
      'rotary': {'generators': (2, 1, 2, 2, 28)}, 'lift': {'position': (2, 2, 2 * 3),
                                                           'ab': (2, 32, 2 * 2 * 3)}}
  assert model.spec.pe.positions == 'normalized'  # The rotary part's.
  assert encodings.facts('liere8+pape').option_names == (
      'share', 'init_scale', 'expm', 'expm_precision', 'parabolas')
  assert encodings.label('liere8+pape') == 'LieRE8+PaPE'
  with pytest.raises(ValueError, match='parabolas'):  # Read by neither part.
    tiny_model(pe='rope_mixed+pape_ri', parabolas=3)


@pytest.mark.parametrize('n_dims', [1, 2, 3])
def test_the_model_runs_in_1d_2d_and_3d_and_its_maps_path_agrees(n_dims):
  size = {1: 16, 2: 16, 3: 8}[n_dims]
  model = tiny_model(pe='liere8+pape', n_dims=n_dims, size=size, parabolas=4)
  x = jax.random.normal(jax.random.key(0), (2,) + (size,) * n_dims + (3,))
  logits = forward(model, x)
  assert logits.shape == (2, 5) and np.all(np.isfinite(logits))
  maps_logits, _ = forward(model, x, return_attention=True)
  np.testing.assert_allclose(maps_logits, logits, atol=1e-5)


def test_a_train_step_moves_both_parts():
  before, after, loss = pe_params_around_two_steps(pe='liere8+pape', parabolas=4)
  assert np.isfinite(loss)
  for part, leaf in (('rotary', 'generators'), ('lift', 'ab'), ('lift', 'position')):
    assert np.abs(after[part][leaf] - before[part][leaf]).max() > 0, (part, leaf)


def test_bench_plan_names_the_rotary_part_and_the_lift():
  out = bench_plan.plan_of(arrows.get_config('pe=liere8+pape'), 'cpu')
  assert out['exponential'].startswith('cond')  # The CPU plan's LieRE exponential.
  assert out['rotation'].endswith('then lifted by XLA (Lift)')
  ctx = encodings.Composed(encodings.Rotate(jnp.zeros((1, 17, 2, 8, 8))),
                           encodings.Lift(jnp.zeros((2, 17, 4)), jnp.zeros((32, 16))))
  assert attention.path(plan('cpu'), ctx, (2, 17, 2, 16)) == 'xla'
