"""Grain worker processes (data.workers, to_iterator) give exactly the batches of ds[k], also on
resume and when SIGTERM ends them; a run of two processes with workers stopped by SIGTERM to its
process group saves the step they agree on and resumes bit-identically; the `bench data` CLI
reports images/s per worker count."""
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys

from absl import flags
import grain
import numpy as np
import pytest

from liere_jax import checkpoint, config_lib
from liere_jax.data import pipeline
from liere_jax.config.data import resolve_data
from tests import datasets, reference
from tests.helpers import preempted_at, two_processes, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def absl_flags_parsed():
  """Grain's worker processes read absl flags, which pytest does not parse."""
  parsed = flags.FLAGS.is_parsed()
  flags.FLAGS.mark_as_parsed()
  yield
  if not parsed:
    flags.FLAGS.unparse_flags()


def test_workers_need_parsed_flags():
  parsed = flags.FLAGS.is_parsed()
  flags.FLAGS.unparse_flags()
  try:
    with pytest.raises(RuntimeError, match='app.run'):
      pipeline.to_iterator(grain.MapDataset.range(4), workers=1)
  finally:
    if parsed:
      flags.FLAGS.mark_as_parsed()


@pytest.mark.usefixtures('absl_flags_parsed')
def test_workers_outlive_a_sigterm_to_the_process_group():
  """The main process notes SIGTERM and saves its step from the batches its workers still make
  (train.train); a worker killed by it would leave them to the main process (the next test)."""
  before = set(multiprocessing.active_children())
  it = pipeline.to_iterator(grain.MapDataset.range(64), workers=1, threads=1, prefetch=1)
  try:
    assert next(it) == 0  # The worker is running: it made this item.
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 1
    for worker in workers:  # As `kill -TERM -PGID` reaches them (not this pytest process).
      os.kill(worker.pid, signal.SIGTERM)
    assert [next(it) for _ in range(1, 40)] == list(range(1, 40))
    assert all(worker.is_alive() for worker in workers)
  finally:
    it.close()
  assert not any(worker.is_alive() for worker in workers)  # close() still ends them.


@pytest.mark.usefixtures('absl_flags_parsed')
def test_items_of_workers_ended_by_sigterm_come_from_this_process(monkeypatch):
  """...from the first item they did not give (a run of several processes goes on to the step
  they agree on: the last test); workers ended otherwise still fail the iterator."""
  # In place of _outlive_sigterm; local functions go to the workers by value (cloudpickle), so
  # that they do not import this module.
  def sigterm_while_starting(worker_index, worker_count):
    del worker_index, worker_count
    os.kill(os.getpid(), signal.SIGTERM)  # As SIGTERM reaches a worker before it ignores it.

  def crash_while_starting(worker_index, worker_count):
    del worker_index, worker_count
    os._exit(3)

  monkeypatch.setattr(pipeline, '_outlive_sigterm', sigterm_while_starting)
  it = pipeline.to_iterator(grain.MapDataset.range(64), start=5, workers=1, threads=1,
                            prefetch=1)
  try:
    assert [next(it) for _ in range(5, 40)] == list(range(5, 40))
  finally:
    it.close()
  monkeypatch.setattr(pipeline, '_outlive_sigterm', crash_while_starting)
  it = pipeline.to_iterator(grain.MapDataset.range(64), workers=1, threads=1, prefetch=1)
  try:
    with pytest.raises(RuntimeError, match='terminated unexpectedly with exit code 3'):
      next(it)
  finally:
    it.close()


@pytest.mark.usefixtures('absl_flags_parsed')
def test_workers_and_resume_give_the_batches_of_ds_k(tmp_path):
  datasets.prepare(datasets.Cifar100, str(tmp_path), sizes=dict(train=12, test=4))
  cfg = resolve_data(config_lib.data_config(name='cifar100', data_dir=str(tmp_path),
                                            augment='randaug', mixup=0.5))
  ds = pipeline.train_dataset(cfg, global_batch_size=4, seed=3)
  want = [ds[k] for k in range(7)]  # 3 batches an epoch: crosses two epoch boundaries.
  assert not np.array_equal(want[0]['image'], want[3]['image'])  # A new shuffle each epoch.
  for workers, threads, start in ((0, 2, 0), (2, 2, 3)):  # Worker 0 makes 3, 5; worker 1: 4, 6.
    it = pipeline.to_iterator(ds, start=start, workers=workers, threads=threads, prefetch=2)
    try:
      got = [next(it) for _ in range(start, len(want))]
    finally:
      it.close()
    for step, batch in zip(range(start, len(want)), got):
      for key in ('image', 'label'):
        np.testing.assert_array_equal(batch[key], want[step][key],
                                      err_msg=f'{workers} workers, start {start}, step {step}')


