r"""bench step: train and eval steps of a config (A) against a baseline (B).

  python -m liere_jax.bench step --config configs/cifar100.py:variant=Ti,pe=liere64 --vs pe=abs \
      --config.batch_size=128 [--steps N] [--breakdown] [--json]
      [--official DIR [--official_python PY] [--official_threads N]]

B is the config with --vs applied to its argument string; overrides --config.key=value apply to
both, --vs items config.key=value to B only (e.g. `--config.model.scan_layers=True --vs
config.model.scan_layers=False`: scan against loop), --vs items FIELD=VALUE replace a field of
B's numerics plan (liere_jax.numerics, e.g. attention=xla, pairs=swap_matmul, expm=cond).
Train steps, then eval steps (rotations cached: computed once outside the timed loop) of the two alternate in one process (A B, B A, A B, ...);
medians after warm-up, ratios A / B, random inputs of the config's shape. --breakdown adds the
train step with the rotations fed in (their gradient dropped), the encoding's own
forward+backward, and XLA FLOP counts (XLA counts a while loop's body once: the chunked
exponential is undercounted; the steps without it are counted exactly). --official times the
official PyTorch LieRE train step of A's shape in a subprocess (peer.py; its interpreter needs
torch, einops and the official code's imports), one of its steps after each pair of ours.
"""
import ast
import dataclasses
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections.config_flags import config_path

from liere_jax import numerics as numerics_lib
from liere_jax.config import load
from liere_jax.bench import peer
from liere_jax.tpu_slices import CHIPS
from liere_jax.bench.flops import liere_flops, model_flops
from liere_jax.bench.timing import fmt, interleaved


def load_config(spec: str, overrides: dict):
  """'path[:args]' -> ConfigDict, with flat {'a.b': value} overrides applied."""
  cfg = load(spec)
  for key, value in overrides.items():
    config_path.set_value(key, cfg, value)
  return cfg


def with_args(spec: str, extra: str) -> str:
  """'configs/x.py:a=1' + 'b=2' -> 'configs/x.py:a=1,b=2' (later keys win in parse_arg).
  Items of `extra` that start with 'config.' are overrides (vs_overrides) and those that name a
  numerics field are the plan's (vs_numerics), not arguments."""
  path, sep, arg = spec.partition(':')
  args = [s for s in arg.split(',') if s] if sep else []
  new = [s for s in extra.split(',') if s and not s.startswith('config.')
         and s.partition('=')[0] not in NUMERICS_FIELDS]
  keys = {s.partition('=')[0] for s in new}
  args = [s for s in args if s.partition('=')[0] not in keys] + new
  return f"{path}:{','.join(args)}" if args else path


def vs_overrides(extra: str) -> dict:
  """'pe=abs,config.model.scan_layers=False' -> {'model.scan_layers': False}: the baseline's own
  overrides, applied over the shared --config.KEY ones. Values are Python literals or strings."""
  out = {}
  for item in filter(None, extra.split(',')):
    if item.startswith('config.'):
      key, sep, value = item[len('config.'):].partition('=')
      if not sep:
        raise ValueError(f'--vs item {item!r} needs a value: config.KEY=VALUE.')
      try:
        out[key] = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        out[key] = value
  return out


# The plan's fields --vs may replace: the choices between programs (not the products, a value).
NUMERICS_FIELDS = {f.name: f.type for f in dataclasses.fields(numerics_lib.Numerics)
                   if f.name not in ('platform', 'products')}


def vs_numerics(extra: str) -> dict:
  """'pe=abs,attention=xla' -> {'attention': 'xla'}: the fields of the numerics plan
  (liere_jax.numerics) the baseline replaces; checked against this backend's plan."""
  out = {}
  for name, _, value in (s.partition('=') for s in extra.split(',')):
    if name in NUMERICS_FIELDS:
      kind = NUMERICS_FIELDS[name]
      out[name] = (value.lower() in ('1', 'true', 'yes') if kind in (bool, 'bool') else
                   int(value) if kind in (int, 'int') else value)
  if out:
    try:
      numerics_lib.plan().replace(**out)
    except ValueError as e:
      raise ValueError(f'--vs: {e}') from None
  return out


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


