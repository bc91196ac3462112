"""Checkpoints with Orbax: atomic, asynchronous, latest N plus the best by eval accuracy.

Layout of a workdir:
  config.json                      the config of the run (a resumed run has its parameter tree)
  checkpoints/<step>/state         params, opt_state, step   (StandardSave)
  checkpoints/<step>/meta          {"step", "data_position", "seed", ...} (JSON)
  best/<step>/...                  the same items for the best eval accuracy so far
  checkpoints/<step>.damaged-<time>  a checkpoint that could not be read, set aside (also best/)
The blocks are stored as blocks/<i>/... whatever model.scan_layers (a stacked state is
unstacked to save and stacked again on restore), so a run resumes with scan_layers on or off.
Orbax writes each step to a temporary directory and renames it when complete, so a run killed
at any moment leaves only whole checkpoints. The RNG is a pure function of (seed, step) and the
data position is the step (batches are `train_ds[step]`), so (state, meta) is all of a run.

A checkpoint that cannot be read (a bad copy, a full disk) is named in one logged line, moved
aside and the next older one is read instead; with none left, `CheckpointError` (one line)
says what to do. In a multi-process run a step counts as read only when every process read it,
so all of them resume from the same step.
"""
import json
from typing import Optional

import jax
import ml_collections
import orbax.checkpoint as ocp

from liere_jax import paths
from liere_jax.checkpoint_damage import (DAMAGED, CheckpointError, first_readable,
                                         set_aside_unreadable_metrics, steps_in,
                                         stored_target)
from liere_jax.config import model as model_spec
from liere_jax.config.run import upgrade
from liere_jax.param_tree import int_keys, shaping_fields, to_loop_params, to_scan_params

CONFIG_FILE = 'config.json'


def config_to_json(config: ml_collections.ConfigDict) -> str:
  return config.to_json(sort_keys=True, indent=1)


def read_config(workdir: str) -> Optional[ml_collections.ConfigDict]:
  path = paths.path(workdir) / CONFIG_FILE
  if not path.exists():
    return None
  try:
    config = _tuples(json.loads(path.read_text()))
  except ValueError as e:
    raise CheckpointError(
        f'{path} cannot be read (invalid JSON: {e}). Move it away to resume with the --config '
        'of the same model (a new one is written), or use a new --workdir.') from None
  return ml_collections.ConfigDict(upgrade(config))  # Fields added since it was written.


def _tuples(x):
  return {k: _tuples(v) for k, v in x.items()} if isinstance(x, dict) else (
      tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x)


def has_checkpoint(workdir: str) -> bool:
  return bool(steps_in(paths.path(workdir) / 'checkpoints'))


def check_same_model(workdir: str, model: model_spec.ModelSpec):
  """Raises if `workdir` holds a checkpoint of a model with another parameter tree than `model`
  (before anything is written). How the tree is computed (remat, scan_layers, dtype, ...) may
  change. A workdir without a checkpoint (a run that failed before its first save) takes any
  model.
  """
  stored = read_config(workdir)
  if stored is None or not has_checkpoint(workdir):
    return
  new = shaping_fields(model)
  try:
    old = shaping_fields(model_spec.resolve_stored(stored.model))
  except ValueError as e:
    raise CheckpointError(f'--workdir {workdir} holds a run whose model section no longer '
                          f'resolves ({e}); use a new --workdir.') from None
  diff = [k for k in old if old[k] != new[k]]
  if not diff:
    return
  key, value = diff[0], old[diff[0]]
  more = ', '.join(f'model.{k}' for k in diff[1:4]) + (' ...' if len(diff) > 4 else '')
  also = f'; also {more}' if more else ''
  raw = stored.model.to_dict()
  for part in key.split('.'):
    raw = raw.get(part) if isinstance(raw, dict) else None
  flag = f'"{tuple(value)}"' if isinstance(value, list) else value
  resume = (f'--config.model.{key}={flag}' if model_spec.json_ready(raw) == value
            else f"that run's config ({CONFIG_FILE} there)")
  raise CheckpointError(
      f'--workdir {workdir} holds a run of a different model (model.{key}: {value!r} there, '
      f'{new[key]!r} now{also}): another parameter tree. Use a new --workdir, or {resume} '
      'to resume it.')


