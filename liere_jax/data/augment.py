"""Augmentations: pure functions of a uint8 image [h, w, c] or clip [t, h, w, c] and a generator.

A clip gets the same transform on every frame (one draw of every random choice per call). All
randomness comes from the `np.random.Generator` passed in, so an example's augmentation is a
pure function of its generator's seed. The official runs' RandAugments are in randaugment.py.

  randaugment            torchvision-flavoured RandAugment: the project's own, NOT the one the
                         official runs used.
  rrc_box, resized_crop  RandomResizedCrop (torchvision / O video_transforms.py:499-573).
  hflip, crop_flip       horizontal flip; pad-by-S/8 random crop and flip.
  random_erasing         random erasing of a normalised float clip (O dataset/random_erasing.py);
                         it tries 100 boxes for images too (timm's cube path; its per-image path
                         tries 10); the official code erases clips only.
  per_frame, pil_*, posterize, solarize, random_sign   the op helpers both files use.

O = github.com/StanfordMIMI/LieRE at b27b41b; a bare file:line below is in O dataset/.

Torchvision-flavoured RandAugment (`randaugment`, the project's 'randaug'; no official file
matches it): 14 ops drawn with replacement, each with a random sign on m = M / 30 (magnitude 1
is torchvision's bin 30), bilinear sampling, grey fill, shears and translates about the centre.

  op                value at M=14, m = 0.467
  identity          -
  shear_x, shear_y  +-0.14 shear about the centre
  translate_x, _y   +-0.45 m = +-0.21 of the width / height (6.7 px on 32 px)
  rotate            +-14 deg
  brightness, color, contrast, sharpness   factor 1 +- 0.42 (contrast greys to the int()
                    of the whole clip's grey mean, not each frame's)
  posterize         drop int(4 m) = 1 bit: keep 7 bits (torchvision would keep 6)
  solarize          pixels >= 255 (1 - m) = 136 inverted
  autocontrast      per-channel min/max stretch
  equalize          PIL ImageOps.equalize
"""
import math
from typing import Callable, Tuple

import numpy as np
from PIL import Image, ImageEnhance, ImageOps


def per_frame(fn: Callable[[Image.Image], Image.Image], x: np.ndarray) -> np.ndarray:
  """Applies a PIL op to an image [h, w, c] or to every frame of a clip [t, h, w, c]."""
  flat = x.reshape((-1,) + x.shape[-3:])
  out = np.stack([np.asarray(fn(Image.fromarray(f))) for f in flat])
  return out.reshape(x.shape[:-3] + out.shape[1:])


def pil_affine(x: np.ndarray, data, resample: int, fill) -> np.ndarray:
  """PIL's AFFINE transform: output pixel (u, v) samples the input at data @ (u, v, 1)."""
  return per_frame(lambda im: im.transform(im.size, Image.AFFINE, data, resample=resample,
                                           fillcolor=fill), x)


def pil_rotate(x: np.ndarray, degrees: float, resample: int, fill) -> np.ndarray:
  """PIL rotate about the centre, counter-clockwise in degrees."""
  return per_frame(lambda im: im.rotate(degrees, resample=resample, fillcolor=fill), x)


def pil_enhance(x: np.ndarray, enhancer, factor: float) -> np.ndarray:
  """A PIL ImageEnhance class (Color, Contrast, ...) at `factor`."""
  return per_frame(lambda im: enhancer(im).enhance(factor), x)


def posterize(x: np.ndarray, bits: int) -> np.ndarray:
  """Keeps the `bits` high bits of every value (8: unchanged, 0: black)."""
  return x & np.uint8((0xFF << (8 - bits)) & 0xFF)


def solarize(x: np.ndarray, threshold: float) -> np.ndarray:
  """PIL ImageOps.solarize: values >= threshold are inverted."""
  return np.where(x < threshold, x, 255 - x).astype(np.uint8)


def random_sign(v: float, rng: np.random.Generator) -> float:
  """-v with probability 1/2 (both official files: `-v if random.random() > 0.5 else v`)."""
  return -v if rng.random() > 0.5 else v


# The torchvision-flavoured RandAugment (the project's 'randaug'; not the official runs').


