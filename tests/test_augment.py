"""Tests of liere_jax/data/augment.py and randaugment.py: every op against its definition (numpy
written here, or the PIL call the official code makes), the op tables, timm policies,
RandomResizedCrop and random erasing. Official facts are from O = StanfordMIMI/LieRE
dataset/randomaug.py and dataset/rand_augment.py."""
import collections
import math

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageOps
import pytest
import torch

from liere_jax.data import augment
from liere_jax.data import randaugment


class Draws:
  """A stand-in generator whose random() is always u (u > 0.5 flips an op's sign)."""

  def __init__(self, u):
    self.u = u

  def random(self):
    return self.u


def _image(seed, h=24, w=20):
  x = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
  x[4:14, 3:11] = (230, 40, 90)  # A flat block, so enhance and blur ops change something.
  return x


CLIP = np.stack([_image(0), _image(1)])  # [2, 24, 20, 3]: two different frames, h != w.


def per_frame(fn, clip=CLIP):
  return np.stack([np.asarray(fn(f)) for f in clip])


def pil(fn):
  """fn(PIL image) -> PIL image, as a numpy [h, w, c] -> [h, w, c] function."""
  return lambda f: np.asarray(fn(Image.fromarray(f)))


# Definitions, written out here.


def nearest_affine(f, a, b, c, d, e, g):
  """PIL AFFINE with NEAREST and black fill: out(u, v) = in(floor(a u' + b v' + c), ...) at
  pixel centres u' = u + 0.5, v' = v + 0.5; outside the image -> 0."""
  h, w = f.shape[:2]
  v, u = np.mgrid[:h, :w] + 0.5
  xs, ys = np.floor(a * u + b * v + c).astype(int), np.floor(d * u + e * v + g).astype(int)
  inside = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
  out = np.zeros_like(f)
  out[inside] = f[ys[inside], xs[inside]]
  return out


def autocontrast(f):
  """Per channel: lo -> 0, hi -> 255, int() of the linear map (PIL's lut, cutoff 0)."""
  out = f.copy()
  for ch in range(f.shape[-1]):
    lo, hi = int(f[..., ch].min()), int(f[..., ch].max())
    if hi > lo:
      out[..., ch] = np.clip((f[..., ch] * (255 / (hi - lo)) - lo * 255 / (hi - lo))
                             .astype(int), 0, 255)
  return out


def keep_bits(f, bits):
  return ((f >> (8 - bits)) << (8 - bits)).astype(np.uint8)


def invert_from(f, threshold):
  """Integer threshold: values >= threshold become 255 - value."""
  return np.where(f >= threshold, 255 - f.astype(int), f).astype(np.uint8)


def enhance(enhancer, factor):
  return pil(lambda im: enhancer(im).enhance(factor))


# The official RandAugment (randomaug.py).

OFFICIAL = {  # name: (min, max) from randomaug.py:184-201, in its order.
    'auto_contrast': (0, 1), 'equalize': (0, 1), 'invert': (0, 1), 'rotate': (0, 30),
    'posterize': (0, 4), 'solarize': (0, 256), 'solarize_add': (0, 110),
    'color': (0.1, 1.9), 'contrast': (0.1, 1.9), 'brightness': (0.1, 1.9),
    'sharpness': (0.1, 1.9), 'shear_x': (0, 0.3), 'shear_y': (0, 0.3), 'cutout_abs': (0, 40),
    'translate_x_abs': (0, 100), 'translate_y_abs': (0, 100),
}
OFFICIAL_AT_14 = {  # The value (M / 30)(max - min) + min each op gets at M = 14.
    'rotate': 14.0, 'posterize': 1.8667, 'solarize': 119.4667, 'solarize_add': 51.3333,
    'color': 0.94, 'contrast': 0.94, 'brightness': 0.94, 'sharpness': 0.94, 'shear_x': 0.14,
    'shear_y': 0.14, 'cutout_abs': 18.6667, 'translate_x_abs': 46.6667,
    'translate_y_abs': 46.6667,
}
SOLARIZE_FROM = {5: 43, 14: 120}  # ceil(M / 30 * 256): the first inverted value.


