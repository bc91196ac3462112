"""Runs whose paths are gs:// URLs, against a real Cloud Storage emulator (tests/gcs.py): train,
SIGTERM, SIGKILL and resume bit-identically, evaluate, convert both ways, fine-tune, a damaged
checkpoint, a dataset prepared into a bucket and read from it, two processes on one bucket that
stop together on SIGTERM and resume bit-identically. Nothing here mocks the storage layer: the
programs talk to fake-gcs-server through their own clients.

Under pytest-xdist each worker runs a module fixture again, so the work on one run (its
programs are the slow part) is one test, not a fixture shared by several."""
import os
import signal
import sys

import jax
import numpy as np
import pytest

from liere_jax import checkpoint, data, distributed, model_init, param_tree, paths
from liere_jax.config import load
from liere_jax.convert import __main__ as convert_cli
from liere_jax.data import prepare
from liere_jax.config import run as run_spec
from liere_jax.config.data import resolve_data
from tests import datasets, gcs, helpers, reference
from tests.helpers import ROOT, free_port, preempted_at, run_tiny, two_processes, wait_for

RUN = 'gs://bucket/run'


@pytest.fixture(scope='module')
def store():
  with gcs.emulator():
    yield


def _same_params(a, b):
  for x, y in zip(*(sorted(param_tree.flatten(p).items()) for p in (a, b))):
    assert x[0] == y[0] and np.array_equal(np.asarray(x[1]), np.asarray(y[1])), x[0]


def test_a_run_in_a_bucket_survives_sigterm_and_sigkill_bit_identically_and_is_read_back(
    store, tiny_run, tmp_path, monkeypatch):
  """The tiny run (4 steps, checkpoints at 2 and 4) trained into gs://bucket/run from an empty
  local folder: stopped by SIGTERM as soon as it starts, resumed by the same command, that run
  killed (SIGKILL) once it writes step 2, resumed again. It ends bit-identical (parameters and
  optimizer state) to the session's tiny_run, the same 4 steps uninterrupted on a local disk.
  Then, from the bucket alone and writing nothing in the local folder, it is evaluated,
  converted both ways and fine-tuned from, and the reproduce runner reads it."""
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  args = ('--config.total_steps=4', '--config.checkpoint_every=2')
  ckpts = f'{RUN}/checkpoints'
  proc = run_tiny('train', RUN, *args, cwd=cwd, wait=False)
  # SIGTERM is handled once the config is written.
  wait_for(lambda: paths.path(f'{RUN}/config.json').exists(), proc)
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate(timeout=300)[0]
  assert proc.returncode == 143, out
  # Between scheduled checkpoints (every 2 steps): nothing but the step reached is saved.
  step = preempted_at(out)
  assert step % 2 == 1 and checkpoint.steps_in(ckpts) == [step], out
  assert out.strip().splitlines()[-1] == (
      f'Preempted (SIGTERM) at step {step} (process 0): saved step {step} to {RUN}; run the '
      'same command to resume there.'), out
  # SIGKILL once step 2 is being written (on a bucket a step is written in place, committed
  # last): the rerun resumes from the last whole step.
  proc = run_tiny('train', RUN, *args, cwd=cwd, wait=False)
  wait_for(lambda: 2 in checkpoint.steps_in(ckpts), proc)
  proc.kill()
  assert f'Resumed from step {step}.' in proc.communicate(timeout=300)[0]
  rc, out = run_tiny('train', RUN, *args, cwd=cwd)
  assert rc == 0, out
  resumed = int(out.split('Resumed from step ')[1].split('.')[0])
  assert step <= resumed <= 2, out
  reference.assert_same_state(reference.stored_state(tiny_run), reference.stored_state(RUN))
  # Metrics as one object per flush; the steps after a resumed one logged again.
  logged = [m['step'] for m in paths.read_metrics(RUN) if 'loss' in m]
  assert logged[:step] == list(range(1, step + 1)) and set(logged) == {1, 2, 3, 4}, logged
  assert logged[resumed - 4:] == list(range(resumed + 1, 5)), logged

  # Everything went to the bucket: no local folder named after the URL.
  assert os.listdir(cwd) == []
  run = paths.path(RUN)
  assert checkpoint.read_config(RUN).total_steps == 4
  assert checkpoint.steps_in(ckpts) == [2, 4]
  assert list((run / 'tensorboard').iterdir())
  monkeypatch.chdir(cwd)  # Evaluated in this process (eval.py's command line: below, on two).
  assert helpers.evaluate(RUN) == paths.read_json(f'{RUN}/eval/results.json')
  results = paths.read_json(f'{RUN}/eval/results.json')
  assert results['step'] == 4 and results['n_examples'] == 40
  assert (run / 'eval' / 'attention.png').read_bytes()[:4] == b'\x89PNG'

  # Converted both ways, and fine-tuned from (a step of the workdir, and the export).
  export = 'gs://bucket/export/run.safetensors'
  assert convert_cli.call(['to_torch', '--workdir', RUN, '--step', '4', '--out', export]) == 0
  assert paths.path(export.replace('.safetensors', '.json')).exists()
  assert convert_cli.call(['from_torch', '--safetensors', export,
                           '--out_workdir', 'gs://bucket/imported']) == 0
  config, params, _ = checkpoint.load_params(RUN, 4)
  _same_params(params, checkpoint.load_params('gs://bucket/imported')[1])
  for source in (f'{RUN}:4', export):
    loaded = model_init.load(run_spec.resolve(config, 1), source)
    for key, value in param_tree.flatten(params).items():
      assert np.array_equal(loaded[key], np.asarray(value)), (source, key)

  # The reproduce runner reads the run's final evaluation from the metrics objects.
  from liere_jax.reproduce import runner
  assert runner._trained(RUN)
  assert runner.plateau_exit(RUN) is None or runner.plateau_exit(RUN) <= 4
  assert os.listdir(cwd) == []


