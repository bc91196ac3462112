"""Runs whose paths are gs:// URLs, against a real Cloud Storage emulator (tests/gcs.py): train,
resume, evaluate, convert both ways, fine-tune, a damaged checkpoint, a dataset prepared into a
bucket and read from it, two processes on one bucket, SIGTERM and resume. Nothing here mocks the
storage layer: the programs talk to fake-gcs-server through their own clients."""
import os
import signal
import sys
import time

import numpy as np
import pytest

from liere_jax import checkpoint, config_lib, data, model_init, param_tree, paths
from liere_jax.convert import __main__ as convert_cli
from liere_jax.data import prepare
from tests import datasets, gcs, helpers
from tests.helpers import ROOT, free_port, run_tiny

RUN = 'gs://bucket/run'


@pytest.fixture(scope='module')
def store():
  with gcs.emulator():
    yield


@pytest.fixture(scope='module')
def gs_run(store, tmp_path_factory):
  """The tiny run trained into gs://bucket/run (4 steps, checkpoints at 2 and 4) from an empty
  local folder: stopped by SIGTERM as soon as it starts, then resumed by the same command.
  Returns (that folder, the step SIGTERM saved, the outputs of both commands)."""
  cwd = tmp_path_factory.mktemp('gs_cwd')
  args = ('--config.total_steps=4', '--config.checkpoint_every=2')
  proc = run_tiny('train', RUN, *args, cwd=cwd, wait=False)
  deadline = time.time() + 300
  while not paths.path(f'{RUN}/config.json').exists():  # Written once SIGTERM is handled.
    assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  stopped = proc.communicate(timeout=300)[0]
  assert proc.returncode == 143, stopped
  line = [l for l in stopped.splitlines() if l.startswith('Preempted (SIGTERM) at step ')]
  assert len(line) == 1, stopped
  step = int(line[0].split()[4])
  assert step < 4 and checkpoint.steps_in(f'{RUN}/checkpoints') == [step], stopped
  rc, resumed = run_tiny('train', RUN, *args, cwd=cwd)
  assert rc == 0, resumed
  return cwd, step, resumed


def _same_params(a, b):
  for x, y in zip(*(sorted(param_tree.flatten(p).items()) for p in (a, b))):
    assert x[0] == y[0] and np.array_equal(np.asarray(x[1]), np.asarray(y[1])), x[0]


def test_sigterm_saves_the_step_reached_and_resume_is_bit_identical(gs_run, tiny_run):
  """The session's tiny_run is the same 4 steps, uninterrupted, on a local disk."""
  _, step, resumed = gs_run
  assert f'Resumed from step {step}.' in resumed
  _same_params(checkpoint.load_params(str(tiny_run))[1], checkpoint.load_params(RUN)[1])
  # Metrics as one object per flush; the steps after `step` logged again by the resumed run.
  assert [m['step'] for m in paths.read_metrics(RUN) if 'loss' in m] == [
      *range(1, step + 1), *range(step + 1, 5)]


def test_a_run_on_gcs_writes_only_there_and_evaluates(gs_run):
  cwd = gs_run[0]
  assert os.listdir(cwd) == []  # No local folder named after the URL.
  run = paths.path(RUN)
  assert checkpoint.read_config(RUN).total_steps == 4
  assert checkpoint.steps_in(run / 'checkpoints') == [2, 4]
  assert list((run / 'tensorboard').iterdir())
  rc, out = run_tiny('eval', RUN, cwd=cwd)
  assert rc == 0, out
  results = paths.read_json(f'{RUN}/eval/results.json')
  assert results['step'] == 4 and results['n_examples'] == 40
  assert (run / 'eval' / 'attention.png').read_bytes()[:4] == b'\x89PNG'
  assert os.listdir(cwd) == []


def test_convert_both_ways_and_fine_tune_from_gcs(gs_run, tmp_path):
  export = 'gs://bucket/export/run.safetensors'
  assert convert_cli.call(['to_torch', '--workdir', RUN, '--step', '4', '--out', export]) == 0
  assert paths.path(export.replace('.safetensors', '.json')).exists()
  assert convert_cli.call(['from_torch', '--safetensors', export,
                           '--out_workdir', 'gs://bucket/imported']) == 0
  config, params, _ = checkpoint.load_params(RUN, 4)
  _same_params(params, checkpoint.load_params('gs://bucket/imported')[1])
  # --config.model_init from the gs:// workdir (a step of it) and from the gs:// export.
  for source in (f'{RUN}:4', export):
    loaded = model_init.load(config, source)
    for key, value in param_tree.flatten(params).items():
      assert np.array_equal(loaded[key], np.asarray(value)), (source, key)


def test_a_damaged_checkpoint_on_gcs_is_set_aside(gs_run):
  config, params, _ = checkpoint.load_params(RUN)
  work = 'gs://bucket/damaged'
  for step in (1, 2):
    checkpoint.save_params(work, config, params, step=step)
  (paths.path(work) / 'checkpoints' / '2' / 'state' / '_METADATA').write_text('not json')
  assert checkpoint.load_params(work)[2] == 1
  names = [d.name for d in (paths.path(work) / 'checkpoints').iterdir()]
  assert '1' in names and '2' not in names and any(n.startswith('2.damaged-') for n in names)


