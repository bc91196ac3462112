"""Training end to end on the synthetic task: 8 devices equal 1, clear errors that write
nothing, NaN stops, eval's results.json; the run spec and the eval step's compiles. The
library's train_and_evaluate / evaluate_workdir run in this process (helpers.train_tiny,
helpers.evaluate); the command line where a process is the point (and tests/test_cli.py for
its refusals). Exact resume after SIGTERM and SIGKILL, and 2 processes equal to 1:
tests/test_gcs.py, in a bucket."""
import dataclasses
import json
import os
import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from liere_jax import checkpoint, data, evaluation, steps
from liere_jax.config import unknown_override
from liere_jax.config import run as run_spec
from liere_jax.data import transform
import liere_jax.configs
from tests import helpers
from tests.helpers import copy_run, evaluate, load_config
from tests.helpers import tiny_config, train_tiny
from tests.helpers import assert_training_randomness_is_a_function_of_seed_and_step
from tests.helpers import tiny_config_and_batch, tiny_run_spec


def assert_trees(a, b, exact=True, atol=0.0):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    if exact:
      assert np.array_equal(x, y), f'{jax.tree_util.keystr(path)} differs'
    else:
      np.testing.assert_allclose(x, y, atol=atol, rtol=atol, err_msg=jax.tree_util.keystr(path))


def test_uint8_batches_normalised_on_the_device_give_the_host_step():
  cfg, batch = tiny_config_and_batch(8)
  pixels = np.random.default_rng(1).integers(0, 256, batch['image'].shape, dtype=np.uint8)
  results = []
  for normalise in ('host', 'device'):
    cfg.data.normalise = normalise
    trainer = helpers.trainer(cfg, jax.devices()[:1])
    scale, offset = transform.normalisation(trainer.run.data)
    images = pixels if normalise == 'device' else pixels.astype(np.float32) * scale + offset
    state, metrics = trainer.train_step(trainer.init_state(0),
                                        trainer.global_batch(dict(batch, image=images)))
    results.append((jax.device_get(state['params']), float(metrics['loss'])))
  assert abs(results[0][1] - results[1][1]) < 1e-6
  assert_trees(results[0][0], results[1][0], exact=False, atol=1e-6)


def test_eight_devices_equal_one_device_step():
  cfg, batch = tiny_config_and_batch(16)
  results = []
  for devices, sharding, model_parallel in [
      (jax.devices()[:1], 'data', 1), (jax.devices(), 'data', 1), (jax.devices(), 'fsdp', 1),
      (jax.devices(), 'fsdp', 2)]:
    cfg.sharding = sharding
    trainer = helpers.trainer(cfg, devices, model_parallel)
    state = trainer.init_state(0)
    for _ in range(2):
      state, metrics = trainer.train_step(state, trainer.global_batch(batch))
    results.append((jax.device_get(state['params']), float(metrics['loss'])))
  assert len(jax.devices()) == 8
  for p, loss in results[1:]:
    assert abs(loss - results[0][1]) < 1e-5
    assert_trees(results[0][0], p, exact=False, atol=1e-5)


def test_parameter_shardings_follow_their_metadata():
  cfg = load_config(liere_jax.configs.path('cifar100'), 'variant=Ti')  # width 192, 3 heads, MLP 768
  cfg.model.qkv_bias = True  # The paper config has none; its sharding is checked here.
  specs = {}
  for sharding, model_parallel in [('data', 1), ('fsdp', 1), ('fsdp', 2)]:
    cfg.sharding = sharding
    trainer = helpers.trainer(cfg, model_parallel=model_parallel)
    params = trainer.state_sharding['params']
    adam = trainer.state_sharding['opt_state'][0]
    block = params['blocks'][0]
    specs[sharding, model_parallel] = (
        block['mlp']['fc1']['kernel'].spec, block['attn']['qkv']['bias'].spec,
        block['norm1']['scale'].spec, params['pe']['generators'].spec,
        adam.mu['blocks'][0]['mlp']['fc1']['kernel'].spec)
  assert specs['data', 1] == (P(None, None), P(None), P(), P(), P(None, None))
  assert specs['fsdp', 1] == (P('data', None), P(None), P(), P(), P('data', None))
  # 4 x 2 mesh: the MLP hidden (768) and q|k|v (576) split over 'model', the width over 'data'.
  assert specs['fsdp', 2] == (P('data', 'model'), P('model'), P(), P(), P('data', 'model'))


