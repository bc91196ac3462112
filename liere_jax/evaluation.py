"""Evaluations of the paper: top-1 with a bootstrap CI, patch shuffling (Table 5), other
resolutions (Fig. 7) and CLS attention maps (Figs. 10-11).

Video with several views per video (data.eval_views, e.g. the official (5, 3)): the official
code scores every view as its own sample and reports the mean over views (O = StanfordMIMI/
LieRE: dataset/videodataset.py:171-196, lightning_modules/lightning_liere_image_classification.py:
181-225); `evaluate` reports that as `top1` and `per_view`, and also `per_video`: each video
classified by the mean of its views' softmax probabilities.
"""
import contextlib
import dataclasses
import io
import json
import math
from typing import Dict, Optional, Tuple

import jax
import numpy as np
from jax.experimental import multihost_utils
from PIL import Image

from liere_jax import data, paths


def shuffle_patches(images: np.ndarray, patch, seed: int = 0) -> np.ndarray:
  """Permutes the patches (tubelets) of [B, *spatial, C] inputs with one fixed permutation."""
  b, *spatial, c = images.shape
  grid = [s // p for s, p in zip(spatial, patch)]
  n = len(grid)
  x = images.reshape([b] + [v for g, p in zip(grid, patch) for v in (g, p)] + [c])
  to_tokens = [0] + [1 + 2 * i for i in range(n)] + [2 + 2 * i for i in range(n)] + [2 * n + 1]
  x = x.transpose(to_tokens).reshape(b, math.prod(grid), *patch, c)
  x = x[:, np.random.default_rng(seed).permutation(x.shape[1])]
  x = x.reshape([b] + grid + list(patch) + [c]).transpose(np.argsort(to_tokens))
  return x.reshape(images.shape)


def bootstrap_ci(correct: np.ndarray, resamples: int = 1000, seed: int = 0):
  """95% percentile bootstrap interval of the mean of 0/1 outcomes."""
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(correct), size=(resamples, len(correct)))
  means = correct[idx].mean(axis=1)
  return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


@dataclasses.dataclass
class Accuracy:
  """Top-1 over a whole eval split.

  top1: the primary number: plain top-1, or with views the per-view accuracy (the official
    protocol's number).
  correct: [num_eval] per example (with views: per video, the fraction of its views right), whose
    mean is top1: the unit a bootstrap resamples.
  per_view, per_video: with views only (else None); per_video classifies each video by the mean
    of its views' softmax probabilities.
  """
  top1: float
  correct: np.ndarray
  per_view: Optional[float] = None
  per_video: Optional[float] = None

  def metrics(self, name: str) -> Dict[str, float]:
    """{name: top1}, plus name_per_view and name_per_video with views."""
    out = {name: self.top1}
    if self.per_video is not None:
      out.update({f'{name}_per_view': self.per_view, f'{name}_per_video': self.per_video})
    return out


def by_video(video: np.ndarray, label: np.ndarray, probs: np.ndarray) -> Accuracy:
  """Accuracy of views: video, label [n] and probs [n, classes] of the n (unpadded) views."""
  ok = probs.argmax(-1) == label
  num = int(video.max()) + 1
  fraction = np.bincount(video, weights=ok, minlength=num) / np.bincount(video, minlength=num)
  summed = np.zeros((num, probs.shape[-1]), np.float64)
  np.add.at(summed, video, probs)
  video_label = np.zeros(num, label.dtype)
  video_label[video] = label
  per_video = float(np.mean(summed.argmax(-1) == video_label))
  return Accuracy(float(ok.mean()), fraction, per_view=float(ok.mean()), per_video=per_video)