def test_two_processes_fine_tune_on_one_bucket_and_stop_together_on_sigterm(gs_run, tmp_path):
  work = 'gs://bucket/two'
  addr = f'127.0.0.1:{free_port()}'
  procs = [run_tiny('train', work, '--config.total_steps=200', f'--config.model_init={RUN}:2',
                    f'--coordinator_address={addr}', '--num_processes=2', f'--process_id={i}',
                    cwd=tmp_path, wait=False) for i in range(2)]
  deadline = time.time() + 300
  while not paths.path(f'{work}/config.json').exists() and all(p.poll() is None for p in procs):
    assert time.time() < deadline
    time.sleep(0.1)
  procs[1].send_signal(signal.SIGTERM)  # One process told: both stop at one step.
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [143, 143], outs
  steps = {int(l.split(' at step ')[1].split()[0]) for out in outs for l in out.splitlines()
           if l.startswith('Preempted')}
  assert len(steps) == 1 and checkpoint.steps_in(f'{work}/checkpoints')[-1] == steps.pop(), outs
  assert 'Started from the parameters of' in outs[0]
  # eval.py takes train.py's process flags and runs on the same two processes.
  addr = f'127.0.0.1:{free_port()}'
  procs = [run_tiny('eval', work, f'--coordinator_address={addr}', '--num_processes=2',
                    f'--process_id={i}', cwd=tmp_path, wait=False) for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  assert paths.read_json(f'{work}/eval/results.json')['n_examples'] == 40


def test_processes_on_separate_disks_stop_in_one_line(tmp_path):
  addr = f'127.0.0.1:{free_port()}'
  for i in range(2):
    (tmp_path / f'host{i}').mkdir()
  procs = [run_tiny('train', tmp_path / f'host{i}' / 'run', '--config.total_steps=2',
                    f'--coordinator_address={addr}', '--num_processes=2', f'--process_id={i}',
                    wait=False) for i in range(2)]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [2, 2], outs
  assert 'process(es) [1] do not see the files process 0 writes there' in outs[1], outs
  assert not (tmp_path / 'host1' / 'run' / 'checkpoints').exists()


def test_a_dataset_prepared_into_a_bucket_is_read_from_it(store, tmp_path):
  download_dir = str(tmp_path / 'dl')
  os.makedirs(download_dir)
  datasets.cifar100_archive(download_dir, dict(train=6, test=3))
  path = prepare.prepare('cifar100', download_dir, 'gs://bucket/tfds')
  assert path == 'gs://bucket/tfds/cifar100/3.0.2'
  with pytest.raises(FileExistsError, match='already prepared; pass --overwrite'):
    prepare.prepare('cifar100', download_dir, 'gs://bucket/tfds')
  cfg = config_lib.load(os.path.join(ROOT, 'configs', 'cifar100.py'))
  cfg.data.data_dir = 'gs://bucket/tfds'
  batch = data.train_dataset(cfg.data, global_batch_size=4, seed=0)[0]
  assert batch['image'].shape == (4, 32, 32, 3) and np.isfinite(batch['image']).all()


def test_a_store_that_cannot_be_read_says_why(store, monkeypatch, tmp_path):
  assert paths.store_problem('gs://bucket/tfds') is None
  assert 'there is no bucket gs://nobucket' in paths.store_problem('gs://nobucket/tfds')
  rc, out = run_tiny('train', 'gs://nobucket/run', cwd=tmp_path)
  assert rc == 2 and out.strip().splitlines()[-1] == (
      'python -m liere_jax.train: error: --workdir=gs://nobucket/run cannot be used: there is '
      'no bucket gs://nobucket (create it: gcloud storage buckets create gs://nobucket).'), out
  assert os.listdir(tmp_path) == []
  monkeypatch.setitem(sys.modules, 'gcsfs', None)  # As without gcsfs installed.
  cfg = config_lib.load(os.path.join(ROOT, 'configs', 'cifar100.py'))
  cfg.data.data_dir = 'gs://bucket/tfds'
  with pytest.raises(FileNotFoundError, match='data.data_dir=gs://bucket/tfds cannot be used: '
                     'reading gs:// needs gcsfs'):
    data.dataset_info(cfg.data)


def test_the_reproduce_runner_reads_and_writes_runs_in_a_bucket(gs_run):
  from liere_jax.reproduce import runner
  assert runner._trained(RUN)  # Its final evaluation is in the metrics objects.
  assert runner.plateau_exit(RUN) is None or runner.plateau_exit(RUN) <= 4
  work = 'gs://bucket/reproduce'
  for text in ('first\n', 'second\n'):  # A bucket takes no appends: the log is rewritten.
    with runner._log(work, 'reproduce_train.log') as f:
      f.write(text)
  assert paths.path(f'{work}/reproduce_train.log').read_text() == 'first\nsecond\n'
  runner._add_wall(work, 'train_s', 2.0, 'abc')
  runner._add_wall(work, 'train_s', 3.0, 'abc')
  assert runner._walls(work)['train_s'] == 5.0


def test_process_flags_come_all_three_or_none():
  from liere_jax import train_lib
  with pytest.raises(ValueError, match='give all three, or none to let jax find them'):
    train_lib.init_distributed('127.0.0.1:1234', None, None)
