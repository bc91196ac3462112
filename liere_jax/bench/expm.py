r"""bench expm: liere_jax.expm methods (and torch.matrix_exp) on realistic LieRE cases.

  python -m liere_jax.bench expm [--case NAME ...] [--impl NAME ...] [--repeats N] [--json]

For each case (a stack of skew-symmetric generator combinations as LieRE builds them:
U[0, 2 pi) strict upper triangles, 2D, times normalized grid positions in [0, 1]) and each
implementation (liere_jax.expm: `impl_numerics`'s fast / scipy / loop / cond / select / pallas,
and torch.matrix_exp when
torch imports): compile time (lower + compile of forward+backward), forward and
forward+backward time (the gradient of sum(R * G) in A, G a fixed random cotangent), XLA temp
memory of the compiled forward+backward, and errors against float64 SciPy on a subsample (max
|R - R64|, max |R^T R - I|, gradient relative error against scipy.linalg.expm_frechet). A
function whose temp memory would not fit is not run: its row says status 'oom'.
"""
import dataclasses
import math
import os
import re
import statistics
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from liere_jax.bench.flops import fast_flops
from liere_jax.bench.timing import fmt, table, timed

MEMORY_FRACTION = 0.8  # Do not run a function whose buffers need more of the free memory.
SUBSAMPLE = 64  # Matrices checked against float64: half evenly spaced, half the largest norms.


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


# cifar_vitb_liere64 is 2,304 matrices = 12 layers x 12 heads x 16 tokens (a 4x4 grid); a 32x32
# CIFAR image with patch 4 has 64 patches (+ CLS), 4x more (bench rotations' cases have them).
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
IMPLS = ('scipy', 'fast', 'torch')  # The default set ('fast': this backend's plan); also XLA's
# forms loop, cond and select, and pallas (the Pallas kernel; interpret mode on CPU: slow).
ALL_IMPLS = IMPLS + ('loop', 'cond', 'select', 'pallas')
ROW_KEYS = ('case', 'impl', 'n_matrices', 'size', 'compile_s', 'fwd_s', 'fwd_bwd_s',
            'temp_bytes', 'max_abs_err', 'orth_err', 'grad_rel_err', 'status')


def parse_case(name: str) -> Case:
  """A CASES name, 'MxB' (M matrices of B x B: M positions of a 2D grid, one block per head)
  or 'LxHxG1xG2[xG3]/B' (L layers x H heads x a 2D or 3D grid, blocks of B in 64 head dims)."""
  if name in CASES:
    return CASES[name]
  m = re.fullmatch(r'(\d+)x(\d+)', name)
  if m and int(m[1]) > 0 and int(m[2]) > 1:
    return Case(1, 1, (int(m[1]),), int(m[2]), head_dim=int(m[2]))
  m = re.fullmatch(r'(\d+)x(\d+)x(\d+(?:x\d+){1,2})/(\d+)', name)
  if m and int(m[4]) > 1 and 64 % int(m[4]) == 0:
    return Case(int(m[1]), int(m[2]), tuple(int(g) for g in m[3].split('x')), int(m[4]))
  raise ValueError(f'--case {name!r} is neither a case ({", ".join(sorted(CASES))}) nor a '
                   'shape: MxB (e.g. 4096x32) or LxHxGRID/B with B dividing 64 (e.g. '
                   '12x12x14x14/8).')


def case_inputs(case: Case, seed: int = 0):
  """(a [m, b, b] float32 skew-symmetric, g [m, b, b] float32 cotangent) as numpy."""
  from liere_jax import rotations
  from liere_jax.positions import grid_positions
  rng = np.random.default_rng(seed)
  k, f = case.head_dim // case.block, rotations.num_free(case.block)
  if len(case.grid) == 1:  # M matrices: the first M points of a 2D grid.
    side = math.isqrt(case.grid[0] - 1) + 1
    pos = grid_positions((side, side), (side, side), 'normalized')[:case.grid[0]]
  else:
    pos = grid_positions(case.grid, case.grid, 'normalized')  # [T, n] in [0, 1]
  gens = rng.uniform(0, 2 * np.pi, (case.layers, case.heads, pos.shape[1], k, f)).astype(
      np.float32)
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


