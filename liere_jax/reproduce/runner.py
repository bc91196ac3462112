"""Running a suite: each unfinished run's training and evaluation as a subprocess of the
installed programs (python -m liere_jax.train / liere_jax.eval), its wall time and commit, and
its report row. A process per program, not training.train_and_evaluate here: glibc reads
MALLOC_TUNABLES when a process starts, a run's memory goes back when it ends, and its log is the
command's output."""
import contextlib
import importlib.resources
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Tuple

import liere_jax
from liere_jax import paths
from liere_jax.reproduce.paper import PLATEAU_EXIT, TRAIN_GRID
from liere_jax.reproduce.suites import SUITES, Run, Suite

LIBRARY = os.path.dirname(os.path.abspath(liere_jax.__file__))


def config_file() -> str:
  """The library's configs/arrows.py, wherever the library is installed."""
  return str(importlib.resources.files('liere_jax.configs').joinpath('arrows.py'))


def machine() -> str:
  import jax  # pylint: disable=import-outside-toplevel
  return (f'{platform.machine()} {os.cpu_count()} cores, {jax.devices()[0].device_kind}, '
          f'jax {jax.__version__}')


def commit(library: str = LIBRARY) -> str:
  """HEAD of the git checkout the library is tracked in (with '+' when tracked files changed),
  or '' for a library outside one (an installed copy)."""
  def git(*args):  # Popen: the suite's subprocess.run is for the programs only.
    with subprocess.Popen(['git', *args], cwd=library, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as proc:
      out = proc.communicate()[0].strip()
    return out if proc.returncode == 0 else None

  try:
    if git('ls-files', '--error-unmatch', '__init__.py') is None:
      return ''
    head = git('rev-parse', '--short', 'HEAD')
    dirty = git('status', '--porcelain', '--untracked-files=no')
  except OSError:  # No git.
    return ''
  return '' if head is None else head + ('+' if dirty else '')


def plateau_exit(workdir: str, threshold: float = PLATEAU_EXIT) -> Optional[int]:
  """The first logged step from which train accuracy stays >= threshold to the end of the run
  (paths.read_metrics; a step logged twice, as after a resume, counts as its last entry), or
  None."""
  accuracy = {m['step']: m['accuracy'] for m in paths.read_metrics(workdir) if 'accuracy' in m}
  exit_step = None
  for step in sorted(accuracy, reverse=True):
    if accuracy[step] < threshold:
      break
    exit_step = step
  return exit_step


def _read(path) -> Optional[dict]:
  return paths.read_json(path) if paths.path(path).exists() else None


def _results(workdir: str, out: str) -> Optional[dict]:
  return _read(os.path.join(workdir, out, 'results.json'))


def _trained(workdir: str) -> bool:
  """Whether training finished: its final evaluation (at total_steps) is logged."""
  config = _read(os.path.join(workdir, 'config.json'))
  return config is not None and any(
      m.get('step') == config['total_steps'] and 'eval_accuracy' in m
      for m in paths.read_metrics(workdir))


def _walls(workdir: str) -> dict:
  return _read(os.path.join(workdir, 'reproduce_wall.json')) or {}


def _add_wall(workdir: str, key: str, seconds: float, code: str):
  walls = _walls(workdir)
  walls[key] = walls.get(key, 0.) + seconds
  walls['machine'] = machine()
  walls.setdefault('commit', code)  # The code the run was trained at: HEAD when it started.
  paths.write(os.path.join(workdir, 'reproduce_wall.json'), json.dumps(walls, indent=1))


@contextlib.contextmanager
def _log(workdir: str, name: str):
  """A file for a program's output that ends as workdir/name, appended to: directly on a local
  disk; on a bucket (no appends) through a local file, uploaded whole with the older log."""
  target = paths.path(workdir) / name
  if not paths.is_url(workdir):
    with open(target, 'a') as f:
      yield f
    return
  with tempfile.TemporaryFile('w+') as f:
    try:
      yield f
    finally:
      f.seek(0)
      paths.write(target, (target.read_text() if target.exists() else '') + f.read())


def command(args: List[str]) -> str:
  """A program's command line as a report shows it."""
  return 'python ' + ' '.join(args)


def row(run: Run, suite: Suite, runs_dir: str, extra: Tuple[str, ...]) -> Optional[dict]:
  """A run's report row, or None if it has not finished."""
  workdir = os.path.join(runs_dir, run.dirname(extra))
  res = _results(workdir, suite.evaluation.out)
  if res is None:
    return None
  walls = _walls(workdir)
  top1, shuffled = res['top1'], res['shuffled_top1']
  sequential = res.get('positions_default')  # The eval program's name for the default mode.
  resolutions = {size: {'sequential' if mode == sequential else mode: acc
                        for mode, acc in by_mode.items()}
                 for size, by_mode in res['resolutions'].items()}
  return dict(
      run=run.dirname(extra), pe=run.pe, px=run.px, seed=run.seed, label=run.label,
      overrides=dict(run.overrides), top1=top1, top1_ci95=res['top1_ci95'],
      shuffled_top1=shuffled, shuffle_drop_rel=(top1 - shuffled) / top1 if top1 else 0.,
      n_examples=res['n_examples'], resolutions=resolutions, steps=res['step'],
      plateau_exit=plateau_exit(workdir),
      wall_s=walls.get('train_s', 0.) + walls.get(suite.evaluation.out + '_s', 0.),
      machine=walls.get('machine', ''), commit=walls.get('commit', ''),
      command=' && '.join(command(a) for a in (run.train_args(workdir, extra),
                                               suite.evaluation.args(workdir))))


def rows(name: str, runs_dir: str, extra: Tuple[str, ...]) -> List[dict]:
  """The rows of the suite's finished runs under runs_dir, in the suite's order."""
  suite = SUITES[name]
  return [r for r in (row(run, suite, runs_dir, extra) for run in suite.runs) if r]


def _cost(run: Run) -> float:
  """A run's cost relative to the main job: its tokens times its steps, roughly."""
  steps = dict(run.overrides).get('total_steps')
  return (run.grid / TRAIN_GRID) ** 2 * (int(steps) / _main_steps() if steps else 1.)


def _main_steps() -> int:
  from liere_jax.configs import arrows  # pylint: disable=import-outside-toplevel
  return arrows.get_config().total_steps


# XLA:CPU allocates a step's temporaries anew every step (~10 GB at 276 px, the attention
# scores), and with glibc's defaults every step page-faults them in again: 2.1M minor faults a
# step at 276 px, ~45% of the CPU time in the kernel. Huge pages on request cut the faults ~130x,
# and with no mmap and no trim freed memory stays in the heap: 276 px runs went from 8.2-8.8 to
# 10.4-12.1 images/s (docs/reproduce.md). A value the user set is kept; other libcs ignore it.
MALLOC_TUNABLES = ('glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:'
                   'glibc.malloc.trim_threshold=68719476736')


def _environment(runs_dir: str) -> dict:
  """The programs import the library this process imported, with MALLOC_TUNABLES and JAX's
  persistent compilation cache in <runs_dir>/.jax_cache (values the user set are kept): a
  suite's seeds and evaluations compile the same programs (LieRE8's train at 108 px, 2 steps:
  21.1 s from a cold cache, 14.5 s from a warm one, on 2 busy cores)."""
  path = os.pathsep.join(p for p in (os.path.dirname(LIBRARY), os.environ.get('PYTHONPATH'))
                         if p)
  return {'GLIBC_TUNABLES': MALLOC_TUNABLES,
          'JAX_COMPILATION_CACHE_DIR': os.path.join(runs_dir, '.jax_cache'),
          **os.environ, 'PYTHONPATH': path}


def run_suite(name: str, runs_dir: str, extra: Tuple[str, ...], dry_run: bool = False,
              log=print, only: Tuple[str, ...] = ()) -> List[dict]:
  """Runs the suite's unfinished runs (only those whose encoding or run name is in `only`,
  if given); returns the rows of its finished ones."""
  suite = SUITES[name]
  todo = [r for r in suite.runs if (not only or r.pe in only or r.dirname(extra) in only)
          and row(r, suite, runs_dir, extra) is None]
  done = sum(row(r, suite, runs_dir, extra) is not None for r in suite.runs)
  log(f'suite {name}: {len(suite.runs)} runs, {done} done here, {len(todo)} to run now '
      f'(workdirs under {runs_dir})')
  spent, cost_done = 0., 0.
  for i, run in enumerate(todo):
    workdir = os.path.join(runs_dir, run.dirname(extra))
    shown = [run.train_args(workdir, extra + ('--progress=false',)),
             suite.evaluation.args(workdir)]
    eta = (spent / cost_done * sum(map(_cost, todo[i:]))) if cost_done else None
    log(f'[{i + 1}/{len(todo)}] {os.path.basename(workdir)}' + (
        f' (ETA {eta / 60:.0f} min for the rest)' if eta is not None else ''))
    if dry_run:
      for args in shown:
        log('  ' + command(args))
      continue
    paths.path(workdir).mkdir(parents=True, exist_ok=True)
    start, code = time.time(), commit()
    steps = [run.train_args(workdir, extra + ('--progress=false',), config=config_file()),
             shown[1]]
    for key, args, shown_args in zip(('train_s', suite.evaluation.out + '_s'), steps, shown):
      if key == 'train_s' and _trained(workdir):
        continue  # Trained by this or another suite; only its evaluation is missing.
      t0 = time.time()
      log_name = f'reproduce_{key[:-2]}.log'
      with _log(workdir, log_name) as logf:
        proc = subprocess.run([sys.executable] + args, stdout=logf, stderr=subprocess.STDOUT,
                              env=_environment(runs_dir), check=False)
      if proc.returncode:
        raise RuntimeError(f'{command(shown_args)} failed (exit {proc.returncode}); see '
                           f'{os.path.join(workdir, log_name)}. Fix it and run the suite '
                           'again: finished runs are kept.')
      _add_wall(workdir, key, time.time() - t0, code)
    spent += time.time() - start
    cost_done += _cost(run)
  return rows(name, runs_dir, extra)


def merge_rows(name: str, new: List[dict], extra: Tuple[str, ...], out_dir: str) -> List[dict]:
  """`new` (from workdirs here) over the rows of the committed <out_dir>/<name>.json, for
  the runs the suite still defines, in the suite's order: a report is rebuilt without the
  workdirs, and a suite run in parts (or on several machines) adds up."""
  path = os.path.join(out_dir, f'{name}.json')
  old = []
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
  by_run = {r['run']: r for r in old}
  by_run.update({r['run']: r for r in new})
  order = [run.dirname(extra) for run in SUITES[name].runs]
  return [by_run[n] for n in order if n in by_run]
