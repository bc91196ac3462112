"""bench compile: a config's train and eval steps compiled for a Cloud TPU slice on this machine,
before paying for the slice.

JAX compiles ahead of time for TPU devices that are not there: `get_topology_desc` gives the
devices of a slice (libtpu, `requirements-tpu.txt`), our `Trainer` builds its mesh, shardings and
steps over them exactly as `train.py` would on the pod, and the TPU compiler reports what each
chip holds (`memory_analysis`) and does (`cost_analysis`). Nothing here runs a step: the step
time and MFU are a roofline estimate from the compiler's counts and the chip's published peak
and bandwidth (CHIPS), not a measurement. A Pallas kernel's FLOPs, transcendentals and bytes
are what its CostEstimate declares (liere_jax.kernels.common.Cost: its MXU products and its
vector-unit element ops, which XLA counts as FLOPs as it does its own elementwise ops); the table
shows the kernels' MXU and vector work beside XLA's own ops.

  python -m liere_jax.bench compile --config configs/imagenet.py:pe=liere64 \
      --topology v5litepod-256 [--vs pe=abs] [--train_only] [--json]
"""
import re

from liere_jax import fit
from liere_jax.bench.flops import model_flops
from liere_jax.bench.hlo import SCOPES, hlo_traffic
from liere_jax.kernels.common import DECLARED
from liere_jax.tpu_slices import GiB, slice_devices


def compile_report(run, slice_, eval_step: bool = True, top: int = 5, numerics=None) -> dict:
  """The run compiled for the slice: per chip memory, whether it fits (liere_jax/fit.py), the
  compiler's FLOPs and bytes a step, the roofline step time and MFU, LieRE's part of the traffic
  and the largest instructions. A run that does not fit has 'fits' False, the compiler's
  figures and 'advice'. numerics: fields of the plan replaced (an A/B: bench step's
  vs_numerics)."""
  chip = slice_.chip
  res = {'topology': slice_.name, 'device_kind': chip.device_kind, 'chips': slice_.chips,
         'hosts': slice_.hosts, 'batch_per_host': run.loop.batch_size // slice_.hosts,
         'peak_flops': chip.peak_flops, 'hbm_bw': chip.hbm_bw, 'source': chip.source}
  memory, compiled = fit.fit(run, slice_devices(slice_), chip.hbm,
                             ('train', 'eval') if eval_step else ('train',), numerics)
  res.update(memory)
  for name, c in compiled.items():
    cost = c.cost_analysis()
    flops, nbytes = float(cost.get('flops', 0)), float(cost.get('bytes accessed', 0))
    step_s = max(flops / chip.peak_flops, nbytes / chip.hbm_bw)
    useful = model_flops(run.model, run.loop.batch_size if name == 'train'
                         else run.evaluation.batch_size, train=name == 'train') / slice_.chips
    res[name].update(flops=flops, bytes=nbytes, model_flops=useful, step_s=step_s,
                     bound='memory' if nbytes / chip.hbm_bw > flops / chip.peak_flops
                     else 'compute', mfu=useful / step_s / chip.peak_flops if step_s else None)
  if compiled:
    res['train'].update(_traffic(compiled['train'].as_text(), top))
  return res


def _traffic(text: str, top: int) -> dict:
  """The train step's HBM traffic (bench/hlo.py): LieRE's parts of it, by op name, the `top`
  largest instructions; and its conditionals and loops."""
  # A data-dependent conditional would be a branch the TPU decides while running: none expected.
  out = {'conditionals': len(re.findall(r' conditional\(', text)),
         'while_loops': len(re.findall(r' while\(', text))}
  traffic = hlo_traffic(text)
  total = sum(r['padded_bytes'] for r in traffic) or 1
  parts = {part: sum(r['padded_bytes'] for r in traffic if r['scope'] == part) / total
           for _, part in SCOPES}
  out['parts'] = {k: v for k, v in parts.items() if v}
  by_op = {}
  for r in traffic:
    key = f"{r['scope']}: {r['op_name'].replace('jit(_train_step)/', '')}"
    by_op[key] = by_op.get(key, 0) + r['padded_bytes']
  out['by_op'] = dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:200])
  out['kernels'] = kernel_work(traffic)
  out['largest'] = [
      {k: r[k] for k in ('opcode', 'scope', 'op_name', 'count', 'bytes', 'padded_bytes')}
      | {'type': r['type'][:80]} for r in sorted(traffic, key=lambda r: -r['padded_bytes'])[:top]]
  return out


