"""Checkpoints: damaged ones are named in one line, set aside and skipped; the same-model check
compares the parameter tree only."""
import asyncio
import gc
import glob
import logging
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from flax import nnx

import liere_jax.configs
from liere_jax import checkpoint, checkpoint_damage
from liere_jax.config import load
from liere_jax.config.model import resolve
from liere_jax.model import ViT
from liere_jax.param_tree import to_loop_params
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARROWS = os.path.join(os.path.dirname(liere_jax.configs.__file__), 'arrows.py')
MODEL = {'width': 32, 'mlp_dim': 64}  # The arrows config in small.
LOOP = {'batch_size': 8, 'total_steps': 2, 'checkpoint_every': 2}


def _config(**model):
  config = load(ARROWS)
  config.model.update(MODEL)
  config.model.update(model)
  return config


def _state(step):
  """A small training state of the shape train.py saves: params, opt_state, step."""
  params = {'blocks': {0: {'kernel': jnp.full((8, 8), float(step))}},
            'head': {'kernel': jnp.full((8, 4), -float(step)), 'bias': jnp.zeros((4,))}}
  return {'params': params, 'opt_state': (jnp.asarray(step), {'mu': params}),
          'step': jnp.asarray(step)}


def _abstract(state):
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)


def _write_run(workdir, steps=(2, 4), best_step=None):
  checkpoint.write_config(str(workdir), _config())
  mngr = checkpoint.manager(str(workdir))
  for step in steps:
    checkpoint.save(mngr, step, _state(step), {'step': step, 'data_position': step})
  mngr.wait_until_finished()
  mngr.close()
  if best_step is not None:
    best = checkpoint.manager(str(workdir), 'best', best=True)
    checkpoint.save(best, best_step, _state(best_step), {'step': best_step},
                    metrics={'accuracy': 0.5})
    best.wait_until_finished()
    best.close()


def _tree(config):
  """{parameter path: shape} of the model of `config`."""
  model = nnx.eval_shape(lambda: ViT(resolve(config.model), rngs=nnx.Rngs(0)))
  params = to_loop_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  return {jax.tree_util.keystr(k): v.shape
          for k, v in jax.tree_util.tree_leaves_with_path(params)}


def _files(directory):
  return {os.path.relpath(p, directory): os.path.getsize(p)
          for p in glob.glob(os.path.join(directory, '**'), recursive=True) if os.path.isfile(p)}


