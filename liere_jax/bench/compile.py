"""bench compile: a config's train and eval steps compiled for a Cloud TPU slice on this machine,
before paying for the slice.

JAX compiles ahead of time for TPU devices that are not there: `get_topology_desc` gives the
devices of a slice (libtpu, `requirements-tpu.txt`), our `Trainer` builds its mesh, shardings and
steps over them exactly as `train.py` would on the pod, and the TPU compiler reports what each
chip holds (`memory_analysis`) and does (`cost_analysis`). Nothing here runs a step: the step
time and MFU are a roofline estimate from the compiler's counts and the chip's published peak
and bandwidth (CHIPS), not a measurement.

  python -m liere_jax.bench compile --config configs/imagenet.py:pe=liere64 \
      --topology v5litepod-256 [--vs pe=abs] [--train_only] [--json]
"""
import dataclasses
import math
import os
import re
from typing import Optional

import jax
import numpy as np

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU generation as Cloud TPU sells it: `family-N` accelerator types."""
  family: str  # The accelerator type's prefix: v4-8, v5litepod-8, v5p-8, v6e-8.
  topology: str  # get_topology_desc's name for it.
  device_kind: str  # jax's device_kind.
  hbm: int  # Bytes a chip.
  peak_flops: float  # bf16 FLOP/s a chip.
  hbm_bw: float  # Bytes/s a chip.
  cores_in_name: bool  # N counts TensorCores (2 a chip, one megacore device), else chips.
  dims: int  # Of the chip torus.
  sizes: tuple  # The chip counts sold.
  source: str


# Each generation's published per-chip figures (Cloud TPU system architecture pages).
CHIPS = {c.family: c for c in [
    Chip('v4', 'v4', 'TPU v4', 32 * GiB, 275e12, 1200e9, True, 3,
         tuple(2**i for i in range(2, 13)), 'https://cloud.google.com/tpu/docs/v4'),
    Chip('v5litepod', 'v5e', 'TPU v5 lite', 16 * GiB, 197e12, 819e9, False, 2,
         (1, 4, 8, 16, 32, 64, 128, 256), 'https://cloud.google.com/tpu/docs/v5e'),
    Chip('v5p', 'v5p', 'TPU v5', 95 * GiB, 459e12, 2765e9, True, 3,
         tuple(2**i for i in range(2, 13)), 'https://cloud.google.com/tpu/docs/v5p'),
    Chip('v6e', 'v6e', 'TPU v6 lite', 32 * GiB, 918e12, 1640e9, False, 2,
         (1, 4, 8, 16, 32, 64, 128, 256), 'https://cloud.google.com/tpu/docs/v6e'),
]}
CHIPS_PER_HOST = 4  # A VM of a multi-host slice; one-host slices: v5e / v6e up to 8 chips.


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str  # v5litepod-8
  chip: Chip
  chips: int
  shape: tuple  # Chips along each torus axis.
  hosts: int

  @property
  def host_shape(self):
    if self.hosts == 1:
      return self.shape + (1,) * (3 - len(self.shape))
    return (2, 2, 1)

  def devices(self):
    """The slice's devices, as jax.devices() lists them on the pod (deviceless)."""
    os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')  # No metadata server off a TPU VM.
    os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # Its lock file: several processes.
    try:
      from jax.experimental import topologies
      topology = topologies.get_topology_desc(
          f"{self.chip.topology}:{'x'.join(map(str, self.shape))}", 'tpu',
          chips_per_host_bounds=self.host_shape,
          chip_config_name='megacore' if self.chip.cores_in_name else 'default')
    except Exception as e:  # pylint: disable=broad-except
      if 'tpu' in str(e).lower():  # libtpu missing, or another platform's jax.
        raise RuntimeError(f'--topology {self.name} needs the TPU compiler: pip install -r '
                           f'requirements-tpu.txt ({type(e).__name__}: {str(e)[:200]})') from e
      raise
    return topology.devices


def _torus(chips: int, dims: int) -> tuple:
  """Chips -> the torus shape Cloud TPU gives that many (2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...;
  1x1, 2x2, 2x4, 4x4, 4x8, 8x8, ...): double the smallest axis, the last of equals."""
  if chips == 1:
    return (1,) * dims
  shape = [2, 2] + [1] * (dims - 2)
  while math.prod(shape) < chips:
    small = min(shape)
    i = max(j for j, s in enumerate(shape) if s == small)
    shape[i] *= 2
  return tuple(shape)


