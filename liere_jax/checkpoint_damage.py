"""Damaged checkpoints: find the first step every process reads, name what is wrong with the
others in one line (file and reason), set them aside as <step>.damaged-<time> (never deleted),
and keep Orbax's and asyncio's reports of the failed reads off the console."""
import json
import logging as std_logging
import re
import sys
import time
from typing import Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from liere_jax import paths

DAMAGED = '.damaged-'  # checkpoints/4 -> checkpoints/4.damaged-20250101-120000
# Status codes of read errors that say nothing about the files themselves (not damage).
_TRANSIENT = ('UNAVAILABLE', 'DEADLINE_EXCEEDED', 'RESOURCE_EXHAUSTED', 'PERMISSION_DENIED',
              'CANCELLED', 'ABORTED')
_READ_ERRORS = (ValueError, KeyError, EOFError, FileNotFoundError, NotADirectoryError,
                IsADirectoryError)


class CheckpointError(ValueError):
  """A run directory or checkpoint that cannot be used; the message is one line with the fix."""


def stored_target(mngr: ocp.CheckpointManager, step: int):
  """The stored state's shapes and dtypes, on this process's first device (whatever topology
  wrote the checkpoint)."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                      mngr.item_metadata(step)['state'])


def first_readable(mngr: ocp.CheckpointManager, steps, read, fix: str):
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
  directory = paths.path(mngr.directory) / str(step)
  try:
    items = {'state': ocp.args.StandardRestore(stored_target(mngr, step))}
    if (directory / 'meta').is_dir():
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


def _describe(directory, error: Exception) -> str:
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
  for path in paths.files_under(directory):
    if path.parent.name == 'd' or path.name.endswith(('.ocdbt', '.txt')):
      continue  # Array data and OCDBT manifests are binary.
    try:
      json.loads(path.read_text())
    except ValueError as e:  # UnicodeDecodeError too.
      return f'{path}: invalid JSON ({e})'
  if not (directory / 'state').is_dir():
    return f'{directory / "state"}: missing'
  return f'{directory}: {type(error).__name__}: {text}'


def _set_aside(directory: str, step: int) -> str:
  """Renames `directory`/`step` to `step`.damaged-<time> (process 0); says what happened."""
  src = paths.path(directory) / str(step)
  dst = src.with_name(f'{step}{DAMAGED}{time.strftime("%Y%m%d-%H%M%S")}')
  n = 1
  while dst.exists():
    dst, n = src.with_name(f'{step}{DAMAGED}{time.strftime("%Y%m%d-%H%M%S")}-{n}'), n + 1
  if jax.process_index() != 0:
    return 'Process 0 sets it aside'
  try:
    src.rename(dst)  # On a bucket (no renames), epath copies every object, then deletes.
  except OSError as e:
    return f'Could not move it aside ({e.strerror or e}); it stays at {src}'
  return f'Moved it to {dst}'


def set_aside_unreadable_metrics(directory: str) -> bool:
  """Sets aside the steps of `directory` whose metrics file is not JSON; True if any."""
  found = False
  directory = paths.path(directory)
  for step in reversed(steps_in(directory)):
    path, name = directory / str(step) / 'metrics' / 'metrics', str(step)
    if not path.is_file():
      continue
    try:
      json.loads(path.read_text())
    except ValueError as e:
      moved = _set_aside(directory, int(name))
      logging.warning('Checkpoint step %s cannot be read: %s: invalid JSON (%s). %s.', name,
                      path, e, moved)
      found = True
  return found


def steps_in(directory) -> list:
  """The steps (folders named by a number) in a checkpoints/ or best/ folder, ascending."""
  directory = paths.path(directory)
  return sorted(int(d.name) for d in directory.iterdir()
                if d.name.isdigit()) if directory.is_dir() else []


def _drop_closed_loop_reports(unraisable):
  """Reads still in flight when an Orbax read fails report into its closed event loop."""
  if not (isinstance(unraisable.exc_value, RuntimeError)
          and str(unraisable.exc_value) == 'Event loop is closed'):
    _drop_closed_loop_reports.next_hook(unraisable)


class _DropFailedReadTasks(std_logging.Filter):
  """asyncio's 'Task (or Future) exception was never retrieved' for the other reads of a failed
  restore (which one depends on when the garbage collector finds them)."""

  def filter(self, record):
    return not (record.getMessage().startswith(('Task exception was never retrieved',
                                                'Future exception was never retrieved'))
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
