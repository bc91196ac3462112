"""Training end to end on the synthetic task: exact resume after SIGKILL, 8 devices and 2
processes equal 1, clear errors that write nothing, NaN stops, eval.py's results.json."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from liere_jax import checkpoint, data, train_lib
from liere_jax.data import pipeline
from tests.helpers import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ['--config.model.width=32', '--config.model.depth=1', '--config.model.heads=2',
        '--config.model.mlp_dim=64', '--config.batch_size=16', '--config.eval_batch_size=16',
        '--config.data.num_eval=40', '--config.log_every=1', '--config.warmup_steps=2',
        '--config.resolutions=(60,)']


def run(script, workdir, *args, devices=1, wait=True, env=None):
  cmd = [sys.executable, os.path.join(ROOT, script), '--config',
         os.path.join(ROOT, 'configs/arrows.py:grid=4'), '--workdir', str(workdir), *TINY,
         *args]
  if script == 'train.py':
    cmd.append('--noprogress')
  env = dict(os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
             JAX_PLATFORMS='cpu', PYTHONPATH=ROOT, **(env or {}))
  proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  if not wait:
    return proc
  out, _ = proc.communicate(timeout=600)
  return proc.returncode, out


def params(workdir):
  return checkpoint.load_params(str(workdir))[1]


def assert_trees(a, b, exact=True, atol=0.0):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    if exact:
      assert np.array_equal(x, y), f'{jax.tree_util.keystr(path)} differs'
    else:
      np.testing.assert_allclose(x, y, atol=atol, rtol=atol, err_msg=jax.tree_util.keystr(path))


def test_sigkill_then_resume_is_bit_identical(tmp_path):
  rc, out = run('train.py', tmp_path / 'ref', '--config.total_steps=8',
                '--config.checkpoint_every=2')
  assert rc == 0, out
  work = tmp_path / 'killed'
  proc = run('train.py', work, '--config.total_steps=8', '--config.checkpoint_every=2',
             wait=False)
  deadline = time.time() + 300
  while not (work / 'checkpoints' / '4').exists() and proc.poll() is None:
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  rc, out = run('train.py', work, '--config.total_steps=8', '--config.checkpoint_every=2')
  assert rc == 0, out
  assert 'Resumed from step' in out
  assert_trees(params(tmp_path / 'ref'), params(work))


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
  rc, out = run('train.py', tmp_path / 'one', '--config.total_steps=3',
                '--config.checkpoint_every=3', devices=2)
  assert rc == 0, out
  addr = f'127.0.0.1:{_free_port()}'
  procs = [run('train.py', tmp_path / 'two', '--config.total_steps=3',
               '--config.checkpoint_every=3', f'--coordinator_address={addr}',
               '--num_processes=2', f'--process_id={i}', wait=False) for i in range(2)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), outs
  assert_trees(params(tmp_path / 'one'), params(tmp_path / 'two'), exact=False, atol=1e-5)


def tiny_config_and_batch(batch_size):
  """The arrows config (grid 4) with a one-block model, and a random batch for it."""
  cfg = load_config('configs/arrows.py', 'grid=4')
  cfg.model.update(width=32, depth=1, heads=2, mlp_dim=64)
  rng = np.random.default_rng(0)
  batch = {'image': rng.normal(size=(batch_size, 48, 48, 3)).astype(np.float32),
           'label': np.eye(4, dtype=np.float32)[rng.integers(0, 4, batch_size)]}
  return cfg, batch


def test_uint8_batches_normalised_on_the_device_give_the_host_step():
  cfg, batch = tiny_config_and_batch(8)
  pixels = np.random.default_rng(1).integers(0, 256, batch['image'].shape, dtype=np.uint8)
  results = []
  for normalise in ('host', 'device'):
    cfg.data.normalise = normalise
    trainer = train_lib.Trainer(cfg, train_lib.make_mesh(jax.devices()[:1], 1))
    scale, offset = pipeline.normalisation(cfg.data)
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
    trainer = train_lib.Trainer(cfg, train_lib.make_mesh(devices, model_parallel))
    state = trainer.init_state(0)
    for _ in range(2):
      state, metrics = trainer.train_step(state, trainer.global_batch(batch))
    results.append((jax.device_get(state['params']), float(metrics['loss'])))
  assert len(jax.devices()) == 8
  for p, loss in results[1:]:
    assert abs(loss - results[0][1]) < 1e-5
    assert_trees(results[0][0], p, exact=False, atol=1e-5)


def test_parameter_shardings_follow_their_metadata():
  cfg = load_config('configs/cifar100.py', 'variant=Ti')  # width 192, 3 heads, MLP 768
  cfg.model.qkv_bias = True  # The paper config has none; its sharding is checked here.
  specs = {}
  for sharding, model_parallel in [('data', 1), ('fsdp', 1), ('fsdp', 2)]:
    cfg.sharding = sharding
    trainer = train_lib.Trainer(cfg, train_lib.make_mesh(model_parallel=model_parallel))
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


def test_eval_writes_results_json(tmp_path):
  rc, out = run('train.py', tmp_path, '--config.total_steps=2', '--config.checkpoint_every=2')
  assert rc == 0, out
  rc, out = run('eval.py', tmp_path)
  assert rc == 0, out
  res = json.loads((tmp_path / 'eval' / 'results.json').read_text())
  assert res['n_examples'] == 40  # num_eval=40 with batches of 16: nothing dropped
  lo, hi = res['top1_ci95']
  assert 0 <= lo <= res['top1'] <= hi <= 1
  assert res['shuffle_drop'] == pytest.approx(res['top1'] - res['shuffled_top1'])
  assert set(res['resolutions']['60']) == {'normalized', 'rescaled'}
  assert (tmp_path / 'eval' / 'attention.png').stat().st_size > 0


@pytest.mark.parametrize('args,message', [
    (['--config.model.input_size=(60, 60)'], 'expects'),
    (['--config.no_such_key=1'], "config has no field 'no_such_key'; its fields are ["),
    (['--config.model.foo=1'], "config.model has no field 'foo'; its fields are ['channels'"),
    (['--config.model.pe.expm=pade'], "model.pe.expm='pade' is unknown"),
    (['--config.model.pe.name=liere128'], 'block size 128'),
    (['--config.batch_size=0'], 'batch_size=0'),
    (['--config.lr=-1.0'], 'lr=-1.0 must be a positive finite number'),
    (['--config.sharding=tp'], "sharding='tp' is unknown"),
    (['--config.resolutions=(50,)'], '50) must be input sizes divisible by the patch'),
])
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, args, message):
  rc, out = run('train.py', tmp_path / 'w', '--config.total_steps=1', *args)
  assert rc != 0 and message in out, out
  assert not (tmp_path / 'w').exists()


def test_unknown_key_is_one_line_without_a_traceback(tmp_path):
  rc, out = run('train.py', tmp_path / 'w', '--config.model.pe.scale=1')
  assert rc == 2 and 'Traceback' not in out, out
  assert "config.model.pe has no field 'scale'; its fields are ['expm', 'init_scale'" in out


def test_a_workdir_without_checkpoint_takes_a_corrected_config(tmp_path):
  # A start that fails after writing config.json (here: at the first step, NaN) leaves no
  # checkpoint; the rerun with another model is accepted.
  rc, out = run('train.py', tmp_path, '--config.total_steps=2', '--config.lr=1e30',
                '--config.model.pe.name=abs')
  assert rc != 0 and (tmp_path / 'config.json').exists(), out
  rc, out = run('train.py', tmp_path, '--config.total_steps=2', '--config.checkpoint_every=2')
  assert rc == 0, out
  assert checkpoint.read_config(str(tmp_path)).model.pe.name == 'liere8'


def test_unprepared_dataset_says_how_to_prepare(tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, 'train.py'), '--config',
         os.path.join(ROOT, 'configs/cifar100.py:variant=Ti'), '--workdir', str(tmp_path / 'w'),
         f'--config.data.data_dir={tmp_path}']
  out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ,
                                                                     PYTHONPATH=ROOT))
  assert out.returncode != 0 and 'liere_jax.data.prepare cifar100' in out.stdout + out.stderr
  assert not (tmp_path / 'w').exists()


def test_workdir_of_a_different_model_is_refused(tmp_path):
  rc, out = run('train.py', tmp_path, '--config.total_steps=2', '--config.checkpoint_every=2')
  assert rc == 0, out
  before = sorted(os.listdir(tmp_path / 'checkpoints'))
  config_before = (tmp_path / 'config.json').read_text()
  rc, out = run('train.py', tmp_path, '--config.total_steps=4', '--config.model.pe.name=abs')
  assert rc != 0 and 'holds a run of a different model (model.pe' in out, out
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == before
  assert (tmp_path / 'config.json').read_text() == config_before


def test_non_finite_state_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  rc, out = run('train.py', tmp_path, '--config.total_steps=2', '--config.checkpoint_every=2')
  assert rc == 0, out
  rc, out = run('train.py', tmp_path, '--config.total_steps=6', '--config.checkpoint_every=1',
                '--config.log_every=1', '--config.lr=1e30')  # resumes at step 2, then blows up
  assert rc != 0 and 'at step 3; stopping' in out and 'checkpoint (step 2)' in out, out
  config, p, step = checkpoint.load_params(str(tmp_path))
  assert step == 2 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(p))
  # "Good" means the checkpoint's own parameters give a finite loss on its step's batch.
  trainer = train_lib.Trainer(config, train_lib.make_mesh(jax.devices()[:1]))
  batch = next(data.to_iterator(data.train_dataset(config.data, global_batch_size=16, seed=0),
                                start=1))
  assert np.isfinite(float(trainer.loss_step(p, trainer.global_batch(batch))))


def test_dropout_trains_deterministically_and_changes_the_step():
  cfg, batch = tiny_config_and_batch(8)
  losses = {}
  for dropout in (0.0, 0.5, 0.5):
    cfg.model.dropout = dropout
    trainer = train_lib.Trainer(cfg, train_lib.make_mesh(jax.devices()[:1]))
    state, metrics = trainer.train_step(trainer.init_state(0), trainer.global_batch(batch))
    losses.setdefault(dropout, []).append(float(metrics['grad_norm']))
  assert losses[0.5][0] == losses[0.5][1] and losses[0.5][0] != losses[0.0][0]
