"""Input pipelines: Grain over TFDS array_record sources, deterministic and resumable.

  train = train_dataset(run.data, global_batch_size=512, seed=run.loop.seed,
                        process_index=jax.process_index(), process_count=jax.process_count())
  for step, batch in zip(range(start, total), to_iterator(train, start=start)):
    ...  # batch == train[step]: image float32 [b, *input_shape], label float32 [b, classes]
  for batch in eval_batches(run.data, global_batch_size=512):
    ...  # image float32, label int32 [b], mask bool [b] (False on padding)

Determinism. `train[step]` is a pure function of (seed, step, process): the global example
stream is `source.seed(seed).shuffle().repeat()` (a new permutation each epoch), per-example
augmentation is a `random_map` whose generator is drawn from (seed, position in that stream),
and process p of P takes positions p, p + P, p + 2P, ... So resuming is `to_iterator(train,
start=step)`, nothing else to checkpoint, and at every step the P per-process batches are
disjoint and together are exactly the 1-process batch (without mixup, which pairs examples
inside a per-process batch). b = global_batch_size / process_count.

Layout: the stages of liere_jax/data/__init__.py (reading, transforms, this pipeline,
preparation); what it knows of each dataset is liere_jax/config/datasets.py, and the data
section, resolved once into a DataSpec, is liere_jax/config/data.py, where every data.* field is
documented.
Every function here takes a DataSpec (a RunSpec's .data, or config.data.resolve_data of a data
section), not the config.

Preparing data (no dataset is downloaded here): `python -m liere_jax.data.prepare NAME
--download_dir=DL --data_dir=DIR` turns the original download in DL into the TFDS dataset,
without TensorFlow (liere_jax/data/prepare.py; docs/configs.md, "Data").
"""
import contextlib
import math
from multiprocessing import resource_tracker
import signal
from typing import Any, Dict, Iterator, Optional, Sequence

from absl import flags
import grain
import numpy as np

from liere_jax.data import arrows
from liere_jax.data import augment
from liere_jax.data import sources
from liere_jax.data import transform
from liere_jax.config.data import DataSpec, spec_of

Example = Dict[str, Any]


def dataset_info(data: DataSpec) -> Dict[str, Any]:
  """dict(input_shape, num_classes, num_train (after fraction), num_eval); checks the data."""
  spec = spec_of(data, 'dataset_info')
  return dict(input_shape=spec.input_shape(), num_classes=spec.info.num_classes,
              num_train=len(sources.train_source(spec)),
              num_eval=len(sources.source(spec, spec.eval_split, train=False)))


def check_data(run) -> dict:
  """Checks that the data of `run` (a RunSpec) exists (how to prepare it, if not) and fits its
  model; returns dataset_info."""
  info = dataset_info(run.data)
  want = run.model.input_size + (run.model.channels,)
  if tuple(info['input_shape']) != want:
    raise ValueError(
        f"The data gives inputs of shape {tuple(info['input_shape'])} but the model expects "
        f'{want} (model.input_size + model.channels); set --config.model.input_size or '
        '--config.data.image_size to match.')
  if info['num_classes'] != run.model.num_classes:
    raise ValueError(f"The data has {info['num_classes']} classes, model.num_classes="
                     f'{run.model.num_classes}; set --config.model.num_classes='
                     f"{info['num_classes']}.")
  return info


