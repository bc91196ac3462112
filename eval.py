r"""Evaluates a trained run: top-1 with a bootstrap 95% CI, patch shuffling (paper Table 5),
other input sizes with sequential and rescaled positions (Fig. 7), CLS attention maps.

  python eval.py --workdir /tmp/arrows [--best] [--step N] [--resolutions 168,216]

The run's own config.json is used; `--config FILE[:args]` (with `--config.x=y` overrides) may
replace it if it describes the same model. Writes DIR/eval/results.json and
DIR/eval/attention.png (`--out NAME`: DIR/NAME/; `--num_eval N`: arrows, first N examples).
Video with several views per video (data.eval_views, e.g. (5, 3)): `top1` is the per-view
accuracy (the official protocol), also written as `top1_per_view`, beside `top1_per_video`
(views' softmax averaged); the CI and n are over videos.
"""
import json
import os

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from liere_jax import config_lib

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, "Config file[:args]; default: the run's own config.json.", lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'The run to evaluate.')
_BEST = flags.DEFINE_bool('best', False, 'Use the best checkpoint instead of the latest.')
_STEP = flags.DEFINE_integer('step', None, 'Use this step instead of the latest.')
_RESOLUTIONS = flags.DEFINE_list('resolutions', None, 'Input sizes to evaluate besides the '
                                 "training one (paper Fig. 7); default: the config's.")
_OUT = flags.DEFINE_string('out', 'eval', 'Subdirectory of --workdir for the results.')
_NUM_EVAL = flags.DEFINE_integer('num_eval', None, 'arrows: evaluate on the first N held-out '
                                 "examples (default: the config's data.num_eval).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from liere_jax import checkpoint, evaluation, train_lib
  workdir = _WORKDIR.value
  train_lib.init_distributed()
  config = _CONFIG.value or checkpoint.read_config(workdir)
  if config is None:
    raise app.UsageError(f'--workdir {workdir} has no {checkpoint.CONFIG_FILE}: not a run of '
                         'train.py (or pass --config).')
  checkpoint.check_same_model(workdir, config)
  if _RESOLUTIONS.value is not None:
    config.resolutions = tuple(int(s) for s in _RESOLUTIONS.value)
  if _NUM_EVAL.value is not None:
    if config.data.name != 'arrows' or _NUM_EVAL.value <= 0:
      raise app.UsageError(f'--num_eval={_NUM_EVAL.value}: only for the arrows task, and > 0 '
                           f'(this run trains on {config.data.name!r}).')
    config.data.num_eval = _NUM_EVAL.value
  config_lib.validate(config, jax.device_count())
  _, params, step = checkpoint.load_params(workdir, _STEP.value, best=_BEST.value)
  trainer = train_lib.Trainer(config, train_lib.make_mesh(model_parallel=config.model_parallel))
  params = jax.device_put(params, trainer.state_sharding['params'])

  accuracy = evaluation.evaluate(trainer, config, params)
  top1, correct = accuracy.top1, accuracy.correct
  shuffled = evaluation.evaluate(trainer, config, params, shuffle=True).top1
  default_mode = trainer.spec.pe.positions
  resolutions = {}
  for size in config.resolutions:
    resolutions[str(size)] = {
        mode: evaluation.evaluate(trainer, config, params, input_size=size, positions=mode).top1
        for mode in dict.fromkeys((default_mode, 'rescaled'))}
  results = dict(
      step=int(step), pe=config.model.pe.name, n_examples=int(len(correct)),
      **accuracy.metrics('top1'), top1_ci95=evaluation.bootstrap_ci(correct),
      shuffled_top1=shuffled,
      shuffle_drop=top1 - shuffled, positions_default=default_mode, resolutions=resolutions)
  if jax.process_index() == 0:
    out = os.path.join(workdir, _OUT.value)
    os.makedirs(out, exist_ok=True)
    results['attention_png'] = os.path.join(out, 'attention.png')
    evaluation.attention_png(trainer, config, params, results['attention_png'])
    with open(os.path.join(out, 'results.json'), 'w') as f:
      json.dump(results, f, indent=1)
    lo, hi = results['top1_ci95']
    print(f"{'run':24s}{workdir} (step {step}, pe={results['pe']})")
    print(f"{'top-1':24s}{top1:.4f}  [{lo:.4f}, {hi:.4f}] 95% CI, n={len(correct)}")
    if accuracy.per_video is not None:
      print(f"{'top-1 per view, video':24s}{accuracy.per_view:.4f}, {accuracy.per_video:.4f}  "
            f'(views: {tuple(config.data.eval_views)}; top-1 is per view)')
    print(f"{'top-1, patches shuffled':24s}{shuffled:.4f}  (drop {top1 - shuffled:+.4f})")
    for size, by_mode in resolutions.items():
      cells = '  '.join(f'{mode} {acc:.4f}' for mode, acc in by_mode.items())
      print(f"{'top-1 at ' + size + ' px':24s}{cells}")
    print(f"{'results':24s}{os.path.join(out, 'results.json')}")


if __name__ == '__main__':
  flags.mark_flags_as_required(['workdir'])
  app.run(main, flags_parser=config_lib.parse_flags)