def test_eval_writes_results_json(tiny_run, tmp_path):
  work = copy_run(tiny_run, tmp_path / 'run')
  returned = evaluate(work)
  res = json.loads((work / 'eval' / 'results.json').read_text())
  assert res == returned
  assert res['n_examples'] == 40  # num_eval=40 with batches of 16: nothing dropped
  lo, hi = res['top1_ci95']
  assert 0 <= lo <= res['top1'] <= hi <= 1
  assert res['shuffle_drop'] == pytest.approx(res['top1'] - res['shuffled_top1'])
  assert res['positions_modes'] == ['normalized', 'rescaled']
  assert set(res['resolutions']['60']) == {'normalized', 'rescaled'}
  assert res['step'] == 4 and (work / 'eval' / 'attention.png').stat().st_size > 0


@pytest.mark.parametrize('key,value,message', [
    ('model.input_size', (60, 60), 'expects'),
    ('model.pe.expm', 'pade', "model.pe.expm='pade' is unknown"),
    ('model.pe.name', 'liere128', 'block size 128'),
    ('lr', -1.0, 'lr=-1.0 must be a positive finite number'),
    ('sharding', 'tp', "sharding='tp' is unknown"),
    ('resolutions', (50,), '(50,) must be input sizes divisible by the patch'),
])
def test_bad_values_are_named_before_anything_is_compiled(key, value, message):
  cfg, _ = tiny_config_and_batch(16)
  *sections, field = key.split('.')
  section = cfg
  for name in sections:
    section = section[name]
  section[field] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    data.check_data(run_spec.resolve(cfg, 1))


def test_an_unknown_override_names_its_section_s_fields():
  cfg, _ = tiny_config_and_batch(16)
  assert "config.model has no field 'foo'; its fields are ['channels'" in (
      unknown_override(cfg, 'model.foo'))


def test_a_workdir_without_checkpoint_takes_a_corrected_config(tmp_path):
  # A start that fails after writing config.json (here: at the first step, NaN) leaves no
  # checkpoint; the rerun with another model is accepted.
  with pytest.raises(FloatingPointError):
    train_tiny(tmp_path, total_steps=2, lr=1e30, model__pe__name='abs')
  assert (tmp_path / 'config.json').exists()
  assert train_tiny(tmp_path, total_steps=2, checkpoint_every=2) is None
  assert checkpoint.read_config(str(tmp_path)).model.pe.name == 'liere8'


def _metrics(workdir):
  """A run's metrics lines in the order written (liere_jax.paths.read_metrics where the library
  has it: metrics/*.jsonl; before it, metrics.jsonl)."""
  try:
    from liere_jax.paths import read_metrics
  except ImportError:
    return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return read_metrics(workdir)


def test_resume_takes_a_new_execution_and_new_cadences_and_refuses_a_different_model(
    tiny_run, tmp_path, capsys):
  work = copy_run(tiny_run, tmp_path / 'run')
  before = sorted(os.listdir(work / 'checkpoints'))
  config_before = (work / 'config.json').read_text()
  for key, value in (('model.pe.name', 'abs'), ('model.width', 64)):
    with pytest.raises(checkpoint.CheckpointError,
                       match=re.escape(f'holds a run of a different model ({key}')):
      train_tiny(work, total_steps=6, **{key: value})
    assert sorted(os.listdir(work / 'checkpoints')) == before
    assert (work / 'config.json').read_text() == config_before
  # How the same parameter tree is computed is not the model: these resume and evaluate.
  same_tree = dict(model__remat='block', model__scan_layers=True, model__dtype='bfloat16')
  # So are the loop's cadences: from step 4 to 7, log_every=2 logs steps 6 and 7 (the last),
  # eval_every=3 evaluates at 6 and 7, checkpoint_every=2 saves 6 and 7, keep=2 keeps those.
  capsys.readouterr()
  assert train_tiny(work, total_steps=7, checkpoint_every=2, keep=2, log_every=2, eval_every=3,
                    **same_tree) is None
  assert 'Resumed from step 4.' in capsys.readouterr().out
  lines = _metrics(work)
  assert [m['step'] for m in lines if m['step'] > 4 and 'loss' in m] == [6, 7]
  assert [m['step'] for m in lines if m['step'] > 4 and 'eval_accuracy' in m] == [6, 7]
  assert sorted(int(s) for s in os.listdir(work / 'checkpoints')) == [6, 7]
  evaluate(work, tiny_config(resolutions=(), data__num_eval=16, **same_tree))
  assert json.loads((work / 'eval' / 'results.json').read_text())['step'] == 7


