"""Scale features: the exponentials split over the mesh, fused attention, bf16 rotations."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import param_tree, rotations
from liere_jax.numerics import plan
from liere_jax.config import model as model_spec
from liere_jax.expm import expm
from liere_jax.model import ViT
from tests import helpers
from tests.helpers import tiny_config_and_batch, tiny_model, tiny_model_config


def _mesh(n):
  return jax.make_mesh((n,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:n])


@pytest.mark.parametrize('n', [3, 8])
def test_split_over_data_computes_a_share_per_device_and_equals_one_device(n):
  a = jax.random.normal(jax.random.key(0), (2, 3, 17, 8, 8))
  a = a - jnp.swapaxes(a, -1, -2)
  g = jax.random.normal(jax.random.key(1), a.shape)
  shapes = []

  def fn(x):
    shapes.append(x.shape)
    return expm(x, plan())

  def loss(a):
    return jnp.sum(rotations.split_over_data(fn, a) * g)

  with jax.set_mesh(_mesh(n)):
    value, grad = jax.jit(jax.value_and_grad(loss))(a)
  ref_value, ref_grad = jax.value_and_grad(lambda a: jnp.sum(expm(a, plan()) * g))(a)
  assert np.prod(shapes[0][:-2]) == -(-2 * 3 * 17 // n)  # each device: 1/n of 102 matrices
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  np.testing.assert_allclose(grad, ref_grad, atol=1e-5)


@pytest.mark.parametrize('pe', ['liere8', 'alibi', 'rope_mixed'])
def test_fused_attention_equals_the_explicit_path(pe):
  model = tiny_model(pe=pe)
  model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  fused = model(x)
  explicit, weights = model(x, return_attention=True)
  assert len(weights) == 2 and weights[0].shape == (2, 2, 17, 17)
  np.testing.assert_allclose(fused, explicit, atol=2e-5, rtol=1e-5)


def test_bf16_rotations_apply_in_bf16_with_a_small_error():
  gen = jax.random.uniform(jax.random.key(0), (1, 3, 2, 8, 28)) * 2 * np.pi
  rot = rotations.liere_rotations(gen, jax.random.uniform(jax.random.key(1), (50, 2)) * 4, 8,
                                 plan())
  x = jax.random.normal(jax.random.key(2), (4, 50, 3, 64)).astype(jnp.bfloat16)
  out = rotations.rotate(x, rot[0], plan())
  ref = rotations.rotate(x.astype(jnp.float32), rot[0], plan())
  assert out.dtype == jnp.bfloat16
  rel = jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)
  assert 1e-4 < rel < 5e-3  # a bf16 rounding of R, not float32 and not worse


def test_bf16_model_runs_and_keeps_float32_rotations():
  cfg = tiny_model_config(pe='liere8')
  cfg.dtype = 'bfloat16'
  model = ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0))
  rotations_ = jax.tree.leaves(model.pe_context((4, 4)))
  assert rotations_ and all(r.dtype == jnp.float32 for r in rotations_)
  assert bool(jnp.all(jnp.isfinite(model(jnp.ones((1, 16, 16, 3))))))


def test_remat_per_block_gives_the_same_train_step_with_dropout():
  # With dropout the recomputed blocks must draw the same masks: the harder case of the two.
  cfg, batch = tiny_config_and_batch(8)
  cfg.model.dropout = 0.1
  steps, remats = [], []
  for remat in ('none', 'block'):
    cfg.model.remat = remat
    trainer = helpers.trainer(cfg, jax.devices()[:1])
    state = trainer.init_state(0)
    jaxpr = str(jax.make_jaxpr(trainer._train_step)(state, trainer.global_batch(batch)))
    remats.append(jaxpr.count('remat2['))
    steps.append(trainer.train_step(state, trainer.global_batch(batch)))
  assert remats[1] >= remats[0] + cfg.model.depth, remats
  for a, b in zip(jax.tree.leaves(steps[0]), jax.tree.leaves(steps[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"model.remat='layers' is unknown; use one of"):
    model_spec.resolve(dict(cfg.model.to_dict(), remat='layers'))


@pytest.mark.parametrize('pe,remat', [('liere8', 'none'), ('string_cayley', 'block')])
def test_scanned_blocks_give_the_loop_s_train_step_with_the_same_parameter_tree(pe, remat):
  cfg, batch = tiny_config_and_batch(8)
  cfg.model.update(depth=3, dropout=0.1, remat=remat)
  cfg.model.pe.name = pe
  steps, scans, inits = [], [], []
  for scan in (False, True):
    cfg.model.scan_layers = scan
    trainer = helpers.trainer(cfg, jax.devices()[:1])
    state = trainer.init_state(0)
    blocks = state['params']['blocks']  # Stacked under scan_layers: blocks/... [3, ...].
    assert sorted(blocks) == ([0, 1, 2] if not scan else ['attn', 'mlp', 'norm1', 'norm2'])
    assert not scan or blocks['attn']['qkv']['kernel'].shape[0] == 3
    inits.append(jax.device_get(param_tree.to_loop_params(state['params'])))
    jaxpr = str(jax.make_jaxpr(trainer._train_step)(state, trainer.global_batch(batch)))
    scans.append(len(re.findall(r'length=3\b', jaxpr)))  # Over the 3 layers (not a kernel's loop).
    for _ in range(2):  # The second step uses new dropout masks in both.
      state, metrics = trainer.train_step(state, trainer.global_batch(batch))
    steps.append((param_tree.to_loop_params(state['params']), metrics))
  assert scans[1] > scans[0] == 0
  assert jax.tree.structure(inits[0]) == jax.tree.structure(inits[1])
  for a, b in zip(jax.tree.leaves(inits[0]), jax.tree.leaves(inits[1])):
    np.testing.assert_array_equal(a, b)  # The same initial parameters.
  for a, b in zip(jax.tree.leaves(steps[0]), jax.tree.leaves(steps[1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('jitter', [0.0, 0.5])
def test_the_model_takes_the_lattice_path_unless_positions_are_jittered(jitter, monkeypatch):
  """The train step's grid positions are known at trace time, so LieRE's rotations take the
  lattice path; jittered training positions are not, and take the general path; evaluation
  (no jitter) takes the lattice path either way."""
  cfg, batch = tiny_config_and_batch(8)
  cfg.model.pe.name, cfg.model.pe.jitter = 'liere8', jitter
  calls, lattice = [], rotations._lattice_rotations
  monkeypatch.setattr(rotations, '_lattice_rotations',
                      lambda *a: calls.append(1) or lattice(*a))
  trainer = helpers.trainer(cfg, jax.devices()[:1])
  state = trainer.init_state(0)
  state, _ = trainer.train_step(state, trainer.global_batch(batch))  # donates its input
  assert len(calls) == (0 if jitter else 1)
  trainer.pe_context(state['params'], (4, 4))
  assert len(calls) == (1 if jitter else 2)
