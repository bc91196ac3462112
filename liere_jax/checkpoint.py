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
import logging as std_logging
import os
import re
import sys
import time
from typing import Optional

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from liere_jax import spec as spec_lib
from liere_jax.model import to_loop_params, to_scan_params

CONFIG_FILE = 'config.json'
DAMAGED = '.damaged-'  # checkpoints/4 -> checkpoints/4.damaged-20250101-120000
# Status codes of read errors that say nothing about the files themselves (not damage).
_TRANSIENT = ('UNAVAILABLE', 'DEADLINE_EXCEEDED', 'RESOURCE_EXHAUSTED', 'PERMISSION_DENIED',
              'CANCELLED', 'ABORTED')
_READ_ERRORS = (ValueError, KeyError, EOFError, FileNotFoundError, NotADirectoryError,
                IsADirectoryError)


class CheckpointError(ValueError):
  """A run directory or checkpoint that cannot be used; the message is one line with the fix."""


def config_to_json(config: ml_collections.ConfigDict) -> str:
  return config.to_json(sort_keys=True, indent=1)


def read_config(workdir: str) -> Optional[ml_collections.ConfigDict]:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      config = _tuples(json.load(f))
  except ValueError as e:
    raise CheckpointError(
        f'{path} cannot be read (invalid JSON: {e}). Move it away to resume with the --config '
        'of the same model (a new one is written), or use a new --workdir.') from None
  if 'pe' in config.get('model', {}):  # Fields added since the run was written.
    config['model'] = {**spec_lib.MODEL_ADDED, **config['model']}
    config['model']['pe'] = {**spec_lib.PE_ADDED, **config['model']['pe']}
  if 'data' in config:
    from liere_jax.data.spec import DATA_ADDED
    config['data'] = {**DATA_ADDED, **config['data']}
  return ml_collections.ConfigDict(config)


def _tuples(x):
  return {k: _tuples(v) for k, v in x.items()} if isinstance(x, dict) else (
      tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x)


def _leaves(tree, prefix=''):
  """{'model.pe.name': value, ...} of a nested dict."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  return {k: v for key, sub in tree.items() for k, v in _leaves(sub, f'{prefix}.{key}'
                                                              if prefix else key).items()}


def has_checkpoint(workdir: str) -> bool:
  path = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(path) and any(d.isdigit() for d in os.listdir(path))


def _tree_fields(model, stored: bool = False) -> dict:
  """{'model.width': 32, ...}: the fields that define the parameter tree (ModelSpec.tree_fields).

  A `stored` run may carry options its encoding ignored then and refuses now; those are reset.
  """
  try:
    fields = spec_lib.resolve(model).tree_fields()
  except ValueError:
    if not stored:
      raise
    from liere_jax.encodings import registry
    m = model.to_dict() if hasattr(model, 'to_dict') else dict(model)
    facts, pe = registry.facts(m['pe']['name']), dict(m['pe'])
    pe.update({k: v for k, v in spec_lib.PE_OPTION_DEFAULTS.items() if k not in facts.options})
    if not facts.reads_positions:
      pe.update(positions=None, jitter=0.0)
    fields = spec_lib.resolve({**m, 'pe': pe}).tree_fields()
  return _leaves(fields, 'model')


def check_same_model(workdir: str, config: ml_collections.ConfigDict):
  """Raises if `workdir` holds a checkpoint of a model with another parameter tree (before
  anything is written). How the tree is computed (remat, scan_layers, dtype, ...) may change.

  A workdir without a checkpoint (a run that failed before its first save) takes any config.
  """
  stored = read_config(workdir)
  if stored is None or not has_checkpoint(workdir):
    return
  new = _tree_fields(config.model)
  try:
    old = _tree_fields(stored.model, stored=True)
  except ValueError as e:
    raise CheckpointError(f'--workdir {workdir} holds a run whose model section no longer '
                          f'resolves ({e}); use a new --workdir.') from None
  raw = _leaves(_tuples(stored.model.to_dict()), 'model')
  # Fields a config sets (model.width) before the ones derived from them (model.head_dim).
  diff = sorted((k for k in set(old) | set(new) if old.get(k) != new.get(k)),
                key=lambda k: (spec_lib.json_ready(raw.get(k)) != old.get(k), k))
  if not diff:
    return
  key, value = diff[0], old.get(diff[0])
  also = f'; also {", ".join(diff[1:4])}' + (' ...' if len(diff) > 4 else '') if diff[1:] else ''
  flag = f'"{tuple(value)}"' if isinstance(value, list) else value
  resume = (f'--config.{key}={flag}' if spec_lib.json_ready(raw.get(key)) == value
            else f"that run's config ({CONFIG_FILE} there)")
  raise CheckpointError(
      f'--workdir {workdir} holds a run of a different model ({key}: {value!r} there, '
      f'{new.get(key)!r} now{also}): another parameter tree. Use a new --workdir, or {resume} '
      'to resume it.')


def write_config(workdir: str, config: ml_collections.ConfigDict):
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    tmp = os.path.join(workdir, CONFIG_FILE + '.tmp')
    with open(tmp, 'w') as f:
      f.write(config_to_json(config))
    os.replace(tmp, os.path.join(workdir, CONFIG_FILE))


def manager(workdir: str, name: str = 'checkpoints', keep: int = 2,
            best: bool = False) -> ocp.CheckpointManager:
  """`checkpoints/` keeps the latest `keep` steps; `best/` keeps the best one by accuracy."""
  directory = os.path.abspath(os.path.join(workdir, name))
  options = ocp.CheckpointManagerOptions(
      max_to_keep=1 if best else keep, create=True, enable_async_checkpointing=True,
      best_fn=(lambda m: m['accuracy']) if best else None, best_mode='max')

  def make():
    return ocp.CheckpointManager(
        directory, options=options,
        item_handlers={'state': ocp.StandardCheckpointHandler(),
                       'meta': ocp.JsonCheckpointHandler()})
  try:
    return make()
  except ValueError:  # The best manager reads every step's metrics when it starts.
    if not _set_aside_unreadable_metrics(directory):
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
  return _first_readable(mngr, steps, read, fix)[1]


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
    if not steps and any(DAMAGED in d for d in os.listdir(mngr.directory)):
      raise CheckpointError(f'No readable checkpoint left in {mngr.directory} (damaged ones are '
                            f'set aside as <step>{DAMAGED}<time>). {fix}')
    if not steps:
      raise FileNotFoundError(f'{workdir} has no checkpoint yet; train first (liere_jax.train).')

    def read(s):
      item = mngr.restore(s, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(_target(mngr, s))))
      return item.state
    step, state = _first_readable(mngr, order, read, fix)
  finally:
    mngr.close()
  return config, _int_keys(state['params']), step


def _target(mngr: ocp.CheckpointManager, step: int):
  """The stored state's shapes and dtypes, on this process's first device (whatever topology
  wrote the checkpoint)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                      mngr.item_metadata(step)['state'])


