"""The training loop: `train_and_evaluate(run, workdir)` trains a resolved RunSpec in a workdir,
evaluating as its loop says, and resumes from the workdir's latest checkpoint; the same on
1 CPU, many devices or a multi-host pod. The command line is liere_jax/train.py.

  run = liere_jax.config.run.resolve(config, jax.device_count())
  train_and_evaluate(run, workdir)
"""
import contextlib
import math
import time

import jax

from liere_jax import paths

class Logger:
  """Metrics (paths.MetricsWriter: metrics/*.jsonl) and TensorBoard events from process 0.
  Metrics are written as one object at each checkpoint, evaluation and close, and at least
  every FLUSH_S seconds: object stores take no appends."""
  FLUSH_S = 300.  # Objects are read back one by one: not too many of them.

  def __init__(self, workdir):
    self.active = jax.process_index() == 0
    if self.active:
      from tensorboardX import SummaryWriter
      self.tb = SummaryWriter(str(paths.path(workdir) / 'tensorboard'))
      self.metrics = paths.MetricsWriter(workdir)
      self.flushed = time.time()

  def write(self, step, metrics):
    if not self.active:
      return
    for k, v in metrics.items():
      self.tb.add_scalar(k, v, step)
    self.metrics.add(step, metrics)
    if time.time() - self.flushed > self.FLUSH_S:
      self.flush()

  def flush(self):
    if self.active:
      self.metrics.flush()
      self.tb.flush()
      self.flushed = time.time()

  def close(self):
    if self.active:
      self.flush()
      self.tb.close()


def train(trainer, workdir: str, init_params=None, progress: bool = True, stop=None):
  """The training loop of `trainer.run` in `workdir`: resumes from its latest checkpoint, else
  starts from `init_params` (model_init.load) or fresh parameters. SIGTERM (`stop`, a
  distributed.Preemption; default one made here) saves the step reached and ends the loop there:
  returns that step (None when the run went to its end)."""
  from tqdm import tqdm

  from liere_jax import checkpoint, data, distributed, evaluation, model_init
  loop = trainer.run.loop
  stop = stop or distributed.Preemption()
  latest = checkpoint.manager(workdir, keep=loop.keep)
  best = checkpoint.manager(workdir, 'best', best=True)
  if latest.latest_step() is not None:
    state, meta = checkpoint.restore(latest, trainer.abstract_state)
    print(f"Resumed from step {meta['step']}." + (
        f' --config.model_init={loop.model_init} is ignored: the run goes on from its own '
        'checkpoint.' if loop.model_init else ''))
  elif init_params is not None:
    state, meta = model_init.init_state(trainer, loop.seed, init_params), {'step': 0}
    print(f'Started from the parameters of {loop.model_init} (fresh optimizer, step 0).')
  else:
    state, meta = trainer.init_state(loop.seed), {'step': 0}
  start = int(meta['step'])

  run_data = trainer.run.data
  train_ds = data.train_dataset(run_data, global_batch_size=loop.batch_size, seed=loop.seed,
                                process_index=jax.process_index(),
                                process_count=jax.process_count())
  batches = data.to_iterator(train_ds, start=start, workers=run_data.workers,
                             threads=run_data.threads, prefetch=run_data.prefetch)
  logger = Logger(workdir)
  bar = tqdm(total=loop.total_steps, initial=start, disable=not progress
             or jax.process_index() != 0, desc='train', unit='step')
  t0, seen, preempted = time.time(), 0, None
  try:
    for step in range(start + 1, loop.total_steps + 1):
      # Data workers outlive SIGTERM to the process group (data/pipeline.py): the batches come.
      batch = trainer.global_batch(next(batches))
      state, metrics = trainer.train_step(state, batch)
      seen += loop.batch_size
      bar.update()
      meta = {'step': step, 'data_position': step, 'seed': loop.seed}
      eval_now = step == loop.total_steps or (loop.eval_every and step % loop.eval_every == 0)
      # SIGTERM (every process agrees on the step): save this step and stop.
      preempted = step if stop.reached(step) else None
      save_now = step % loop.checkpoint_every == 0 or eval_now or preempted
      if save_now or step % loop.log_every == 0:
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        # A checkpoint is good when its own parameters give a finite loss on its step's batch
        # (the step's reported loss is of the parameters before the update).
        if save_now:
          metrics['saved_loss'] = float(trainer.loss_step(state['params'], batch))
        bad = [k for k in ('loss', 'param_norm', 'saved_loss') if not math.isfinite(
            metrics.get(k, 0.))]
        if bad:  # NaNs persist, so checking at log and save steps is enough.
          latest.wait_until_finished()
          raise FloatingPointError(
              f'{bad[0]} is {metrics[bad[0]]} at step {step}; stopping. The last good checkpoint '
              f'(step {latest.latest_step()}) is intact. Resume with a lower --config.lr, or '
              'start from it in a new --workdir with --config.grad_clip=1.0 '
              f'--config.model_init={workdir} (clipping changes the optimizer state).')
      if step % loop.log_every == 0 or step == loop.total_steps:
        metrics['images_per_s'] = seen / (time.time() - t0)
        t0, seen = time.time(), 0
        logger.write(step, metrics)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}")
      if save_now:
        checkpoint.save(latest, step, state, meta)
        logger.flush()  # The metrics up to a checkpoint are kept with it.
      if eval_now:  # Also when preempted: it belongs to this step, which is then complete.
        accuracy = evaluation.evaluate(trainer, state['params'])
        evals = accuracy.metrics('eval_accuracy')  # With video views: also per view and video.
        logger.write(step, evals)
        logger.flush()
        bar.write(f'step {step}: ' + ', '.join(f'{k} {v:.4f}' for k, v in evals.items()))
        checkpoint.save(best, step, state, meta, metrics={'accuracy': accuracy.top1})
      if preempted:
        break
  finally:
    batches.close()  # Ends the worker processes (data.workers).
    stop.close()
  bar.close()
  for mngr in (latest, best):
    mngr.wait_until_finished()
    mngr.close()
  logger.close()
  if preempted:
    print(f'{stop.cause} at step {preempted} (process {jax.process_index()}): saved step '
          f'{preempted} to {workdir}; run the same command to resume there.', flush=True)
  return preempted