def official_expected(name, magnitude, sign):
  """[h, w, 3] -> [h, w, 3]: the op's definition at M = magnitude; sign = that of the draw."""
  low, high = OFFICIAL[name]
  v = magnitude / 30 * (high - low) + low
  s = sign * v
  if name == 'cutout_abs':
    def cutout(f):  # randomaug.py:127-145 with uniform(w) = w + (1 - w) u, u = 0.3 here.
      h, w = f.shape[:2]
      x0, y0 = int(max(0, w + (1 - w) * 0.3 - v / 2)), int(max(0, h + (1 - h) * 0.3 - v / 2))
      im = Image.fromarray(f)
      ImageDraw.Draw(im).rectangle((x0, y0, min(w, x0 + v), min(h, y0 + v)), (125, 123, 114))
      return np.asarray(im)
    return cutout
  return {
      'auto_contrast': autocontrast,
      'equalize': pil(ImageOps.equalize),
      'invert': lambda f: 255 - f,
      'rotate': pil(lambda im: im.rotate(s)),
      'posterize': lambda f: keep_bits(f, 1),  # max(1, int(v)): 1 at M = 5 and 14.
      'solarize': lambda f: invert_from(f, SOLARIZE_FROM[magnitude]),
      # Every value gains int(v) (an int plus v, truncated), then >= 128 is inverted.
      'solarize_add': lambda f: invert_from(np.minimum(f.astype(int) + int(v), 255), 128),
      'color': enhance(ImageEnhance.Color, v),
      'contrast': enhance(ImageEnhance.Contrast, v),
      'brightness': enhance(ImageEnhance.Brightness, v),
      'sharpness': enhance(ImageEnhance.Sharpness, v),
      'shear_x': lambda f: nearest_affine(f, 1, s, 0, 0, 1, 0),
      'shear_y': lambda f: nearest_affine(f, 1, 0, 0, s, 1, 0),
      'translate_x_abs': lambda f: nearest_affine(f, 1, 0, s, 0, 1, 0),
      'translate_y_abs': lambda f: nearest_affine(f, 1, 0, 0, 0, 1, s),
  }[name]


@pytest.mark.parametrize('name', list(OFFICIAL))
@pytest.mark.parametrize('magnitude', [5, 14])
def test_official_ops_match_their_definition(name, magnitude):
  op, low, high = randaugment.OFFICIAL_RANDAUG_OPS[name]
  v = magnitude / 30 * (high - low) + low
  for u, sign in ((0.3, 1), (0.7, -1)):  # randomaug.py: random.random() > 0.5 negates.
    if name == 'cutout_abs' and u == 0.7:
      continue  # Unsigned; u = 0.3 places the box.
    out = op(CLIP, v, Draws(u))
    expected = per_frame(official_expected(name, magnitude, sign))
    np.testing.assert_array_equal(out, expected, err_msg=f'{name} M={magnitude} u={u}')
    assert not np.array_equal(out, CLIP), name  # No op is the identity on this clip.


def test_official_translate_blanks_a_cifar_image_and_cutout_is_19_px():
  x = np.random.default_rng(0).integers(1, 256, (32, 32, 3), dtype=np.uint8)
  ops = {k: op for k, (op, _, _) in randaugment.OFFICIAL_RANDAUG_OPS.items()}
  for u in (0.3, 0.7):
    assert not ops['translate_x_abs'](x, 14 / 30 * 100, Draws(u)).any()
    assert not ops['translate_y_abs'](x, 14 / 30 * 100, Draws(u)).any()
  assert ops['translate_x_abs'](x, 5 / 30 * 100, Draws(0.3)).any()  # 16.7 px keeps some.
  box = (ops['cutout_abs'](np.zeros((64, 64, 3), np.uint8), 14 / 30 * 40, Draws(0.5)) != 0).all(-1)
  rows, cols = np.nonzero(box.any(1))[0], np.nonzero(box.any(0))[0]
  assert box.sum() == 19 * 19 and (rows[0], cols[0]) == (23, 23)  # int(32.5 - 9.33) = 23.