def parse_slice(name: str) -> Slice:
  """'v5litepod-256', 'v4-32', 'v5p-128', 'v6e-8' -> its Slice; a one-line error otherwise."""
  family, _, n = name.partition('-')
  chip = CHIPS.get(family)
  known = ', '.join(f'{c.family}-N (N in {c.sizes[0] * (2 if c.cores_in_name else 1)}..'
                    f'{c.sizes[-1] * (2 if c.cores_in_name else 1)})' for c in CHIPS.values())
  if chip is None or not n.isdigit():
    raise ValueError(f'--topology={name!r} is not a Cloud TPU accelerator type; use {known}.')
  chips = int(n) // 2 if chip.cores_in_name else int(n)
  if chips not in chip.sizes or (chip.cores_in_name and int(n) % 2):
    sold = [s * (2 if chip.cores_in_name else 1) for s in chip.sizes]
    raise ValueError(f'--topology={name!r}: {family} slices are {family}-N for N in {sold}.')
  one_host = CHIPS_PER_HOST if chip.cores_in_name else 8
  hosts = 1 if chips <= one_host else chips // CHIPS_PER_HOST
  return Slice(name, chip, chips, _torus(chips, chip.dims), hosts)


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


def compile_steps(run, devices, steps=('train', 'eval')) -> dict:
  """The run's train and eval steps (`steps`) compiled for `devices` with the mesh, shardings
  and batch train.py uses there: {'train': Compiled, 'eval': Compiled}."""
  from liere_jax.steps import Trainer, make_mesh
  trainer = Trainer(run, make_mesh(devices, run.loop.model_parallel))
  m = run.model
  image = (run.loop.batch_size,) + tuple(m.input_size) + (m.channels,)
  batch = {'image': jax.ShapeDtypeStruct(
               image, np.uint8 if trainer.pixels is not None else np.float32),
           'label': jax.ShapeDtypeStruct((run.loop.batch_size, m.num_classes), np.float32)}
  batch = _abstract(batch, {k: trainer.batch_sharding for k in batch})
  out = {}
  with jax.set_mesh(trainer.mesh):
    if 'train' in steps:
      out['train'] = trainer.train_step.jitted.trace(trainer.abstract_state,
                                                     batch).lower().compile()
    if 'eval' in steps:
      params = _abstract(trainer.param_shapes, trainer.param_sharding)
      ctx = jax.eval_shape(lambda p: trainer._pe_context_fn(p, m.train_grid, None), params)
      ctx = _abstract(ctx, jax.tree.map(lambda _: trainer.replicated, ctx))
      b = run.evaluation.batch_size
      ebatch = {'image': jax.ShapeDtypeStruct((b,) + image[1:], np.float32),
                'label': jax.ShapeDtypeStruct((b,), np.int32),
                'mask': jax.ShapeDtypeStruct((b,), np.bool_)}
      ebatch = _abstract(ebatch, {k: trainer.batch_sharding for k in ebatch})
      out['eval'] = trainer.eval_step.jitted.trace(params, ebatch, ctx).lower().compile()
  return out


# --- What the compiled program does: memory, the compiler's counts, the roofline, LieRE's part.

# Named scopes (jax.named_scope in the library) -> the part of the step they are.
SCOPES = (('liere_expm', 'exponential'), ('liere_lattice', 'lattice'),
          ('pe_rotate', 'rotation application'))
_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's4': 1, 'u4': 1, 'bf16': 2, 'f16': 2, 's16': 2,
                'u16': 2, 'f32': 4, 's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8,
                'c64': 8, 'c128': 16}
_SKIP = {'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast', 'after-all',
         'partition-id', 'replica-id', 'while', 'conditional', 'call', 'opt-barrier'}
_ARRAY = re.compile(r'(\w+)\[([\d,]*)\](?:\{([\d,]*)(?::T\((\d+),(\d+)\))?[^}]*\})?')
_INSTR = re.compile(r'^\s*(?:ROOT )?%(\S+) = ')
_HEADER = re.compile(r'^(?:ENTRY )?%(\S+) .*\{$')