def _truncate_arrays(step_dir):
  """Halves every array file of a checkpoint (a bad copy, a full disk)."""
  paths = [p for p in glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'), recursive=True)]
  assert paths
  for path in paths:
    os.truncate(path, os.path.getsize(path) // 2)
  return _files(step_dir)


def _damaged(directory, step):
  return glob.glob(os.path.join(directory, f'{step}{checkpoint.DAMAGED}*'))


def _warnings(caplog):
  return [r.getMessage() for r in caplog.records if 'cannot be read' in r.getMessage()]


def test_restore_sets_a_damaged_latest_aside_and_resumes_from_the_one_before(tmp_path, caplog):
  _write_run(tmp_path)
  ckpts = str(tmp_path / 'checkpoints')
  before = _truncate_arrays(os.path.join(ckpts, '4'))
  mngr = checkpoint.manager(str(tmp_path))
  with caplog.at_level(logging.WARNING):
    state, meta = checkpoint.restore(mngr, _abstract(_state(0)))
  assert meta['step'] == 2 and float(state['params']['head']['kernel'][0, 0]) == -2.0
  (line,) = _warnings(caplog)
  assert '\n' not in line and line.startswith('Checkpoint step 4 cannot be read: ')
  assert os.path.join(ckpts, '4', 'state', 'd') in line and 'using step 2' in line, line
  # Set aside whole, not deleted; the manager goes on without it.
  (aside,) = _damaged(ckpts, 4)
  assert _files(aside) == before and aside in line
  assert mngr.all_steps() == [2] and checkpoint.has_checkpoint(str(tmp_path))
  checkpoint.save(mngr, 4, _state(4), {'step': 4})  # The step is free again.
  mngr.wait_until_finished()
  mngr.close()
  assert checkpoint.load_params(str(tmp_path))[2] == 4


def test_a_step_another_process_cannot_read_is_set_aside_by_all(tmp_path, caplog, monkeypatch):
  """Processes resume from one step: step 4 reads here, but another process failed on it."""
  _write_run(tmp_path)
  ckpts = str(tmp_path / 'checkpoints')
  calls = []
  monkeypatch.setattr(checkpoint_damage, 'all_processes_agree',
                      lambda ok: calls.append(ok) or (ok and len(calls) > 1))
  mngr = checkpoint.manager(str(tmp_path))
  with caplog.at_level(logging.WARNING):
    _, meta = checkpoint.restore(mngr, _abstract(_state(0)))
  mngr.close()
  assert meta['step'] == 2 and calls == [True, True]
  (line,) = _warnings(caplog)
  assert 'step 4 cannot be read: another process could not read it' in line, line
  assert _damaged(ckpts, 4)


def test_all_processes_agree_across_two_processes():
  script = ('import sys, jax; from liere_jax import checkpoint_damage; i = int(sys.argv[2]); '
            'jax.distributed.initialize(sys.argv[1], 2, i); '
            'print(checkpoint_damage.all_processes_agree(i == 0), '
            'checkpoint_damage.all_processes_agree(True))')
  addr = f'127.0.0.1:{helpers.free_port()}'
  procs = [helpers.python(['-c', script, addr, str(i)], wait=False) for i in range(2)]
  try:
    outs = [p.communicate(timeout=120)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()  # A peer that hangs must not outlive the test.
  assert [out.strip().splitlines()[-1] for out in outs] == ['False True'] * 2, outs


def test_no_readable_checkpoint_stops_in_one_line_with_the_fix(tmp_path, caplog):
  _write_run(tmp_path)
  ckpts = str(tmp_path / 'checkpoints')
  for step in (2, 4):
    _truncate_arrays(os.path.join(ckpts, str(step)))
  mngr = checkpoint.manager(str(tmp_path))
  with caplog.at_level(logging.WARNING), pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.restore(mngr, _abstract(_state(0)))
  message = str(e.value)
  assert '\n' not in message and message.startswith(f'No readable checkpoint left in {ckpts}')
  assert 'start over from step 0' in message and 'new --workdir' in message
  assert len(_warnings(caplog)) == 2 and _damaged(ckpts, 2) and _damaged(ckpts, 4)
  assert not checkpoint.has_checkpoint(str(tmp_path))


def test_load_params_falls_back_from_a_damaged_latest(tmp_path, caplog):
  _write_run(tmp_path)
  ckpts = str(tmp_path / 'checkpoints')
  # Damaged metadata instead of arrays: the JSON file is named.
  with open(os.path.join(ckpts, '4', 'state', '_METADATA'), 'r+') as f:
    f.truncate(10)
  with caplog.at_level(logging.WARNING):
    config, params, step = checkpoint.load_params(str(tmp_path))
  assert step == 2 and float(params['blocks'][0]['kernel'][0, 0]) == 2.0
  assert config.model.width == 32
  (line,) = _warnings(caplog)
  assert os.path.join(ckpts, '4', 'state', '_METADATA') + ': invalid JSON' in line, line
  assert _damaged(ckpts, 4)


def test_a_damaged_best_checkpoint_names_the_fix(tmp_path, caplog):
  _write_run(tmp_path, best_step=4)
  best = str(tmp_path / 'best')
  _truncate_arrays(os.path.join(best, '4'))
  with caplog.at_level(logging.WARNING), pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.load_params(str(tmp_path), best=True)
  assert '\n' not in str(e.value) and 'leave out --best' in str(e.value)
  assert _damaged(best, 4) and len(_warnings(caplog)) == 1
  assert checkpoint.load_params(str(tmp_path))[2] == 4  # The latest is intact.


def test_the_best_manager_starts_past_a_damaged_metrics_file(tmp_path, caplog):
  _write_run(tmp_path, steps=(), best_step=4)
  best = str(tmp_path / 'best')
  with open(os.path.join(best, '4', 'metrics', 'metrics'), 'r+') as f:
    f.truncate(3)
  with caplog.at_level(logging.WARNING):
    mngr = checkpoint.manager(str(tmp_path), 'best', best=True)
  assert mngr.all_steps() == [] and _damaged(best, 4)
  (line,) = _warnings(caplog)
  assert os.path.join(best, '4', 'metrics', 'metrics') in line
  mngr.close()


def test_a_checkpoint_of_another_optimizer_is_refused_not_set_aside(tmp_path):
  _write_run(tmp_path)
  other = _state(0)
  other['opt_state'] = ((), *other['opt_state'])  # E.g. gradient clipping switched on.
  mngr = checkpoint.manager(str(tmp_path))
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.restore(mngr, _abstract(other))
  assert '\n' not in str(e.value) and 'does not fit the model and optimizer' in str(e.value)
  assert 'opt_state' in str(e.value)
  assert mngr.all_steps() == [2, 4] and not _damaged(str(tmp_path / 'checkpoints'), 4)
  mngr.close()


def test_an_unfinished_save_is_not_a_checkpoint(tmp_path, caplog):
  # Orbax writes a step under a temporary name and renames it when complete.
  _write_run(tmp_path)
  tmp = tmp_path / 'checkpoints' / '6.orbax-checkpoint-tmp-1234'
  (tmp / 'state').mkdir(parents=True)
  (tmp / 'state' / '_METADATA').write_text('{"tree_meta')
  mngr = checkpoint.manager(str(tmp_path))
  with caplog.at_level(logging.WARNING):
    _, meta = checkpoint.restore(mngr, _abstract(_state(0)))
  assert meta['step'] == 4 and not _warnings(caplog)
  mngr.close()


def test_an_unreadable_config_is_one_line(tmp_path):
  _write_run(tmp_path, steps=(2,))
  path = tmp_path / checkpoint.CONFIG_FILE
  path.write_text(path.read_text()[:40])
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.check_same_model(str(tmp_path), resolve(_config().model))
  assert '\n' not in str(e.value) and str(path) in str(e.value) and '--workdir' in str(e.value)


def test_reads_a_failed_restore_left_unretrieved_stay_off_the_console(caplog):
  """asyncio reports a failed read nobody awaited as a Task or a Future (whichever the garbage
  collector finds): both are dropped once a restore has installed the filter; other errors
  still reach the log. (The one-line test below met the Future form now and then.)"""
  checkpoint_damage._quiet_stale_reads()  # pylint: disable=protected-access
  loop = asyncio.new_event_loop()

  async def fail(error):
    raise error

  def orphan(error, task):
    if task:
      t = loop.create_task(fail(error))
      loop.run_until_complete(asyncio.sleep(0))
      assert t.done()
    else:
      loop.create_future().set_exception(error)
    gc.collect()

  with caplog.at_level(logging.ERROR, logger='asyncio'):
    for task in (True, False):
      orphan(ValueError('OUT_OF_RANGE: Error reading a cut array'), task)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    orphan(RuntimeError('not a read'), False)
    assert [r.getMessage().split('\n')[0] for r in caplog.records] == [
        'Future exception was never retrieved']
  loop.close()


def test_train_resumes_past_a_damaged_checkpoint_in_one_line(tmp_path):
  # The run's step 2 (a state of train.py's structure), and a newer step 4 whose array files
  # are cut short (a bad copy, a full disk). The run has reached total_steps at step 2, so
  # train.py only restores.
  config = _config()
  config.update(LOOP)
  trainer = helpers.trainer(config)
  checkpoint.write_config(str(tmp_path), config)
  mngr = checkpoint.manager(str(tmp_path))
  state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), trainer.abstract_state)
  checkpoint.save(mngr, 2, state, {'step': 2, 'data_position': 2, 'seed': 0})
  mngr.wait_until_finished()
  mngr.close()
  ckpts = str(tmp_path / 'checkpoints')
  shutil.copytree(os.path.join(ckpts, '2'), os.path.join(ckpts, '4'))
  before = _truncate_arrays(os.path.join(ckpts, '4'))
  overrides = [f'--config.model.{k}={v}' for k, v in MODEL.items()] + [
      f'--config.{k}={v}' for k, v in LOOP.items()]
  out = subprocess.run(
      [sys.executable, '-m', 'liere_jax.train', '--config', ARROWS, '--workdir', str(tmp_path),
       '--progress=false', *overrides], capture_output=True, text=True, cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  out = out.stdout + out.stderr
  lines = out.splitlines()
  damaged = [line for line in lines if 'cannot be read' in line]
  assert len(damaged) == 1 and 'step 4' in damaged[0], out
  assert os.path.join(ckpts, '4', 'state', 'd') in damaged[0], out
  assert 'Resumed from step 2.' in lines and 'Traceback' not in out, out
  # Nothing else about it: no Orbax, TensorStore or asyncio reports of reads still in flight.
  noise = ('Traceback', 'Error', 'error', 'orbax', 'tensorstore', 'Event loop', 'checkpoint')
  assert not [line for line in lines if line not in damaged and any(w in line for w in noise)], out
  (aside,) = _damaged(ckpts, 4)
  assert _files(aside) == before
  assert sorted(d for d in os.listdir(ckpts) if d.isdigit()) == ['2']


@pytest.mark.parametrize('how', [dict(remat='block'), dict(scan_layers=True),
                                 dict(dtype='bfloat16'),
                                 dict(remat='block', scan_layers=True, dtype='bfloat16')])
def test_same_model_takes_another_way_to_compute_the_same_tree(tmp_path, how):
  _write_run(tmp_path, steps=(2,))
  checkpoint.check_same_model(str(tmp_path), resolve(_config(**how).model))
  assert _tree(_config(**how)) == _tree(_config())  # It is the same tree: names and shapes.


@pytest.mark.parametrize('override, key, old, fix', [
    (dict(width=64), 'model.width', 32, '--config.model.width=32'),
    (dict(pool='cls'), 'model.pool', 'mean', '--config.model.pool=mean'),
])
def test_same_model_refuses_another_tree_naming_the_field_and_the_fix(tmp_path, override, key,
                                                                      old, fix):
  _write_run(tmp_path, steps=(2,))
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.check_same_model(str(tmp_path), resolve(_config(**override).model))
  message = str(e.value)
  assert '\n' not in message and f'different model ({key}: {old!r} there' in message, message
  assert 'new --workdir' in message and fix in message, message


def test_same_model_refuses_another_parameter_free_encoding(tmp_path):
  _write_run(tmp_path, steps=(2,))
  config = _config()
  config.model.pe.name = 'sincos'
  with pytest.raises(checkpoint.CheckpointError, match=r'\(model\.pe\.name: '):
    checkpoint.check_same_model(str(tmp_path), resolve(config.model))


def test_same_model_reads_an_old_workdir(tmp_path):
  # config.json of a run written before remat, scan_layers, dropout_sites, init, pe.jitter,
  # pe.expm_precision and the top-level fields added since, with a pe option its encoding
  # ignored then (refused today).
  _write_run(tmp_path, steps=(2,))
  config = _config()
  config.model.pe.name = 'rope_mixed'
  old = config.to_dict()
  for key in ('remat', 'scan_layers', 'dropout_sites', 'init'):
    del old['model'][key]
  del old['model']['pe']['jitter'], old['model']['pe']['expm_precision']
  for key in ('resolutions', 'model_parallel', 'model_init', 'model_init_head'):
    old.pop(key, None)
  old['model']['pe']['init_scale'] = 1.0
  (tmp_path / checkpoint.CONFIG_FILE).write_text(
      checkpoint.config_to_json(ml_collections.ConfigDict(old)))
  checkpoint.check_same_model(str(tmp_path), resolve(config.model))
  stored = checkpoint.read_config(str(tmp_path))
  # expm_precision: LieRE's old 'highest' does not apply to rope_mixed (no exponential).
  assert (stored.model.scan_layers, stored.model.pe.expm_precision) == (False, 'auto')
  assert (stored.model_init, tuple(stored.resolutions)) == ('', ())
  config.model.width = 64
  with pytest.raises(checkpoint.CheckpointError, match='model.width: 32 there, 64 now'):
    checkpoint.check_same_model(str(tmp_path), resolve(config.model))


def test_a_workdir_without_checkpoint_takes_any_model(tmp_path):
  checkpoint.write_config(str(tmp_path), _config())
  checkpoint.check_same_model(str(tmp_path), resolve(_config(width=64).model))
  assert not checkpoint.has_checkpoint(str(tmp_path))


def test_a_scanned_run_saves_blocks_by_layer_and_resumes_as_a_loop_run(tmp_path):
  """model.scan_layers keeps the blocks stacked in the train state; its checkpoint holds
  blocks/<i>/... (a loop run's layout) and restores into either layout."""
  config = _config(depth=2)
  config.update(LOOP)
  trainers = {}
  for scan in (True, False):
    config.model.scan_layers = scan
    trainers[scan] = helpers.trainer(config, jax.devices()[:1])
  state = trainers[True].init_state(0)
  assert state['params']['blocks']['attn']['qkv']['kernel'].shape[0] == 2  # Stacked.
  labels = jax.nn.one_hot(jnp.arange(8) % 4, config.model.num_classes)
  batch = {'image': jax.random.normal(jax.random.key(0), (8, *config.model.input_size, 3)),
           'label': labels}
  state, _ = trainers[True].train_step(state, trainers[True].global_batch(batch))
  expected = jax.device_get(to_loop_params(state))
  checkpoint.write_config(str(tmp_path), config)
  mngr = checkpoint.manager(str(tmp_path))
  checkpoint.save(mngr, 1, state, {'step': 1, 'data_position': 1, 'seed': 0})
  mngr.wait_until_finished()
  _, params, _ = checkpoint.load_params(str(tmp_path))
  assert sorted(params['blocks']) == [0, 1]
  for scan in (False, True):
    restored, meta = checkpoint.restore(mngr, trainers[scan].abstract_state)
    assert meta['step'] == 1
    assert jax.tree.structure(restored) == jax.tree.structure(trainers[scan].abstract_state)
    restored = jax.device_get(to_loop_params(restored))
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
      assert (a == b).all()
  mngr.close()


# ----------------------------------------------------------------------------------------------
# What a damaged checkpoint or config.json tells the user, checked without training a run: one
# line, without TensorStore's spec, naming the step or the file and the ways out.


def test_an_error_s_first_line_drops_tensorstore_s_spec_and_orbax_s_advice():
  error = ValueError('Unable to read "/w/4/state/x": NOT_FOUND [tensorstore_spec={"driver": '
                     '"zarr"}]\nIf this mismatch is intentional, pass partial_restore=True.')
  assert checkpoint_damage._first_line(error) == 'Unable to read "/w/4/state/x": NOT_FOUND'


def test_a_step_whose_metrics_are_not_json_is_set_aside_with_a_one_line_warning(tmp_path,
                                                                                 caplog):
  for step, text in ((3, '{"loss": 1.0}'), (5, '{"loss": ')):
    (tmp_path / str(step) / 'metrics').mkdir(parents=True)
    (tmp_path / str(step) / 'metrics' / 'metrics').write_text(text)
  assert checkpoint_damage.set_aside_unreadable_metrics(str(tmp_path))
  assert checkpoint_damage.steps_in(tmp_path) == [3]
  lines = [r.getMessage() for r in caplog.records if 'cannot be read' in r.getMessage()]
  path = tmp_path / '5' / 'metrics' / 'metrics'
  assert len(lines) == 1 and '\n' not in lines[0], lines
  assert lines[0].startswith(f'Checkpoint step 5 cannot be read: {path}: invalid JSON ('), lines
  assert lines[0].endswith('.') and f'Moved it to {tmp_path / "5"}' in lines[0], lines


def test_a_config_json_that_is_not_json_names_the_file_and_the_ways_out(tmp_path):
  path = tmp_path / checkpoint.CONFIG_FILE
  path.write_text('{"model": ')  # Cut short, as by a full disk.
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.read_config(str(tmp_path))
  message = str(e.value)
  assert '\n' not in message and message.startswith(f'{path} cannot be read (invalid JSON: ')
  assert message.endswith('Move it away to resume with the --config of the same model (a new '
                          'one is written), or use a new --workdir.'), message