def _int_keys(tree):
  """Orbax returns the layer indices of `blocks` as strings; the model's tree uses ints."""
  if not isinstance(tree, dict):
    return tree
  return {int(k) if isinstance(k, str) and k.isdigit() else k: _int_keys(v)
          for k, v in tree.items()}


def save_params(workdir: str, config: ml_collections.ConfigDict, params, step: int = 0):
  """A params-only checkpoint (e.g. imported weights) that eval.py and load_params read."""
  check_same_model(workdir, config)
  write_config(workdir, config)
  mngr = manager(workdir)
  save(mngr, step, {'params': to_loop_params(params)}, {'step': step, 'data_position': step, 'imported': True})
  mngr.wait_until_finished()
  mngr.close()


# Damaged checkpoints.


def _first_readable(mngr: ocp.CheckpointManager, steps, read, fix: str):
  """(step, read(step)) of the first of `steps` that every process reads. A step that cannot
  be read as written (here or in another process) is set aside with one logged line; none left
  raises CheckpointError ending in `fix`."""
  _quiet_stale_reads()
  directory = str(mngr.directory)
  for i, step in enumerate(steps):
    try:
      result, error = read(step), None
    except _READ_ERRORS as e:
      if _transient(e):
        raise
      result, error = None, e
    if all_processes_agree(error is None):  # Every process resumes from the same step.
      return step, result
    problem = _damage(mngr, step) if error is not None else None
    if error is not None and problem is None:  # It reads as written: the target does not fit.
      raise CheckpointError(
          f'{directory}/{step} does not fit the model and optimizer of this config '
          f'({_first_line(error)}). Use the config it was written with, or a new --workdir.'
      ) from None
    problem = problem or 'another process could not read it'
    moved = _set_aside(directory, step)
    mngr.reload()
    then = f'using step {steps[i + 1]}' if i + 1 < len(steps) else 'no other step to use'
    logging.warning('Checkpoint step %d cannot be read: %s. %s; %s.', step, problem, moved, then)
  raise CheckpointError(f'No readable checkpoint left in {directory} (damaged ones are set '
                        f'aside as <step>{DAMAGED}<time>). {fix}')


def all_processes_agree(ok: bool) -> bool:
  """True when `ok` is true in every process (a collective: all processes call it alike)."""
  if jax.process_count() == 1:
    return ok
  return bool(multihost_utils.process_allgather(np.int32(ok)).min())


def _damage(mngr: ocp.CheckpointManager, step: int) -> Optional[str]:
  """'<file>: <reason>' when `step` cannot be read with its own shapes, else None."""
  directory = os.path.join(str(mngr.directory), str(step))
  try:
    items = {'state': ocp.args.StandardRestore(_target(mngr, step))}
    if os.path.isdir(os.path.join(directory, 'meta')):
      items['meta'] = ocp.args.JsonRestore()
    mngr.restore(step, args=ocp.args.Composite(**items))
  except _READ_ERRORS as error:
    if _transient(error):
      raise
    return _describe(directory, error)
  return None


