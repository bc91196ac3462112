r"""Evaluates a trained run: top-1 with a bootstrap 95% CI, patch shuffling (paper Table 5),
other input sizes with the encoding's own and rescaled positions (Fig. 7), CLS attention maps.

  python -m liere_jax.eval --workdir /tmp/arrows [--best] [--step N] [--resolutions 168,216]

(`python eval.py ...` in a checkout is the same.) The run's own config.json is used;
`--config FILE[:args]` (with `--config.x=y` overrides) may replace it if it describes the same
model. Writes DIR/eval/results.json and DIR/eval/attention.png (`--out NAME`: DIR/NAME/;
`--num_eval N`: arrows, first N examples). Encodings that read no positions (none, abs, sincos)
are evaluated at other sizes in their own mode only (results.json: positions_modes).
Video with several views per video (data.eval_views, e.g. (5, 3)): `top1` is the per-view
accuracy (the official protocol), also written as `top1_per_view`, beside `top1_per_video`
(views' softmax averaged); the CI and n are over videos.

In a process of your own: `liere_jax.evaluation.evaluate_workdir(liere_jax.config.run.resolve(
config, jax.device_count()), DIR)`. This file is the command line: its flags, and the run's
config (its config.json or --config, with this command's overrides) resolved for this process's
devices.
"""
import jax
from absl import app, flags, logging
from ml_collections import config_flags

from liere_jax import command, distributed, evaluation, paths
from liere_jax.config import parse_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, "Config file[:args]; default: the run's own config.json.", lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The run to evaluate.')
_BEST = flags.DEFINE_bool('best', False, 'Use the best checkpoint instead of the latest.')
_STEP = flags.DEFINE_integer('step', None, 'Use this step instead of the latest.')
_RESOLUTIONS = flags.DEFINE_list('resolutions', None, 'Input sizes to evaluate besides the '
                                 "training one (paper Fig. 7); default: the config's.")
_OUT = flags.DEFINE_string('out', 'eval', 'Subdirectory of --workdir for the results.')
_PROCESS = distributed.process_flags()  # As train.py's: eval runs on the same processes.
_NUM_EVAL = flags.DEFINE_integer('num_eval', None, 'arrows: evaluate on the first N held-out '
                                 "examples (default: the config's data.num_eval).")


def _config(workdir: str):
  """The run's config (--config or its config.json) with this command's overrides."""
  from liere_jax import checkpoint
  config = _CONFIG.value or checkpoint.read_config(workdir)
  if config is None:
    raise app.UsageError(f'--workdir {workdir} has no {checkpoint.CONFIG_FILE}: not a run of '
                         'liere_jax.train (or pass --config).')
  if _RESOLUTIONS.value is not None:
    try:
      config.resolutions = tuple(int(s) for s in _RESOLUTIONS.value)
    except ValueError:
      raise app.UsageError(f'--resolutions={",".join(_RESOLUTIONS.value)}: input sizes are '
                           'integers, e.g. --resolutions=168,216.') from None
  if _NUM_EVAL.value is not None:
    if config.data.name != 'arrows' or _NUM_EVAL.value <= 0:
      raise app.UsageError(f'--num_eval={_NUM_EVAL.value}: only for the arrows task, and > 0 '
                           f'(this run trains on {config.data.name!r}).')
    config.data.num_eval = _NUM_EVAL.value
  return config


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from liere_jax import checkpoint
  from liere_jax.config import run as run_spec
  workdir = _WORKDIR.value
  with command.refusing():
    distributed.init_distributed(*(f.value for f in _PROCESS))
    paths.check_store(workdir, '--workdir')
    checkpoint.check_shared_workdir(workdir, create=False)  # Before any process reads it.
    run = run_spec.resolve(_config(workdir), jax.device_count())
    checkpoint.check_same_model(workdir, run.model)  # A --config of another model.
  evaluation.evaluate_workdir(run, workdir, step=_STEP.value, best=_BEST.value, out=_OUT.value,
                             checks=command.refusing)


def run():
  """`python -m liere_jax.eval` (and the checkout's eval.py)."""
  flags.mark_flags_as_required(['workdir'])
  command.run(main, 'eval', flags_parser=parse_flags)


if __name__ == '__main__':
  run()
