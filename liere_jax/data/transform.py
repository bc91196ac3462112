"""Raw examples to model inputs: decoding, crops, clip sampling, augmentation, normalisation.

Everything here is numpy on the host; randomness comes from the generator passed in.
"""
import io
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
from PIL import Image

from liere_jax.data import arrows
from liere_jax.data import augment
from liere_jax.data import randaugment
from liere_jax.config.data import DataSpec, spec_of

Example = Dict[str, Any]


def normalisation(data: DataSpec) -> Tuple[np.ndarray, np.ndarray]:
  """(scale, offset) float32 [channels]: normalised = pixels * scale + offset, i.e.
  (x / 255 - mean) / std with the dataset's constants."""
  info = spec_of(data, 'normalisation').info
  mean, std = np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32)
  return 1 / (255 * std), -mean / std


def resize_crop(image: np.ndarray, size: int, view: int = 0, views: int = 1) -> np.ndarray:
  """[h, w, c] -> [size, size, c]: shorter side to `size` (bilinear, antialiased), then crop
  `view` of `views` evenly spaced along the longer side (views = 1: the centre; O
  videodataset.py:264-287 spaces 3 at int(k * (long - size) / 2))."""
  h, w = image.shape[:2]
  scale = size / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  if (nh, nw) != (h, w):
    image = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BILINEAR))
  slack = max(nh, nw) - size
  start = slack // 2 if views == 1 else int(view * (slack / (views - 1)))
  top, left = (start, 0) if nh > nw else (0, start)
  return image[top:top + size, left:left + size]


