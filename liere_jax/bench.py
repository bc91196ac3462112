r"""Benchmarks: the matrix exponential on realistic LieRE cases, and whole train/eval steps.

  python -m liere_jax.bench expm [--case NAME ...] [--impl NAME ...] [--repeats N] [--json]
  python -m liere_jax.bench step --config configs/cifar100.py:variant=Ti,pe=liere64 --vs pe=abs \
      --config.batch_size=128 [--steps N] [--breakdown] [--json]
      [--official /work/official/LieRE --official_script PATH --official_python PY]

expm: for each case (a stack of skew-symmetric generator combinations as LieRE builds them:
U[0, 2 pi) strict upper triangles, 2D, times normalized grid positions in [0, 1]) and each
implementation (liere_jax.expm methods fast / scipy / scipy_remat, and torch.matrix_exp when
torch imports): compile time (lower + compile of forward+backward), forward and
forward+backward time (the gradient of sum(R * G) in A, G a fixed random cotangent), XLA temp
memory of the compiled forward+backward, and errors against float64 SciPy on a subsample (max
|R - R64|, max |R^T R - I|, gradient relative error against scipy.linalg.expm_frechet). A
function whose temp memory would not fit is not run: its row says status 'oom'.

step: the config (A) and the same config with --vs applied to its argument string (B);
overrides --config.key=value apply to both. Train steps, then eval steps (rotations cached:
computed once outside the timed loop) of the two alternate in one process (A B, B A, A B, ...);
medians after warm-up, ratios A / B, random inputs of the config's shape. --breakdown adds the
train step with the rotations fed in (their gradient dropped), the encoding's own
forward+backward, and XLA FLOP counts (XLA counts a while loop's body once: the chunked
exponential is undercounted; the steps without it are counted exactly). --official times the
official PyTorch LieRE train step of A's shape in a subprocess (its interpreter needs torch,
einops and the official code's imports), one of its steps after each pair of ours.

Timings use block_until_ready and nothing device-specific: the same command runs on CPU, GPU
and TPU. The last line of --json output is the machine-readable result.
"""
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags
from ml_collections.config_flags import config_path

_CONFIG = config_flags.DEFINE_config_file('config', None, 'step: config file[:args].',
                                          lock_config=False)
_VS = flags.DEFINE_string('vs', None, 'step: arguments appended to the config argument string '
                          'for the baseline, e.g. pe=abs.')
_STEPS = flags.DEFINE_integer('steps', 10, 'step: timed steps of each (after warm-up).')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed calls of each before timing.')
_BREAKDOWN = flags.DEFINE_bool('breakdown', False, 'step: also time the train step with the '
                               'rotations cached, the encoding alone, and count XLA FLOPs.')
_OFFICIAL = flags.DEFINE_string('official', None, 'step: an official StanfordMIMI/LieRE '
                                'checkout; times its train step at the same shape.')
_OFFICIAL_SCRIPT = flags.DEFINE_string('official_script', '/work/official/time_official.py',
                                       'step: the timing script (build_official_model) to load.')
_OFFICIAL_PYTHON = flags.DEFINE_string('official_python', None, 'step: interpreter with torch, '
                                       "einops and the official code's imports; default: this.")
_OFFICIAL_THREADS = flags.DEFINE_integer('official_threads', None,
                                         'step: torch threads; default: CPU count.')