def _array_bytes(type_str: str):
  """(logical, as laid out) bytes of an HLO type: tiled layouts T(a,b) round the two most
  minor dimensions up to the tile (an 8 x 8 float32 block takes an 8 x 128 tile on a TPU)."""
  logical = padded = 0
  for dtype, dims, layout, ta, tb in _ARRAY.findall(type_str):
    size = _DTYPE_BYTES.get(dtype, 0)
    shape = [int(d) for d in dims.split(',') if d]
    n = math.prod(shape)
    logical += size * n
    if ta and layout and shape:
      order = [int(i) for i in layout.split(',')]
      padded_shape = list(shape)
      for i, tile in zip(order[:2], (int(tb), int(ta))):
        padded_shape[i] = -(-shape[i] // tile) * tile
      n = math.prod(padded_shape)
    padded += size * n
  return logical, padded


def _split_type(rest: str):
  """'TYPE opcode(operands), attrs' -> (TYPE, opcode, operands, attrs)."""
  if rest.startswith('('):
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == '('
      depth -= ch == ')'
      if depth == 0:
        break
    type_str, rest = rest[:i + 1], rest[i + 2:]
  else:
    type_str, _, rest = rest.partition(' ')
  opcode, _, rest = rest.partition('(')
  depth, i = 1, 0
  while depth and i < len(rest):
    depth += rest[i] == '('
    depth -= rest[i] == ')'
    i += 1
  return type_str, opcode, rest[:i - 1], rest[i:]


def hlo_traffic(text: str) -> list:
  """The compiled module's top-level instructions (fusions, custom calls, copies, collectives;
  not the computations fused into them), each with its HBM bytes (operands read + result
  written, logical and as laid out) times the trip count of the loops around it:
  [{'name', 'opcode', 'type', 'scope', 'op_name', 'bytes', 'padded_bytes', 'count'}]."""
  comps, order, fused, calls = {}, [], set(), {}
  current = None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(' '):
      current = header.group(1)
      comps[current] = []
      order.append(current)
      if line.startswith('ENTRY'):
        entry = current
      continue
    m = _INSTR.match(line)
    if m and current:
      type_str, opcode, operands, attrs = _split_type(line[m.end():])
      comps[current].append((m.group(1), type_str, opcode, operands, attrs))
      for key in ('calls', 'to_apply'):
        fused.update(re.findall(key + r'=%([\w.\-]+)', attrs))
      trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
      for sub in re.findall(r'(?:body|condition)=%([\w.\-]+)', attrs):
        calls.setdefault(current, []).append((sub, int(trip.group(1)) if trip else 1))
      for sub in re.findall(r'%([\w.\-]+)', (re.search(r'branch_computations=\{([^}]*)\}',
                                                      attrs) or re.search('()', '')).group(1)):
        calls.setdefault(current, []).append((sub, 1))
  count = {entry: 1}
  stack = [entry]
  while stack:
    c = stack.pop()
    for sub, n in calls.get(c, []):
      count[sub] = count.get(sub, 0) + count[c] * n
      stack.append(sub)
  out = []
  for comp, mult in count.items():
    sizes = {name: _array_bytes(t) for name, t, *_ in comps.get(comp, [])}
    names = {}  # An instruction the compiler added (a copy, a layout change) has no op_name:
    for name, type_str, opcode, operands, attrs in comps.get(comp, []):  # its operand's, marked.
      args = re.findall(r'%([\w.\-]+)', operands)
      own = re.search(r'op_name="([^"]*)"', attrs)
      names[name] = own.group(1) if own else next(
          (f'({opcode} of) {names[a].removeprefix("(")}' for a in args if names.get(a)), '')
      if opcode in _SKIP or comp in fused:
        continue
      read = [sizes.get(o, (0, 0)) for o in args]
      written = sizes[name]
      op_name = names[name]
      scope = next((part for key, part in SCOPES if key in op_name), 'other')
      out.append({'name': name, 'opcode': opcode, 'type': type_str, 'scope': scope,
                  'op_name': op_name, 'count': mult,
                  'bytes': mult * (written[0] + sum(r[0] for r in read)),
                  'padded_bytes': mult * (written[1] + sum(r[1] for r in read))})
  return out


_OOM = re.compile(r'required for (.+?) \(([\d.]+)([KMGT])\) exceeds available HBM '
                  r'\(([\d.]+)([KMGT])\)')
_UNIT = {'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


class DoesNotFit(Exception):
  """The step needs more memory a chip than the chip has (the TPU compiler's refusal)."""

  def __init__(self, what, need, available):
    super().__init__(f'{what} need {need / GiB:.2f} GiB of the {available / GiB:.2f} GiB')
    self.what, self.need, self.available = what, need, available


def _compile(run, devices, eval_step):
  try:
    return compile_steps(run, devices, ('train', 'eval') if eval_step else ('train',))
  except Exception as e:  # pylint: disable=broad-except
    m = _OOM.search(str(e))
    if m is None:
      raise
    raise DoesNotFit(m.group(1), float(m.group(2)) * _UNIT[m.group(3)],
                     float(m.group(4)) * _UNIT[m.group(5)]) from None


def _state_bytes(run, devices) -> int:
  """Bytes a chip of the train state (parameters and Adam's moments) in its sharding."""
  from liere_jax import steps
  t = steps.Trainer(run, steps.make_mesh(devices, run.loop.model_parallel))
  leaves = jax.tree.leaves(t.abstract_state)
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in leaves)


def _bench_env():
  """libtpu reads these while it loads off a TPU VM; set for that moment only, so that nothing
  (jax.distributed's cluster detection) mistakes this machine for a pod host."""
  quiet = {'TPU_ACCELERATOR_TYPE': 'v5litepod-8', 'TPU_WORKER_HOSTNAMES': 'localhost'}
  saved = {k: os.environ.get(k) for k in quiet}
  os.environ.update({k: v for k, v in quiet.items() if saved[k] is None})
  return saved


def _restore_env(saved):
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)