def _blend(a: np.ndarray, b: np.ndarray, factor: float) -> np.ndarray:
  """PIL ImageEnhance semantics: b + factor * (a - b), clipped."""
  out = b.astype(np.float32) + factor * (a.astype(np.float32) - b)
  return np.clip(out, 0, 255).astype(np.uint8)


def _gray(x: np.ndarray) -> np.ndarray:
  return (x @ np.array([0.299, 0.587, 0.114], np.float32))[..., None]


_FILL = (128, 128, 128)


def _shear(x, m, axis):
  s = 0.3 * m
  h, w = x.shape[-3:-1]
  data = (1, s, -s * h / 2, 0, 1, 0) if axis == 1 else (1, 0, 0, s, 1, -s * w / 2)
  return pil_affine(x, data, Image.BILINEAR, _FILL)


def _translate(x, m, axis):
  t = 0.45 * m * x.shape[-2 if axis == 1 else -3]  # torchvision: 150/331 of the size.
  data = (1, 0, t, 0, 1, 0) if axis == 1 else (1, 0, 0, 0, 1, t)
  return pil_affine(x, data, Image.BILINEAR, _FILL)


def _autocontrast(x, m):
  del m
  lo = x.min(axis=(-3, -2), keepdims=True).astype(np.float32)
  hi = x.max(axis=(-3, -2), keepdims=True).astype(np.float32)
  scale = np.where(hi > lo, 255 / np.maximum(hi - lo, 1), 1)
  return np.clip((x - lo) * scale + np.where(hi > lo, 0, lo), 0, 255).astype(np.uint8)


# name -> (x [..., h, w, c] uint8, signed magnitude in [-1, 1]) -> same shape; magnitude 1 is
# torchvision's RandAugment bin 30.
RANDAUG_OPS = {
    'identity': lambda x, m: x,
    'shear_x': lambda x, m: _shear(x, m, 1),
    'shear_y': lambda x, m: _shear(x, m, 0),
    'translate_x': lambda x, m: _translate(x, m, 1),
    'translate_y': lambda x, m: _translate(x, m, 0),
    'rotate': lambda x, m: pil_rotate(x, 30 * m, Image.BILINEAR, _FILL),
    'brightness': lambda x, m: _blend(x, np.zeros_like(x), 1 + 0.9 * m),
    'color': lambda x, m: _blend(x, _gray(x), 1 + 0.9 * m),
    'contrast': lambda x, m: _blend(x, np.full_like(x, _gray(x).mean()), 1 + 0.9 * m),
    'sharpness': lambda x, m: pil_enhance(x, ImageEnhance.Sharpness, 1 + 0.9 * m),
    'posterize': lambda x, m: posterize(x, 8 - int(4 * abs(m))),  # 8 -> 4 bits.
    'solarize': lambda x, m: solarize(x, 255 * (1 - abs(m))),
    'autocontrast': _autocontrast,
    'equalize': lambda x, m: per_frame(ImageOps.equalize, x),
}


def randaugment(x: np.ndarray, rng: np.random.Generator, num_ops: int = 2,
                magnitude: int = 14) -> np.ndarray:
  """RandAugment (Cubuk et al. 2020), torchvision flavour: num_ops of RANDAUG_OPS, random sign.

  NOT what the official runs used (randaugment.official_randaugment). Ops are drawn uniformly
  with replacement, each at magnitude / 30 with a random sign. x: uint8 [..., h, w, c].
  """
  names = list(RANDAUG_OPS)
  for op in rng.integers(len(names), size=num_ops):
    sign = 1 if rng.random() < 0.5 else -1
    x = RANDAUG_OPS[names[op]](x, sign * magnitude / 30)
  return x


def hflip(x: np.ndarray, rng: np.random.Generator, p: float = 0.5) -> np.ndarray:
  """Mirrors [..., h, w, c] left-right with probability p (every frame alike)."""
  return x[..., ::-1, :] if rng.random() < p else x