def write_config(workdir: str, config: ml_collections.ConfigDict):
  if jax.process_index() == 0:
    paths.path(workdir).mkdir(parents=True, exist_ok=True)
    paths.write(paths.path(workdir) / CONFIG_FILE, config_to_json(config))


PROCESS_CHECK = 'process_check.json'


def check_shared_workdir(workdir: str, create: bool = True):
  """Several processes: stops every one of them in one line unless all see the same workdir
  (one shared bucket or file system): process 0 writes a token that every process must read
  back, and all must see the same checkpoints. Without this a process on its own local disk
  waits for process 0's checkpoints until a timeout. `create=False` (eval): a workdir that
  process 0 does not have stops all of them too."""
  if jax.process_count() == 1:
    return
  import random
  import zlib
  import numpy as np
  from jax.experimental import multihost_utils
  marker = paths.path(workdir) / PROCESS_CHECK
  token = random.getrandbits(30) + 1  # 0: process 0 has no such workdir.
  if jax.process_index() == 0:
    if create:  # A bucket has no folders: a new one is_dir() only once it holds an object.
      paths.path(workdir).mkdir(parents=True, exist_ok=True)
    if create or paths.path(workdir).is_dir():
      paths.write(marker, json.dumps({'token': token}))
    else:
      token = 0
  # Process 0 wrote before this collective, so every process may read the marker after it.
  token = int(multihost_utils.broadcast_one_to_all(np.int32(token)))
  if not token:
    raise CheckpointError(f'--workdir {workdir} does not exist (process 0 looked for it).')
  try:
    seen = json.loads(marker.read_text())['token'] == token
  except (OSError, ValueError, KeyError):
    seen = False
  view = json.dumps([steps_in(paths.path(workdir) / d) for d in ('checkpoints', 'best')])
  mine = np.array([seen, zlib.crc32(view.encode()) & 0x7fffffff], np.int32)
  every = np.asarray(multihost_utils.process_allgather(mine))
  if jax.process_index() == 0:
    marker.unlink(missing_ok=True)
  blind = [i for i in range(len(every)) if not every[i][0]]
  if blind:
    raise CheckpointError(
        f'--workdir {workdir}: process(es) {blind} do not see the files process 0 writes there '
        '(a local disk on each host?); give every process one shared workdir, e.g. '
        'gs://BUCKET/run, or a shared file system.')
  if len(set(every[:, 1].tolist())) > 1:
    raise CheckpointError(
        f'--workdir {workdir}: the processes see different checkpoints there (a copy on each '
        'host?); give every process one shared workdir, e.g. gs://BUCKET/run.')


def manager(workdir: str, name: str = 'checkpoints', keep: int = 2,
            best: bool = False) -> ocp.CheckpointManager:
  """`checkpoints/` keeps the latest `keep` steps; `best/` keeps the best one by accuracy."""
  directory = paths.path(workdir) / name
  options = ocp.CheckpointManagerOptions(
      max_to_keep=1 if best else keep, create=True, enable_async_checkpointing=True,
      best_fn=(lambda m: m['accuracy']) if best else None, best_mode='max',
      # Several processes: each manager's barriers under its own name. At an evaluation step
      # the latest and the best manager save at once, and under Orbax's default names their
      # finishing threads meet at one barrier ("... is already ongoing"): the run hung.
      multiprocessing_options=ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=name))

  def make():
    return ocp.CheckpointManager(
        directory, options=options,
        item_handlers={'state': ocp.StandardCheckpointHandler(),
                       'meta': ocp.JsonCheckpointHandler()})
  try:
    return make()
  except ValueError:  # The best manager reads every step's metrics when it starts.
    if not set_aside_unreadable_metrics(directory):
      raise
    return make()