def test_non_finite_state_stops_and_keeps_the_last_good_checkpoint(tiny_run, tmp_path):
  work = copy_run(tiny_run, tmp_path / 'run')
  with pytest.raises(FloatingPointError, match=r'at step 5; stopping. The last good checkpoint '
                     r'\(step 4\)'):  # Resumes at step 4, then blows up.
    train_tiny(work, total_steps=8, checkpoint_every=1, log_every=1, lr=1e30)
  config, p, step = checkpoint.load_params(str(work))
  assert step == 4 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(p))
  # "Good" means the checkpoint's own parameters give a finite loss on its step's batch.
  trainer = helpers.trainer(config, jax.devices()[:1])
  batch = next(data.to_iterator(data.train_dataset(trainer.run.data, global_batch_size=16, seed=0),
                                start=3))  # Step s trains on batch s - 1.
  assert np.isfinite(float(trainer.loss_step(p, trainer.global_batch(batch))))


def test_dropout_changes_the_step_and_its_masks_are_a_function_of_seed_and_step():
  """...the same for the same (seed, step) from a new Trainer too, as after a resume."""
  assert_training_randomness_is_a_function_of_seed_and_step(
      lambda cfg, on: cfg.model.update(dropout=0.5 if on else 0.0), resumed=True)


def test_the_eval_step_compiles_once_per_grid_whatever_the_position_mode():
  trainer = steps.Trainer(tiny_run_spec('liere8'), steps.make_mesh(jax.devices()[:1]))
  params = trainer.init_state(0)['params']
  accuracies = [evaluation.evaluate(trainer, params, positions=mode).top1
                for mode in (None, 'normalized', 'rescaled')]
  assert accuracies[0] == accuracies[1]
  # The mode only changes the context (the rotations); the step takes it as an input.
  assert trainer._pe_context.jitted._cache_size() == 3
  assert trainer.eval_step.jitted._cache_size() == 1


@pytest.mark.parametrize('pe,modes', [('abs', ('integer',)), ('none', ('integer',)),
                                      ('rope_mixed', ('integer', 'rescaled')),
                                      ('liere8', ('normalized', 'rescaled'))])
def test_other_sizes_are_evaluated_in_the_modes_the_encoding_reads(pe, modes):
  spec = tiny_run_spec(pe)
  assert spec.evaluation.positions_modes == modes
  if pe != 'abs':
    return
  trainer = steps.Trainer(spec, steps.make_mesh(jax.devices()[:1]))
  _, results = evaluation.evaluate_run(trainer, trainer.init_state(0)['params'])
  assert results['positions_modes'] == ['integer']
  assert list(results['resolutions']) == ['60'] and list(results['resolutions']['60']) == [
      'integer']


