"""The RandAugments of the official runs, as functions of a uint8 image or clip and a generator.

  official_randaugment   the RandAugment of the official CIFAR-100 / ImageNet runs (O
                         dataset/randomaug.py, a kentaroy47 / rpmcruz port).
  timm_randaugment       the video RandAugment of the official UCF101 run (O dataset/
                         rand_augment.py, timm's, created by O dataset/video_transforms.py:621-654).

A clip gets the same ops on every frame; all randomness comes from the generator passed in (the
project's own torchvision-flavoured RandAugment is augment.randaugment).
O = github.com/StanfordMIMI/LieRE at b27b41b; a bare file:line below is in O dataset/.

Official RandAugment (`official_randaugment`, randomaug.py). `RandAugment(2, 14)` picks 2 of the
16 ops uniformly WITH replacement (`random.choices`, :264), and gives each the fixed value
v = (M / 30) * (max - min) + min (:266): no noise and no identity op. The geometric ops flip v's
sign with probability 1/2 inside the op (`if random.random() > 0.5: v = -v`), sample with PIL's
default NEAREST and fill with black; shears are about the top-left corner (no centring).

  op               range       v at M=14  what it does at M=14                     randomaug.py
  auto_contrast    [0, 1]      -          PIL ImageOps.autocontrast                :62-63, 185
  equalize         [0, 1]      -          PIL ImageOps.equalize                    :70-71, 186
  invert           [0, 1]      -          255 - x                                  :66-67, 187
  rotate           [0, 30]     14.0       +-14 deg about the centre                :55-59, 188
  posterize        [0, 4]      1.867      max(1, int(v)): keep 1 bit               :92-95, 189
  solarize         [0, 256]    119.47     pixels >= 120 inverted                   :78-80, 190
  solarize_add     [0, 110]    51.33      EVERY pixel + v (clipped, truncated:     :83-89, 191
                                          +51), then pixels >= 128 inverted
  color            [0.1, 1.9]  0.94       PIL ImageEnhance.Color 0.94              :103-105, 192
  contrast         [0.1, 1.9]  0.94       ImageEnhance.Contrast 0.94               :98-100, 193
  brightness       [0.1, 1.9]  0.94       ImageEnhance.Brightness 0.94             :108-110, 194
  sharpness        [0.1, 1.9]  0.94       ImageEnhance.Sharpness 0.94              :113-115, 195
  shear_x, _y      [0, 0.3]    0.14       +-0.14 shear about (0, 0)                :11-22, 196-197
  cutout_abs       [0, 40]     18.67      a 19 x 19 px box of (125, 123, 114)      :127-145, 198
                                          (PIL truncates the corners and draws
                                          both ends), clipped at the border; its
                                          centre is np.random.uniform(w) =
                                          uniform(low=w, high=1), on (1, w]
  translate_x_abs, [0, 100]    46.67      +-46.67 px ABSOLUTE (PIL samples x + 47  :33-52, 199-200
  translate_y_abs                         at pixel centres): a 32 px CIFAR image
                                          becomes all black: 1 - (14/16)^2 = 23%
                                          of images get one of these two ops

timm video RandAugment (`timm_randaugment`, rand_augment.py). Policy 'rand-m7-n4-mstd0.5-inc1'
(O lightning_modules/lightning_data_image.py:240): picks n = 4 ops uniformly WITH replacement
(`np.random.choice(..., replace=True)`, :468-478); each is applied with probability p = 0.5
(`random.random() > prob` skips, :365-366) at a magnitude drawn from N(m, mstd) clipped to
[0, 10] (:367-370); the arguments are drawn once and applied to every frame (:371-382). inc1
selects the "increasing" set (:404-420). VideoMAE's create_random_augment passes
translate_const = int(0.45 * 224) (unused by the relative translates), bicubic resampling and
no img_mean, so the fill is (128, 128, 128) (:36, :349-356; video_transforms.py:647-649).

  op (inc1 set)          level -> arg                       at m=7            rand_augment.py
  auto_contrast          -                                  -                 :142-143
  equalize               -                                  -                 :150-151
  invert                 -                                  -                 :146-147
  rotate                 +-30 m/10 deg (random sign)        +-21 deg          :108-111, 200-204
  posterize_increasing   keep 4 - int(4 m/10) bits          keep 2 bits       :173-176, 242-253
  solarize_increasing    threshold 256 - int(256 m/10)      >= 77 inverted    :154-155, 263-272
  solarize_add           +int(110 m/10) to pixels < 128     +77 (max 255)     :158-170, 275-277
  color_increasing, contrast_increasing, brightness_increasing, sharpness_increasing
                         factor 1 +- 0.9 m/10               1 +- 0.63         :179-192, 212-217
  shear_x, shear_y       +-0.3 m/10                         +-0.21            :64-75, 220-224
  translate_x_rel, _y    +-0.45 m/10 of the width / height  +-0.315           :78-91, 234-239
The inc0 set (:385-401) has posterize (keep int(4 m/10) bits), solarize (threshold
int(256 m/10)) and the enhance ops at factor 0.1 + 1.8 m/10 instead.

Where this is not the official code, and why:
- Randomness comes from a numpy Generator instead of Python's `random` and numpy's global state
  (determinism and resumability); the distributions are the same.
- timm parses 'inc0' with `bool('0')`, which is True, so 'inc0' silently selects the increasing
  set too; here inc0 means the standard set, as the policy grammar intends. timm ignores
  unknown tokens and clips m > 10; here both raise. 'p' (per-op probability) is newer timm's
  token; the official file has no 'p' and always uses 0.5.
- timm's posterize with 0 bits (reached only at magnitude 10) is black with the Pillow of the
  time; Pillow >= 11 raises instead. Here it is black.
- The official RandAugment ran on PIL images only (CIFAR, ImageNet); applying it to a clip
  (same op on every frame) is ours.
- Where these run matters and is the caller's choice: O runs official_randaugment on the
  native-resolution PIL image BEFORE cropping (CIFAR: before the pad-4 crop; ImageNet: before
  RandomResizedCrop), so its absolute 46.67 px translates blank 32 px CIFAR images but move a
  ~500 px ImageNet image by ~9%. O's UCF101 order: timm_randaugment on the decoded frames,
  normalise, rrc_box + resized_crop(antialias=False), hflip, random_erasing.
"""
from typing import Any, List, Tuple

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from liere_jax.data import augment
from liere_jax.config.timm_policy import TIMM_MAX_LEVEL as _TIMM_MAX_LEVEL
from liere_jax.config.timm_policy import TimmPolicy, parse_timm_policy  # noqa: F401  Re-exported.