def save(mngr: ocp.CheckpointManager, step: int, state, meta: dict, metrics=None):
  """Writes `step` (asynchronously). A step the best manager (`metrics`) holds already is kept:
  a run that resumed from before it computes the same step again."""
  if metrics is not None and step in mngr.all_steps():
    return
  state = to_loop_params(state)
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          meta=ocp.args.JsonSave(meta)), metrics=metrics)


def restore(mngr: ocp.CheckpointManager, abstract_state, step: Optional[int] = None):
  """(state, meta) at `step` (default: the latest readable one), placed like `abstract_state`
  (shardings, and its layout of the blocks: stacked or blocks/<i>). Damaged checkpoints are set
  aside; none readable raises CheckpointError."""
  steps = sorted(mngr.all_steps(), reverse=True) if step is None else [step]
  if not steps:
    raise CheckpointError(f'{mngr.directory} holds no checkpoint to resume from.')
  stored = to_loop_params(abstract_state)
  stacked = jax.tree.structure(stored) != jax.tree.structure(abstract_state)

  def read(s):
    out = mngr.restore(s, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(stored), meta=ocp.args.JsonRestore()))
    if not stacked:
      return out.state, out.meta
    shardings = jax.tree.map(lambda x: x.sharding, abstract_state)
    return jax.jit(to_scan_params, out_shardings=shardings)(out.state), out.meta
  fix = ('Run the same command again to start over from step 0, or use a new --workdir.'
         if step is None else 'Restore another step.')
  return first_readable(mngr, steps, read, fix)[1]


def load_params(workdir: str, step: Optional[int] = None, best: bool = False):
  """(config, params, step) from a run's latest / given / best checkpoint; a damaged latest or
  best one is set aside and the next readable one is used.

  Works for training checkpoints and params-only (imported) ones alike.
  """
  config = read_config(workdir)
  if config is None:
    raise FileNotFoundError(f'{workdir} has no {CONFIG_FILE}: not a liere_jax workdir.')
  mngr = manager(workdir, 'best' if best else 'checkpoints', best=best)
  try:
    steps = mngr.all_steps()
    if step is not None and step not in steps:
      raise ValueError(f'--step {step} is not in {workdir}; available: {sorted(steps)}.')
    if step is not None:
      order, fix = [step], f'Pick another --step ({sorted(set(steps) - {step})}).'
    elif best:
      first = mngr.best_step()
      order = [first] + sorted((s for s in steps if s != first), reverse=True)
      fix = 'Use the latest checkpoint instead (leave out --best).'
    else:
      order = sorted(steps, reverse=True)
      fix = f'Train again with --workdir {workdir} to write a new one.'
    if not steps and any(DAMAGED in d.name for d in paths.path(mngr.directory).iterdir()):
      raise CheckpointError(f'No readable checkpoint left in {mngr.directory} (damaged ones are '
                            f'set aside as <step>{DAMAGED}<time>). {fix}')
    if not steps:
      raise FileNotFoundError(f'{workdir} has no checkpoint yet; train first (liere_jax.train).')

    def read(s):
      item = mngr.restore(s, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(stored_target(mngr, s))))
      return item.state
    step, state = first_readable(mngr, order, read, fix)
  finally:
    mngr.close()
  return config, int_keys(state['params']), step


def save_params(workdir: str, config: ml_collections.ConfigDict, params, step: int = 0):
  """A params-only checkpoint (e.g. imported weights) that eval.py and load_params read; the
  caller has checked the workdir (check_same_model)."""
  write_config(workdir, config)
  mngr = manager(workdir)
  save(mngr, step, {'params': to_loop_params(params)},
       {'step': step, 'data_position': step, 'imported': True})
  mngr.wait_until_finished()
  mngr.close()