_CASE = flags.DEFINE_multi_string('case', None, 'expm: cases (default: all but tiny).')
_IMPL = flags.DEFINE_multi_string('impl', None, 'expm: implementations (default: all).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'expm: timed calls of each (after warm-up).')
_JSON = flags.DEFINE_bool('json', False, 'Print the result as JSON on the last line.')

MEMORY_FRACTION = 0.8  # Do not run a function whose buffers need more of the free memory.
SUBSAMPLE = 64  # Matrices checked against float64: half evenly spaced, half the largest norms.


# --------------------------------------------------------------------------------------------
# expm
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
  """layers x heads x tokens x (head_dim / block) matrices of size block."""
  layers: int
  heads: int
  grid: tuple
  block: int
  head_dim: int = 64

  @property
  def n_matrices(self):
    return self.layers * self.heads * math.prod(self.grid) * (self.head_dim // self.block)


# Matrix counts as the issue gives them. cifar_vitb_liere64 is 2,304 = 12 layers x 12 heads x 16
# tokens (a 4x4 grid); a 32x32 CIFAR image with patch 4 has 64 patches (+ CLS), i.e. 4x more.
CASES = {
    'cifar_vitb_liere64': Case(12, 12, (4, 4), 64),
    'imagenet_vitb16_liere64': Case(12, 12, (14, 14), 64),  # 28,224
    'imagenet_vitb16_liere8': Case(12, 12, (14, 14), 8),  # 225,792 blocks of 8x8
    'imagenet_vitb16_liere2': Case(12, 12, (14, 14), 2),  # 903,168 blocks of 2x2
    'tiny': Case(1, 2, (2, 2), 8, 16),  # 16 matrices; for the tests, not in the default list
    'tiny2': Case(1, 2, (2, 2), 2, 8),  # 32 matrices 2x2; likewise
}
DEFAULT_CASES = ('cifar_vitb_liere64', 'imagenet_vitb16_liere64', 'imagenet_vitb16_liere8',
                 'imagenet_vitb16_liere2')
IMPLS = ('scipy', 'scipy_remat', 'fast', 'torch')
ROW_KEYS = ('case', 'impl', 'n_matrices', 'size', 'compile_s', 'fwd_s', 'fwd_bwd_s',
            'temp_bytes', 'max_abs_err', 'orth_err', 'grad_rel_err', 'status')


def case_inputs(case: Case, seed: int = 0):
  """(a [m, b, b] float32 skew-symmetric, g [m, b, b] float32 cotangent) as numpy."""
  from liere_jax import rotations
  from liere_jax.positions import grid_positions
  rng = np.random.default_rng(seed)
  k, f = case.head_dim // case.block, rotations.num_free(case.block)
  gens = rng.uniform(0, 2 * np.pi, (case.layers, case.heads, 2, k, f)).astype(np.float32)
  pos = grid_positions(case.grid, case.grid, 'normalized')  # [T, 2] in [0, 1]
  coeffs = np.einsum('tn,lhnkf->lhtkf', pos, gens).astype(np.float32)
  a = np.asarray(rotations.skew(jnp.asarray(coeffs), case.block)).reshape(
      -1, case.block, case.block)
  g = rng.standard_normal(a.shape, dtype=np.float32)
  return a, g


def available_bytes(device=None) -> Optional[int]:
  """Free memory of a device: its allocator's limit (GPU/TPU), else (CPU, or device None)
  the host's free RAM."""
  stats = None
  try:
    stats = device.memory_stats() if device is not None else None
  except Exception:  # pylint: disable=broad-except
    pass
  if stats and 'bytes_limit' in stats:
    return int(stats['bytes_limit']) - int(stats.get('bytes_in_use', 0))
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None


def is_oom(e: BaseException) -> bool:
  if isinstance(e, MemoryError):
    return True
  msg = str(e)
  return any(s in msg for s in ('RESOURCE_EXHAUSTED', 'Out of memory', 'out of memory',
                                "can't allocate memory", 'Failed to allocate'))


def _timed(fn, *args):
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0, out


def _reference_errors(a64, r, grad, g):
  """Max |R - exp(A)|, max |R^T R - I| and the gradient's relative error, all vs float64.

  The gradient of sum(exp(A) * G) in A is L(A^T, G). LieRE's parameters reach A only through
  its skew-symmetric part (a_ij = c, a_ji = -c), and `fast` projects its gradient on it, so
  both sides are compared on grad - grad^T.
  """
  import scipy.linalg
  ref = np.stack([scipy.linalg.expm(x) for x in a64])
  out = {}
  if r is not None:
    r = np.asarray(r, np.float64)
    out['max_abs_err'] = float(np.abs(r - ref).max())
    eye = np.eye(r.shape[-1])
    out['orth_err'] = float(np.abs(np.einsum('mji,mjk->mik', r, r) - eye).max())
  if grad is not None:
    lref = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                     for x, y in zip(a64, np.asarray(g, np.float64))])
    lref = lref - np.swapaxes(lref, -1, -2)
    grad = np.asarray(grad, np.float64)
    grad = grad - np.swapaxes(grad, -1, -2)
    out['grad_rel_err'] = float(np.abs(grad - lref).max() / max(np.abs(lref).max(), 1e-30))
  return out


