"""bench data: a config's real train batches per second against Grain worker count.

  python -m liere_jax.bench data --config configs/imagenet.py --config.batch_size=32 \
      [--workers 0,1,2] [--batches N] [--repeats N] [--json]

Times `train_dataset` of the config's data (its own decode, augmentation, normalisation and
mixup) through `to_iterator` with 0, 1, 2, ... worker processes, `data.threads` threads and
`data.prefetch` batches ahead in each process, as train.py runs it. The data is a stand-in of
the real size written to a temporary directory (liere_jax/data/write_standin.py), unless
--config.data.data_dir names prepared data; arrows without a data_dir are rendered on the fly,
as in training. Each count runs `warmup` batches plus one per thread of every process (filling
the pipeline), then `batches` timed ones; `repeats` rounds visit the counts in turn (0 1 2 0 1
2 ...) so that load from elsewhere on the machine falls on all of them; the rate is the median.
Images/s (video: clips/s and frames/s), and CPU ms per image of the main process and its
workers (read from /proc: the per-core cost, whatever else loads the machine).
"""
import dataclasses
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Sequence, Tuple

# Enough that Grain's shuffle, ~20 ms an epoch, costs < 2% (liere_jax/data/write_standin.py).
STANDIN_EXAMPLES = {'cifar100': 2048, 'imagenet2012': 256, 'ucf101': 24}


def cores() -> int:
  """CPU cores this process may run on."""
  return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def _cpu_seconds() -> float:
  """CPU seconds of this process and its live children (the workers), where /proc has them."""
  total = time.process_time()
  for child in multiprocessing.active_children():
    try:
      with open(f'/proc/{child.pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')  # utime, stime.
    except (OSError, IndexError, ValueError):
      return math.nan
  return total


def _rate(ds, workers: int, threads: int, prefetch: int, warmup: int,
          batches: int) -> Tuple[float, float]:
  """(batches per second, CPU seconds per batch) from `ds` once the pipeline is full."""
  from liere_jax.data import pipeline
  it = pipeline.to_iterator(ds, workers=workers, threads=threads, prefetch=prefetch)
  try:
    for _ in range(warmup + threads * max(1, workers)):
      next(it)
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    for _ in range(batches):
      next(it)
    return batches / (time.perf_counter() - t0), (_cpu_seconds() - cpu0) / batches
  finally:
    it.close()


def bench_data(config, *, workers: Sequence[int] = (0, 1, 2), batches: int = 10,
               warmup: int = 2, repeats: int = 1,
               log: Callable[[str], None] = print) -> Dict:
  """Rows {workers, threads, images_per_s, cpu_ms_per_image, runs} (video: per frame, and also
  clips_per_s, frames_per_s, cpu_ms_per_clip) for `config` (its data section and batch_size),
  with what was measured."""
  from liere_jax.config.data import resolve_data
  from liere_jax.data import pipeline, write_standin  # TFDS and Grain: only for this benchmark.
  data = resolve_data(config.data)
  name = data.name
  with tempfile.TemporaryDirectory(prefix='liere_bench_data_') as tmp:
    stand_in = not data.data_dir and name in STANDIN_EXAMPLES
    if stand_in:
      t0 = time.perf_counter()
      data = dataclasses.replace(
          data, data_dir=write_standin.prepare(data.tfds_name, tmp, STANDIN_EXAMPLES[name]))
      log(f'stand-in {name}: {STANDIN_EXAMPLES[name]} examples in '
          f'{time.perf_counter() - t0:.1f} s')
    shape = pipeline.dataset_info(data)['input_shape']
    frames = shape[0] if len(shape) == 4 else 1
    ds = pipeline.train_dataset(data, global_batch_size=config.batch_size, seed=config.seed)
    runs: Dict[int, List[Tuple[float, float]]] = {n: [] for n in workers}
    for r in range(repeats):
      for n in workers:
        rate, cpu = _rate(ds, n, data.threads, data.prefetch, warmup, batches)
        runs[n].append((rate * config.batch_size, cpu / config.batch_size))
        log(f'round {r + 1}/{repeats}: {n} workers: {runs[n][-1][0]:.1f} examples/s, '
            f'{1e3 * runs[n][-1][1]:.1f} CPU ms each')
  rows = []
  for n in workers:
    rate = statistics.median(x for x, _ in runs[n])
    cpu = statistics.median(c for _, c in runs[n])
    row = dict(workers=n, threads=data.threads, images_per_s=rate * frames,
               cpu_ms_per_image=1e3 * cpu / frames, runs=[x * frames for x, _ in runs[n]])
    if frames > 1:
      row.update(clips_per_s=rate, frames_per_s=rate * frames, cpu_ms_per_clip=1e3 * cpu)
    rows.append(row)
  return dict(
      rows=rows, dataset=name, augment=data.augment, mixup=data.mixup,
      input_shape=list(shape), batch_size=config.batch_size, batches=batches, warmup=warmup,
      repeats=repeats, threads=data.threads, prefetch=data.prefetch, cores=cores(),
      data='stand-in (liere_jax/data/write_standin.py)' if stand_in else (data.data_dir or 'rendered'),
      measured='train_dataset batches (read, decode, augment, normalise, batch, mixup) received '
               'by the main process via to_iterator, after warm-up; medians over repeats; CPU '
               'time of the main process and its workers')


def data_table(res: Dict) -> str:
  """The rows as text, with speed-ups over 1 worker and images per CPU second (per core)."""
  video = res['input_shape'][0] if len(res['input_shape']) == 4 else 0
  unit = f'{"clips/s":>9} {"frames/s":>9}' if video else f'{"images/s":>9}'
  one = {r['workers']: r['images_per_s'] for r in res['rows']}.get(1)
  lines = [f'workers threads {unit}  vs 1 worker  CPU ms/image  images/CPU s  runs (images/s)']
  for r in res['rows']:
    rate = (f'{r["clips_per_s"]:9.1f} {r["frames_per_s"]:9.1f}' if video
            else f'{r["images_per_s"]:9.1f}')
    ratio = f'{r["images_per_s"] / one:11.2f}' if one else f'{"":11}'
    lines.append(f'{r["workers"]:7d} {r["threads"]:7d} {rate}  {ratio}  '
                 f'{r["cpu_ms_per_image"]:12.2f}  {1e3 / r["cpu_ms_per_image"]:12.1f}  '
                 + ' '.join(f'{x:.1f}' for x in r['runs']))
  return '\n'.join(lines)
