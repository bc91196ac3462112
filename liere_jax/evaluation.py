"""Evaluations of the paper: top-1 with a bootstrap CI, patch shuffling (Table 5), other
resolutions (Fig. 7) and CLS attention maps (Figs. 10-11)."""
import math
from typing import Optional

import jax
import numpy as np
from jax.experimental import multihost_utils
from PIL import Image

from liere_jax import data


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


def evaluate(trainer, config, params, *, input_size=None, positions: Optional[str] = None,
             shuffle: bool = False):
  """(top-1, per-example correctness) over the whole eval split; nothing is dropped.

  The encoding's context (rotations) is computed once for the resolution and reused.
  """
  ctx, correct = None, []
  batches = data.eval_batches(config.data, global_batch_size=config.eval_batch_size,
                              process_index=jax.process_index(),
                              process_count=jax.process_count(), input_size=input_size)
  for local in batches:
    if shuffle:
      local = dict(local, image=shuffle_patches(local['image'], config.model.patch))
    batch = trainer.global_batch(local)
    if ctx is None:
      grid = tuple(s // p for s, p in zip(batch['image'].shape[1:-1], config.model.patch))
      ctx = trainer.pe_context(params, grid, positions)
    ok, mask = trainer.eval_step(params, batch, ctx, positions)
    ok, mask = (np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in (ok, mask))
    correct.append(ok[mask])
  correct = np.concatenate(correct)
  return float(correct.mean()), correct


def _heat(x: np.ndarray) -> np.ndarray:
  """[h, w] in [0, 1] -> [h, w, 3] uint8, black-red-yellow-white."""
  rgb = np.stack([np.clip(3 * x, 0, 1), np.clip(3 * x - 1, 0, 1), np.clip(3 * x - 2, 0, 1)], -1)
  return (255 * rgb).astype(np.uint8)


def attention_png(trainer, config, params, path: str, num_examples: int = 4):
  """Saves the CLS token's attention per layer (averaged over heads) for a few eval inputs:
  one row per example, the input first and then layers 1..L. Mean-pooled models (no CLS)
  show the attention each patch receives, averaged over queries. Video: averaged over time."""
  batch = next(iter(data.eval_batches(config.data, global_batch_size=num_examples)))
  images = batch['image'][:num_examples]
  _, attention = jax.jit(lambda p, x: trainer.model(p)(x, return_attention=True))(
      jax.device_get(params), images)
  prefix = trainer.spec.num_prefix
  grid = tuple(s // p for s, p in zip(images.shape[1:-1], trainer.spec.patch))
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
  Image.fromarray(np.concatenate(rows, axis=0)).save(path)