def test_official_op_table_and_magnitude_rule(monkeypatch):
  assert list(randaugment.OFFICIAL_RANDAUG_OPS) == list(OFFICIAL) and len(OFFICIAL) == 16
  assert {k: (lo, hi) for k, (_, lo, hi) in randaugment.OFFICIAL_RANDAUG_OPS.items()} == OFFICIAL
  seen = []
  monkeypatch.setattr(randaugment, 'OFFICIAL_RANDAUG_OPS', {
      k: (lambda x, v, rng, k=k: seen.append((k, v)) or x, lo, hi)
      for k, (lo, hi) in OFFICIAL.items()})
  draws = 4000
  for seed in range(draws // 2):
    randaugment.official_randaugment(CLIP, np.random.default_rng(seed), num_ops=2, magnitude=14)
  values = collections.defaultdict(set)
  for k, v in seen:
    values[k].add(round(v, 4))
  for k, v in OFFICIAL_AT_14.items():
    assert values[k] == {v}, k  # Fixed: no noise, no sign outside the op.
  counts = collections.Counter(k for k, _ in seen)
  assert len(seen) == draws and set(counts) == set(OFFICIAL)
  assert max(abs(c - draws / 16) for c in counts.values()) < 5 * math.sqrt(draws / 16)
  pairs = [seen[i][0] == seen[i + 1][0] for i in range(0, draws, 2)]
  assert abs(np.mean(pairs) - 1 / 16) < 0.02  # random.choices: with replacement.
  with pytest.raises(ValueError, match='magnitude=31'):
    randaugment.official_randaugment(CLIP, np.random.default_rng(0), magnitude=31)


# The torchvision-flavoured RandAugment (the project's own).

GRAY = np.array([0.299, 0.587, 0.114], np.float32)


def blend(f, degenerate, factor):
  return np.clip(degenerate + factor * (f.astype(np.float32) - degenerate), 0, 255).astype(
      np.uint8)


def bilinear_affine(data):
  return pil(lambda im: im.transform(im.size, Image.AFFINE, data, resample=Image.BILINEAR,
                                     fillcolor=(128, 128, 128)))


def torchvision_expected(name, m):
  """The op at signed m = +-M / 30; geometric ops grey-filled and about the centre. Contrast
  blends with the grey mean of the whole clip, truncated (one transform for every frame)."""
  h, w = CLIP.shape[1:3]
  gray = lambda f: (f @ GRAY)[..., None]
  return {
      'identity': lambda f: f,
      'shear_x': bilinear_affine((1, 0.3 * m, -0.3 * m * h / 2, 0, 1, 0)),
      'shear_y': bilinear_affine((1, 0, 0, 0.3 * m, 1, -0.3 * m * w / 2)),
      'translate_x': bilinear_affine((1, 0, 0.45 * m * w, 0, 1, 0)),
      'translate_y': bilinear_affine((1, 0, 0, 0, 1, 0.45 * m * h)),
      'rotate': pil(lambda im: im.rotate(30 * m, resample=Image.BILINEAR,
                                         fillcolor=(128, 128, 128))),
      'brightness': lambda f: blend(f, 0.0, 1 + 0.9 * m),
      'color': lambda f: blend(f, gray(f), 1 + 0.9 * m),
      'contrast': lambda f: blend(f, float(int(gray(CLIP).mean())), 1 + 0.9 * m),
      'sharpness': enhance(ImageEnhance.Sharpness, 1 + 0.9 * m),
      'posterize': lambda f: keep_bits(f, 8 - int(4 * abs(m))),
      'solarize': lambda f: invert_from(f, math.ceil(255 * (1 - abs(m)))),
      'autocontrast': autocontrast,
      'equalize': pil(ImageOps.equalize),
  }[name]


@pytest.mark.parametrize('name', list(augment.RANDAUG_OPS))
@pytest.mark.parametrize('m', [-14 / 30, 0.8])
def test_torchvision_style_ops_match_their_definition(name, m):
  out = augment.RANDAUG_OPS[name](CLIP, m)
  expected = per_frame(torchvision_expected(name, m))
  if name == 'autocontrast':  # Float arithmetic here; PIL's lut in `autocontrast`.
    assert np.abs(out.astype(int) - expected).max() <= 1
  else:
    np.testing.assert_array_equal(out, expected, err_msg=f'{name} m={m}')
  assert np.array_equal(out, CLIP) == (name == 'identity'), name


def test_autocontrast_keeps_a_flat_channel_as_pil_does():
  """A channel of one value (hi == lo) stays as it is, as PIL's autocontrast leaves it."""
  clip = CLIP.copy()
  clip[..., 1] = 77
  out = augment.RANDAUG_OPS['autocontrast'](clip, 0.5)
  np.testing.assert_array_equal(out[..., 1], clip[..., 1])
  assert np.abs(out.astype(int) - per_frame(pil(ImageOps.autocontrast), clip)).max() <= 1


def test_torchvision_style_table(monkeypatch):
  assert list(augment.RANDAUG_OPS) == [
      'identity', 'shear_x', 'shear_y', 'translate_x', 'translate_y', 'rotate', 'brightness',
      'color', 'contrast', 'sharpness', 'posterize', 'solarize', 'autocontrast', 'equalize']
  seen = []
  monkeypatch.setattr(augment, 'RANDAUG_OPS', {
      k: (lambda x, m, k=k: seen.append((k, m)) or x) for k in augment.RANDAUG_OPS})
  for seed in range(500):
    augment.randaugment(CLIP, np.random.default_rng(seed))
  assert len(seen) == 1000 and len({k for k, _ in seen}) == 14
  assert {round(m, 6) for _, m in seen} == {round(14 / 30, 6), round(-14 / 30, 6)}


@pytest.mark.parametrize('name', list(augment.RANDAUG_OPS))
def test_torchvision_style_ops_treat_equal_frames_alike(name):
  frame = CLIP[0]
  clip = np.stack([frame] * 3)
  for m in (-0.5, 1.0):
    out = augment.RANDAUG_OPS[name](clip, m)
    assert out.shape == clip.shape and out.dtype == np.uint8
    assert (out == out[:1]).all()
    np.testing.assert_array_equal(augment.RANDAUG_OPS[name](frame, m), out[0])
    assert np.array_equal(out, clip) == (name == 'identity'), name


def _record_ops(monkeypatch, module, table):
  """Wraps every op of module.<table> to log (name, input, output) and call through."""
  calls = []

  def wrap(name, fn):
    def op(x, *args):
      out = fn(x, *args)
      calls.append((name, x, out))
      return out
    return op

  ops = {k: wrap(k, v) if callable(v) else (wrap(k, v[0]),) + tuple(v[1:])
         for k, v in getattr(module, table).items()}
  monkeypatch.setattr(module, table, ops)
  return calls


@pytest.mark.parametrize('fn,module,table', [
    (augment.randaugment, augment, 'RANDAUG_OPS'),
    (randaugment.official_randaugment, randaugment, 'OFFICIAL_RANDAUG_OPS'),
    (randaugment.timm_randaugment, randaugment, 'TIMM_OPS'),
])
def test_randaugments_apply_the_drawn_ops_in_turn(monkeypatch, fn, module, table):
  """The output is the drawn ops applied one after the other to the input (an identity or a
  dropped op fails), and it changes the clip for most draws."""
  calls = _record_ops(monkeypatch, module, table)
  seeds, changed = 40, 0
  for seed in range(seeds):
    calls.clear()
    out = fn(CLIP, np.random.default_rng(seed))
    if fn is randaugment.timm_randaugment:  # The ops of the plan that the same draws give.
      plan = randaugment.sample_timm_ops(np.random.default_rng(seed), 'rand-m7-n4-mstd0.5-inc1')
      assert [c[0] for c in calls] == [name for name, _, _ in plan]
    else:
      assert len(calls) == 2  # num_ops.
    inputs = [CLIP] + [c[2] for c in calls]
    for (name, x, _), expected in zip(calls, inputs):
      assert x is expected, name
    assert out is inputs[-1]
    changed += not np.array_equal(out, CLIP)
  # Ours draws identity twice 1 time in 196; timm skips all 4 ops 1 time in 16.
  assert changed >= 0.8 * seeds


@pytest.mark.parametrize('fn', [augment.randaugment, randaugment.official_randaugment,
                                randaugment.timm_randaugment])
def test_randaugments_treat_every_frame_alike(fn):
  for seed in range(12):
    clip = fn(CLIP, np.random.default_rng(seed))
    assert clip.shape == CLIP.shape and clip.dtype == np.uint8
    if fn is augment.randaugment:  # Its contrast uses the clip's mean: compare equal frames.
      same = fn(np.stack([CLIP[0]] * 2), np.random.default_rng(seed))
      np.testing.assert_array_equal(same, np.stack([fn(CLIP[0], np.random.default_rng(seed))] * 2))
    else:
      frames = [fn(f, np.random.default_rng(seed)) for f in CLIP]
      np.testing.assert_array_equal(clip, np.stack(frames))


# timm's video RandAugment (rand_augment.py).

TIMM_AT_7 = {  # name: (arg with the sign kept, arg with it flipped) at level 7.
    'auto_contrast': (None, None), 'equalize': (None, None), 'invert': (None, None),
    'rotate': (21.0, -21.0), 'posterize_increasing': (2, 2), 'solarize_increasing': (77, 77),
    'solarize_add': (77, 77), 'color_increasing': (1.63, 0.37),
    'contrast_increasing': (1.63, 0.37), 'brightness_increasing': (1.63, 0.37),
    'sharpness_increasing': (1.63, 0.37), 'shear_x': (0.21, -0.21), 'shear_y': (0.21, -0.21),
    'translate_x_rel': (0.315, -0.315), 'translate_y_rel': (0.315, -0.315),
    # The inc0 set's own ops.
    'posterize': (2, 2), 'solarize': (179, 179), 'color': (1.36, 1.36),
    'contrast': (1.36, 1.36), 'brightness': (1.36, 1.36), 'sharpness': (1.36, 1.36),
}


def test_timm_op_sets_and_level_to_arg():
  assert randaugment.TIMM_INCREASING == (
      'auto_contrast', 'equalize', 'invert', 'rotate', 'posterize_increasing',
      'solarize_increasing', 'solarize_add', 'color_increasing', 'contrast_increasing',
      'brightness_increasing', 'sharpness_increasing', 'shear_x', 'shear_y', 'translate_x_rel',
      'translate_y_rel')
  assert randaugment.TIMM_STANDARD == (
      'auto_contrast', 'equalize', 'invert', 'rotate', 'posterize', 'solarize', 'solarize_add',
      'color', 'contrast', 'brightness', 'sharpness', 'shear_x', 'shear_y', 'translate_x_rel',
      'translate_y_rel')
  assert set(randaugment.TIMM_OPS) == set(TIMM_AT_7)
  for name, expected in TIMM_AT_7.items():
    level_to_arg = randaugment.TIMM_OPS[name][1]
    got = tuple(None if level_to_arg is None else level_to_arg(7, Draws(u)) for u in (0.3, 0.7))
    assert got == pytest.approx(expected) if got[0] is not None else got == expected, name
  # Edges of the level range: posterize_increasing 4 -> 0 bits, solarize 256 -> 0.
  assert randaugment.TIMM_OPS['posterize_increasing'][1](10, Draws(0.3)) == 0
  assert randaugment.TIMM_OPS['solarize_increasing'][1](0, Draws(0.3)) == 256


def bicubic(fn):
  return pil(lambda im: fn(im, dict(resample=Image.BICUBIC, fillcolor=(128, 128, 128))))


def timm_expected(name, arg):
  h, w = CLIP.shape[1:3]
  affine = lambda data: bicubic(lambda im, kw: im.transform(im.size, Image.AFFINE, data, **kw))
  enhancers = dict(color=ImageEnhance.Color, contrast=ImageEnhance.Contrast,
                   brightness=ImageEnhance.Brightness, sharpness=ImageEnhance.Sharpness)
  if name.replace('_increasing', '') in enhancers:
    return enhance(enhancers[name.replace('_increasing', '')], arg)
  geometric = {
      'shear_x': lambda: (1, arg, 0, 0, 1, 0), 'shear_y': lambda: (1, 0, 0, arg, 1, 0),
      'translate_x_rel': lambda: (1, 0, arg * w, 0, 1, 0),
      'translate_y_rel': lambda: (1, 0, 0, 0, 1, arg * h),
  }
  if name in geometric:
    return affine(geometric[name]())
  return {
      'auto_contrast': autocontrast,
      'equalize': pil(ImageOps.equalize),
      'invert': lambda f: 255 - f,
      'rotate': bicubic(lambda im, kw: im.rotate(arg, **kw)),
      'posterize': lambda f: keep_bits(f, arg),
      'posterize_increasing': lambda f: keep_bits(f, arg),
      'solarize': lambda f: invert_from(f, arg),
      'solarize_increasing': lambda f: invert_from(f, arg),
      # Only values below 128 gain `arg` (at most 255); the rest are kept.
      'solarize_add': lambda f: np.where(f < 128, np.minimum(f.astype(int) + arg, 255),
                                         f).astype(np.uint8),
  }[name]


@pytest.mark.parametrize('name', list(TIMM_AT_7))
@pytest.mark.parametrize('level', [4.2, 7])
def test_timm_ops_match_their_definition(name, level):
  op, level_to_arg = randaugment.TIMM_OPS[name]
  for u in (0.3, 0.7):
    arg = None if level_to_arg is None else level_to_arg(level, Draws(u))
    out = op(CLIP, arg)
    np.testing.assert_array_equal(out, per_frame(timm_expected(name, arg)),
                                  err_msg=f'{name} level={level} u={u}')
    assert not np.array_equal(out, CLIP), name


@pytest.mark.parametrize('policy,expected', [
    ('rand-m7-n4-mstd0.5-inc1', (7, 4, 0.5, True, 0.5)),
    ('rand-m9-n3-mstd0.5', (9, 3, 0.5, False, 0.5)),
    ('rand-inc0-n1-m0', (0, 1, 0.0, False, 0.5)),
    ('rand-m10-n2-mstd1-inc1-p0.8', (10, 2, 1.0, True, 0.8)),
    ('rand', (10, 2, 0.0, False, 0.5)),
])
def test_timm_policy_parsing(policy, expected):
  assert tuple(randaugment.parse_timm_policy(policy)) == expected


@pytest.mark.parametrize('policy,bad', [
    ('rand-m7-x3', "'x3'"), ('rand-m7.5-n2', "'m7.5'"), ('rand-inc2', "'inc2'"),
    ('rand-m7--n2', "''"), ('augmix-m5', "'rand-'"), ('rand-m11', 'm11'),
    ('rand-p1.5', 'p1.5'), ('rand-mstd-0.5', "'mstd'"),
])
def test_timm_policy_errors_name_the_bad_token(policy, bad):
  with pytest.raises(ValueError, match=bad):
    randaugment.parse_timm_policy(policy)


@pytest.mark.parametrize('policy,n,p,std', [
    ('rand-m7-n4-mstd0.5-inc1', 4, 0.5, 0.5), ('rand-m5-n3-p0.8', 3, 0.8, 0.0),
])
def test_timm_applied_ops_and_magnitudes_follow_the_policy(policy, n, p, std):
  draws = 4000
  plans = [randaugment.sample_timm_ops(np.random.default_rng(s), policy) for s in range(draws)]
  counts = np.array([len(plan) for plan in plans])
  assert abs(counts.mean() - n * p) < 4 * math.sqrt(n * p * (1 - p) / draws)
  assert counts.max() == n and counts.min() == 0
  names = collections.Counter(name for plan in plans for name, _, _ in plan)
  pol = randaugment.parse_timm_policy(policy)
  assert set(names) == set(randaugment.TIMM_INCREASING if pol.increasing
                          else randaugment.TIMM_STANDARD)
  magnitudes = np.array([m for plan in plans for _, m, _ in plan])
  assert abs(magnitudes.mean() - pol.magnitude) < 0.03
  assert abs(magnitudes.std() - std) < 0.03
  rotations = np.array([arg for plan in plans for name, m, arg in plan if name == 'rotate'])
  assert abs(np.mean(rotations < 0) - 0.5) < 0.1  # Random sign.
  for plan in plans[:200]:
    for name, m, arg in plan:
      if name == 'rotate':
        assert abs(arg) == pytest.approx(3 * m)  # Level -> 30 m / 10 deg.


# RandomResizedCrop.


def _rrc_law(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), n=1500):
  """rrc_box on a large square, by a grid integral: a try (s ~ U(scale), t ~ U(log ratio))
  fits iff s e^t <= 1 and s e^-t <= 1; 10 misses give the whole image (s = 1, t = 0).
  Returns P(10 misses), E[area fraction], E[log(w/h)^2]."""
  s = np.linspace(*scale, 2 * n + 1)[1::2][:, None]
  t = np.linspace(math.log(ratio[0]), math.log(ratio[1]), 2 * n + 1)[1::2][None]
  fits = (s * np.exp(np.abs(t)) <= 1)
  miss = (1 - fits.mean())**10
  return (miss, (1 - miss) * (s * fits).sum() / fits.sum() + miss,
          (1 - miss) * (t**2 * fits).sum() / fits.sum())