# The official RandAugment (O dataset/randomaug.py; CIFAR-100 and ImageNet).


def _cutout_abs(x: np.ndarray, v: float, rng: np.random.Generator) -> np.ndarray:
  """A v x v box of (125, 123, 114), as randomaug.py:127-145 places and PIL draws it."""
  h, w = x.shape[-3:-1]
  # np.random.uniform(w) is uniform(low=w, high=1.0) = w + (1 - w) U: centres on (1, w].
  cx, cy = w + (1 - w) * rng.random(), h + (1 - h) * rng.random()
  x0, y0 = int(max(0, cx - v / 2)), int(max(0, cy - v / 2))
  x1, y1 = min(w, x0 + v), min(h, y0 + v)
  out = x.copy()
  # ImageDraw.rectangle truncates the corners to ints and fills both ends inclusive.
  out[..., y0:int(y1) + 1, x0:int(x1) + 1, :] = (125, 123, 114)
  return out


def _official_affine(data):
  """A geometric op of randomaug.py: AFFINE data(+-v), NEAREST and black fill (PIL defaults)."""
  return lambda x, v, rng: augment.pil_affine(x, data(augment.random_sign(v, rng)),
                                              Image.NEAREST, None)


# name -> (op(x uint8 [..., h, w, c], v, rng) -> same shape, min, max); op gets
# v = (M / 30) * (max - min) + min. The order is randomaug.py:184-201's.
OFFICIAL_RANDAUG_OPS = {
    'auto_contrast': (lambda x, v, rng: augment.per_frame(ImageOps.autocontrast, x), 0, 1),
    'equalize': (lambda x, v, rng: augment.per_frame(ImageOps.equalize, x), 0, 1),
    'invert': (lambda x, v, rng: 255 - x, 0, 1),
    'rotate': (lambda x, v, rng: augment.pil_rotate(x, augment.random_sign(v, rng),
                                                    Image.NEAREST, None), 0, 30),
    'posterize': (lambda x, v, rng: augment.posterize(x, max(1, int(v))), 0, 4),
    'solarize': (lambda x, v, rng: augment.solarize(x, v), 0, 256),
    'solarize_add': (
        lambda x, v, rng: augment.solarize(np.clip(x + v, 0, 255).astype(np.uint8), 128), 0, 110),
    'color': (lambda x, v, rng: augment.pil_enhance(x, ImageEnhance.Color, v), 0.1, 1.9),
    'contrast': (lambda x, v, rng: augment.pil_enhance(x, ImageEnhance.Contrast, v), 0.1, 1.9),
    'brightness': (lambda x, v, rng: augment.pil_enhance(x, ImageEnhance.Brightness, v), 0.1, 1.9),
    'sharpness': (lambda x, v, rng: augment.pil_enhance(x, ImageEnhance.Sharpness, v), 0.1, 1.9),
    'shear_x': (_official_affine(lambda v: (1, v, 0, 0, 1, 0)), 0.0, 0.3),
    'shear_y': (_official_affine(lambda v: (1, 0, 0, v, 1, 0)), 0.0, 0.3),
    'cutout_abs': (_cutout_abs, 0, 40),
    'translate_x_abs': (_official_affine(lambda v: (1, 0, v, 0, 1, 0)), 0.0, 100),
    'translate_y_abs': (_official_affine(lambda v: (1, 0, 0, 0, 1, v)), 0.0, 100),
}