def center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """[h, w, c] -> [size, size, c]: the centre of the image as it is, zero-padded where it is
  smaller (torchvision CenterCrop, O's ImageNet eval: data_image.py:209)."""
  h, w = image.shape[:2]
  ph, pw = max(0, size - h), max(0, size - w)
  image = np.pad(image, ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
  h, w = image.shape[:2]
  top, left = round((h - size) / 2), round((w - size) / 2)  # Half to even, as torchvision.
  return image[top:top + size, left:left + size]


def _frame_indices(num_video_frames: int, num: int, stride: int,
                   rng: Optional[np.random.Generator]) -> np.ndarray:
  """num frames at `stride` from a uniform (rng) or centred start; clipped to the video."""
  slack = max(0, num_video_frames - ((num - 1) * stride + 1))
  start = rng.integers(slack + 1) if rng is not None else slack // 2
  return np.minimum(start + stride * np.arange(num), num_video_frames - 1)


def train_clip(n: int, num: int, stride: int, rng: np.random.Generator,
               videomae: bool) -> np.ndarray:
  """Training frame indices [num] of an n-frame video: at `stride` from a uniform start, or
  VideoMAE's (O videodataset.py:390-417): floor(linspace) of num points over a random window of
  num * stride frames; a video no longer than that: linspace(0, n, n // stride), then n - 1."""
  if not videomae:
    return _frame_indices(n, num, stride, rng)
  window = num * stride
  if n <= window:
    k = n // stride
    return np.clip(np.concatenate([np.linspace(0, n, k), np.full(num - k, n)]), 0,
                   n - 1).astype(np.int64)
  end = rng.integers(window, n)
  return np.clip(np.linspace(end - window, end, num), end - window, end - 1).astype(np.int64)


def eval_clip(n: int, num: int, stride: int, view: int, views: int) -> np.ndarray:
  """Eval frame indices [num]: views = 1: the centred clip; else clip `view` of `views` whose
  starts are evenly spaced on the grid 0, stride, 2 stride, ... < n, whose last point short
  videos repeat (O videodataset.py:264-276, 382-388)."""
  if views == 1:
    return _frame_indices(n, num, stride, None)
  points = -(-n // stride)
  start = int(view * (max(points - num, 0) / (views - 1)))
  return stride * np.minimum(start + np.arange(num), points - 1)


def _decode_jpeg(jpeg: bytes, draft: int = 0) -> np.ndarray:
  with Image.open(io.BytesIO(jpeg)) as image:
    if draft:  # JPEG: decode at a reduced scale whose sides are >= draft, when there is one.
      image.draft('RGB', (draft, draft))
    return np.asarray(image.convert('RGB'))


def decoder(spec: DataSpec, size: int, grid: int, *,
            train: bool) -> Callable[[Example, Any, int], Example]:
  """(raw example, rng or None, view) -> dict(image=uint8 [*input_shape], label=int32).

  Training under crop='rrc' (and an augment) keeps the native size: the augmentation crops.
  Eval: view v of the prod(eval_views) views, temporal v // spatial, spatial v % spatial.
  """
  expected = {'cifar100': (32, 32, 3),
              'arrows': (arrows.CELL * grid, arrows.CELL * grid, 3)}.get(spec.name)
  if train:
    mode = 'native' if spec.augment != 'none' and spec.crop == 'rrc' else 'resize_center'
    temporal, spatial = 1, 1
  else:
    mode, (temporal, spatial) = spec.eval_crop, spec.eval_views

  def fit(image: np.ndarray, view: int) -> np.ndarray:
    if mode == 'native':
      return image
    if mode == 'center':
      return center_crop(image, size)
    return resize_crop(image, size, view, spatial)

  def decode(raw: Example, rng: Optional[np.random.Generator], view: int = 0) -> Example:
    label = np.int32(raw['label'])
    t, s = divmod(view, spatial)
    if spec.name == 'ucf101':
      frames, n = raw['frames'], len(raw['frames'])
      idx = (train_clip(n, spec.num_frames, spec.frame_stride, rng, spec.augment == 'videomae')
             if train else eval_clip(n, spec.num_frames, spec.frame_stride, t, temporal))
      # A draft is a reduced-scale decode: only where the frame is downscaled to S anyway.
      draft = size if mode == 'resize_center' else 0
      return dict(image=np.stack([fit(_decode_jpeg(frames[i], draft), s) for i in idx]),
                  label=label)
    image = np.asarray(raw['image'])
    if expected is not None and image.shape != expected:
      raise ValueError(f'{spec.tfds_name} gave an image of shape {image.shape}, expected '
                       f'{expected} from the data config (grid={grid}); prepare the matching '
                       'dataset or fix data.grid / data.name.')
    if image.ndim != 3 or image.shape[-1] != 3:
      raise ValueError(f'{spec.tfds_name} gave an image of shape {image.shape}; expected RGB '
                       '[height, width, 3].')
    return dict(image=fit(image, s), label=label)
  return decode


def train_augment(spec: DataSpec, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """uint8 [..., h, w, c] (native size under crop='rrc') -> [..., S, S, c], in the order of
  data.augment; the official RandAugments come before the crop, as in O (data_image.py:96-104,
  193-205; videodataset.py:306-341)."""
  if spec.augment == 'none':
    return x
  if spec.augment == 'official_randaug':
    x = randaugment.official_randaugment(x, rng)
  elif spec.augment == 'videomae':
    x = randaugment.timm_randaugment(x, rng, spec.randaug_policy)
  if spec.crop == 'pad':
    x = augment.crop_flip(x, rng)
  else:
    box = augment.rrc_box(rng, *x.shape[-3:-1])
    x = augment.hflip(augment.resized_crop(x, box, spec.size,
                                           antialias=spec.name != 'ucf101'), rng)
  return augment.randaugment(x, rng) if spec.augment == 'randaug' else x


def normalise(spec: DataSpec, images: np.ndarray) -> np.ndarray:
  """uint8 [..., c] -> float32 (x / 255 - mean) / std, computed in place in one float32 copy."""
  scale, offset = normalisation(spec)
  out = images.astype(np.float32)
  out *= scale
  out += offset
  return out