def crop_flip(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Zero-pad by size/8, random crop back to size, flip half the time: [..., h, w, c]."""
  h, w = x.shape[-3:-1]
  pad = max(1, h // 8)
  lead = [(0, 0)] * (x.ndim - 3)
  padded = np.pad(x, lead + [(pad, pad), (pad, pad), (0, 0)])
  top, left = rng.integers(2 * pad + 1, size=2)
  return hflip(padded[..., top:top + h, left:left + w, :], rng)


# RandomResizedCrop.


def rrc_box(rng: np.random.Generator, height: int, width: int,
            scale: Tuple[float, float] = (0.08, 1.0),
            ratio: Tuple[float, float] = (3 / 4, 4 / 3)) -> Tuple[int, int, int, int]:
  """RandomResizedCrop's box (top, left, h, w), torchvision's sampling.

  Up to 10 tries of area ~ U(scale) * height * width and log(w / h) ~ U(log ratio); the first
  box that fits is placed uniformly. Otherwise the whole image, cut to the ratio range, centred.
  (O video_transforms.py:499-538 is the same rule; O passes ratio (0.75, 1.3333) for UCF101.)
  """
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target = area * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(*log_ratio))
    w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
    if 0 < w <= width and 0 < h <= height:
      return int(rng.integers(height - h + 1)), int(rng.integers(width - w + 1)), h, w
  if width / height < min(ratio):
    w, h = width, round(width / min(ratio))
  elif width / height > max(ratio):
    w, h = round(height * max(ratio)), height
  else:
    w, h = width, height
  return (height - h) // 2, (width - w) // 2, h, w


def _bilinear_axis(x: np.ndarray, axis: int, size: int) -> np.ndarray:
  """torch interpolate(mode='bilinear', align_corners=False, antialias=False) along axis < 0."""
  n = x.shape[axis]
  src = np.maximum((np.arange(size) + 0.5) * (n / size) - 0.5, 0)
  i0 = np.minimum(src.astype(np.int64), n - 1)
  i1 = np.minimum(i0 + 1, n - 1)
  frac = (src - i0).astype(np.float32).reshape((-1,) + (1,) * (-axis - 1))
  return np.take(x, i0, axis) * (1 - frac) + np.take(x, i1, axis) * frac


def resized_crop(x: np.ndarray, box: Tuple[int, int, int, int], size: int,
                 antialias: bool = True) -> np.ndarray:
  """Crops box = (top, left, h, w) of [..., H, W, c] and resizes it to [..., size, size, c].

  antialias=True: PIL's bilinear resize of the crop (torchvision's RandomResizedCrop on PIL
  images, the official ImageNet run); uint8 only. antialias=False: plain bilinear with half-pixel
  centres, as O's UCF101 run did with torch interpolate on float clips (video_transforms.py:
  567-573); any dtype, uint8 is rounded. The same box for every frame.
  """
  top, left, h, w = box
  crop = x[..., top:top + h, left:left + w, :]
  if antialias:
    return per_frame(lambda im: im.resize((size, size), Image.BILINEAR), crop)
  out = _bilinear_axis(_bilinear_axis(crop.astype(np.float32), -3, size), -2, size)
  if x.dtype == np.uint8:
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
  return out.astype(x.dtype)


# Random erasing (O dataset/random_erasing.py as videodataset.py:343-353 configures it).


def random_erasing(x: np.ndarray, rng: np.random.Generator, p: float = 0.25,
                   scale: Tuple[float, float] = (0.02, 1 / 3),
                   ratio: Tuple[float, float] = (0.3, 1 / 0.3)) -> np.ndarray:
  """With probability p, one box of a normalised float clip becomes N(0, 1) noise.

  x: float [..., h, w, c] (normalised). O's settings: mode 'pixel' (fresh noise per pixel,
  channel and frame), one box (max_count 1), and the same box on every frame (cube). Up to 100
  tries of area ~ U(scale) * h * w, log(h / w) ~ U(log ratio), kept if strictly smaller than
  the frame; the box is placed uniformly. No box found: x unchanged.
  """
  if rng.random() > p:
    return x
  height, width = x.shape[-3:-1]
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(100):
    target = rng.uniform(*scale) * height * width
    aspect = math.exp(rng.uniform(*log_ratio))
    h, w = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
    if w < width and h < height:
      top, left = rng.integers(height - h + 1), rng.integers(width - w + 1)
      out = x.copy()
      out[..., top:top + h, left:left + w, :] = rng.standard_normal(
          x.shape[:-3] + (h, w, x.shape[-1]), dtype=np.float32)
      return out
  return x