def test_rrc_box_distribution():
  rng = np.random.default_rng(0)
  boxes = np.array([augment.rrc_box(rng, 1000, 1000) for _ in range(20000)])
  top, left, h, w = boxes.T
  assert (top >= 0).all() and (left >= 0).all() and (top + h <= 1000).all()
  assert (left + w <= 1000).all()
  area, log_ratio = h * w / 1e6, np.log(w / h)
  _, mean_area, mean_sq = _rrc_law()
  assert abs(area.mean() / mean_area - 1) < 0.02
  assert abs(np.mean(log_ratio**2) / mean_sq - 1) < 0.03 and abs(log_ratio.mean()) < 0.005
  assert area.min() < 0.081 and area.max() > 0.99
  assert log_ratio.min() < math.log(3 / 4) + 0.005 and log_ratio.max() > math.log(4 / 3) - 0.005
  # Where every try fits, the area is uniform on the scale range.
  narrow = np.array([augment.rrc_box(rng, 600, 800, scale=(0.1, 0.5))[2:] for _ in range(4000)])
  fraction = narrow.prod(1) / (600 * 800)
  assert abs(fraction.mean() - 0.3) < 0.01 and abs(fraction.std() - 0.4 / math.sqrt(12)) < 0.01
  # Where most tries miss, 10 tries set how often the whole image comes back.
  whole = np.mean([augment.rrc_box(rng, 1000, 1000, scale=(0.9, 1.0)) == (0, 0, 1000, 1000)
                   for _ in range(4000)])
  assert abs(whole - _rrc_law(scale=(0.9, 1.0))[0]) < 0.025