def _transient(error: Exception) -> bool:
  return isinstance(error, ValueError) and str(error).startswith(_TRANSIENT)


def _first_line(error: Exception, limit: int = 300) -> str:
  """`error` in one line, without TensorStore's spec and Orbax's advice on partial restores."""
  text = str(error).split(' [tensorstore_spec', 1)[0]
  text = re.split(r'\s*(?:If this mismatch is intentional|Truncating/padding is disabled)', text)[0]
  return ' '.join(line.strip() for line in text.splitlines() if line.strip())[:limit] or (
      type(error).__name__)


def _describe(directory: str, error: Exception) -> str:
  """'<file>: <reason>' for a read error of the checkpoint in `directory`."""
  text = _first_line(error, limit=2000)
  # TensorStore: 'CODE: Error opening ...: Error reading ... local file "FILE": reason'.
  parts = re.split(r': (?=(?:[^"]*"[^"]*")*[^"]*$)', text)  # At ': ' outside quotes.
  at = [i for i, part in enumerate(parts) if 'file "' in part]
  if at:
    path = re.findall(r'file "([^"]+)"', parts[at[-1]])[-1]
    reason = ': '.join(parts[at[-1] + 1:]) or parts[at[-1]]
    code = f' ({parts[0]})' if re.fullmatch(r'[A-Z_]+', parts[0]) else ''
    return f'{path}: {reason[:300]}{code}'
  for root, _, names in sorted(os.walk(directory)):
    for name in sorted(names):
      path = os.path.join(root, name)
      if os.path.basename(root) == 'd' or name.endswith(('.ocdbt', '.txt')):
        continue  # Array data and OCDBT manifests are binary.
      try:
        with open(path) as f:
          json.load(f)
      except ValueError as e:
        return f'{path}: invalid JSON ({e})'
  if not os.path.isdir(os.path.join(directory, 'state')):
    return f'{os.path.join(directory, "state")}: missing'
  return f'{directory}: {type(error).__name__}: {text}'


def _set_aside(directory: str, step: int) -> str:
  """Renames `directory`/`step` to `step`.damaged-<time> (process 0); says what happened."""
  src = os.path.join(directory, str(step))
  dst = f'{src}{DAMAGED}{time.strftime("%Y%m%d-%H%M%S")}'
  n = 1
  while os.path.exists(dst):
    dst, n = f'{src}{DAMAGED}{time.strftime("%Y%m%d-%H%M%S")}-{n}', n + 1
  if jax.process_index() != 0:
    return 'Process 0 sets it aside'
  try:
    os.rename(src, dst)
  except OSError as e:
    return f'Could not move it aside ({e.strerror}); it stays at {src}'
  return f'Moved it to {dst}'


def _set_aside_unreadable_metrics(directory: str) -> bool:
  """Sets aside the steps of `directory` whose metrics file is not JSON; True if any."""
  found = False
  for name in sorted(os.listdir(directory), key=lambda d: -int(d) if d.isdigit() else 0):
    path = os.path.join(directory, name, 'metrics', 'metrics')
    if not name.isdigit() or not os.path.isfile(path):
      continue
    try:
      with open(path) as f:
        json.load(f)
    except ValueError as e:
      moved = _set_aside(directory, int(name))
      logging.warning('Checkpoint step %s cannot be read: %s: invalid JSON (%s). %s.', name,
                      path, e, moved)
      found = True
  return found


def _drop_closed_loop_reports(unraisable):
  """Reads still in flight when an Orbax read fails report into its closed event loop."""
  if not (isinstance(unraisable.exc_value, RuntimeError)
          and str(unraisable.exc_value) == 'Event loop is closed'):
    _drop_closed_loop_reports.next_hook(unraisable)


class _DropFailedReadTasks(std_logging.Filter):
  """asyncio's 'Task exception was never retrieved' for the other reads of a failed restore."""

  def filter(self, record):
    return not (record.getMessage().startswith('Task exception was never retrieved')
                and record.exc_info and isinstance(record.exc_info[1], ValueError))


_DROP_FAILED_READ_TASKS = _DropFailedReadTasks()


def _quiet_stale_reads():
  """Installs _drop_closed_loop_reports in front of sys.unraisablehook and the asyncio filter
  (once each)."""
  if sys.unraisablehook is not _drop_closed_loop_reports:
    _drop_closed_loop_reports.next_hook = sys.unraisablehook
    sys.unraisablehook = _drop_closed_loop_reports
  asyncio_log = std_logging.getLogger('asyncio')
  if _DROP_FAILED_READ_TASKS not in asyncio_log.filters:
    asyncio_log.addFilter(_DROP_FAILED_READ_TASKS)