class _JaxImpl:
  """One liere_jax.expm method, jitted: forward and gradient of sum(R * G)."""

  def __init__(self, method):
    from liere_jax.expm import expm
    self.name = method
    self.fwd = jax.jit(lambda a: expm(a, method))
    self.fwd_bwd = jax.jit(jax.grad(lambda a, g: jnp.sum(expm(a, method) * g)))

  def prepare(self, a, g, row):
    """Compiles both and reads XLA's memory analysis: a function whose temp + output buffers
    exceed MEMORY_FRACTION of the free memory is not run (row status 'oom').
    a, g: device arrays (shared by the JAX implementations)."""
    self.a, self.g = a, g
    free = available_bytes(next(iter(a.devices())))
    t0 = time.perf_counter()
    self.fwd_c = self.fwd.lower(self.a).compile()
    compile_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    self.fwd_bwd_c = self.fwd_bwd.lower(self.a, self.g).compile()
    row['compile_s'] = time.perf_counter() - t0
    row['compile_fwd_s'] = compile_fwd
    mem = self.fwd_bwd_c.memory_analysis()
    mem_f = self.fwd_c.memory_analysis()
    row['temp_bytes'] = int(mem.temp_size_in_bytes) if mem is not None else None
    row['fwd_temp_bytes'] = int(mem_f.temp_size_in_bytes) if mem_f is not None else None
    need = lambda m: (m.temp_size_in_bytes + m.output_size_in_bytes) if m is not None else 0
    self.run_fwd = free is None or need(mem_f) <= MEMORY_FRACTION * free
    self.run_bwd = free is None or need(mem) <= MEMORY_FRACTION * free
    if not (self.run_fwd and self.run_bwd):
      row['status'] = 'oom'
      row['note'] = (f'needs {need(mem) / 2**30:.1f} GiB (fwd+bwd), {need(mem_f) / 2**30:.1f} '
                     f'GiB (fwd); {free / 2**30:.1f} GiB free')
    return True

  def call_fwd(self):
    return self.fwd_c(self.a)

  def call_fwd_bwd(self):
    return self.fwd_bwd_c(self.a, self.g)


class _TorchImpl:
  """torch.matrix_exp; its gradient through torch autograd."""

  def __init__(self):
    # torch's OpenMP threads spin-wait between calls by default and then compete with XLA's
    # threads in this process: on 2 cores that doubled torch's own times. Must precede import.
    os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
    import torch
    self.torch = torch
    self.name = 'torch'
    self.device = 'cuda' if torch.cuda.is_available() else 'cpu'

  def _sync(self):
    if self.device == 'cuda':
      self.torch.cuda.synchronize()

  # Peak memory of torch.matrix_exp forward+backward, measured on CPU (torch 2.13): about 50x
  # (64x64), 67x (8x8) and 85x (2x2) the input's bytes; the forward alone needs far less.
  # torch has no ahead-of-time memory analysis, so this bound decides whether to run.
  BWD_BYTES_FACTOR, FWD_BYTES_FACTOR = 96, 16

  def prepare(self, a, g, row):
    """a, g: numpy arrays. Decides from BWD/FWD_BYTES_FACTOR whether to run."""
    if self.device == 'cuda':
      free = self.torch.cuda.mem_get_info()[0]
    else:
      free = available_bytes(None)
    self.run_fwd = free is None or self.FWD_BYTES_FACTOR * a.nbytes <= MEMORY_FRACTION * free
    self.run_bwd = free is None or self.BWD_BYTES_FACTOR * a.nbytes <= MEMORY_FRACTION * free
    if not self.run_bwd:
      row['status'] = 'oom'
      row['note'] = (f'torch fwd+bwd would need ~{self.BWD_BYTES_FACTOR * a.nbytes / 2**30:.0f} '
                     f'GiB (estimated: {self.BWD_BYTES_FACTOR}x the input); {free / 2**30:.1f} '
                     'GiB free')
    self.a = self.torch.from_numpy(np.array(a)).to(self.device)
    self.g = self.torch.from_numpy(np.array(g)).to(self.device)
    return True

  def call_fwd(self):
    with self.torch.no_grad():
      r = self.torch.matrix_exp(self.a)
    self._sync()
    return r

  def call_fwd_bwd(self):
    a = self.a.detach().requires_grad_(True)
    (self.torch.matrix_exp(a) * self.g).sum().backward()
    self._sync()
    return a.grad


