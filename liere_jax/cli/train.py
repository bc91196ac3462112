"""The command line of liere_jax.train (its docstring says how to run it): the flags, and the
config resolved for this process's devices before train.train_and_evaluate."""
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from liere_jax import cli, config_lib, train

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file[:args].',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints and metrics go.')
_PROCESS = cli.process_flags()
_PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar.')
_CHECK_FIT = flags.DEFINE_string(
    'check_fit', None, "First compile the train step for a Cloud TPU slice (e.g. v5litepod-256: "
    "deviceless, before any host waits on another) or for 'devices' (the ones it runs on), and "
    'stop in one line, exit 2, where it does not fit their memory (liere_jax.bench.compile). '
    'Costs one more compile.')
# A preempted run exits with the status of a process ended by SIGTERM, after saving.
PREEMPTED_EXIT = 143


def main(argv):
  del argv
  from liere_jax.config import run as run_spec
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value
  if not workdir:
    raise app.UsageError('--workdir is required.')
  fit = _CHECK_FIT.value
  if fit and fit != 'devices':  # The slice's program, compiled here before the pod starts.
    from liere_jax.bench import compile as tpu
    with cli.refusing():
      print(f"{fit}: fits ({tpu.check_fit(_CONFIG.value, fit)['need'] / tpu.GiB:.2f} GiB a chip).")
  cli.init_distributed(_PROCESS)
  # Everything is checked before anything is compiled or written.
  with cli.refusing():
    run = run_spec.resolve(_CONFIG.value, jax.device_count())  # A bad config file fails here.
    if fit == 'devices':
      from liere_jax.bench import compile as tpu
      tpu.check_fit(_CONFIG.value, fit)
  if train.train_and_evaluate(run, workdir, progress=_PROGRESS.value,
                              checks=cli.refusing) is not None:
    sys.exit(PREEMPTED_EXIT)


def run():
  """`python -m liere_jax.train` (and the checkout's train.py)."""
  flags.mark_flags_as_required(['config', 'workdir'])
  cli.run(main, 'train', flags_parser=config_lib.parse_flags)


if __name__ == '__main__':
  run()
