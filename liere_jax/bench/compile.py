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
import re

from liere_jax import fit
from liere_jax.bench.flops import model_flops
from liere_jax.bench.hlo import SCOPES, hlo_traffic
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
  out['largest'] = [
      {k: r[k] for k in ('opcode', 'scope', 'op_name', 'count', 'bytes', 'padded_bytes')}
      | {'type': r['type'][:80]} for r in sorted(traffic, key=lambda r: -r['padded_bytes'])[:top]]
  return out


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