def test_rrc_box_fallback_is_a_centre_crop_cut_to_the_ratio():
  never = (2.0, 3.0)  # Larger than the image: every try misses.
  rng = np.random.default_rng(0)
  assert augment.rrc_box(rng, 100, 400, scale=never) == (0, 133, 100, 133)  # w = 100 * 4/3.
  assert augment.rrc_box(rng, 400, 100, scale=never) == (133, 0, 133, 100)  # h = 100 / (3/4).
  assert augment.rrc_box(rng, 90, 100, scale=never) == (0, 0, 90, 100)


def test_resized_crop_matches_torch_and_takes_one_box_for_all_frames():
  clip = np.random.default_rng(0).integers(0, 256, (2, 40, 50, 3), dtype=np.uint8)
  as_torch = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.float32)).permute(0, 3, 1, 2)
  for box, size in (((3, 5, 30, 36), 16), ((0, 0, 40, 50), 24), ((10, 20, 7, 9), 20)):
    top, left, h, w = box
    ref = {aa: torch.nn.functional.interpolate(
        as_torch(clip[:, top:top + h, left:left + w]), size=(size, size), mode='bilinear',
        align_corners=False, antialias=aa).permute(0, 2, 3, 1).numpy() for aa in (False, True)}
    plain = augment.resized_crop(clip.astype(np.float32), box, size, antialias=False)
    np.testing.assert_allclose(plain, ref[False], atol=1e-3)
    rounded = augment.resized_crop(clip, box, size, antialias=False)
    assert rounded.dtype == np.uint8 and np.abs(rounded - ref[False]).max() <= 0.5 + 1e-3
    smooth = augment.resized_crop(clip, box, size)  # PIL bilinear, antialiased.
    assert smooth.shape == (2, size, size, 3) and smooth.dtype == np.uint8
    assert np.abs(smooth - ref[True]).max() <= 1
    for i in range(2):
      np.testing.assert_array_equal(augment.resized_crop(clip[i], box, size), smooth[i])
  # Downscaling: antialiasing averages more than two taps.
  down = [augment.resized_crop(clip, (0, 0, 40, 50), 10, antialias=aa) for aa in (True, False)]
  assert np.abs(down[0].astype(int) - down[1]).max() > 10