def official_randaugment(x: np.ndarray, rng: np.random.Generator, num_ops: int = 2,
                         magnitude: float = 14) -> np.ndarray:
  """The official runs' RandAugment(num_ops, magnitude): see the module docstring's table.

  x: uint8 [..., h, w, c]; every frame of a clip gets the same ops, signs and cutout box.
  """
  if not 0 <= magnitude <= 30:
    raise ValueError(f'magnitude={magnitude} is out of 30 (randomaug.py: M in [0, 30]).')
  names = list(OFFICIAL_RANDAUG_OPS)
  for i in rng.integers(len(names), size=num_ops):  # random.choices: with replacement.
    op, low, high = OFFICIAL_RANDAUG_OPS[names[i]]
    x = op(x, (magnitude / 30) * (high - low) + low, rng)
  return x


# timm's RandAugment as the official UCF101 run configured it (O dataset/rand_augment.py).

_TIMM_FILL = (128, 128, 128)  # VideoMAE passes no img_mean (video_transforms.py:647-649).
_TIMM_RESAMPLE = Image.BICUBIC  # train_interpolation='bicubic' (data_image.py:237).


def _timm_affine(data):
  return lambda x, arg: augment.pil_affine(x, data(arg, x), _TIMM_RESAMPLE, _TIMM_FILL)


def _timm_solarize_add(x: np.ndarray, add: int) -> np.ndarray:
  """rand_augment.py:158-170: values below 128 gain `add` (max 255); the rest are kept."""
  return np.where(x < 128, np.minimum(x.astype(np.int32) + add, 255), x).astype(np.uint8)


def _timm_enhance(enhancer):
  return lambda x, factor: augment.pil_enhance(x, enhancer, factor)


def _enhance_level(level, rng):
  del rng
  return level / _TIMM_MAX_LEVEL * 1.8 + 0.1


def _enhance_increasing_level(level, rng):
  return 1.0 + augment.random_sign(level / _TIMM_MAX_LEVEL * 0.9, rng)


def _signed_level(scale):
  return lambda level, rng: augment.random_sign(level / _TIMM_MAX_LEVEL * scale, rng)