class StepBench:
  """One config: its trainer, compiled train/eval steps, state and batches."""

  def __init__(self, config, mesh, breakdown=False, numerics=None):
    from liere_jax import steps
    from liere_jax.config import run as run_spec
    self.config = config
    self.trainer = t = steps.Trainer(run_spec.resolve(config, mesh.devices.size), mesh,
                                     numerics_lib.for_mesh(mesh, **(numerics or {})))
    self.state = t.init_state(config.seed)
    train, evalb = random_batches(config)
    self.train_batch, self.eval_batch = t.global_batch(train), t.global_batch(evalb)
    self.grid = tuple(s // p for s, p in zip(config.model.input_size, config.model.patch))
    t0 = time.perf_counter()
    self.train_c = t.train_step.lower(self.state, self.train_batch).compile()
    self.compile_s = time.perf_counter() - t0
    self.ctx = t.pe_context(self.state['params'], self.grid)  # cached, outside the timed loop
    t0 = time.perf_counter()
    self.eval_c = t.eval_step.lower(self.state['params'], self.eval_batch, self.ctx).compile()
    self.eval_compile_s = time.perf_counter() - t0
    self.flops = _flops(self.train_c)
    self.eval_flops = _flops(self.eval_c)
    self.model_flops = model_flops(t.spec, config.batch_size)
    self.expm_flops = _expm_flops(t, self.state['params'], self.grid, mesh.shape['data'])
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
        ctx = t.model(params).pe_context(self.grid)  # Its float leaves (abs's: none).
        return sum((jnp.sum(x, dtype=jnp.float32) for x in jax.tree.leaves(ctx)
                    if jnp.issubdtype(x.dtype, jnp.floating)), jnp.float32(0))
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


def _expm_flops(trainer, params, grid, n):
  """Counted forward FLOPs of LieRE's rotations (bench.flops.liere_flops: the exponentials and
  the lattice path's products): one device's share when split over n devices (the largest) and
  all of them on one. None for encodings without exponentials."""
  from liere_jax.positions import grid_positions, with_prefix
  spec = trainer.spec
  if spec.pe.family != 'liere' or not spec.pe.expm.startswith('fast') or spec.pe.block == 2:
    return None
  pos = with_prefix(grid_positions(grid, spec.train_grid, spec.pe.positions), spec.num_prefix)
  gens = jax.device_get(params)['pe']['generators']
  per_device, one_device = liere_flops(gens, pos, spec.pe.block, n_devices=n,
                                       form=spec.pe.expm.partition('_')[2] or 'auto')
  return {'per_device': per_device, 'one_device': one_device, 'devices': n}


# Library calls whose FLOPs XLA's cost analysis does not see (cuBLAS / cuDNN GEMMs, convolutions
# and attention on GPUs; oneDNN's on CPUs).
_OPAQUE_CALLS = re.compile(r'custom_call_target="(__cublas|__cudnn|__onednn)')


def _flops(compiled):
  """XLA's FLOP count of a compiled step, None where it is not the whole step: the products
  handed to a library (custom calls) are missing, and a loop's body is counted once."""
  try:
    text = compiled.as_text()
    if _OPAQUE_CALLS.search(text) or re.search(r'\swhile\(', text):
      return None
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0]
    return float(cost['flops'])
  except Exception:  # pylint: disable=broad-except
    return None


def bench_step(config, baseline, *, names=('A', 'B'), steps=10, warmup=2, breakdown=False,
               official=None, baseline_numerics=None, log=print):
  """Times config (A) against baseline (B): train and eval steps, alternating A, B.

  baseline_numerics: {field: value} replaced in B's numerics plan (an A/B of two forms of one
    computation: vs_numerics).
  official: None or dict(checkout, python=None, threads=None): also time the official PyTorch
  train step of A's shape (liere_jax.bench.peer), one step after each pair of ours. Its worker
  starts first, so a wrong checkout (or an A without official counterpart) fails with
  peer.OfficialError before anything compiles.
  """
  from liere_jax.steps import make_mesh
  off = None
  if official:
    try:
      off = peer.Official(config, official['checkout'], python=official.get('python'),
                          threads=official.get('threads'))
    except ValueError as e:  # No official counterpart of A.
      raise peer.OfficialError(str(e)) from e
    log(f"official: RoPEViT from {official['checkout']}, torch {off.info['torch']} on "
        f"{off.info['device']} ({off.info['threads']} threads), {off.info['params']:,} params")
  try:
    mesh = make_mesh(model_parallel=config.model_parallel)
    log('compiling A')
    a = StepBench(config, mesh, breakdown)
    log('compiling B')
    b = StepBench(baseline, mesh, breakdown, baseline_numerics)
    res = _run_steps(a, b, off, names, steps, warmup, breakdown)
    kind = jax.devices()[0].device_kind
    res['device_kind'] = kind
    res['peak_flops'] = peak_flops(kind)
    return res
  finally:
    if off is not None:
      off.close()