def _to_numpy(x, idx):
  if hasattr(x, 'detach'):
    return x.detach()[idx].cpu().numpy()
  return np.asarray(x[jnp.asarray(idx)])


def _make_impl(name):
  if name == 'torch':
    try:
      return _TorchImpl(), None
    except ImportError as e:
      return None, f'torch is not importable ({e})'
  return _JaxImpl(name), None


def bench_expm(cases: Sequence[str], impls: Sequence[str], repeats: int = 3, warmup: int = 1,
               log=print):
  """Rows (dicts with ROW_KEYS, plus compile_fwd_s, fwd_temp_bytes, note) per case and impl."""
  for c in cases:
    if c not in CASES:
      raise ValueError(f'Unknown case {c!r}; use one of {sorted(CASES)}.')
  for i in impls:
    if i not in IMPLS:
      raise ValueError(f'Unknown impl {i!r}; use one of {IMPLS}.')
  rows = []
  for case_name in cases:
    case = CASES[case_name]
    a, g = case_inputs(case)
    norms = np.abs(a).sum(-2).max(-1)
    idx = np.unique(np.concatenate([
        np.linspace(0, len(a) - 1, SUBSAMPLE // 2).astype(int),
        np.argsort(norms)[-(SUBSAMPLE // 2):]]))
    a64, g_sub = a[idx].astype(np.float64), g[idx]
    a_dev = g_dev = None  # One device copy for all JAX implementations.
    active = []
    for name in impls:
      row = dict.fromkeys(ROW_KEYS)
      row.update(case=case_name, impl=name, n_matrices=len(a), size=case.block, status='ok',
                 compile_fwd_s=None, fwd_temp_bytes=None, note=None, fwd_gflop=None)
      if name == 'fast':  # Counted, not from XLA (which counts a loop body once).
        from liere_jax.expm import fast_flops
        row['fwd_gflop'] = fast_flops(a) / 1e9
      rows.append(row)
      impl, why = _make_impl(name)
      if impl is None:
        row.update(status='unavailable', note=why)
        continue
      log(f'[{case_name}] {name}: compiling')
      try:
        if isinstance(impl, _JaxImpl):
          if a_dev is None:
            a_dev, g_dev = jnp.asarray(a), jnp.asarray(g)
          impl.prepare(a_dev, g_dev, row)
        else:
          impl.prepare(a, g, row)
        # First calls: warm-up, and the outputs the errors are measured on.
        r = grad = None
        if impl.run_fwd:
          r = _to_numpy(impl.call_fwd(), idx)
        if impl.run_bwd:
          grad = _to_numpy(impl.call_fwd_bwd(), idx)
        row.update(_reference_errors(a64, r, grad, g_sub))
      except Exception as e:  # pylint: disable=broad-except
        if not is_oom(e):
          raise
        row.update(status='oom', note=str(e).splitlines()[0][:200])
        impl.run_fwd = impl.run_bwd = False
      impl.times = {'fwd': [], 'fwd_bwd': []}
      active.append((impl, row))
    # Timing: implementations interleaved, call by call, so load on the machine hits all alike.
    for rep in range(max(warmup - 1, 0) + repeats):
      for impl, row in active:
        for kind, run in (('fwd', impl.run_fwd), ('fwd_bwd', impl.run_bwd)):
          if not run:
            continue
          try:
            dt, out = _timed(getattr(impl, 'call_' + kind))
            del out
          except Exception as e:  # pylint: disable=broad-except
            if not is_oom(e):
              raise
            row.update(status='oom', note=str(e).splitlines()[0][:200])
            setattr(impl, 'run_' + ('fwd' if kind == 'fwd' else 'bwd'), False)
            continue
          if rep >= max(warmup - 1, 0):
            impl.times[kind].append(dt)
    for impl, row in active:
      for kind in ('fwd', 'fwd_bwd'):
        if impl.times[kind]:
          row[kind + '_s'] = statistics.median(impl.times[kind])
      log(f'[{case_name}] {impl.name}: ' + ', '.join(
          f'{k}={row[k]:.3g}' for k in ('fwd_s', 'fwd_bwd_s') if row[k] is not None))
    del active, a_dev, g_dev
  return rows


def _fmt(x, spec):
  return '-' if x is None else format(x, spec)


def expm_table(rows) -> str:
  head = (f"{'case':26s} {'impl':12s} {'n':>8s} {'b':>3s} {'status':7s} {'compile':>8s} "
          f"{'fwd':>8s} {'fwd+bwd':>8s} {'x remat':>7s} {'temp MiB':>9s} {'max err':>8s} "
          f"{'orth':>8s} {'grad rel':>8s}")
  lines = [head, '-' * len(head)]
  ref = {r['case']: r['fwd_bwd_s'] for r in rows if r['impl'] == 'scipy_remat'}
  for r in rows:
    base = ref.get(r['case'])
    speed = base / r['fwd_bwd_s'] if base and r['fwd_bwd_s'] else None
    temp = None if r['temp_bytes'] is None else r['temp_bytes'] / 2**20
    lines.append(
        f"{r['case']:26s} {r['impl']:12s} {r['n_matrices']:8d} {r['size']:3d} {r['status']:7s} "
        f"{_fmt(r['compile_s'], '8.2f')} {_fmt(r['fwd_s'], '8.3f')} "
        f"{_fmt(r['fwd_bwd_s'], '8.3f')} {_fmt(speed, '7.2f')} {_fmt(temp, '9.1f')} "
        f"{_fmt(r['max_abs_err'], '8.1e')} {_fmt(r['orth_err'], '8.1e')} "
        f"{_fmt(r['grad_rel_err'], '8.1e')}")
  notes = [f"  {r['case']} / {r['impl']}: {r['note']}" for r in rows if r.get('note')]
  notes += [f"  {r['case']} / fast: {r['fwd_gflop']:.1f} GFLOP forward "
            f"({r['fwd_gflop'] * 1e9 / (2 * r['size']**3 * r['n_matrices']):.1f} products per "
            f"matrix), {r['fwd_gflop'] / r['fwd_s']:.0f} GFLOP/s"
            for r in rows if r.get('fwd_gflop') and r.get('fwd_s')]
  return '\n'.join(lines + (['notes:'] + notes if notes else []))


# --------------------------------------------------------------------------------------------
# step
# --------------------------------------------------------------------------------------------
def load_config(spec: str, overrides: dict):
  """'path[:args]' -> ConfigDict, with flat {'a.b': value} overrides applied."""
  import importlib.util
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('bench_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  cfg = module.get_config(*([arg] if arg else []))
  for key, value in overrides.items():
    config_path.set_value(key, cfg, value)
  return cfg


def with_args(spec: str, extra: str) -> str:
  """'configs/x.py:a=1' + 'b=2' -> 'configs/x.py:a=1,b=2' (later keys win in parse_arg)."""
  path, sep, arg = spec.partition(':')
  args = [s for s in arg.split(',') if s] if sep else []
  new = [s for s in extra.split(',') if s]
  keys = {s.partition('=')[0] for s in new}
  args = [s for s in args if s.partition('=')[0] not in keys] + new
  return f"{path}:{','.join(args)}" if args else path


def random_batches(config, seed=0):
  """A train batch (one-hot labels) and an eval batch (int labels, mask) of the config's shape."""
  m = config.model
  rng = np.random.default_rng(seed)
  b = config.batch_size
  image = rng.standard_normal((b,) + tuple(m.input_size) + (m.channels,), dtype=np.float32)
  label = rng.integers(0, m.num_classes, b).astype(np.int32)
  train = dict(image=image, label=np.eye(m.num_classes, dtype=np.float32)[label])
  evalb = dict(image=image, label=label, mask=np.ones(b, bool))
  return train, evalb


class _StepBench:
  """One config: its trainer, compiled train/eval steps, state and batches."""

  def __init__(self, config, mesh, breakdown=False):
    from liere_jax import train_lib
    self.config = config
    self.trainer = t = train_lib.Trainer(config, mesh)
    self.state = t.init_state(config.seed)
    train, evalb = random_batches(config)
    self.train_batch, self.eval_batch = t.global_batch(train), t.global_batch(evalb)
    self.grid = tuple(s // p for s, p in zip(config.model.input_size, config.model.patch))
    t0 = time.perf_counter()
    self.train_c = t.train_step.lower(self.state, self.train_batch).compile()
    self.compile_s = time.perf_counter() - t0
    self.ctx = t.pe_context(self.state['params'], self.grid)  # cached, outside the timed loop
    t0 = time.perf_counter()
    self.eval_c = t.eval_step.lower(self.state['params'], self.eval_batch, self.ctx,
                                    None).compile()
    self.eval_compile_s = time.perf_counter() - t0
    self.flops = _flops(self.train_c)
    self.eval_flops = _flops(self.eval_c)
    self.times = {'train': [], 'eval': []}
    self.extra = {}
    if breakdown:
      self._build_breakdown()

  def train(self):
    self.state, metrics = self.train_c(self.state, self.train_batch)
    return self.state, metrics

  def eval(self):
    return self.eval_c(self.state['params'], self.eval_batch, self.ctx)

  def _build_breakdown(self):
    """The train step with the context fed in (no gradient to the encoding), and the encoding's
    own forward+backward (the rotations' cost), as separate compiled functions."""
    import optax
    t = self.trainer

    def cached_step(params, batch, ctx):
      rng = jax.random.key(0)

      def loss_fn(params):
        logits = t.model(params, train=True, rng=rng)(batch['image'], ctx=ctx)
        return optax.softmax_cross_entropy(logits, batch['label']).mean()
      return jax.grad(loss_fn)(params)

    def pe_fwd_bwd(params):
      def f(params):
        ctx = t.model(params).pe_context(self.grid)
        return sum(jnp.sum(x) for x in jax.tree.leaves(ctx)) if ctx is not None else 0.
      return jax.grad(f)(params)

    p = self.state['params']
    self.cached_c = jax.jit(cached_step).lower(p, self.train_batch, self.ctx).compile()
    self.pe_c = jax.jit(pe_fwd_bwd).lower(p).compile()
    self.extra['xla_flops_pe_fwd_bwd'] = _flops(self.pe_c)
    self.extra['flops_train_cached_rot'] = _flops(self.cached_c)
    self.times.update(train_cached_rot=[], pe_fwd_bwd=[])

  def train_cached_rot(self):
    return self.cached_c(self.state['params'], self.train_batch, self.ctx)

  def pe_fwd_bwd(self):
    return self.pe_c(self.state['params'])


def _flops(compiled):
  try:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0]
    return float(cost['flops'])
  except Exception:  # pylint: disable=broad-except
    return None


# A subprocess that runs one official train step per line it reads and answers its seconds.
# It loads the timing script from a path (never copied into this repo) and uses its
# build_official_model, so the model is the one that script times.
_OFFICIAL_WORKER = textwrap.dedent('''
    import importlib.util, json, sys, time, contextlib, io
    script, checkout, pe, block, batch, threads, size, patch, classes, dim, depth, heads, mlp = \
        json.loads(sys.argv[1])
    try:
      import torch, einops
      spec = importlib.util.spec_from_file_location('time_official', script)
      mod = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(mod)
      torch.set_num_threads(threads)
      torch.manual_seed(0)
      with contextlib.redirect_stdout(io.StringIO()):
        model = mod.build_official_model(pe, block, checkout, dim=dim, depth=depth, heads=heads,
                                         mlp_dim=mlp, image_size=size, patch_size=patch,
                                         num_classes=classes)
      model.train()
      opt = torch.optim.Adam(model.parameters(), lr=1e-4)
      loss_fn = torch.nn.CrossEntropyLoss()
      x = torch.randn(batch, 3, size, size)
      y = torch.randint(0, classes, (batch,))
    except Exception as e:
      print(json.dumps({'error': f'{type(e).__name__}: {e}'}), flush=True)
      sys.exit(0)
    print(json.dumps({'ready': torch.__version__}), flush=True)
    for line in sys.stdin:
      t0 = time.perf_counter()
      opt.zero_grad(set_to_none=True)
      loss = loss_fn(model(x), y)
      loss.backward()
      opt.step()
      loss.item()
      print(json.dumps({'s': time.perf_counter() - t0}), flush=True)
''')

_OFFICIAL_PE = {'abs': ('absolute', None), 'rope_mixed': ('rope_mixed', None)}


class _Official:
  """The official PyTorch train step in a worker process; step() runs one and returns seconds."""

  def __init__(self, config, checkout, script, python, threads):
    m = config.model
    from liere_jax import encodings, model as model_lib
    width, depth, heads, mlp = model_lib.dims(m)
    block = encodings.liere_block(m.pe.name)
    pe = ('liere', block) if block else _OFFICIAL_PE.get(m.pe.name)
    self.proc, self.error = None, None
    if pe is None:
      self.error = f'no official counterpart of pe={m.pe.name}'
      return
    if len(m.input_size) != 2 or m.input_size[0] != m.input_size[1] or m.channels != 3:
      self.error = 'the official timing covers square 2D RGB images only'
      return
    if not os.path.exists(script):
      self.error = f'--official_script {script} does not exist'
      return
    args = [script, checkout, pe[0], pe[1], config.batch_size, threads or os.cpu_count(),
            m.input_size[0], m.patch[0], m.num_classes, width, depth, heads, mlp]
    self.proc = subprocess.Popen([python or sys.executable, '-c', _OFFICIAL_WORKER,
                                  json.dumps(args)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    first = json.loads(self.proc.stdout.readline() or '{"error": "worker died"}')
    if 'error' in first:
      self.error = first['error']
      self.close()
    else:
      self.torch_version = first['ready']

  def step(self):
    self.proc.stdin.write('step\n')
    self.proc.stdin.flush()
    return json.loads(self.proc.stdout.readline())['s']

  def close(self):
    if self.proc is not None:
      self.proc.stdin.close()
      self.proc.wait()
      self.proc = None


def bench_step(config, baseline, *, names=('A', 'B'), steps=10, warmup=2, breakdown=False,
               official=None, log=print):
  """Times config (A) against baseline (B): train and eval steps, alternating A, B.

  official: None or dict(checkout, script, python, threads): also time the official PyTorch
  train step of A's shape, one step after each pair of ours.
  """
  from liere_jax import train_lib
  mesh = train_lib.make_mesh()
  log('compiling A')
  a = _StepBench(config, mesh, breakdown)
  log('compiling B')
  b = _StepBench(baseline, mesh, breakdown)
  off = None
  if official:
    off = _Official(config, official['checkout'], official['script'], official.get('python'),
                    official.get('threads'))
    if off.error:
      log(f'official: unavailable ({off.error})')
  off_times = []
  kinds = ['train', 'eval'] + (['train_cached_rot', 'pe_fwd_bwd'] if breakdown else [])
  # One loop per kind of step; within it A and B alternate, in the order A B, B A, A B, ...
  # (a step right after another kind of step, or after the other config's, can run slower:
  # each config goes first as often as second).
  for kind in kinds:
    for i in range(warmup + steps):
      for bench in ((a, b) if i % 2 == 0 else (b, a)):
        dt, out = _timed(getattr(bench, kind))
        del out
        if i >= warmup:
          bench.times[kind].append(dt)
      if kind == 'train' and off is not None and off.proc is not None:
        dt = off.step()
        if i >= warmup:
          off_times.append(dt)
  if off is not None:
    off.close()
  med = lambda bench, k: statistics.median(bench.times[k])
  res = {
      'config': names[0], 'baseline': names[1],
      'platform': jax.devices()[0].platform, 'devices': jax.device_count(),
      'batch_size': config.batch_size, 'steps': steps,
      'train_s': med(a, 'train'), 'baseline_train_s': med(b, 'train'),
      'train_ratio': med(a, 'train') / med(b, 'train'),
      'eval_s': med(a, 'eval'), 'baseline_eval_s': med(b, 'eval'),
      'eval_ratio': med(a, 'eval') / med(b, 'eval'),
      'compile_s': a.compile_s, 'baseline_compile_s': b.compile_s,
      'eval_compile_s': a.eval_compile_s, 'baseline_eval_compile_s': b.eval_compile_s,
      'flops_train': a.flops, 'baseline_flops_train': b.flops,
      'flops_eval': a.eval_flops, 'baseline_flops_eval': b.eval_flops,
  }
  if breakdown:
    res.update({
        'train_cached_rot_s': med(a, 'train_cached_rot'),
        'baseline_train_cached_rot_s': med(b, 'train_cached_rot'),
        'cached_rot_ratio': med(a, 'train_cached_rot') / med(b, 'train_cached_rot'),
        'pe_fwd_bwd_s': med(a, 'pe_fwd_bwd'),
        'baseline_pe_fwd_bwd_s': med(b, 'pe_fwd_bwd'),
        'xla_flops_pe_fwd_bwd': a.extra['xla_flops_pe_fwd_bwd'],
        'flops_train_cached_rot': a.extra['flops_train_cached_rot'],
        'baseline_flops_train_cached_rot': b.extra['flops_train_cached_rot'],
    })
  if official:
    if off_times:
      res['official_train_s'] = statistics.median(off_times)
      res['speedup_vs_official'] = res['official_train_s'] / res['train_s']
      res['official_torch'] = off.torch_version
    else:
      res['official_train_s'] = res['speedup_vs_official'] = None
      res['official_note'] = off.error
  return res


def step_table(res) -> str:
  lines = [f"A = {res['config']}", f"B = {res['baseline']}",
           f"{'':22s} {'A':>10s} {'B':>10s} {'A / B':>8s}"]
  row = lambda name, x, y: lines.append(
      f'{name:22s} {_fmt(x, "10.4f")} {_fmt(y, "10.4f")} '
      f'{_fmt(x / y if x and y else None, "8.3f")}')
  row('train step (s)', res['train_s'], res['baseline_train_s'])
  row('eval step, cached (s)', res['eval_s'], res['baseline_eval_s'])
  row('compile train (s)', res['compile_s'], res['baseline_compile_s'])
  row('compile eval (s)', res['eval_compile_s'], res['baseline_eval_compile_s'])
  row('train GFLOP (XLA)', _g(res['flops_train']), _g(res['baseline_flops_train']))
  row('eval GFLOP (XLA)', _g(res['flops_eval']), _g(res['baseline_flops_eval']))
  if 'train_cached_rot_s' in res:
    row('train, ctx cached (s)', res['train_cached_rot_s'], res['baseline_train_cached_rot_s'])
    row('train, ctx cached GFLOP', _g(res['flops_train_cached_rot']),
        _g(res['baseline_flops_train_cached_rot']))
    lines.append(f"{'encoding fwd+bwd (s)':22s} {_fmt(res['pe_fwd_bwd_s'], '10.4f')} "
                 f"{_fmt(res['baseline_pe_fwd_bwd_s'], '10.4f')}   (XLA GFLOP "
                 f"{_fmt(_g(res['xla_flops_pe_fwd_bwd']), '.2f')}: counts a loop body once)")
  if 'official_train_s' in res:
    if res['official_train_s']:
      lines.append(f"official PyTorch train step (s): {res['official_train_s']:.4f}  "
                   f"-> A is {res['speedup_vs_official']:.2f}x faster")
    else:
      lines.append(f"official PyTorch: unavailable ({res.get('official_note')})")
  return '\n'.join(lines)


def _g(x):
  return None if x is None else x / 1e9


# --------------------------------------------------------------------------------------------
def main(argv):
  if len(argv) != 2 or argv[1] not in ('expm', 'step'):
    raise app.UsageError('Usage: python -m liere_jax.bench {expm,step} [flags]; see --help.')
  log = lambda s: print(s, file=sys.stderr, flush=True)
  if argv[1] == 'expm':
    rows = bench_expm(_CASE.value or DEFAULT_CASES, _IMPL.value or IMPLS, _REPEATS.value,
                      max(_WARMUP.value, 1) if _WARMUP.present else 1, log=log)
    print(f'platform: {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), '
          f'jax {jax.__version__}')
    print(expm_table(rows))
    if _JSON.value:
      print(json.dumps(rows))
    return
  if _CONFIG.value is None or _VS.value is None:
    raise app.UsageError('step needs --config CONFIG[:args] and --vs ARGS.')
  spec = config_flags.get_config_filename(flags.FLAGS['config'])
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  spec_b = with_args(spec, _VS.value)
  baseline = load_config(spec_b, overrides)
  official = None
  if _OFFICIAL.value:
    official = dict(checkout=_OFFICIAL.value, script=_OFFICIAL_SCRIPT.value,
                    python=_OFFICIAL_PYTHON.value, threads=_OFFICIAL_THREADS.value)
  res = bench_step(_CONFIG.value, baseline, names=(spec, spec_b), steps=_STEPS.value,
                   warmup=_WARMUP.value, breakdown=_BREAKDOWN.value, official=official, log=log)
  res['overrides'] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in overrides.items()}
  print(f'platform: {res["platform"]} x{res["devices"]}, jax {jax.__version__}, '
        f'batch {res["batch_size"]}, {res["steps"]} timed steps (medians)')
  print(step_table(res))
  if _JSON.value:
    print(json.dumps(res, default=str))


if __name__ == '__main__':
  app.run(main)