def slice_devices(slice_):
  saved = _bench_env()
  try:
    return slice_.devices()
  finally:
    _restore_env(saved)


def compile_report(run, slice_, eval_step: bool = True, top: int = 5) -> dict:
  """The run compiled for the slice: per chip memory, whether it fits, the compiler's FLOPs and
  bytes a step, the roofline step time and MFU, LieRE's part of the traffic and the largest
  instructions. A run that does not fit has 'fits' False, the compiler's figures and 'advice'."""
  from liere_jax.bench.flops import model_flops
  chip, devices = slice_.chip, slice_devices(slice_)
  data = slice_.chips // run.loop.model_parallel
  res = {'topology': slice_.name, 'device_kind': chip.device_kind, 'chips': slice_.chips,
         'hosts': slice_.hosts, 'mesh': {'data': data, 'model': run.loop.model_parallel},
         'sharding': run.loop.sharding, 'batch': run.loop.batch_size,
         'batch_per_host': run.loop.batch_size // slice_.hosts,
         'batch_per_chip': run.loop.batch_size / data, 'hbm': chip.hbm,
         'peak_flops': chip.peak_flops, 'hbm_bw': chip.hbm_bw, 'source': chip.source,
         'remat': run.model.remat}
  try:
    compiled = _compile(run, devices, eval_step)
  except DoesNotFit as e:
    state = _state_bytes(run, devices)
    res.update(fits=False, need=e.need + state, available=e.available, state=state)
    res['advice'] = _advice(run, res, temp=e.need)
    return res
  for name, c in compiled.items():
    ma, cost = c.memory_analysis(), c.cost_analysis()
    mem = {'arguments': ma.argument_size_in_bytes, 'temporaries': ma.temp_size_in_bytes,
           'outputs': ma.output_size_in_bytes, 'aliased': ma.alias_size_in_bytes,
           'code': ma.generated_code_size_in_bytes}
    mem['need'] = (mem['arguments'] + mem['outputs'] - mem['aliased'] + mem['temporaries']
                   + mem['code'])
    flops, nbytes = float(cost.get('flops', 0)), float(cost.get('bytes accessed', 0))
    step_s = max(flops / chip.peak_flops, nbytes / chip.hbm_bw)
    useful = model_flops(run.model, run.loop.batch_size if name == 'train'
                         else run.evaluation.batch_size, train=name == 'train') / slice_.chips
    res[name] = dict(mem, flops=flops, bytes=nbytes, model_flops=useful, step_s=step_s,
                     bound='memory' if nbytes / chip.hbm_bw > flops / chip.peak_flops
                     else 'compute', mfu=useful / step_s / chip.peak_flops if step_s else None)
  text = compiled['train'].as_text()
  # A data-dependent conditional would be a branch the TPU decides while running: none expected.
  res['train']['conditionals'] = len(re.findall(r' conditional\(', text))
  res['train']['while_loops'] = len(re.findall(r' while\(', text))
  traffic = hlo_traffic(text)
  total = sum(r['padded_bytes'] for r in traffic) or 1
  parts = {part: sum(r['padded_bytes'] for r in traffic if r['scope'] == part) / total
           for _, part in SCOPES}
  res['train']['parts'] = {k: v for k, v in parts.items() if v}
  by_op = {}
  for r in traffic:
    key = f"{r['scope']}: {r['op_name'].replace('jit(_train_step)/', '')}"
    by_op[key] = by_op.get(key, 0) + r['padded_bytes']
  res['train']['by_op'] = dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:200])
  res['train']['largest'] = [
      {k: r[k] for k in ('opcode', 'scope', 'op_name', 'count', 'bytes', 'padded_bytes')}
      | {'type': r['type'][:80]} for r in sorted(traffic, key=lambda r: -r['padded_bytes'])[:top]]
  res['need'] = max(res[k]['need'] for k in compiled)
  res['fits'] = res['need'] <= chip.hbm
  res['state'] = res['train']['arguments']
  if not res['fits']:
    res['advice'] = _advice(run, res, temp=res['train']['temporaries'])
  return res


