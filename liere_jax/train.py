r"""Trains a ViT from a config on 1 CPU, many devices or a multi-host pod, unchanged.

  python -m liere_jax.train --config configs/arrows.py --workdir /tmp/arrows
  python -m liere_jax.train --config configs/cifar100.py:pe=liere8,variant=B --workdir DIR \
      --config.total_steps=1000 --config.batch_size=256

(`python train.py ...` in a checkout is the same.) Running the same command again resumes from
the latest checkpoint, exactly: the RNG is a function of (seed, step) and batch k is
`train_ds[k]`. Several processes: set --coordinator_address/--num_processes/--process_id (or run
on a TPU pod, where `jax.distributed.initialize()` finds them itself).
`--config.model_init=DIR[:best|:STEP]` (or an export, or an official checkpoint) starts a new run
from another's parameters: fine-tuning, liere_jax/model_init.py.

In a process of your own (a notebook, a test), with no flags (liere_jax/training.py):

  run = liere_jax.config.run.resolve(config, jax.device_count())
  liere_jax.training.train_and_evaluate(run, workdir)

This file is the command line: its flags, and the config resolved for this process's devices.
"""
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from liere_jax import command, distributed, training
from liere_jax.config import parse_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file[:args].',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints and metrics go.')
_PROCESS = distributed.process_flags()
_PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar.')
_CHECK_FIT = flags.DEFINE_string(
    'check_fit', None, "First compile the train step for a Cloud TPU slice (e.g. v5litepod-256: "
    "deviceless, before any host waits on another) or for 'devices' (the ones it runs on), and "
    'stop in one line, exit 2, where it does not fit their memory (liere_jax/fit.py). '
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
    from liere_jax import fit as fits
    with command.refusing():
      print(f"{fit}: fits ({fits.check_fit(_CONFIG.value, fit)['need'] / fits.GiB:.2f} GiB a "
            'chip).')
  with command.refusing():
    distributed.init_distributed(*(f.value for f in _PROCESS))
  # Everything is checked before anything is compiled or written.
  with command.refusing():
    run = run_spec.resolve(_CONFIG.value, jax.device_count())  # A bad config file fails here.
    if fit == 'devices':
      from liere_jax import fit as fits
      fits.check_fit(_CONFIG.value, fit)
  if training.train_and_evaluate(run, workdir, progress=_PROGRESS.value,
                                 checks=command.refusing) is not None:
    sys.exit(PREEMPTED_EXIT)


def run():
  """`python -m liere_jax.train` (and the checkout's train.py)."""
  flags.mark_flags_as_required(['config', 'workdir'])
  command.run(main, 'train', flags_parser=parse_flags)


if __name__ == '__main__':
  run()