def evaluate(steps, params, *, input_size: Optional[int] = None,
             positions: Optional[str] = None, shuffle: bool = False) -> Accuracy:
  """Top-1 of the run of `steps` (a steps.EvalSteps; a Trainer is one) over the whole eval
  split (every view, with data.eval_views); nothing is dropped. input_size: another input size;
  positions: another position mode; shuffle: patches permuted (shuffle_patches).

  The encoding's context (rotations) is computed once for the resolution and reused.
  """
  run = steps.run
  ctx, correct, views = None, [], []
  batches = data.eval_batches(run.data, global_batch_size=run.evaluation.batch_size,
                              process_index=jax.process_index(),
                              process_count=jax.process_count(), input_size=input_size)
  gather = lambda *xs: [np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in xs]
  for local in batches:
    if shuffle:
      local = dict(local, image=shuffle_patches(local['image'], run.model.patch))
    batch = steps.global_batch(local)
    if ctx is None:
      grid = tuple(s // p for s, p in zip(batch['image'].shape[1:-1], run.model.patch))
      ctx = steps.pe_context(params, grid, positions)
    if 'video' in batch:  # Several views per video: keep the probabilities to average them.
      probs = steps.predict_step(params, batch, ctx)
      probs, mask, video, label = gather(probs, batch['mask'], batch['video'], batch['label'])
      views.append((video[mask], label[mask], probs[mask]))
    else:
      ok, mask = gather(*steps.eval_step(params, batch, ctx))
      correct.append(ok[mask])
  if views:
    return by_video(*map(np.concatenate, zip(*views)))
  correct = np.concatenate(correct)
  return Accuracy(float(correct.mean()), correct)


def evaluate_run(steps, params) -> Tuple[Accuracy, dict]:
  """Every evaluation of the run's EvalSpec: (accuracy, results) where results holds top-1
  with its bootstrap CI, the patch-shuffled top-1 (Table 5) and the top-1 at each of
  `resolutions` in each of `positions_modes` (Fig. 7; 'rescaled' only for encodings that read
  positions: for the others it would repeat the first mode)."""
  spec = steps.run.evaluation
  accuracy = evaluate(steps, params)
  shuffled = evaluate(steps, params, shuffle=True).top1
  resolutions = {str(size): {mode: evaluate(steps, params, input_size=size,
                                            positions=mode).top1
                             for mode in spec.positions_modes}
                 for size in spec.resolutions}
  return accuracy, dict(
      n_examples=int(len(accuracy.correct)), **accuracy.metrics('top1'),
      top1_ci95=bootstrap_ci(accuracy.correct), shuffled_top1=shuffled,
      shuffle_drop=accuracy.top1 - shuffled, positions_default=steps.spec.pe.positions,
      positions_modes=list(spec.positions_modes), resolutions=resolutions)


def _heat(x: np.ndarray) -> np.ndarray:
  """[h, w] in [0, 1] -> [h, w, 3] uint8, black-red-yellow-white."""
  rgb = np.stack([np.clip(3 * x, 0, 1), np.clip(3 * x - 1, 0, 1), np.clip(3 * x - 2, 0, 1)], -1)
  return (255 * rgb).astype(np.uint8)


def attention_png(steps, params, path: str, num_examples: int = 4):
  """Saves the CLS token's attention per layer (averaged over heads) for a few eval inputs:
  one row per example, the input first and then layers 1..L. Mean-pooled models (no CLS)
  show the attention each patch receives, averaged over queries. Video: averaged over time."""
  one_view = dataclasses.replace(steps.run.data, eval_views=(1, 1))  # One row per video.
  batch = next(iter(data.eval_batches(one_view, global_batch_size=num_examples)))
  images = batch['image'][:num_examples]
  _, attention = jax.jit(lambda p, x: steps.model(p)(x, return_attention=True))(
      jax.device_get(params), images)
  prefix = steps.spec.num_prefix
  grid = tuple(s // p for s, p in zip(images.shape[1:-1], steps.spec.patch))
  rows = []
  for i in range(len(images)):
    img = images[i] if images.ndim == 4 else images[i, 0]
    img = (img - img.min()) / max(float(img.max() - img.min()), 1e-6)
    size = img.shape[:2]
    tiles = [(255 * img).astype(np.uint8)]
    for weights in attention:  # [B, H, T, T]
      w = np.asarray(weights[i]).mean(0)
      w = w[0, prefix:] if prefix else w.mean(0)
      w = w.reshape(grid)
      w = w.mean(0) if w.ndim == 3 else w
      w = (w - w.min()) / max(float(w.max() - w.min()), 1e-12)
      tile = Image.fromarray(_heat(w)).resize(size[::-1], Image.NEAREST)
      tiles.append(np.asarray(tile))
    rows.append(np.concatenate([np.pad(t, ((2, 2), (2, 2), (0, 0))) for t in tiles], axis=1))
  png = io.BytesIO()
  Image.fromarray(np.concatenate(rows, axis=0)).save(png, format='PNG')
  paths.write(path, png.getvalue())  # A local file or an object (gs://...).


def evaluate_workdir(run, workdir: str, *, step=None, best: bool = False, out: str = 'eval',
                     devices=None, checks=contextlib.nullcontext) -> dict:
  """Every evaluation of `run` (a RunSpec of the workdir's model) on the parameters of
  `workdir`'s latest checkpoint (`best`, or `step`): writes DIR/<out>/results.json and
  attention.png from process 0, prints the summary and returns the results. In any process (a
  notebook, a test, `python -m liere_jax.eval`). devices: those to run on (default: all; `run`
  must be resolved for their number). checks: a context manager around the checkpoint's lookup (the
  command line's makes its errors one-line refusals)."""
  from liere_jax import checkpoint
  from liere_jax.steps import EvalSteps, make_mesh
  from liere_jax.config import run as run_spec
  run_spec.spec_of(run, 'evaluate_workdir')
  with checks():
    _, params, step = checkpoint.load_params(workdir, step, best=best)
  steps = EvalSteps(run, make_mesh(devices, run.loop.model_parallel))
  params = steps.place_params(params)  # Stacked under model.scan_layers.

  accuracy, results = evaluate_run(steps, params)
  results = dict(step=int(step), pe=run.model.pe.name, **results)
  if jax.process_index() != 0:
    return results
  out = paths.path(workdir) / out
  out.mkdir(parents=True, exist_ok=True)
  results['attention_png'] = str(out / 'attention.png')
  attention_png(steps, params, results['attention_png'])
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