def test_bench_data_cli_json():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, '-m', 'liere_jax.bench', 'data', '--config', 'configs/cifar100.py',
       '--config.batch_size=4', '--workers', '0,1', '--batches', '1', '--warmup', '0',
       '--repeats', '1', '--json'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads(proc.stdout.strip().splitlines()[-1])
  assert [r['workers'] for r in res['rows']] == [0, 1]
  for r in res['rows']:
    assert r['images_per_s'] > 0 and r['cpu_ms_per_image'] > 0, r
  assert res['config'] == 'configs/cifar100.py' and res['dataset'] == 'cifar100'
  assert res['cores'] >= 1 and res['batch_size'] == 4 and 'stand-in' in res['data']
  assert res['input_shape'] == [32, 32, 3] and res['measured']
  assert 'images/CPU s' in proc.stdout  # The table came first.


def _workers_of(pid: int) -> list:
  """The pids of the processes that `pid` spawned (multiprocessing's spawn: Grain's workers)."""
  found = []
  for child in os.listdir('/proc'):
    try:
      stat = open(f'/proc/{child}/stat').read()
      spawned = b'spawn_main' in open(f'/proc/{child}/cmdline', 'rb').read()
    except (OSError, ValueError):  # Not a process, or one that just ended.
      continue
    if spawned and int(stat.rsplit(')', 1)[1].split()[1]) == pid:
      found.append(int(child))
  return found


def test_two_processes_with_workers_stopped_by_sigterm_to_their_group_save_the_agreed_step(
    tmp_path):
  """Two processes (jax.distributed, one device each) with data.workers=2, sent SIGTERM as a
  pod's VMs shut down: to the whole process group. Once while the workers start (the signal ends
  those it reaches before they ignore it; their batches then come from the training process),
  once mid-run in the resumed run (at its first evaluation; the workers ignore it). Both
  times both processes save the step they agree on and exit 143, and the state saved the second
  time is bit-identical to the same steps uninterrupted (tests/reference.py)."""
  work = tmp_path / 'run'
  # An evaluation every 2 steps holds the run there a while; it is stopped long before step 50.
  args = ('--config.total_steps=50', '--config.checkpoint_every=2', '--config.eval_every=2',
          '--config.data.workers=2')
  ckpts = str(work / 'checkpoints')
  stops = []
  for moment in ('workers start', 'mid-run'):
    procs = two_processes('train', work, *args, cwd=tmp_path)
    try:
      if moment == 'workers start':
        wait_for(lambda: all(_workers_of(p.pid) for p in procs), *procs, timeout=120)
      else:  # The resumed run saved a step: at an evaluation.
        wait_for(lambda: checkpoint.steps_in(ckpts)[-1] > stops[0], *procs, timeout=120)
      os.killpg(procs[0].pid, signal.SIGTERM)
      outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:  # Workers whose process was killed (a failed test) would outlive it.
      with contextlib.suppress(ProcessLookupError):
        os.killpg(procs[0].pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [143, 143], (moment, outs)
    steps = {preempted_at(out) for out in outs}
    assert len(steps) == 1, (moment, outs)
    stops.append(steps.pop())
    assert checkpoint.steps_in(ckpts)[-1] == stops[-1], (moment, outs)
    if moment == 'workers start':  # Ended by it: a worker that had not yet ignored SIGTERM.
      assert any('A data worker was ended by SIGTERM' in out for out in outs), outs
    else:
      assert all(f'Resumed from step {stops[0]}.' in out for out in outs), outs
  reference.assert_same_state(reference.uninterrupted_state(work, stops[1], processes=2),
                              reference.stored_state(work))
