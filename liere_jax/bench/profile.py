"""bench profile: where a train step's device time goes, from a `jax.profiler` trace.

  python -m liere_jax.bench profile --config configs/imagenet.py:pe=liere64 [--steps N] [--json]

Per step: the fraction of the wall time the device is busy (the union of its kernels and
copies), kernels launched, device-to-host copies (a conditional's predicate is one), and the
kernels that take the most time. Read from the trace's XSpace with `jax.profiler.ProfileData`
(no TensorBoard plugin needed). On a CPU there is no device plane: the summary says so.
"""
import collections
import glob
import re
import tempfile
import time

import jax

_D2H = re.compile(r'(?i)memcpy.?(d2h|dtoh)')
_COPY = re.compile(r'(?i)memcpy|memset')


def summarize_xspace(profile, steps: int, wall_s: float, top: int = 8) -> dict:
  """The summary of a `jax.profiler.ProfileData` holding `steps` steps that took wall_s."""
  devices = [p for p in profile.planes if p.name.startswith('/device:')]
  out = {'steps': steps, 'wall_ms_per_step': 1e3 * wall_s / steps, 'device_planes': len(devices)}
  if not devices:
    out['note'] = 'no device plane in the trace (a CPU run): nothing to summarize'
    return out
  # The first device's stream lines: its kernels and copies (other lines are derived views).
  lines = [l for l in devices[0].lines if l.name.lower().startswith('stream')]
  events = [(e.name, e.start_ns, e.duration_ns) for l in lines for e in l.events]
  spans = sorted((s, s + d) for _, s, d in events)
  busy, end = 0.0, float('-inf')
  for s, e in spans:  # The union of the intervals.
    if e > end:
      busy += e - max(s, end)
      end = e
  per_kernel = collections.defaultdict(lambda: [0, 0.0])
  for name, _, d in events:
    if not _COPY.search(name):
      per_kernel[name][0] += 1
      per_kernel[name][1] += d
  total = sum(d for _, d in per_kernel.values()) or 1.0
  out.update(
      device=devices[0].name,
      busy_fraction=busy / (wall_s * 1e9),
      kernels_per_step=sum(n for n, _ in per_kernel.values()) / steps,
      d2h_copies_per_step=sum(1 for n, _, _ in events if _D2H.search(n)) / steps,
      copies_per_step=sum(1 for n, _, _ in events if _COPY.search(n)) / steps,
      top_kernels=[{'name': k[:80], 'per_step': n / steps, 'ms_per_step': d / 1e6 / steps,
                    'share': d / total}
                   for k, (n, d) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top]])
  return out


def profile_step(config, steps: int = 5, warmup: int = 2, log=print) -> dict:
  """Traces `steps` train steps of the config (random inputs of its shape) after warm-up."""
  from liere_jax.bench.step import StepBench
  from liere_jax.steps import make_mesh
  bench = StepBench(config, make_mesh(model_parallel=config.model_parallel))
  for _ in range(warmup):
    jax.block_until_ready(bench.train())
  with tempfile.TemporaryDirectory() as tmp:
    log(f'tracing {steps} train steps')
    with jax.profiler.trace(tmp):
      t0 = time.perf_counter()
      for _ in range(steps):
        jax.block_until_ready(bench.train())
      wall = time.perf_counter() - t0
    path, = glob.glob(f'{tmp}/**/*.xplane.pb', recursive=True)
    profile = jax.profiler.ProfileData.from_file(path)
    return summarize_xspace(profile, steps, wall)


def profile_table(res: dict) -> str:
  lines = [f"{res['wall_ms_per_step']:.2f} ms per step over {res['steps']} steps"]
  if 'note' in res:
    return '\n'.join(lines + [res['note']])
  lines.append(f"{res['device']}: busy {100 * res['busy_fraction']:.1f}% of the wall time, "
               f"{res['kernels_per_step']:.1f} kernels, {res['copies_per_step']:.1f} copies "
               f"({res['d2h_copies_per_step']:.1f} device-to-host) per step")
  lines += [f"  {k['ms_per_step']:8.3f} ms {100 * k['share']:5.1f}% x{k['per_step']:<6.1f} "
            f"{k['name']}" for k in res['top_kernels']]
  return '\n'.join(lines)