def test_the_run_spec_is_resolved_once_and_names_a_bad_field():
  cfg, _ = tiny_config_and_batch(8)
  run = run_spec.resolve(cfg, 8)
  assert (run.optimizer.lr, run.optimizer.decay_steps, run.loop.batch_size) == (1e-3, 300, 128)
  assert run.model.width == 32 and run.data.grid == 4 and run.evaluation.resolutions == (168,)
  # It keeps the config it came from (config.json), which resolves to it again.
  assert run.to_config().to_dict() == cfg.to_dict() and run_spec.resolve(run.to_config(), 8) == run
  old = cfg.to_dict()  # A config.json written before model_parallel and model_init existed.
  for key in ('model_parallel', 'model_init', 'model_init_head', 'resolutions'):
    del old[key]
  assert run_spec.resolve(run_spec.upgrade(old), 1).loop.model_parallel == 1  # As read back.
  for key, value, message in (
      ('bach_size', 8, "--config.bach_size is not a field of a run; remove it (the fields"),
      ('batch_size', 100, "--config.batch_size=100 must be a positive multiple of the mesh's 8"),
      ('eval_every', -1, '--config.eval_every=-1 must be an integer >= 0'),
      ('model_init_head', 'new', "--config.model_init_head='new' is unknown; use one of")):
    with pytest.raises(ValueError, match='^' + re.escape(message)) as e:
      run_spec.resolve({**cfg.to_dict(), key: value}, 8)
    assert '\n' not in str(e.value)


def test_the_library_takes_a_run_spec_and_refuses_a_config_naming_the_resolve(tmp_path):
  from liere_jax import training
  cfg, _ = tiny_config_and_batch(8)
  mesh = steps.make_mesh(jax.devices()[:1])
  fix = re.escape('; resolve the config first: liere_jax.config.run.resolve(config, '
                  'jax.device_count()).') + '$'
  for call, what in ((lambda: steps.Trainer(cfg, mesh), 'Trainer takes a RunSpec'),
                     (lambda: steps.EvalSteps(cfg, mesh), 'EvalSteps takes a RunSpec'),
                     (lambda: steps.make_optimizer(cfg),
                      'make_optimizer takes an OptimizerSpec'),
                     (lambda: training.train_and_evaluate(cfg, str(tmp_path)),
                      'train_and_evaluate takes a RunSpec'),
                     (lambda: evaluation.evaluate_workdir(cfg, str(tmp_path)),
                      'evaluate_workdir takes a RunSpec')):
    with pytest.raises(TypeError, match='^' + what + ', not a ConfigDict' + fix):
      call()
  assert not os.listdir(tmp_path)
  # A run resolved for other devices than the mesh's: its batch checks do not hold there.
  with pytest.raises(ValueError, match=re.escape('resolved for 2 devices and the mesh has 1; '
                                                 'resolve it for the mesh: ')):
    steps.EvalSteps(run_spec.resolve(cfg, 2), mesh)
  # A spec made by hand has no config to store in a workdir.
  bare = dataclasses.replace(run_spec.resolve(cfg, 1), source=None)
  with pytest.raises(ValueError, match='not made by liere_jax.config.run.resolve'):
    bare.to_config()


@pytest.mark.parametrize('warmup', [0, 50])
def test_the_schedule_is_linear_warmup_then_cosine_to_zero(warmup):
  config = load_config('configs/arrows.py')
  config.warmup_steps = warmup
  _, schedule = steps.make_optimizer(run_spec.resolve(config, 1))
  lr, total = config.lr, config.total_steps
  for step in (0, 1, 25, warmup, 120, 299, total):
    if step < warmup:
      want = lr * step / warmup
    else:
      want = lr * 0.5 * (1 + np.cos(np.pi * (step - warmup) / (total - warmup)))
    assert float(schedule(step)) == pytest.approx(want, rel=1e-5, abs=1e-9), step


def test_evaluation_reads_batches_of_eval_batch_size(monkeypatch):
  sizes = []
  real = evaluation.data.eval_batches

  def spy(*args, global_batch_size, **kwargs):
    sizes.append(global_batch_size)
    return real(*args, global_batch_size=global_batch_size, **kwargs)
  monkeypatch.setattr(evaluation.data, 'eval_batches', spy)
  trainer = steps.Trainer(tiny_run_spec('liere8'), steps.make_mesh(jax.devices()[:1]))
  result = evaluation.evaluate(trainer, trainer.init_state(0)['params'])
  assert sizes == [8] and len(result.correct) == 24
