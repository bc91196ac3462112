"""Paths a user gives (workdirs, model_init, exports, data_dir): local folders or URLs such as
gs://bucket/run, all through etils `epath` (as Orbax and TFDS do). gs:// needs gcsfs (epath's
backend without TensorFlow) and, for TensorBoard events, google-cloud-storage (tensorboardX's
client); both are in requirements.txt.

Object stores have no append and no directory rename, so what a run writes is a set of whole
objects: metrics go to metrics/<time>_<first>-<last>.jsonl, one object per flush (an older run's
single metrics.jsonl is still read first), and each file is written whole: under a temporary
name renamed at the end on a local disk, in one upload (atomic there) on a store.
"""
import json
import os
import threading
import time
from typing import List, Optional, Union

from etils import epath
from fsspec import config as fsspec_config

PathLike = Union[str, os.PathLike]

# gcsfs caches directory listings for the life of a process; other processes (the other hosts
# of a pod, a later run, tensorstore's own writes) change a bucket behind that cache, and a
# stale listing hides their checkpoints. Every listing is asked afresh.
fsspec_config.conf.setdefault('gs', {}).setdefault('use_listings_cache', False)
METRICS_DIR = 'metrics'
LEGACY_METRICS = 'metrics.jsonl'  # Runs written before metrics/ (appended to, local only).


def is_url(p: PathLike) -> bool:
  return '://' in os.fspath(p)


def path(p: PathLike) -> epath.Path:
  """`p` as an epath.Path: a URL as given, a local path expanded (~) and made absolute."""
  s = os.fspath(p)
  return epath.Path(s if is_url(s) else os.path.abspath(os.path.expanduser(s)))


def write(p: PathLike, data: Union[str, bytes]):
  """`data` at `p` whole: readers see the old file or the new one, never a part."""
  p = path(p)
  data = data.encode() if isinstance(data, str) else data
  if is_url(p):  # One upload: an object appears complete or not at all.
    p.write_bytes(data)
    return
  tmp = p.with_name(p.name + '.tmp')
  tmp.write_bytes(data)
  os.replace(tmp, p)


def read_json(p: PathLike):
  return json.loads(path(p).read_text())


def store_problem(p: PathLike, timeout: float = None) -> Optional[str]:
  """Why the store of URL `p` cannot be read (a missing client, no credentials or permission,
  no such bucket, no answer within `timeout` s), in a few words; None when it can (or `p` is
  local). Clients retry for minutes on an unreachable store: this asks once, with a deadline."""
  s = os.fspath(p)
  if not is_url(s):
    return None
  timeout = float(os.environ.get('LIERE_STORE_TIMEOUT_S', 60)) if timeout is None else timeout
  scheme, rest = s.split('://', 1)
  if scheme == 'gs':
    try:
      import gcsfs  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      return ('reading gs:// needs gcsfs, which is not installed (pip install -r '
              'requirements.txt)')
  bucket = f'{scheme}://{rest.split("/", 1)[0]}'
  result = {}

  def probe():
    try:
      result['exists'] = path(bucket).exists()
    except Exception as e:  # pylint: disable=broad-except  # Clients raise many kinds.
      result['error'] = e
  thread = threading.Thread(target=probe, daemon=True)
  thread.start()
  thread.join(timeout)
  if thread.is_alive():
    return (f'no answer from {bucket} within {timeout:.0f} s (no network? '
            'LIERE_STORE_TIMEOUT_S sets the wait)')
  error = result.get('error')
  if error is not None:
    text = ' '.join(str(error).split())[:200]
    if 'Credentials' in type(error).__name__ or 'credentials' in text.lower():
      return (f'no Google Cloud credentials to read {bucket} (`gcloud auth application-default '
              f'login`, or a VM service account): {text}')
    if isinstance(error, PermissionError) or any(c in text for c in ('401', '403')):
      return (f'no permission to read {bucket} (credentials of an account with access: '
              f'`gcloud auth application-default login`): {text}')
    return f'{bucket} cannot be read ({type(error).__name__}: {text})'
  if not result['exists']:
    return f'there is no bucket {bucket} (create it: gcloud storage buckets create {bucket})'
  return None


def check_store(p: Optional[PathLike], what: str, tensorboard: bool = False):
  """Raises FileNotFoundError, one line naming `what` (e.g. '--workdir'), when `p` is a URL
  whose store cannot be used (store_problem); `tensorboard`: TensorBoard events go there too,
  which tensorboardX writes with google-cloud-storage."""
  if p is None or not is_url(p):
    return
  problem = store_problem(p)
  if problem is None and tensorboard and os.fspath(p).startswith('gs://'):
    try:
      from google.cloud import storage  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      problem = ('TensorBoard events on gs:// need google-cloud-storage, which is not '
                 'installed (pip install -r requirements.txt)')
  if problem:
    raise FileNotFoundError(f'{what}={os.fspath(p)} cannot be used: {problem}.')


def files_under(p: PathLike):
  """Every file below `p`, depth first (epath's rglob and walk do not work on gs://)."""
  for child in sorted(path(p).iterdir()):
    if child.is_dir():
      yield from files_under(child)
    else:
      yield child


class MetricsWriter:
  """Lines {'step': ..., **metrics} buffered and written as one object per flush."""

  def __init__(self, workdir: PathLike):
    self.dir = path(workdir) / METRICS_DIR
    self.lines: List[str] = []
    self.steps: List[int] = []

  def add(self, step: int, metrics: dict):
    self.lines.append(json.dumps({'step': step, **metrics}) + '\n')
    self.steps.append(step)

  def flush(self):
    if not self.lines:
      return
    self.dir.mkdir(parents=True, exist_ok=True)
    name = f'{time.time_ns():020d}_{self.steps[0]}-{self.steps[-1]}.jsonl'
    write(self.dir / name, ''.join(self.lines))
    self.lines, self.steps = [], []


def read_metrics(workdir: PathLike) -> List[dict]:
  """Every metrics line of a run in the order written (an old run's metrics.jsonl first); a
  step logged twice, as after a resume, appears twice: the later line is the current one."""
  workdir = path(workdir)
  texts = []
  if (workdir / LEGACY_METRICS).exists():
    texts.append((workdir / LEGACY_METRICS).read_text())
  if (workdir / METRICS_DIR).exists():
    texts += [f.read_text() for f in sorted((workdir / METRICS_DIR).glob('*.jsonl'))]
  return [json.loads(line) for text in texts for line in text.splitlines() if line.strip()]