def train_dataset(data: DataSpec, *, global_batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> grain.MapDataset:
  """Infinite MapDataset of this process's batches; ds[step] is the batch of that step.

  Yields dict(image=float32 [b, *input_shape] normalised (data.normalise='device': uint8
  pixels), label=float32 [b, num_classes] one-hot, or mixed with mixup),
  b = global_batch_size // process_count.
  """
  spec = spec_of(data, 'train_dataset')
  batch = _per_process(global_batch_size, process_index, process_count)
  decode = transform.decoder(spec, spec.size, spec.grid, train=True)

  def example(raw, rng):
    ex = decode(raw, rng)
    image = transform.train_augment(spec, ex['image'], rng)
    if spec.normalise == 'host':
      image = transform.normalise(spec, image)
    if spec.random_erasing:  # On normalised values (O videodataset.py:343-353).
      image = augment.random_erasing(image, rng, p=spec.random_erasing)
    return dict(image=image, label=ex['label'])

  def finish(batch: Example, rng: np.random.Generator) -> Example:
    images = batch['image']
    labels = np.eye(spec.info.num_classes, dtype=np.float32)[batch['label']]
    if spec.mixup > 0:
      lam = np.float32(rng.beta(spec.mixup, spec.mixup))
      # lam x + (1 - lam) x[::-1] in one new array, not three (the batch is ours to change).
      mixed = (1 - lam) * images[::-1]
      images *= lam
      images += mixed
      labels = lam * labels + (1 - lam) * labels[::-1]
    return dict(image=images, label=labels)

  ds = sources.train_source(spec).seed(seed).shuffle().repeat().random_map(example)
  ds = ds[process_index::process_count].batch(batch, drop_remainder=True, batch_fn=_stack)
  return ds.random_map(finish)


def eval_batches(data: DataSpec, *, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1, input_size: Optional[int] = None) -> Iterator[Example]:
  """All of the eval split once, in order, padded: dict(image, label int32 [b], mask bool [b]).

  Every process yields ceil(num_eval * views / global_batch_size) batches; padding has mask
  False. Video with views = prod(data.eval_views) > 1: the items are (video, view) pairs, the
  views of a video consecutive, and batches also carry video int32 [b] (the video's index in
  the eval split; -1 on padding). Process p of P takes items p, p + P, ... (disjoint slices).
  input_size: evaluate at another spatial size (images are resized; arrows are rendered with
  grid = input_size // 12, more cells of the same 12 px).
  """
  spec = spec_of(data, 'eval_batches')
  batch = _per_process(global_batch_size, process_index, process_count)
  size, grid = spec.size, spec.grid
  if input_size:
    if not isinstance(input_size, (int, np.integer)):
      raise ValueError(f'input_size={input_size!r} must be an int: the side of the square input '
                       '(for video, of each frame).')
    size = int(input_size)
    if spec.name == 'arrows':
      if size % arrows.CELL:
        raise ValueError(f'input_size={size} is not a multiple of the {arrows.CELL} px arrows '
                         f'cells; use e.g. {arrows.CELL * max(4, size // arrows.CELL)}.')
      grid = size // arrows.CELL
  records = sources.source(spec, spec.eval_split, train=False, grid=grid)
  decode = transform.decoder(spec, size, grid, train=False)
  views = math.prod(spec.eval_views)
  num = len(records) * views
  pad = dict(image=np.zeros(spec.input_shape(size), np.uint8), label=np.int32(0), mask=False)
  if views > 1:
    pad['video'] = np.int32(-1)

  def example(index: int) -> Example:
    if index >= num:
      return pad
    video, view = divmod(index, views)
    ex = dict(decode(records[video], None, view), mask=True)
    if views > 1:
      ex['video'] = np.int32(video)
    return ex

  def finish(batch: Example) -> Example:
    return dict(batch, image=transform.normalise(spec, batch['image']))

  total = math.ceil(num / global_batch_size) * global_batch_size
  ds = grain.MapDataset.range(total)[process_index::process_count].map(example)
  return to_iterator(ds.batch(batch, batch_fn=_stack).map(finish))


def _per_process(global_batch_size: int, process_index: int, process_count: int) -> int:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} must be in [0, process_count='
                     f'{process_count}).')
  if global_batch_size < 1 or global_batch_size % process_count:
    raise ValueError(f'global_batch_size={global_batch_size} must be a positive multiple of '
                     f'process_count={process_count}.')
  return global_batch_size // process_count


def _stack(examples: Sequence[Example]) -> Example:
  return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def to_iterator(ds: grain.MapDataset, *, start: int = 0, workers: int = 0, threads: int = 2,
                prefetch: int = 2) -> Iterator[Example]:
  """Iterates ds[start], ds[start + 1], ..., computed ahead; the same items for any settings.

  workers = 0: `threads` threads of this process compute up to `prefetch` items ahead.
  workers = N > 0: N Grain worker processes (mp_prefetch); worker i computes ds[start + i::N]
  with its own `threads` and `prefetch`, holds one more finished, and the items come back in
  order through shared memory (so about N (prefetch + 2) items exist at once). Workers are
  spawned and import the main module: call this under `if __name__ == '__main__'` with absl
  flags parsed (app.run), and close() the iterator when done (else they end when it is
  collected). The workers outlive a SIGTERM, also one that comes while they start (_Workers).
  """
  if workers and not flags.FLAGS.is_parsed():
    raise RuntimeError(f'workers={workers}: Grain worker processes read absl flags; run under '
                       'absl.app.run (as train.py does), or call '
                       'absl.flags.FLAGS.mark_as_parsed() first.')
  it = ds[start:].to_iter_dataset(
      grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch))
  if not workers:
    return iter(it)
  return _Workers(it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers),
                                 worker_init_fn=_outlive_sigterm))


def _outlive_sigterm(worker_index: int, worker_count: int):
  """In each worker process, first thing: SIGTERM sent to the whole process group (`kill --
  -PGID`, a VM shutting down, a job scheduler) leaves the workers running, so that the main
  process, which notes it (distributed.Preemption), gets the batches to reach the step its
  processes agree on and save it; it ends them itself (close(): an event, then SIGKILL). The
  worker started with SIGTERM blocked (_Workers): one that came before is dropped here too."""
  del worker_index, worker_count
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


class _Workers:
  """Grain's workers, started and read with SIGTERM blocked in this thread. The processes it
  starts, and the threads that start them, inherit that mask: a SIGTERM that reaches a worker
  while it starts waits for `_outlive_sigterm` instead of ending it (the run would then fail
  unsaved, or hang: spawning blocks on a dead worker once the dataset it sends is more than a
  pipe holds). This process still gets it at once, in another thread (JAX's preemption
  notifier; Python runs distributed.Preemption's handler in the main thread)."""

  def __init__(self, workers: grain.IterDataset):
    # Started here first: starting it in a thread unblocks SIGTERM there (multiprocessing).
    resource_tracker.ensure_running()
    with _sigterm_blocked():
      self._it = iter(workers)

  def __iter__(self):
    return self

  def __next__(self) -> Example:
    with _sigterm_blocked():
      return next(self._it)

  def close(self):
    self._it.close()


@contextlib.contextmanager
def _sigterm_blocked():
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