# Random erasing (random_erasing.py as videodataset.py:343-353 configures it) and flips.


def test_random_erasing():
  x = np.random.default_rng(0).normal(size=(2, 48, 60, 3)).astype(np.float32)
  rng = np.random.default_rng(1)
  fractions, erased, aspects = [], 0, []
  draws = 3000
  for _ in range(draws):
    out = augment.random_erasing(x, rng, p=0.25)
    changed = out != x
    if not changed.any():
      continue
    erased += 1
    assert (changed == changed[:1, ..., :1]).all()  # Same box on every frame and channel.
    rows, cols = np.nonzero(changed[0, ..., 0].any(1))[0], np.nonzero(changed[0, ..., 0].any(0))[0]
    h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
    assert changed[0, ..., 0].sum() == h * w and h < 48 and w < 60  # A box, smaller than x.
    assert not np.array_equal(out[0][changed[0]], out[1][changed[1]])  # Fresh noise per frame.
    fractions.append(h * w / (48 * 60))
    aspects.append(math.log(h / w))
  assert abs(erased / draws - 0.25) < 4 * math.sqrt(0.25 * 0.75 / draws)
  fractions = np.array(fractions)
  assert fractions.min() > 0.015 and fractions.max() < 1 / 3 + 0.02
  assert fractions.min() < 0.03 and fractions.max() > 0.28
  assert min(aspects) < math.log(0.3) + 0.3 and max(aspects) > -math.log(0.3) - 0.3
  noise = augment.random_erasing(np.zeros((4, 48, 60, 3), np.float32), rng, p=1.0)
  values = noise[noise != 0]
  assert abs(values.mean()) < 0.05 and abs(values.std() - 1) < 0.05  # N(0, 1) per pixel.
  assert augment.random_erasing(x, rng, p=0.0) is x


def test_hflip():
  rng = np.random.default_rng(0)
  outs = [augment.hflip(CLIP, rng) for _ in range(2000)]
  flipped = [np.array_equal(o, CLIP[:, :, ::-1]) for o in outs]
  assert all(f or np.array_equal(o, CLIP) for f, o in zip(flipped, outs))
  assert abs(np.mean(flipped) - 0.5) < 0.05
