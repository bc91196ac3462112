"""Grain worker processes (data.workers, to_iterator) give exactly the batches of ds[k], also on
resume, and outlive SIGTERM to the process group, also while they start: a run of two processes
with workers stopped by it saves the step they agree on and resumes bit-identically. The `bench
data` CLI reports images/s per worker count."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

from absl import flags
import grain
import numpy as np
import pytest

from liere_jax import checkpoint
from liere_jax.config import data_config
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


def _sigterm_blocked_and_pending(pid: int) -> bool:
  status = dict(line.split(':\t') for line in open(f'/proc/{pid}/status').read().splitlines())
  bit = 1 << (signal.SIGTERM - 1)
  return all(int(status[key], 16) & bit for key in ('SigBlk', 'ShdPnd'))


@pytest.mark.usefixtures('absl_flags_parsed')
def test_workers_outlive_a_sigterm_to_the_process_group():
  """...also one that reaches a worker while it starts (it waits, blocked, until the worker
  ignores it), with a dataset of more than a pipe holds (spawning blocks until the worker reads
  it). The main process notes SIGTERM and saves its step from the batches the workers still make
  (train.train); a worker ended by it would fail the run unsaved, or hang it."""
  payload = bytes(100_000)
  ds = grain.MapDataset.range(64).map(lambda k: k + payload[k])
  at_start = []

  def sigterm_when_started():  # As `kill -TERM -PGID` reaches them (not this pytest process).
    while not (workers := _workers_of(os.getpid())):
      time.sleep(0.005)
    for pid in workers:
      os.kill(pid, signal.SIGTERM)
      at_start.append(_sigterm_blocked_and_pending(pid))
  killer = threading.Thread(target=sigterm_when_started)
  killer.start()
  it = pipeline.to_iterator(ds, workers=1, threads=1, prefetch=1)
  try:
    assert next(it) == 0
    killer.join()
    assert at_start == [True]  # It came before the worker could ignore it.
    workers = _workers_of(os.getpid())
    for pid in workers:  # Once they run.
      os.kill(pid, signal.SIGTERM)
    assert [next(it) for _ in range(1, 40)] == list(range(1, 40))
    assert workers and _workers_of(os.getpid()) == workers
  finally:
    it.close()
  assert not _workers_of(os.getpid())  # close() still ends them.


@pytest.mark.usefixtures('absl_flags_parsed')
def test_workers_and_resume_give_the_batches_of_ds_k(tmp_path):
  datasets.prepare(datasets.Cifar100, str(tmp_path), sizes=dict(train=12, test=4))
  cfg = resolve_data(data_config(name='cifar100', data_dir=str(tmp_path),
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


def test_two_processes_with_workers_stopped_by_sigterm_to_their_group_save_the_agreed_step(
    tmp_path):
  """Two processes (jax.distributed, one device each) with data.workers=2, sent SIGTERM as a
  pod's VMs shut down: to the whole process group. Once while the workers start, once mid-run in
  the resumed run (at its first evaluation). Both
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
        workers = [w for p in procs for w in _workers_of(p.pid)]
      else:  # The resumed run saved a step: at an evaluation.
        wait_for(lambda: checkpoint.steps_in(ckpts)[-1] > stops[0], *procs, timeout=120)
      os.killpg(procs[0].pid, signal.SIGTERM)
      if moment == 'workers start':  # It reached a worker while it started: it waits there.
        assert any(_sigterm_blocked_and_pending(w) for w in workers)
      outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:  # Workers whose process was killed (a failed test) would outlive it.
      with contextlib.suppress(ProcessLookupError):
        os.killpg(procs[0].pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [143, 143], (moment, outs)
    steps = {preempted_at(out) for out in outs}
    assert len(steps) == 1, (moment, outs)
    stops.append(steps.pop())
    assert checkpoint.steps_in(ckpts)[-1] == stops[-1], (moment, outs)
    if moment == 'mid-run':
      assert all(f'Resumed from step {stops[0]}.' in out for out in outs), outs
  reference.assert_same_state(reference.uninterrupted_state(work, stops[1], processes=2),
                              reference.stored_state(work))
