"""Fine-tuning from a checkpoint (liere_jax/model_init.py, --config.model_init): from a workdir
(latest, :best, :STEP), a .safetensors export and an official LieRE .ckpt the parameters carry
over exactly, the optimizer state is fresh and the step 0; the absolute embedding is resized as
evaluation resizes it (same logits at the new grid); a head is reinitialised only when asked;
every other mismatch stops in one line before training writes anything (tests/test_cli.py: the
command line's refusal)."""
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import checkpoint, convert, model_init
from liere_jax.steps import make_optimizer
from liere_jax import param_tree
from liere_jax.config import run as run_spec
from liere_jax.config.model import resolve
from liere_jax.model import ViT
from tests import foreign_formats, helpers, official_fixtures
from tests.helpers import tiny_model_config, tiny_run_config


def _random_params(config, seed):
  """Every parameter drawn at random (the zero-initialised head too), with numpy."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32),
                      convert.abstract_params(resolve(config.model)))


def _save_run(workdir, config, steps, best_step=None):
  """A training workdir: {step: params} with a non-zero Adam state, the best at best_step."""
  checkpoint.write_config(workdir, config)
  tx, _ = make_optimizer(run_spec.resolve(config, 1))
  best = {best_step: steps[best_step]} if best_step else {}
  for name, kept in (('checkpoints', steps), ('best', best)):
    mngr = checkpoint.manager(workdir, name, best=name == 'best')
    for step, params in kept.items():
      state = {'params': params, 'step': np.int32(step),
               'opt_state': jax.tree.map(jnp.ones_like, tx.init(params))}
      checkpoint.save(mngr, step, state, {'step': step, 'data_position': step},
                      metrics={'accuracy': 1.0} if name == 'best' else None)
    mngr.wait_until_finished()
    mngr.close()
  return workdir


def _assert_equal(loaded, params, skip=()):
  want = convert.flatten(params)
  assert loaded.keys() == want.keys()
  for key, value in want.items():
    if key not in skip:
      np.testing.assert_array_equal(loaded[key], value, err_msg='/'.join(key))


def _run(config):
  """The RunSpec of `config` on one device: the test's edge."""
  return run_spec.resolve(config, 1)


def _fresh_start(config, loaded):
  trainer = helpers.trainer(config)
  return model_init.init_state(trainer, config.seed, loaded)


def test_workdir_latest_best_and_step_fresh_optimizer(tmp_path):
  config = tiny_run_config(pe='liere8', share='layers')
  steps = {1: _random_params(config, 1), 2: _random_params(config, 2)}
  run = _save_run(str(tmp_path / 'run'), config, steps, best_step=1)
  for suffix, step in (('', 2), (':1', 1), (':best', 1), (':2', 2)):
    _assert_equal(model_init.load(_run(config), run + suffix), steps[step])
  new = tiny_run_config(pe='liere8', share='layers', size=24)  # Another grid: LieRE carries over.
  loaded = model_init.load(_run(new), run)
  _assert_equal(loaded, steps[2])
  state = _fresh_start(new, loaded)
  assert int(state['step']) == 0
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(state['opt_state']))
  _assert_equal({k: np.asarray(v) for k, v in convert.flatten(state['params']).items()},
                steps[2])
  scanned = tiny_run_config(pe='liere8', share='layers', size=24)
  scanned.model.scan_layers = True  # Stacked blocks in the state; blocks/<i> in the checkpoint.
  state = _fresh_start(scanned, model_init.load(_run(scanned), run))
  _assert_equal({k: np.asarray(v) for k, v in convert.flatten(
      param_tree.to_loop_params(state['params'])).items()}, steps[2])
  with pytest.raises(FileNotFoundError, match=r'holds no checkpoint of step 3 \(it holds '
                     r'\[1, 2\]\)'):
    model_init.load(_run(config), run + ':3')


def test_safetensors_export(tmp_path):
  config = tiny_run_config(pe='rope_mixed', pool='mean')
  params = _random_params(config, 3)
  run = _save_run(str(tmp_path / 'run'), config, {4: params})
  out = str(tmp_path / 'model.safetensors')
  convert.export_torch(run, out)
  new = tiny_run_config(pe='rope_mixed', pool='mean', size=32)
  _assert_equal(model_init.load(_run(new), out), params)


def test_official_lightning_checkpoint(tmp_path):
  """An official LieRE8 checkpoint as Lightning writes it (the official keys and shapes of
  tests/fixtures/official, tests/foreign_formats.py), fine-tuned at another size and class
  count."""
  pytest.importorskip('torch')
  case = official_fixtures.load()['cases']['liere8_2d']  # 16 px, patch 4: a 4x4 grid.
  state = official_fixtures.state_dict(case['state_dict'], case['value_seed'], case['zeros'])
  _, official = convert.config_from_json(case['rope_vit_kwargs'], 'liere8_2d')
  params = convert.from_official_layout(state, official)
  path = str(tmp_path / 'epoch=199.ckpt')
  foreign_formats.write_lightning_checkpoint(path, state, epoch=199)
  # Fine-tune at 24 px (6x6) with 7 classes: the grid comes from the pos_embedding.
  new = tiny_run_config(num_classes=7, size=24, pe='liere8', share='layers', width=128, heads=2,
                        qkv_bias=False)
  new.model.mlp_dim = official.mlp_dim
  with pytest.raises(ValueError, match='head/bias has shape \\(5,\\) in the checkpoint and '
                     '\\(7,\\) in this model; set --config.model_init_head=reinit'):
    model_init.load(_run(new), path)
  new.model_init_head = 'reinit'
  loaded = model_init.load(_run(new), path)
  _assert_equal(loaded, params, skip=model_init.HEAD)
  assert all(loaded[k] is None for k in model_init.HEAD)
  head = convert.flatten(_fresh_start(new, loaded)['params'])
  assert head[('head', 'kernel')].shape == (128, 7) and not np.any(head[('head', 'kernel')])