def kernel_work(traffic: list) -> dict:
  """The Pallas kernels' work a step as their CostEstimates declare it, loops counted, by
  kernel: {name: {'calls', 'mxu_flops', 'vpu_ops', 'unsplit_flops', 'transcendentals',
  'bytes'}}. The split of a kernel's FLOPs into MXU and vector work is its Cost, recorded when
  this process traced it (kernels.common.DECLARED); one it did not trace has its FLOPs under
  'unsplit_flops'."""
  out = {}
  for r in traffic:
    est = r.get('cost_estimate')
    if est is None:
      continue
    key = tuple(est.get(k, 0) for k in ('flops', 'transcendentals', 'bytes_accessed'))
    name, cost = DECLARED.get(key, (re.sub(r'\.\d+$', '', r['name']), None))
    k = out.setdefault(name, dict.fromkeys(
        ('calls', 'mxu_flops', 'vpu_ops', 'unsplit_flops', 'transcendentals', 'bytes'), 0))
    n = r['count']
    k['calls'] += n
    if cost is None:
      k['unsplit_flops'] += n * key[0]
    else:
      k['mxu_flops'] += n * cost.mxu_flops
      k['vpu_ops'] += n * cost.vpu_ops
    k['transcendentals'] += n * key[1]
    k['bytes'] += n * key[2]
  return dict(sorted(out.items()))


def kernel_totals(train: dict) -> dict:
  """A compiled train step's kernels' work summed ('kernels' of compile_report), and XLA's own
  ops' FLOPs and bytes (the compiler's totals less the kernels')."""
  ks = train.get('kernels', {}).values()
  total = {k: sum(x[k] for x in ks) for k in ('mxu_flops', 'vpu_ops', 'unsplit_flops',
                                              'transcendentals', 'bytes')}
  total['xla_flops'] = train['flops'] - sum(x['mxu_flops'] + x['vpu_ops'] + x['unsplit_flops']
                                            for x in ks)
  total['xla_bytes'] = train['bytes'] - total['bytes']
  return total


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
  totals = [kernel_totals(r['train']) if 'train' in r else None for r in results]
  part = lambda key, scale: [t[key] / scale if t else None for t in totals]
  row('train XLA TFLOP / step', get('train', 'flops', 1e12), '10.3f')
  row('  Pallas kernels: MXU TFLOP', part('mxu_flops', 1e12), '10.3f')
  row('  Pallas kernels: VPU Tops', part('vpu_ops', 1e12), '10.3f')
  if any(t and t['unsplit_flops'] for t in totals):
    row('  Pallas kernels: unsplit TFLOP', part('unsplit_flops', 1e12), '10.3f')
  row("  XLA's own ops TFLOP", part('xla_flops', 1e12), '10.3f')
  row('train model TFLOP / step', get('train', 'model_flops', 1e12), '10.3f')
  row('train XLA GB accessed / step', get('train', 'bytes', 1e9))
  row('  Pallas kernels GB', part('bytes', 1e9))
  row("  XLA's own ops GB", part('xla_bytes', 1e9))
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
    if not r.get('train', {}).get('kernels'):
      continue
    lines.append(f'{chr(65 + i)}: Pallas kernels of the train step, as their CostEstimates '
                 'declare them (loops counted):')
    lines.append(f"  {'kernel':24s}{'calls':>6s}{'MXU TFLOP':>11s}{'VPU Tops':>10s}"
                 f"{'G transc.':>11s}{'GB':>9s}")
    for name, k in r['train']['kernels'].items():
      mxu = k['mxu_flops'] + k['unsplit_flops']
      lines.append(f"  {name:24s}{k['calls']:6d}{mxu / 1e12:11.3f}{k['vpu_ops'] / 1e12:10.3f}"
                   f"{k['transcendentals'] / 1e9:11.2f}{k['bytes'] / 1e9:9.2f}"
                   + ('  (FLOPs not split: not traced here)' if k['unsplit_flops'] else ''))
  for i, r in enumerate(results):
    if 'train' not in r:
      continue
    lines.append(f'{chr(65 + i)}: largest HBM traffic of the train step (bytes as laid out, '
                 'loops counted):')
    for x in r['train']['largest']:
      lines.append(f"  {x['padded_bytes'] / 1e6:10.1f} MB  {x['scope']:20s} {x['opcode']:12s} "
                   f"{x['type'][:50]}  {x['op_name'][-60:]}")
  return '\n'.join(lines)