def impl_numerics(name: str, precision: str = 'auto', platform=None):
  """The numerics plan of a JAX impl: the platform's (default: this backend's), its exponential
  replaced by the impl's."""
  from liere_jax import numerics as numerics_lib
  numerics = numerics_lib.plan(platform).at_precision(precision)
  if name == 'pallas':
    return numerics.replace(expm_kernel=True)
  return numerics if name == 'fast' else numerics.replace(expm=name, expm_kernel=False)


class _JaxImpl:
  """One exponential (impl_numerics), jitted: forward and gradient of sum(R * G)."""

  def __init__(self, method, precision='auto'):
    from liere_jax.expm import expm
    self.name = method
    numerics = impl_numerics(method, precision)
    self.fwd = jax.jit(lambda a: expm(a, numerics))
    self.fwd_bwd = jax.jit(jax.grad(lambda a, g: jnp.sum(expm(a, numerics) * g)))

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


def _make_impl(name, precision):
  if name == 'torch':
    try:
      return _TorchImpl(), None
    except ImportError as e:
      return None, f'torch is not importable ({e})'
  return _JaxImpl(name, precision), None


def bench_expm(cases: Sequence[str], impls: Sequence[str], repeats: int = 3, warmup: int = 1,
               precision='auto', log=print):
  """Rows (dicts with ROW_KEYS, plus compile_fwd_s, fwd_temp_bytes, note) per case (parse_case)
  and impl; the JAX impls' products at `precision` (liere_jax.numerics.PRECISIONS)."""
  from liere_jax.numerics import PRECISIONS
  parsed = {c: parse_case(c) for c in cases}
  for i in impls:
    if i not in ALL_IMPLS:
      raise ValueError(f'Unknown impl {i!r}; use one of {ALL_IMPLS}.')
  if precision not in PRECISIONS:
    raise ValueError(f'--precision={precision!r} is unknown; use one of {PRECISIONS}.')
  rows = []
  for case_name in cases:
    case = parsed[case_name]
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
                 compile_fwd_s=None, fwd_temp_bytes=None, note=None, fwd_gflop=None,
                 precision=None if name == 'torch' else precision)
      if name in ('fast', 'loop', 'cond', 'select'):  # Counted (XLA counts a loop body once).
        row['fwd_gflop'] = fast_flops(a, form='auto' if name == 'fast' else name) / 1e9
      rows.append(row)
      impl, why = _make_impl(name, precision)
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
            dt, out = timed(getattr(impl, 'call_' + kind))
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


def expm_table(rows) -> str:
  head = (f"{'case':26s} {'impl':12s} {'n':>8s} {'b':>3s} {'status':7s} {'compile':>8s} "
          f"{'fwd':>8s} {'fwd+bwd':>8s} {'x scipy':>7s} {'temp MiB':>9s} {'max err':>8s} "
          f"{'orth':>8s} {'grad rel':>8s}")
  lines = []
  ref = {r['case']: r['fwd_bwd_s'] for r in rows if r['impl'] == 'scipy'}
  for r in rows:
    base = ref.get(r['case'])
    speed = base / r['fwd_bwd_s'] if base and r['fwd_bwd_s'] else None
    temp = None if r['temp_bytes'] is None else r['temp_bytes'] / 2**20
    lines.append(
        f"{r['case']:26s} {r['impl']:12s} {r['n_matrices']:8d} {r['size']:3d} {r['status']:7s} "
        f"{fmt(r['compile_s'], '8.2f')} {fmt(r['fwd_s'], '8.3f')} "
        f"{fmt(r['fwd_bwd_s'], '8.3f')} {fmt(speed, '7.2f')} {fmt(temp, '9.1f')} "
        f"{fmt(r['max_abs_err'], '8.1e')} {fmt(r['orth_err'], '8.1e')} "
        f"{fmt(r['grad_rel_err'], '8.1e')}")
  notes = [f"  {r['case']} / {r['impl']}: {r['note']}" for r in rows if r.get('note')]
  notes += [f"  {r['case']} / {r['impl']}: {r['fwd_gflop']:.1f} GFLOP forward "
            f"({r['fwd_gflop'] * 1e9 / (2 * r['size']**3 * r['n_matrices']):.1f} products per "
            f"matrix), {r['fwd_gflop'] / r['fwd_s']:.0f} GFLOP/s"
            for r in rows if r.get('fwd_gflop') and r.get('fwd_s')]
  return '\n'.join([table(head, lines)] + (['notes:'] + notes if notes else []))