def test_an_official_checkpoint_s_model_is_this_run_s_at_its_grid_and_classes_with_a_cls_token():
  """What the official checkpoint fixes (grid from its pos_embedding, classes from its head, CLS
  pooling) replaces this run's values, and what follows from them follows: the model a config
  with those values resolves to."""
  here = helpers.tiny_spec('liere8', pool='mean')  # 16 px, patch 4: a 4 x 4 grid.
  state = {'mlp_head.1.weight': np.zeros((7, 32)), 'pos_embedding': np.zeros((1, 1 + 36, 32))}
  there = tiny_model_config('liere8', pool='cls', size=24)
  there.num_classes = 7
  assert model_init._official_model(state, here) == resolve(there)


@pytest.mark.parametrize('pool', ['cls', 'mean'])
def test_abs_embedding_resized_as_evaluation_does(tmp_path, pool):
  config = tiny_run_config(pe='abs', size=32, pool=pool)  # 8x8 patches.
  params = _random_params(config, 5)
  run = _save_run(str(tmp_path / 'run'), config, {1: params})
  new = tiny_run_config(pe='abs', size=44, pool=pool)  # 11x11.
  loaded = model_init.load(_run(new), run)
  prefix = int(pool == 'cls')
  assert loaded[model_init.EMBEDDING].shape == (1, prefix + 121, 32)
  _assert_equal(loaded, params, skip=[model_init.EMBEDDING])
  # The new model at its own grid computes what the old one computes at that grid.
  tree = {**convert.flatten(params), model_init.EMBEDDING: loaded[model_init.EMBEDDING]}
  x = np.random.default_rng(0).normal(size=(2, 44, 44, 3)).astype(np.float32)
  np.testing.assert_allclose(_logits(new, convert.unflatten_like(params, tree), x),
                             _logits(config, params, x), atol=1e-6)


def _logits(config, params, x):
  model = ViT(resolve(config.model), rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  nnx.update(model, state)
  model.eval()
  return np.asarray(model(x))


@pytest.mark.parametrize('kw,head,message', [
    (dict(pe='abs'), 'load', r"model.pe.name='liere8', this run has 'abs'; set "
     r'--config.model.pe.name=liere8'),
    (dict(positions='integer'), 'load', r'model.pe.positions=.normalized.'),
    (dict(width=64), 'load', r'parameter blocks/0/attn/proj/bias has shape \(32,\) in the '
     r'checkpoint and \(64,\) in this model; .*set --config.model.width=32'),
    (dict(qkv_bias=False), 'load', r'parameter blocks/0/attn/qkv/bias has shape \(96,\) in the '
     r'checkpoint and none in this model; .*--config.model.qkv_bias=True'),
    (dict(share='all'), 'load', r'parameter pe/generators has shape \(2, 2, 2, 2, 28\) in the '
     r'checkpoint and \(1, 1, 2, 2, 28\) in this model; .*--config.model.pe.share=none'),
    (dict(num_classes=3), 'load', r'head/bias has shape \(5,\) in the checkpoint and \(3,\) in '
     r'this model; set --config.model_init_head=reinit'),
    (dict(), 'keep', r"model_init_head='keep' is unknown"),
])
def test_mismatch_is_one_line_naming_the_fix(tmp_path, kw, head, message):
  config = tiny_run_config(pe='liere8')
  run = _save_run(str(tmp_path / 'run'), config, {1: _random_params(config, 6)})
  new = tiny_run_config(**{'pe': 'liere8', **kw})
  new.model_init_head = head
  with pytest.raises(ValueError, match=message) as e:
    model_init.load(_run(new), run)
  assert '\n' not in str(e.value)


def _train(workdir, **overrides):
  """One step of the tiny run on the 5 x 5 grid, in this process (helpers.train)."""
  config = helpers.tiny_config('grid=5', **{
      **dict(batch_size=8, eval_batch_size=8, data__num_eval=8, total_steps=1, warmup_steps=0,
             resolutions=()), **overrides})
  assert helpers.train(config, workdir) is None


def test_training_fine_tunes_resumes_and_refuses_before_writing(tmp_path, capsys):
  source = helpers.tiny_config()  # The 4 x 4 grid.
  run = _save_run(str(tmp_path / 'base'), source, {3: _random_params(source, 7)})
  bad = str(tmp_path / 'bad')
  with pytest.raises(ValueError, match=re.escape(
      f'--config.model_init={run}: parameter blocks/0/attn/proj/bias has shape (32,) in the '
      'checkpoint and (64,) in this model;')):
    _train(bad, model_init=run, model__width=64)
  assert not os.path.exists(bad)
  work = str(tmp_path / 'ft')
  _train(work, model_init=run)
  assert f'Started from the parameters of {run}' in capsys.readouterr().out
  assert checkpoint.read_config(work).model_init == run
  _train(work, model_init=run, total_steps=2)
  out = capsys.readouterr().out
  assert 'Resumed from step 1.' in out and 'is ignored' in out, out