# name -> (op(x uint8 [..., h, w, c], arg) -> same shape, level_to_arg(level in [0, 10], rng)
# or None for ops without an argument).
TIMM_OPS = {
    'auto_contrast': (lambda x, arg: augment.per_frame(ImageOps.autocontrast, x), None),
    'equalize': (lambda x, arg: augment.per_frame(ImageOps.equalize, x), None),
    'invert': (lambda x, arg: 255 - x, None),
    'rotate': (lambda x, arg: augment.pil_rotate(x, arg, _TIMM_RESAMPLE, _TIMM_FILL),
               _signed_level(30.0)),
    'posterize': (augment.posterize, lambda level, rng: int(level / _TIMM_MAX_LEVEL * 4)),
    'posterize_increasing': (augment.posterize,
                             lambda level, rng: 4 - int(level / _TIMM_MAX_LEVEL * 4)),
    'solarize': (augment.solarize, lambda level, rng: int(level / _TIMM_MAX_LEVEL * 256)),
    'solarize_increasing': (augment.solarize,
                            lambda level, rng: 256 - int(level / _TIMM_MAX_LEVEL * 256)),
    'solarize_add': (_timm_solarize_add, lambda level, rng: int(level / _TIMM_MAX_LEVEL * 110)),
    'color': (_timm_enhance(ImageEnhance.Color), _enhance_level),
    'color_increasing': (_timm_enhance(ImageEnhance.Color), _enhance_increasing_level),
    'contrast': (_timm_enhance(ImageEnhance.Contrast), _enhance_level),
    'contrast_increasing': (_timm_enhance(ImageEnhance.Contrast), _enhance_increasing_level),
    'brightness': (_timm_enhance(ImageEnhance.Brightness), _enhance_level),
    'brightness_increasing': (_timm_enhance(ImageEnhance.Brightness),
                              _enhance_increasing_level),
    'sharpness': (_timm_enhance(ImageEnhance.Sharpness), _enhance_level),
    'sharpness_increasing': (_timm_enhance(ImageEnhance.Sharpness), _enhance_increasing_level),
    'shear_x': (_timm_affine(lambda s, x: (1, s, 0, 0, 1, 0)), _signed_level(0.3)),
    'shear_y': (_timm_affine(lambda s, x: (1, 0, 0, s, 1, 0)), _signed_level(0.3)),
    'translate_x_rel': (_timm_affine(lambda pct, x: (1, 0, pct * x.shape[-2], 0, 1, 0)),
                        _signed_level(0.45)),  # hparams have no translate_pct: 0.45.
    'translate_y_rel': (_timm_affine(lambda pct, x: (1, 0, 0, 0, 1, pct * x.shape[-3])),
                        _signed_level(0.45)),
}
TIMM_STANDARD = ('auto_contrast', 'equalize', 'invert', 'rotate', 'posterize', 'solarize',
                 'solarize_add', 'color', 'contrast', 'brightness', 'sharpness', 'shear_x',
                 'shear_y', 'translate_x_rel', 'translate_y_rel')  # rand_augment.py:385-401.
TIMM_INCREASING = ('auto_contrast', 'equalize', 'invert', 'rotate', 'posterize_increasing',
                   'solarize_increasing', 'solarize_add', 'color_increasing',
                   'contrast_increasing', 'brightness_increasing', 'sharpness_increasing',
                   'shear_x', 'shear_y', 'translate_x_rel',
                   'translate_y_rel')  # rand_augment.py:404-420.


def sample_timm_ops(rng: np.random.Generator, policy: str) -> List[Tuple[str, float, Any]]:
  """The ops one timm_randaugment call applies, in order: (name, magnitude, arg)."""
  pol = parse_timm_policy(policy)
  names = TIMM_INCREASING if pol.increasing else TIMM_STANDARD
  applied = []
  for i in rng.integers(len(names), size=pol.num_ops):  # np.random.choice(replace=True).
    if rng.random() > pol.prob:  # rand_augment.py:365: skipped with probability 1 - p.
      continue
    magnitude = pol.magnitude
    if pol.magnitude_std > 0:
      magnitude = rng.normal(magnitude, pol.magnitude_std)
    magnitude = min(_TIMM_MAX_LEVEL, max(0.0, magnitude))
    level_to_arg = TIMM_OPS[names[i]][1]
    arg = None if level_to_arg is None else level_to_arg(magnitude, rng)
    applied.append((names[i], magnitude, arg))
  return applied


def timm_randaugment(x: np.ndarray, rng: np.random.Generator,
                     policy: str = 'rand-m7-n4-mstd0.5-inc1') -> np.ndarray:
  """timm RandAugment as the official UCF101 run used it; x uint8 [..., h, w, c].

  Every frame of a clip gets the same ops and arguments (timm applies each op to the list of
  PIL frames with one draw). Geometric ops resample bicubic and fill (128, 128, 128).
  """
  for name, _, arg in sample_timm_ops(rng, policy):
    x = TIMM_OPS[name][0](x, arg)
  return x