def _run_steps(a, b, off, names, steps, warmup, breakdown):
  off_times = []
  kinds = ['train', 'eval'] + (['train_cached_rot', 'pe_fwd_bwd'] if breakdown else [])
  # One loop per kind of step; within it A and B alternate, in the order A B, B A, A B, ...
  # (a step right after another kind of step, or after the other config's, can run slower:
  # each config goes first as often as second).
  def official_step(kept):  # One of the official code's after each pair of ours.
    dt = off.step()
    if kept:
      off_times.append(dt)
  for kind in kinds:
    a.times[kind], b.times[kind] = interleaved(
        [getattr(a, kind), getattr(b, kind)], steps, warmup, alternate=True,
        after_round=official_step if kind == 'train' and off is not None else None)
  med = lambda bench, k: statistics.median(bench.times[k])
  res = {
      'config': names[0], 'baseline': names[1],
      'platform': jax.devices()[0].platform, 'devices': jax.device_count(),
      'batch_size': a.config.batch_size, 'steps': steps,
      'train_s': med(a, 'train'), 'baseline_train_s': med(b, 'train'),
      'train_ratio': med(a, 'train') / med(b, 'train'),
      'eval_s': med(a, 'eval'), 'baseline_eval_s': med(b, 'eval'),
      'eval_ratio': med(a, 'eval') / med(b, 'eval'),
      'compile_s': a.compile_s, 'baseline_compile_s': b.compile_s,
      'eval_compile_s': a.eval_compile_s, 'baseline_eval_compile_s': b.eval_compile_s,
      'model_flops_train': a.model_flops, 'baseline_model_flops_train': b.model_flops,
      'flops_train': a.flops, 'baseline_flops_train': b.flops,
      'flops_eval': a.eval_flops, 'baseline_flops_eval': b.eval_flops,
      'expm_flops': a.expm_flops,
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
  if off is not None:
    res['official_train_s'] = statistics.median(off_times)
    res['official_over_train'] = res['official_train_s'] / res['train_s']
    res['official_over_baseline_train'] = res['official_train_s'] / res['baseline_train_s']
    res['official'] = dict(off.info, kwargs=off.kwargs)
  return res


# Dense bf16 tensor-core peaks (vendor data sheets), for the model FLOP utilisation; TPUs'
# from bench.compile.CHIPS.
PEAK_BF16_FLOPS = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12, 'L4': 121e12}


def peak_flops(device_kind: str):
  """The bf16 peak FLOP/s of a device, None where not known (CPUs)."""
  tpu = next((c.peak_flops for c in CHIPS.values() if c.device_kind == device_kind), None)
  return tpu or next((v for k, v in PEAK_BF16_FLOPS.items() if k in device_kind), None)


def step_table(res) -> str:
  lines = [f"A = {res['config']}", f"B = {res['baseline']}",
           f"{'':22s} {'A':>10s} {'B':>10s} {'A / B':>8s}"]
  row = lambda name, x, y: lines.append(
      f'{name:22s} {fmt(x, "10.4f"):>10s} {fmt(y, "10.4f"):>10s} '
      f'{fmt(x / y if x and y else None, "8.3f"):>8s}')
  row('train step (s)', res['train_s'], res['baseline_train_s'])
  row('eval step, cached (s)', res['eval_s'], res['baseline_eval_s'])
  row('compile train (s)', res['compile_s'], res['baseline_compile_s'])
  row('compile eval (s)', res['eval_compile_s'], res['baseline_eval_compile_s'])
  # MFU counts the ViT's products from its shapes (bench.flops.model_flops); XLA's count is shown
  # only where it is the whole step ('-': a library's GEMMs or a loop body it misses).
  row('train GFLOP (model)', _g(res['model_flops_train']), _g(res['baseline_model_flops_train']))
  row('train GFLOP (XLA)', _g(res['flops_train']), _g(res['baseline_flops_train']))
  per_s = lambda t: res['batch_size'] / t if t else None
  row('train images/s', per_s(res['train_s']), per_s(res['baseline_train_s']))
  if res.get('peak_flops'):
    mfu = lambda f, t: f / t / res['peak_flops']
    row(f"MFU ({res['peak_flops'] / 1e12:.0f} TFLOP/s)",
        mfu(res['model_flops_train'], res['train_s']),
        mfu(res['baseline_model_flops_train'], res['baseline_train_s']))
  row('eval GFLOP (XLA)', _g(res['flops_eval']), _g(res['baseline_flops_eval']))
  if res.get('expm_flops'):
    e = res['expm_flops']
    lines.append(f"A's exponentials, forward GFLOP per device (counted): "
                 f"{_g(e['per_device']):.3f} on {e['devices']} devices, "
                 f"{_g(e['one_device']):.3f} on one ({e['per_device'] / e['one_device']:.4f})")
  if 'train_cached_rot_s' in res:
    row('train, ctx cached (s)', res['train_cached_rot_s'], res['baseline_train_cached_rot_s'])
    row('train, ctx cached GFLOP', _g(res['flops_train_cached_rot']),
        _g(res['baseline_flops_train_cached_rot']))
    lines.append(f"{'encoding fwd+bwd (s)':22s} {fmt(res['pe_fwd_bwd_s'], '10.4f')} "
                 f"{fmt(res['baseline_pe_fwd_bwd_s'], '10.4f')}   (XLA GFLOP "
                 f"{fmt(_g(res['xla_flops_pe_fwd_bwd']), '.2f')}: counts a loop body once)")
  if 'official_train_s' in res:
    lines.append(f"official PyTorch LieRE train step, A's shape (s): "
                 f"{res['official_train_s']:.4f}  (torch {res['official']['torch']}, "
                 f"{res['official']['device']})")
    lines.append(f"  official / A: {res['official_over_train']:.2f}x   "
                 f"official / B: {res['official_over_baseline_train']:.2f}x")
  return '\n'.join(lines)


def _g(x):
  return None if x is None else x / 1e9