def _advice(run, res, temp) -> str:
  """What would fit, estimated: the batch a chip that leaves the temporaries room (they grow
  with the batch), and the settings that shrink them (remat) or the state (fsdp)."""
  room = 0.95 * res.get('available', res['hbm']) - res['state']
  per_chip = res['batch_per_chip']
  fit = int(per_chip * room / temp) // 8 * 8 if room > 0 else 0
  options = []
  if fit >= 8:
    options.append(f"--config.batch_size={fit * res['mesh']['data']} ({fit} a chip)")
  if run.model.remat == 'none':
    options.append('--config.model.remat=block')
  if run.loop.sharding != 'fsdp' and res['state'] > 0.1 * res.get('available', res['hbm']):
    options.append('--config.sharding=fsdp')  # The state is worth sharding.
  return ' or '.join(options) or 'a slice with more chips'


def refusal(name: str, res: dict) -> str:
  """The one line of a run that does not fit its slice."""
  return (f"{name} does not fit {res['topology']}: the train step needs "
          f"{res['need'] / GiB:.2f} GiB a chip ({res['batch_per_chip']:g} images a chip) and a "
          f"{res['device_kind']} chip has {res.get('available', res['hbm']) / GiB:.2f} GiB; "
          f"would fit (estimate): {res['advice']}.")


