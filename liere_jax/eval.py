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

In a process of your own: `evaluate_workdir(liere_jax.config.run.resolve(config,
jax.device_count()), DIR)`.
"""
import contextlib
import json

import jax

from liere_jax import paths


def evaluate_workdir(run, workdir: str, *, step=None, best: bool = False, out: str = 'eval',
                     devices=None, checks=contextlib.nullcontext) -> dict:
  """Every evaluation of `run` (a run_spec.RunSpec of the workdir's model) on the parameters of
  `workdir`'s latest checkpoint (`best`, or `step`): writes DIR/<out>/results.json and
  attention.png from process 0, prints the summary and returns the results. In any process (a
  notebook, a test, `python -m liere_jax.eval`). devices: those to run on (default: all; `run`
  must be resolved for their number). checks: a context manager around the checkpoint's lookup (the
  command line's makes its errors one-line refusals)."""
  from liere_jax import checkpoint, evaluation, train_lib
  from liere_jax.config import run as run_spec
  run_spec.spec_of(run, 'evaluate_workdir')
  with checks():
    _, params, step = checkpoint.load_params(workdir, step, best=best)
  steps = train_lib.EvalSteps(run, train_lib.make_mesh(devices, run.loop.model_parallel))
  params = steps.place_params(params)  # Stacked under model.scan_layers.

  accuracy, results = evaluation.evaluate_run(steps, params)
  results = dict(step=int(step), pe=run.model.pe.name, **results)
  if jax.process_index() != 0:
    return results
  out = paths.path(workdir) / out
  out.mkdir(parents=True, exist_ok=True)
  results['attention_png'] = str(out / 'attention.png')
  evaluation.attention_png(steps, params, results['attention_png'])
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
  return results


if __name__ == '__main__':  # The command line is liere_jax/cli/evaluate.py.
  from liere_jax.cli import evaluate as evaluate_cli
  evaluate_cli.run()