def _tiny_params(scale=1.0):
  """The tiny run's config and fresh parameters (seed 0) times `scale`, as numpy."""
  config = helpers.tiny_config()
  trainer = helpers.trainer(config, jax.devices()[:1])
  params = jax.device_get(param_tree.to_loop_params(trainer.init_state(0)['params']))
  return config, jax.tree.map(lambda x: np.asarray(x) * np.asarray(scale, x.dtype), params)


def test_a_damaged_checkpoint_on_gcs_is_set_aside(store):
  config, params = _tiny_params()
  work = 'gs://bucket/damaged'
  for step in (1, 2):
    checkpoint.save_params(work, config, params, step=step)
  (paths.path(work) / 'checkpoints' / '2' / 'state' / '_METADATA').write_text('not json')
  assert checkpoint.load_params(work)[2] == 1
  names = [d.name for d in (paths.path(work) / 'checkpoints').iterdir()]
  assert '1' in names and '2' not in names and any(n.startswith('2.damaged-') for n in names)


def test_two_processes_on_one_bucket_stop_together_on_sigterm_and_resume_bit_identically(
    store, tmp_path):
  """Two processes fine-tune from parameters in the bucket, with scheduled saves at steps 2
  (an evaluation), 4 and 6. One process gets SIGTERM once step 2 is saved: both save the step
  they agree on, between the scheduled ones, and exit 143; the same command resumes there. The
  run ends bit-identical (parameters and optimizer state) to the same 6 steps uninterrupted on
  2 devices of this process fed the 1-process batches (tests/reference.py): so 2 processes
  equal 1 too. Then eval.py runs on the same two processes."""
  init = 'gs://bucket/init'
  checkpoint.save_params(init, *_tiny_params(0.5))
  work = 'gs://bucket/two'
  args = ('--config.total_steps=6', '--config.checkpoint_every=4', '--config.eval_every=2',
          f'--config.model_init={init}')
  procs = two_processes('train', work, *args, cwd=tmp_path)
  # The evaluation at step 2 (compiled then) holds both processes there a while.
  wait_for(lambda: 2 in checkpoint.steps_in(f'{work}/checkpoints'), *procs)
  procs[1].send_signal(signal.SIGTERM)  # One process told: both stop at one step.
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [143, 143], outs
  steps = {preempted_at(out) for out in outs}
  assert len(steps) == 1, outs
  step = steps.pop()
  assert step in (3, 5) and checkpoint.steps_in(f'{work}/checkpoints')[-1] == step, outs
  assert f'Started from the parameters of {init}' in outs[0]
  procs = two_processes('train', work, *args, cwd=tmp_path)
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  assert all(f'Resumed from step {step}. --config.model_init={init} is ignored' in out
             for out in outs), outs
  got = reference.stored_state(work)
  assert int(got['step']) == 6
  reference.assert_same_state(reference.uninterrupted_state(work, 6, processes=2, init=init),
                              got)
  # eval.py takes train.py's process flags and runs on the same two processes.
  procs = two_processes('eval', work, cwd=tmp_path)
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
  cfg = load(os.path.join(ROOT, 'configs', 'cifar100.py'))
  cfg.data.data_dir = 'gs://bucket/tfds'
  batch = data.train_dataset(resolve_data(cfg.data), global_batch_size=4, seed=0)[0]
  assert batch['image'].shape == (4, 32, 32, 3) and np.isfinite(batch['image']).all()


def test_a_store_that_cannot_be_read_says_why(store, monkeypatch, tmp_path):
  assert paths.store_problem('gs://bucket/tfds') is None
  assert 'there is no bucket gs://nobucket' in paths.store_problem('gs://nobucket/tfds')
  # Refused before anything is written (the command line prints it as its one line, exit
  # status 2: tests/test_cli.py).
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError) as refusal:
    helpers.train(helpers.tiny_config(), 'gs://nobucket/run')
  assert str(refusal.value) == (
      '--workdir=gs://nobucket/run cannot be used: there is no bucket gs://nobucket (create it: '
      'gcloud storage buckets create gs://nobucket).')
  assert os.listdir(tmp_path) == []
  monkeypatch.setitem(sys.modules, 'gcsfs', None)  # As without gcsfs installed.
  cfg = load(os.path.join(ROOT, 'configs', 'cifar100.py'))
  cfg.data.data_dir = 'gs://bucket/tfds'
  with pytest.raises(FileNotFoundError, match='data.data_dir=gs://bucket/tfds cannot be used: '
                     'reading gs:// needs gcsfs'):
    data.dataset_info(resolve_data(cfg.data))


def test_the_reproduce_runner_writes_its_logs_and_walls_in_a_bucket(store):
  from liere_jax.reproduce import runner
  work = 'gs://bucket/reproduce'
  for text in ('first\n', 'second\n'):  # A bucket takes no appends: the log is rewritten.
    with runner._log(work, 'reproduce_train.log') as f:
      f.write(text)
  assert paths.path(f'{work}/reproduce_train.log').read_text() == 'first\nsecond\n'
  runner._add_wall(work, 'train_s', 2.0, 'abc')
  runner._add_wall(work, 'train_s', 3.0, 'abc')
  assert runner._walls(work)['train_s'] == 5.0


def test_process_flags_come_all_three_or_none():
  with pytest.raises(ValueError, match='give all three, or none to let jax find them'):
    distributed.init_distributed('127.0.0.1:1234', None, None)