def compile_table(results: list, names: list) -> str:
  """Side by side: each compiled run's per-chip memory, the compiler's counts, the roofline."""
  a = results[0]
  lines = [f"{a['topology']}: {a['chips']} x {a['device_kind']}, {a['hosts']} host(s), mesh "
           f"data={a['mesh']['data']} x model={a['mesh']['model']}, sharding {a['sharding']}, "
           f"batch {a['batch']} ({a['batch_per_host']} a host, {a['batch_per_chip']:g} a chip)",
           f"chip: {a['hbm'] / GiB:.0f} GiB HBM, {a['hbm_bw'] / 1e9:.0f} GB/s, "
           f"{a['peak_flops'] / 1e12:.0f} bf16 TFLOP/s ({a['source']}); step time and MFU are "
           'roofline estimates from the compiler\'s counts, not measured']
  lines += [f'{chr(65 + i)} = {n}' for i, n in enumerate(names)]
  head = f"{'per chip':34s}" + ''.join(f'{chr(65 + i):>10s}' for i in range(len(results)))
  lines.append(head + ('     A / B' if len(results) == 2 else ''))

  def row(label, values, fmt='10.2f'):
    cells = ''.join('         -' if v is None else format(v, fmt) for v in values)
    ratio = ''
    if len(values) == 2 and all(isinstance(v, float) and v for v in values):
      ratio = format(values[0] / values[1], '10.3f')
    lines.append(f'{label:34s}{cells}{ratio}')

  get = lambda prog, key, scale=1.: [r[prog][key] / scale if prog in r else None
                                     for r in results]
  row('fits', [None for _ in results])
  lines[-1] = f"{'fits':34s}" + ''.join(f"{'yes' if r['fits'] else 'NO':>10s}" for r in results)
  row('need GiB (of HBM)', [r['need'] / GiB for r in results])
  for key in ('arguments', 'temporaries', 'outputs'):
    row(f'  train {key} GiB', get('train', key, GiB))
  row('train XLA TFLOP / step', get('train', 'flops', 1e12), '10.3f')
  row('train model TFLOP / step', get('train', 'model_flops', 1e12), '10.3f')
  row('train XLA GB accessed / step', get('train', 'bytes', 1e9))
  row('train est. step ms', get('train', 'step_s', 1e-3))
  row('train est. MFU', get('train', 'mfu'), '10.3f')
  lines[-1] += '  (' + ', '.join(r['train']['bound'] + ' bound' for r in results
                                  if 'train' in r) + ')'
  for _, part in SCOPES:
    row(f'  {part} % of traffic', [100 * r['train']['parts'].get(part, 0.) if 'train' in r
                                   else None for r in results], '10.1f')
  row('train conditionals / while loops', [None for _ in results])
  lines[-1] = f"{'train conditionals / while loops':34s}" + ''.join(
      f"{r['train']['conditionals']:>6d} / {r['train']['while_loops']:<2d}" if 'train' in r
      else '         -' for r in results)
  row('eval need GiB', get('eval', 'need', GiB))
  row('eval est. step ms', get('eval', 'step_s', 1e-3))
  if len(results) == 2 and all('train' in r for r in results):
    a_ops, b_ops = (r['train']['by_op'] for r in results)
    diff = {k: a_ops.get(k, 0) - b_ops.get(k, 0) for k in set(a_ops) | set(b_ops)}
    lines.append("A - B: where the train steps' traffic differs most (MB as laid out, summed by "
                 'op name over layers and loops):')
    for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:8]:
      lines.append(f'  {v / 1e6:+10.1f} MB  {k[-100:]}')
  for i, r in enumerate(results):
    if 'train' not in r:
      continue
    lines.append(f'{chr(65 + i)}: largest HBM traffic of the train step (bytes as laid out, '
                 'loops counted):')
    for x in r['train']['largest']:
      lines.append(f"  {x['padded_bytes'] / 1e6:10.1f} MB  {x['scope']:20s} {x['opcode']:12s} "
                   f"{x['type'][:50]}  {x['op_name'][-60:]}")
  return '\n'.join(lines)


def check_fit(config, target: str, name: str = 'The run'):
  """train.py --check_fit: raises ValueError (one line: the need and what would fit) where the
  run does not fit `target`, a Cloud TPU slice compiled for here (deviceless) or 'devices' (the
  devices this process runs on, after jax.distributed starts). Returns the report."""
  from liere_jax.config import run as run_spec
  if target != 'devices':
    slice_ = parse_slice(target)
    res = compile_report(run_spec.resolve(config, slice_.chips), slice_, top=0)
  else:
    devices = jax.devices()
    run = run_spec.resolve(config, len(devices))
    stats = devices[0].memory_stats() or {}
    limit = stats.get('bytes_limit')
    res = {'topology': f'{len(devices)} x {devices[0].device_kind}', 'hbm': limit,
           'device_kind': devices[0].device_kind, 'batch_per_chip': run.loop.batch_size /
           (len(devices) // run.loop.model_parallel), 'mesh': {
               'data': len(devices) // run.loop.model_parallel}, 'fits': True}
    try:
      ma = compile_steps(run, devices, ('train',))['train'].memory_analysis()
      res['state'] = ma.argument_size_in_bytes
      res['need'] = (ma.argument_size_in_bytes + ma.output_size_in_bytes
                     - ma.alias_size_in_bytes + ma.temp_size_in_bytes)
      res['fits'] = limit is None or res['need'] <= limit  # None: the backend does not say.
      temp = ma.temp_size_in_bytes
    except DoesNotFit as e:
      res.update(state=_state_bytes(run, devices), available=e.available, fits=False)
      res['need'], temp = e.need + res['state'], e.need
    if not res['fits']:
      res['advice'] = _advice(run, res, temp)
  if not res['fits']:
    raise ValueError(refusal(name, res))
  return res