def check(run, workdir: str):
  """Everything about starting `run` (a run_spec.RunSpec) in `workdir` that can be refused,
  before anything is compiled or written: the store, the dataset, a workdir that all processes
  see, the same model as the workdir's checkpoints, and --config.model_init's parameters, which
  it returns (None when fresh or resumed)."""
  from liere_jax import checkpoint, data, model_init
  paths.check_store(workdir, '--workdir', tensorboard=True)
  data.check_data(run)  # Says how to prepare an unprepared dataset.
  # Several processes: one workdir, seen alike (before any of them reads it).
  checkpoint.check_shared_workdir(workdir)
  checkpoint.check_same_model(workdir, run.model)
  # A resumed run ignores model_init.
  return (model_init.load(run) if run.loop.model_init
          and not checkpoint.has_checkpoint(workdir) else None)


def train_and_evaluate(run, workdir: str, *, progress: bool = True, devices=None,
                       checks=contextlib.nullcontext):
  """Trains `run` (a run_spec.RunSpec; config.json keeps the config it was resolved from) in
  `workdir`, evaluating as its loop says; resumes from the workdir's latest checkpoint. In any
  process: a notebook, a test, `python -m liere_jax.train`. devices: those to run on (default:
  all; `run` must be resolved for their number). checks: a context manager around the checks
  (`check`); the command line's makes their errors one-line refusals. Returns the step a
  SIGTERM stopped it at, or None."""
  from liere_jax import checkpoint, distributed, steps
  from liere_jax.config import run as run_spec
  run_spec.spec_of(run, 'train_and_evaluate')
  with checks():
    init_params = check(run, workdir)
  trainer = steps.Trainer(run, steps.make_mesh(devices, run.loop.model_parallel))
  stop = distributed.Preemption()  # From the first write on, SIGTERM saves the step reached.
  checkpoint.write_config(workdir, run.to_config())
  return train(trainer, workdir, init_params, progress=progress, stop=stop)
