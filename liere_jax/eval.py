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
"""
import json

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from liere_jax import cli, config_lib, paths

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, "Config file[:args]; default: the run's own config.json.", lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The run to evaluate.')
_BEST = flags.DEFINE_bool('best', False, 'Use the best checkpoint instead of the latest.')
_STEP = flags.DEFINE_integer('step', None, 'Use this step instead of the latest.')
_RESOLUTIONS = flags.DEFINE_list('resolutions', None, 'Input sizes to evaluate besides the '
                                 "training one (paper Fig. 7); default: the config's.")
_OUT = flags.DEFINE_string('out', 'eval', 'Subdirectory of --workdir for the results.')
_PROCESS = cli.process_flags()  # As train.py's: eval runs on the same processes.
_NUM_EVAL = flags.DEFINE_integer('num_eval', None, 'arrows: evaluate on the first N held-out '
                                 "examples (default: the config's data.num_eval).")


def _config(workdir: str):
  """The run's config (--config or its config.json) with this command's overrides."""
  from liere_jax import checkpoint
  config = _CONFIG.value or checkpoint.read_config(workdir)
  if config is None:
    raise app.UsageError(f'--workdir {workdir} has no {checkpoint.CONFIG_FILE}: not a run of '
                         'liere_jax.train (or pass --config).')
  checkpoint.check_same_model(workdir, config)
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
  from liere_jax import checkpoint, evaluation, run_spec, train_lib
  workdir = _WORKDIR.value
  cli.init_distributed(_PROCESS)
  paths.check_store(workdir, '--workdir')
  checkpoint.check_shared_workdir(workdir, create=False)  # Before any process reads it.
  run = run_spec.resolve(_config(workdir), jax.device_count())
  _, params, step = checkpoint.load_params(workdir, _STEP.value, best=_BEST.value)
  trainer = train_lib.Trainer(run, train_lib.make_mesh(model_parallel=run.loop.model_parallel))
  params = trainer.place_params(params)  # Stacked under model.scan_layers.

  accuracy, results = evaluation.evaluate_run(trainer, params)
  results = dict(step=int(step), pe=run.model.pe.name, **results)
  if jax.process_index() != 0:
    return
  out = paths.path(workdir) / _OUT.value
  out.mkdir(parents=True, exist_ok=True)
  results['attention_png'] = str(out / 'attention.png')
  evaluation.attention_png(trainer, params, results['attention_png'])
  paths.write(out / 'results.json', json.dumps(results, indent=1))
  (lo, hi), top1, shuffled = results['top1_ci95'], accuracy.top1, results['shuffled_top1']
  print(f"{'run':24s}{workdir} (step {step}, pe={results['pe']})")
  print(f"{'top-1':24s}{top1:.4f}  [{lo:.4f}, {hi:.4f}] 95% CI, n={results['n_examples']}")
  if accuracy.per_video is not None:
    print(f"{'top-1 per view, video':24s}{accuracy.per_view:.4f}, {accuracy.per_video:.4f}  "
          f'(views: {run.data.eval_views}; top-1 is per view)')
  print(f"{'top-1, patches shuffled':24s}{shuffled:.4f}  (drop {top1 - shuffled:+.4f})")
  for size, by_mode in results['resolutions'].items():
    cells = '  '.join(f'{mode} {acc:.4f}' for mode, acc in by_mode.items())
    print(f"{'top-1 at ' + size + ' px':24s}{cells}")
  print(f"{'results':24s}{out / 'results.json'}")


def run():
  """`python -m liere_jax.eval` (and the checkout's eval.py)."""
  flags.mark_flags_as_required(['workdir'])
  from liere_jax import checkpoint
  app.run(cli.one_line(main, (checkpoint.CheckpointError, FileNotFoundError), 'eval'),
          flags_parser=config_lib.parse_flags)


if __name__ == '__main__':
  run()
