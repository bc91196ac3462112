"""Tests of liere_jax.data: the arrows task, its TFDS builder and the Grain pipelines (offline)."""
import dataclasses
import io
import json
import logging
import re
import os
import subprocess
import sys

import jax
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

from liere_jax import checkpoint, evaluation
from liere_jax.config import base_config, load
from liere_jax.config.data import DATA
from liere_jax.data import arrows
from liere_jax.data import augment
from liere_jax.data import pipeline
from liere_jax.data import randaugment
from liere_jax.data import sources
from liere_jax.config import data as data_spec
from liere_jax.data import write_arrows
from liere_jax.data import transform
from tests import datasets, helpers
from tests.helpers import tiny_model_config


def data_config(**overrides):
  return data_spec.data_config(**{'name': 'arrows', 'num_eval': 50, **overrides})


def resolved(**overrides):
  """The DataSpec of data_config(**overrides): what the pipeline takes."""
  return data_spec.resolve_data(data_config(**overrides))


def image_bytes(batch, i):
  return batch['image'][i].tobytes()


# The arrows task.


def test_arrows_is_a_pure_function_of_seed_and_index():
  a, b = arrows.make_example(3, 17), arrows.make_example(3, 17)
  assert a['image'].tobytes() == b['image'].tobytes() and a['label'] == b['label']
  assert a['image'].shape == (108, 108, 3) and a['image'].dtype == np.uint8
  assert a['label'].dtype == np.int32
  assert a['image'].tobytes() != arrows.make_example(3, 18)['image'].tobytes()
  assert a['image'].tobytes() != arrows.make_example(4, 17)['image'].tobytes()


def test_glyphs_point_where_their_direction_says():
  # An arrow's head is heavier than its shaft; a Y's arms are heavier than its base.
  yy, xx = np.mgrid[:arrows.CELL, :arrows.CELL]
  for d, (dr, dc) in enumerate(arrows.STEPS):
    for glyph, sign in ((arrows.ARROW + d, 1), (arrows.Y + d, -1)):
      g = arrows.GLYPHS[glyph].astype(float)
      shift = np.array([(yy * g).sum(), (xx * g).sum()]) / g.sum() - (arrows.CELL - 1) / 2
      assert sign * (shift @ (dr, dc)) > 0.5, (glyph, shift)
      assert abs(shift @ (dc, dr)) < 1e-6  # Symmetric across the pointing axis.


def _parse(image, grid):
  """Reads back the glyph id of every cell by exact bitmap match: [grid, grid]."""
  cells = image[..., 0].reshape(grid, arrows.CELL, grid, arrows.CELL).transpose(0, 2, 1, 3)
  match = (cells[:, :, None] == arrows.GLYPHS[None, None]).all(axis=(-1, -2))
  assert (match.sum(-1) == 1).all()  # Every cell is exactly one glyph (or blank).
  return match.argmax(-1)


@pytest.mark.parametrize('grid', [4, 9, 14, 23])
def test_arrows_label_is_the_arrow_at_the_base_of_the_y(grid):
  for index in range(60):
    ex = arrows.make_example(5, index, grid)
    ids = _parse(ex['image'], grid)
    assert (ex['image'] == ex['image'][..., :1]).all()  # Grey: 3 equal channels.
    # Every object once, in distinct cells: 1 Y, 8 arrows, A-E.
    assert np.sum(ids >= arrows.Y) == 1
    assert np.sum((ids >= arrows.ARROW) & (ids < arrows.LETTER)) == 8
    assert sorted(ids[(ids >= arrows.LETTER) & (ids < arrows.Y)]) == list(range(5, 10))
    (r, c), = np.argwhere(ids >= arrows.Y)
    dr, dc = arrows.STEPS[ids[r, c] - arrows.Y]
    assert 0 <= r + dr < grid and 0 <= c + dc < grid
    assert ids[r + dr, c + dc] == arrows.ARROW + ex['label']
    layout = arrows.make_layout(5, index, grid)
    assert len(set(zip(layout['rows'], layout['cols']))) == arrows.NUM_OBJECTS
    assert (layout['rows'][1], layout['cols'][1]) == (r + dr, c + dc)


def test_arrows_labels_and_y_orientations_are_uniform():
  layouts = [arrows.make_layout(0, i) for i in range(4000)]
  for key in ('label', 'y_direction'):
    freq = np.bincount([l[key] for l in layouts], minlength=4) / len(layouts)
    np.testing.assert_allclose(freq, 0.25, atol=0.03)
  # The Y reaches every cell that has a neighbour on its base side, edges included.
  assert len({(l['rows'][0], l['cols'][0]) for l in layouts}) == 81


def test_majority_floor_matches_the_exact_value():
  # 7 uniform distractor directions + the target, ties split: 0.4423 exactly.
  assert abs(arrows.majority_floor(0, 3000, 9) - 0.4423) < 0.03


def test_arrows_source_and_png(tmp_path):
  src = arrows.ArrowsSource(seed=2, size=5, grid=14)
  assert len(src) == 5 and src[4]['image'].shape == (168, 168, 3)
  assert src[3]['image'].tobytes() == arrows.make_example(2, 3, 14)['image'].tobytes()
  with pytest.raises(IndexError):
    src[5]
  with pytest.raises(ValueError, match='grid=3'):
    arrows.make_example(0, 0, grid=3)
  arrows.save_examples_png(str(tmp_path / 'a.png'), n=3)
  assert Image.open(tmp_path / 'a.png').size[0] > 3 * 108


# The TFDS builder.


@pytest.fixture(scope='module')
def arrows_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  write_arrows.prepare_arrows(data_dir, grid=9, num_train=40, num_test=12)
  return data_dir


def test_tfds_arrows_equal_make_example(arrows_dir):
  for split, n in (('train', 40), ('test', 12)):
    src = tfds.data_source('liere_arrows/grid9', split=split, data_dir=arrows_dir)
    assert len(src) == n
    for i in (0, n - 1):
      ref = arrows.make_example(arrows.split_seed(0, split), i, 9)
      np.testing.assert_array_equal(src[i]['image'], ref['image'])
      assert src[i]['label'] == ref['label']


def test_pipeline_reads_prepared_arrows_like_on_the_fly(arrows_dir):
  kw = dict(global_batch_size=4)
  cfg = resolved(num_eval=12)
  stored = list(pipeline.eval_batches(resolved(num_eval=12, data_dir=arrows_dir), **kw))
  fly = list(pipeline.eval_batches(cfg, **kw))
  for a, b in zip(stored, fly, strict=True):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  info = pipeline.dataset_info(resolved(data_dir=arrows_dir, num_eval=12, fraction=0.5))
  assert info['num_train'] == 20 and info['num_eval'] == 12
  with pytest.raises(FileNotFoundError, match='prepare_arrows'):
    pipeline.dataset_info(resolved(data_dir=arrows_dir, grid=14, num_eval=12))
  with pytest.raises(ValueError, match='num_eval=50'):
    pipeline.dataset_info(resolved(data_dir=arrows_dir))


# The pipelines.


def test_train_batches_are_a_function_of_seed_and_step():
  cfg = resolved()
  ds = pipeline.train_dataset(cfg, global_batch_size=8, seed=1)
  a, a8 = ds[7], ds[8]  # Each ds[k] computes the batch: once each.
  b = pipeline.train_dataset(cfg, global_batch_size=8, seed=1)[7]
  c = pipeline.train_dataset(cfg, global_batch_size=8, seed=2)[7]
  assert a['image'].shape == (8, 108, 108, 3) and a['label'].shape == (8, 4)
  assert a['image'].dtype == a['label'].dtype == np.float32
  np.testing.assert_array_equal(a['image'], b['image'])
  np.testing.assert_array_equal(a['label'], b['label'])
  assert not np.array_equal(a['image'], c['image'])
  assert not np.array_equal(a['image'], a8['image'])
  assert a['image'].min() == -1 and a['image'].max() == 1  # (x/255 - 0.5) / 0.5.
  resumed = next(pipeline.to_iterator(ds, start=7))
  np.testing.assert_array_equal(resumed['image'], a['image'])


def test_process_shards_are_disjoint_and_make_the_global_batch():
  cfg = resolved(num_train=30)  # 30 examples: steps cross epochs too.
  one = pipeline.train_dataset(cfg, global_batch_size=12, seed=0)
  shards = [pipeline.train_dataset(cfg, global_batch_size=12, seed=0, process_index=p,
                                   process_count=3) for p in range(3)]
  for step in (0, 2, 3, 5):
    flat = [image_bytes(batch, i) for batch in [s[step] for s in shards] for i in range(4)]
    batch = one[step]
    assert sorted(flat) == sorted(image_bytes(batch, i) for i in range(12))
    if step != 2:  # Step 2 spans the end of epoch 0 (positions 24..35), so it may repeat one.
      assert len(set(flat)) == 12  # Disjoint.
  with pytest.raises(ValueError, match='multiple of process_count=3'):
    pipeline.train_dataset(cfg, global_batch_size=8, seed=0, process_count=3)


def test_fraction_trains_on_the_first_examples_and_repeats():
  cfg = resolved(num_train=100, fraction=0.2)
  assert pipeline.dataset_info(cfg)['num_train'] == 20
  first = {((arrows.make_example(0, i)['image'] / 255 - .5) / .5).astype(np.float32).tobytes()
           for i in range(20)}
  ds = pipeline.train_dataset(cfg, global_batch_size=10, seed=0)
  seen = [image_bytes(batch, i) for batch in [ds[s] for s in range(4)] for i in range(10)]
  assert set(seen) == first  # Two epochs of exactly the first 20.
  assert seen[:20] != seen[20:]  # Reshuffled each epoch.
  for bad in (0.0, 1.5):
    with pytest.raises(ValueError, match='fraction'):
      pipeline.dataset_info(resolved(fraction=bad))


def _eval_on_processes(cfg, global_batch_size, process_count):
  """[the eval batches of process p for each p]."""
  return [list(pipeline.eval_batches(cfg, global_batch_size=global_batch_size, process_index=p,
                                     process_count=process_count))
          for p in range(process_count)]


@pytest.mark.parametrize('process_count', [1, 2])
def test_eval_never_drops_examples(process_count):
  cfg = resolved(num_eval=50)
  expected = sorted(((arrows.make_example(1, i)['image'] / 255 - .5) / .5).astype(np.float32)
                    .tobytes() for i in range(50))
  seen = []
  per_process = _eval_on_processes(cfg, 16, process_count)
  for b in sum(per_process, []):
    assert b['image'].shape[0] == 16 // process_count and b['label'].dtype == np.int32
    seen += [image_bytes(b, i) for i in np.flatnonzero(b['mask'])]
  assert list(map(len, per_process)) == [4] * process_count  # ceil(50 / 16), on every process.
  assert sorted(seen) == expected


def test_eval_at_another_resolution_renders_more_cells():
  b = next(pipeline.eval_batches(resolved(), global_batch_size=4, input_size=168))
  assert b['image'].shape == (4, 168, 168, 3)
  ref = arrows.make_example(1, 0, grid=14)
  np.testing.assert_array_equal(b['image'][0], (ref['image'] / 255 - .5) / .5)
  with pytest.raises(ValueError, match='multiple of the 12 px'):
    pipeline.eval_batches(resolved(), global_batch_size=4, input_size=100)


def test_config_errors_name_the_bad_value():
  with pytest.raises(ValueError, match="augment='light'.*label"):
    pipeline.train_dataset(resolved(augment='light'), global_batch_size=4, seed=0)
  with pytest.raises(ValueError, match='augmentation'):
    pipeline.dataset_info(resolved(augmentation='none'))
  with pytest.raises(ValueError, match='image_size=64'):
    pipeline.dataset_info(resolved(name='cifar100', image_size=64))
  with pytest.raises(ValueError, match='image_size'):
    pipeline.dataset_info(resolved(name='imagenet2012'))


def test_unprepared_datasets_say_how_to_prepare(tmp_path):
  with pytest.raises(FileNotFoundError, match='liere_jax.data.prepare cifar100 --download_dir'):
    pipeline.train_dataset(resolved(name='cifar100', data_dir=str(tmp_path)),
                           global_batch_size=4, seed=0)
  with pytest.raises(FileNotFoundError, match='ILSVRC2012_img_train.tar'):
    pipeline.dataset_info(resolved(name='imagenet2012', image_size=224,
                                   eval_split='validation', data_dir=str(tmp_path)))
  with pytest.raises(FileNotFoundError, match='liere_jax.data.prepare ucf101'):
    pipeline.dataset_info(resolved(name='ucf101', image_size=224, data_dir=str(tmp_path)))
  with pytest.raises(FileNotFoundError, match='prepare_arrows'):
    pipeline.dataset_info(resolved(data_dir=str(tmp_path)))


def test_tfds_logs_are_held_back_when_the_source_is_refused_and_let_out_when_it_opens():
  seen = []
  handler = logging.Handler()
  handler.emit = lambda record: seen.append(record.getMessage())
  logger = logging.getLogger('absl')
  logger.addHandler(handler)
  try:
    with sources._held_logs():  # pylint: disable=protected-access
      logger.warning('opened')
      assert seen == []
    with pytest.raises(FileNotFoundError), sources._held_logs():
      logger.warning('probed')
      raise FileNotFoundError
  finally:
    logger.removeHandler(handler)
  assert seen == ['opened']


def test_cifar100_on_mock_data():
  cfg = resolved(name='cifar100', augment='randaug', data_dir='/unused')
  with tfds.testing.mock_data(num_examples=24):
    info = pipeline.dataset_info(cfg)
    assert info == dict(input_shape=(32, 32, 3), num_classes=100, num_train=24, num_eval=24)
    a = pipeline.train_dataset(cfg, global_batch_size=8, seed=0)[5]
    b = pipeline.train_dataset(cfg, global_batch_size=8, seed=0)[5]
    np.testing.assert_array_equal(a['image'], b['image'])
    assert a['image'].shape == (8, 32, 32, 3) and np.isfinite(a['image']).all()
    np.testing.assert_array_equal(a['label'].sum(1), 1)
    batches = list(pipeline.eval_batches(cfg, global_batch_size=16, input_size=64))
    assert [b['image'].shape for b in batches] == [(16, 64, 64, 3)] * 2
    assert sum(b['mask'].sum() for b in batches) == 24
    assert all(b['label'].max() < 100 for b in batches)


def test_imagenet_on_mock_data():
  # Mock images have random sizes: shorter side to image_size, centre crop.
  cfg = resolved(name='imagenet2012', image_size=40, augment='light',
                 eval_split='validation', data_dir='/unused')
  with tfds.testing.mock_data(num_examples=10):
    assert pipeline.dataset_info(cfg)['input_shape'] == (40, 40, 3)
    a = pipeline.train_dataset(cfg, global_batch_size=4, seed=0)[2]
    assert a['image'].shape == (4, 40, 40, 3) and a['label'].shape == (4, 1000)
    b = next(pipeline.eval_batches(cfg, global_batch_size=4, input_size=24))
    assert b['image'].shape == (4, 24, 24, 3) and b['mask'].all()


def test_crop_flip_is_a_window_of_the_padded_image():
  x = np.random.default_rng(0).integers(1, 256, (16, 16, 3), dtype=np.uint8)
  padded = np.pad(x, ((2, 2), (2, 2), (0, 0)))  # 16 / 8 = 2.
  windows = {(np.ascontiguousarray(w[:, ::f]).tobytes(), f)
             for t in range(5) for l in range(5) for f in (1, -1)
             for w in [padded[t:t + 16, l:l + 16]]}
  outs = [augment.crop_flip(x, np.random.default_rng(i)) for i in range(40)]
  found = [{f for b, f in windows if b == np.ascontiguousarray(o).tobytes()} for o in outs]
  assert all(found)  # Every output is some window, flipped or not.
  assert {1, -1} <= set.union(*found) and len({o.tobytes() for o in outs}) > 10


# UCF101: its Video feature needs TensorFlow, so mock_data cannot make it; tests/datasets.py
# writes a tiny copy in the same on-disk format (a Sequence of JPEG frames under 'video').


@pytest.fixture(scope='module')
def ucf_dir(tmp_path_factory):
  return datasets.prepare(datasets.Ucf101, str(tmp_path_factory.mktemp('ucf')))


def test_ucf101_clips(ucf_dir):
  cfg = resolved(name='ucf101', data_dir=ucf_dir, image_size=16, mixup=0.8,
                 augment='light', num_eval=2000)
  assert pipeline.dataset_info(cfg) == dict(input_shape=(8, 16, 16, 3), num_classes=101,
                                            num_train=6, num_eval=3)
  train = pipeline.train_dataset(cfg, global_batch_size=4, seed=0)
  a, b = train[3], pipeline.train_dataset(cfg, global_batch_size=4, seed=0)[3]
  np.testing.assert_array_equal(a['image'], b['image'])
  assert a['image'].shape == (4, 8, 16, 16, 3) and a['label'].shape == (4, 101)
  np.testing.assert_allclose(a['label'].sum(1), 1, rtol=1e-6)
  assert (a['label'] > 0).sum() > 4  # Mixup mixed some labels.

  batches = list(pipeline.eval_batches(cfg, global_batch_size=4, input_size=8))
  assert len(batches) == 1 and batches[0]['mask'].tolist() == [True] * 3 + [False]
  b = batches[0]
  assert b['image'].shape == (4, 8, 8, 8, 3)
  assert sorted(b['label'][:3]) == [50, 51, 52]
  info = data_spec.DATASETS['ucf101']
  mean, std = np.array(info.mean), np.array(info.std)
  pixels = ((b['image'] * std + mean) * 255)[..., 0].mean(axis=(-1, -2))  # [4, frames]
  for clip, label in zip(pixels, b['label'][:3]):
    # 32 frames: the centred clip is frames 1, 5, ..., 29; 10 frames: 0, 4, 8, then the last.
    frames = [1 + 4 * t for t in range(8)] if label != 52 else [0, 4, 8] + [9] * 5
    np.testing.assert_allclose(clip, 8 * np.array(frames), atol=2)


# The official recipes: training orders, RandomResizedCrop, eval crops and views.


@pytest.fixture(scope='module')
def ucf_native_dir(tmp_path_factory):
  return datasets.prepare(datasets.Ucf101Native, str(tmp_path_factory.mktemp('ucf1')),
                          texture=120)


@pytest.fixture(scope='module')
def imagenet_dir(tmp_path_factory):
  return datasets.prepare(datasets.Imagenet2012, str(tmp_path_factory.mktemp('in')))


def _record(monkeypatch, ops):
  """Wraps module.<name> for each (module, name) to log (name, input shape, dtype) and call
  through."""
  calls = []
  for module, name in ops:
    def wrapped(x, *args, _name=name, _fn=getattr(module, name), **kw):
      calls.append((_name, x.shape, x.dtype) if isinstance(x, np.ndarray) else (_name, args))
      return _fn(x, *args, **kw)
    monkeypatch.setattr(module, name, wrapped)
  return calls


_OPS = ((randaugment, 'official_randaugment'), (randaugment, 'timm_randaugment'),
        (augment, 'randaugment'), (augment, 'crop_flip'), (augment, 'rrc_box'),
        (augment, 'resized_crop'), (augment, 'hflip'), (augment, 'random_erasing'))


def test_official_orders(monkeypatch, imagenet_dir, ucf_native_dir):
  calls = _record(monkeypatch, _OPS)
  u8, f32 = np.dtype(np.uint8), np.dtype(np.float32)
  with tfds.testing.mock_data(num_examples=4):  # O data_image.py:96-104: RA, pad-crop, flip.
    pipeline.train_dataset(resolved(name='cifar100', augment='official_randaug',
                                    data_dir='/unused'), global_batch_size=1, seed=0)[0]
  assert [c[0] for c in calls] == ['official_randaugment', 'crop_flip', 'hflip']
  assert calls[0][1:] == ((32, 32, 3), u8)
  # O data_image.py:193-205: RA on the native image, then RandomResizedCrop, then flip.
  calls.clear()
  cfg = resolved(name='imagenet2012', image_size=24, augment='official_randaug', crop='rrc',
                 data_dir=imagenet_dir)
  source = tfds.data_source('imagenet2012', split='train', data_dir=imagenet_dir)
  native = {source[i]['image'].shape for i in range(len(source))}
  pipeline.train_dataset(cfg, global_batch_size=1, seed=0)[0]
  assert [c[0] for c in calls] == ['official_randaugment', 'rrc_box', 'resized_crop', 'hflip']
  assert calls[0][1] in native and calls[1][1] == calls[0][1][:2]
  assert calls[2][1] == calls[0][1] and calls[3][1] == (24, 24, 3)
  # O videodataset.py:306-353: timm RA on native frames, RRC, flip, then erasing (normalised).
  calls.clear()
  cfg = resolved(name='ucf101/ucf101_1', image_size=16, num_frames=4, augment='videomae',
                 crop='rrc', random_erasing=1.0, data_dir=ucf_native_dir)
  pipeline.train_dataset(cfg, global_batch_size=1, seed=0)[0]
  assert [c[0] for c in calls] == ['timm_randaugment', 'rrc_box', 'resized_crop', 'hflip',
                                   'random_erasing']
  assert calls[0][1:] == ((4, 24, 32, 3), u8) and calls[1][1] == (24, 32)
  assert calls[4][1:] == ((4, 16, 16, 3), f32)
  # Ours ('randaug'): crop and flip first, RandAugment at S.
  calls.clear()
  pipeline.train_dataset(dataclasses.replace(cfg, augment='randaug', crop='pad',
                                             random_erasing=0.0), global_batch_size=1, seed=0)[0]
  assert [c[0] for c in calls] == ['crop_flip', 'hflip', 'randaugment']
  assert calls[2][1] == (4, 16, 16, 3)


def test_rrc_crops_native_images_anew_each_time_and_every_frame_alike(ucf_native_dir):
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
  spec = resolved(name='imagenet2012', image_size=24, augment='light', crop='rrc')
  outs = [transform.train_augment(spec, image, np.random.default_rng(i)) for i in range(6)]
  assert all(o.shape == (24, 24, 3) and o.dtype == np.uint8 for o in outs)
  assert len({o.tobytes() for o in outs}) == 6
  clip = np.stack([image] * 5)
  spec = resolved(name='ucf101', image_size=24, augment='videomae', crop='rrc')
  for seed in range(4):
    out = transform.train_augment(spec, clip, np.random.default_rng(seed))
    assert out.shape == (5, 24, 24, 3) and (out == out[:1]).all()
  # Through the pipeline: native 24 x 32 frames -> [frames, S, S, 3], a pure function of step.
  cfg = resolved(name='ucf101/ucf101_1', image_size=16, augment='light', crop='rrc',
                 data_dir=ucf_native_dir)
  assert pipeline.dataset_info(cfg)['input_shape'] == (8, 16, 16, 3)
  a, b = (pipeline.train_dataset(cfg, global_batch_size=2, seed=0)[1] for _ in range(2))
  assert a['image'].shape == (2, 8, 16, 16, 3)
  np.testing.assert_array_equal(a['image'], b['image'])


def test_videomae_training_clips_follow_the_official_sampler():
  # O videodataset.py:390-417: end ~ U[32, n), floor(linspace(end - 32, end, 8)) clipped to
  # end - 1; a video of n <= 32 frames: floor(linspace(0, n, n // 4)) then n, clipped to n - 1.
  starts = set()
  for seed in range(200):
    idx = transform.train_clip(40, 8, 4, np.random.default_rng(seed), videomae=True)
    np.testing.assert_array_equal(idx - idx[0], [0, 4, 9, 13, 18, 22, 27, 31])
    starts.add(int(idx[0]))
  assert starts == set(range(8))
  short = transform.train_clip(29, 8, 4, np.random.default_rng(0), videomae=True)
  np.testing.assert_array_equal(short, [0, 4, 9, 14, 19, 24, 28, 28])


def _torchvision_center_crop(image, size):
  """torchvision CenterCrop written out: paste into a zero canvas (pad left/top (S - h) // 2),
  or cut from offset int(round((h - S) / 2.0)) (Python rounds half to even)."""
  out = np.zeros((size, size, 3), np.uint8)
  h, w = image.shape[:2]
  src_t, dst_t = (int(round((h - size) / 2.0)), 0) if h >= size else (0, (size - h) // 2)
  src_l, dst_l = (int(round((w - size) / 2.0)), 0) if w >= size else (0, (size - w) // 2)
  ch, cw = min(h, size), min(w, size)
  out[dst_t:dst_t + ch, dst_l:dst_l + cw] = image[src_t:src_t + ch, src_l:src_l + cw]
  return out


def test_eval_center_crop_is_torchvisions(imagenet_dir):
  rng = np.random.default_rng(0)
  for h in range(30, 52):  # Odd and even differences both ways, e.g. 47 - 40 = 7: offset 4.
    image = rng.integers(1, 256, (h, 81 - h, 3), dtype=np.uint8)
    np.testing.assert_array_equal(transform.center_crop(image, 40),
                                  _torchvision_center_crop(image, 40))
  cfg = resolved(name='imagenet2012', image_size=40, eval_crop='center',
                 eval_split='validation', data_dir=imagenet_dir)
  source = tfds.data_source('imagenet2012', split='validation', data_dir=imagenet_dir)
  expected = [_torchvision_center_crop(source[i]['image'], 40) for i in range(len(source))]
  assert any(min(source[i]['image'].shape[:2]) < 40 for i in range(len(source)))  # Some pad.
  batches = list(pipeline.eval_batches(cfg, global_batch_size=len(source)))
  info = data_spec.DATASETS['imagenet2012']
  mean, std = np.array(info.mean), np.array(info.std)
  pixels = np.round((batches[0]['image'] * std + mean) * 255).astype(np.uint8)
  np.testing.assert_array_equal(pixels, expected)


def _official_view(jpegs, size, num, stride, t, s, temporal=5, spatial=3):
  """O videodataset.py:264-296, 382-388 written out: frames 0, stride, ... (the last repeated
  up to num), resized to shorter side `size`, clip t of `temporal`, crop s of `spatial` along
  the longer side."""
  index = list(range(0, len(jpegs), stride))
  while len(index) < num:
    index.append(index[-1])
  start = int(t * max((len(index) - num) / (temporal - 1), 0))
  frames = []
  for i in index[start:start + num]:
    frame = Image.open(io.BytesIO(jpegs[i])).convert('RGB')
    w, h = frame.size
    short = min(w, h)
    frame = np.asarray(frame.resize((round(w * size / short), round(h * size / short)),
                                    Image.BILINEAR))
    offset = int(s * ((max(frame.shape[:2]) - size) / (spatial - 1)))
    frames.append(frame[offset:offset + size] if frame.shape[0] > frame.shape[1]
                  else frame[:, offset:offset + size])
  return np.stack(frames)


@pytest.mark.parametrize('process_count', [1, 2])
def test_eval_views_are_the_official_ones(ucf_native_dir, process_count):
  # 4 frames at stride 2 (32-frame videos: 16 grid points, clips start at 0, 3, 6, 9, 12; the
  # 10-frame video: 5 points, starts 0, 0, 0, 0, 1); 24 x 32 frames -> 16 x 21: crops at 0, 2, 5.
  cfg = resolved(name='ucf101/ucf101_1', image_size=16, num_frames=4, frame_stride=2,
                 eval_views=(5, 3), data_dir=ucf_native_dir)
  source = sources.video_source(cfg, 'test')
  raw = [source[v] for v in range(len(source))]
  expected = [(v, _official_view(raw[v]['frames'], 16, 4, 2, t, s).tobytes(), raw[v]['label'])
              for v in range(len(raw)) for t in range(5) for s in range(3)]
  assert len(expected) == 45 and len({e[1] for e in expected}) > 30
  info = data_spec.DATASETS['ucf101']
  mean, std = np.array(info.mean), np.array(info.std)
  seen = []
  per_process = _eval_on_processes(cfg, 8, process_count)
  for b in sum(per_process, []):
    assert b['image'].shape == (8 // process_count, 4, 16, 16, 3)
    assert ((b['video'] >= 0) == b['mask']).all()  # Padding: video -1, mask False.
    pixels = np.round((b['image'] * std + mean) * 255).astype(np.uint8)
    seen += [(int(b['video'][i]), pixels[i].tobytes(), int(b['label'][i]))
             for i in np.flatnonzero(b['mask'])]
  assert list(map(len, per_process)) == [6] * process_count  # ceil(45 / 8), on every process.
  if process_count == 1:
    assert seen == expected  # In order: video by video, temporal-major (O's (ck, cp) order).
  assert sorted(seen) == sorted(expected)  # Every view once, over disjoint process slices.


def test_per_view_and_per_video_accuracy_on_hand_made_scores():
  video = np.array([1, 0, 0, 1, 0, 1])
  label = np.array([0, 1, 1, 0, 1, 0])
  probs = np.array([[.3, .7], [.6, .4], [.4, .6], [.9, .1], [.45, .55], [.2, .8]])
  # Video 0 (label 1): views right F T T, mean (.483, .517) -> right. Video 1 (label 0): views
  # F T F, mean (.467, .533) -> wrong.
  acc = evaluation.by_video(video, label, probs)
  assert acc.top1 == acc.per_view == 0.5 and acc.per_video == 0.5
  np.testing.assert_allclose(acc.correct, [2 / 3, 1 / 3])
  assert acc.metrics('top1') == dict(top1=0.5, top1_per_view=0.5, top1_per_video=0.5)
  probs[3] = [.1, .9]  # Video 1: F F F, mean still wrong; video 0 unchanged.
  acc = evaluation.by_video(video, label, probs)
  assert (acc.per_view, acc.per_video) == (2 / 6, 0.5)
  assert evaluation.Accuracy(0.7, np.ones(3)).metrics('x') == dict(x=0.7)


def test_evaluate_with_views_scores_every_view_and_every_video(ucf_native_dir):
  data = data_config(name='ucf101/ucf101_1', image_size=16, num_frames=4, frame_stride=2,
                     eval_views=(5, 3), data_dir=ucf_native_dir)
  model = tiny_model_config(pe='abs', n_dims=3, size=16, depth=1)
  model.patch, model.input_size, model.num_classes = (2, 8, 8), (4, 16, 16), 101
  config = base_config(model=model, data=data, batch_size=8, total_steps=1, lr=1e-3)
  trainer = helpers.trainer(config)
  rng = np.random.default_rng(0)  # Random parameters (no init to compile) ...
  params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(x.dtype),
                        trainer.abstract_state['params'])
  params['head']['bias'][:] = -100  # ... that predict one of the labels 50-52, by view.
  params['head']['bias'][50:53] = 0
  params = jax.device_put(params, trainer.state_sharding['params'])
  acc = evaluation.evaluate(trainer, params)
  # Independently: every view's prediction from the model, then the means by hand.
  video, label, probs = [], [], []
  forward = jax.jit(lambda params, x: jax.nn.softmax(trainer.model(params)(x)))
  for b in pipeline.eval_batches(trainer.run.data, global_batch_size=8):
    p = forward(params, b['image'])
    video += list(b['video'][b['mask']])
    label += list(b['label'][b['mask']])
    probs += list(np.asarray(p)[b['mask']])
  video, label, probs = np.array(video), np.array(label), np.array(probs)
  right = probs.argmax(-1) == label
  assert len(right) == 45 and 0 < right.mean() < 1
  assert acc.top1 == acc.per_view == pytest.approx(right.mean())
  per_video = [probs[video == v].mean(0).argmax() == label[video == v][0] for v in range(3)]
  assert acc.per_video == pytest.approx(np.mean(per_video)) and len(acc.correct) == 3


@pytest.mark.parametrize('name,overrides', [
    ('cifar100', dict(augment='official_randaug')),
    ('imagenet2012', dict(image_size=24, augment='official_randaug', crop='rrc')),
    ('imagenet2012', dict(image_size=24, augment='randaug', crop='rrc', random_erasing=0.5)),
    ('ucf101/ucf101_1', dict(image_size=16, num_frames=4, augment='videomae', crop='rrc',
                             random_erasing=0.25)),
])
def test_new_modes_are_a_function_of_seed_and_step(name, overrides, imagenet_dir,
                                                   ucf_native_dir):
  data_dir = {'imagenet2012': imagenet_dir, 'ucf101/ucf101_1': ucf_native_dir}.get(name)
  cfg = resolved(name=name, data_dir=data_dir or '/unused', **overrides)
  with tfds.testing.mock_data(num_examples=8):  # Used by cifar100 only (data_dir='/unused').
    make = lambda seed, **kw: pipeline.train_dataset(cfg, global_batch_size=4, seed=seed, **kw)
    a, b, c = make(0)[2], make(0)[2], make(1)[2]
    np.testing.assert_array_equal(a['image'], b['image'])
    assert not np.array_equal(a['image'], c['image'])
    halves = [make(0, process_index=p, process_count=2)[2]['image'] for p in range(2)]
    assert sorted(x.tobytes() for h in halves for x in h) == sorted(x.tobytes() for x in a['image'])


def test_recipe_config_errors_name_the_bad_value():
  bad = [(dict(crop='random'), 'data.crop'), (dict(eval_crop='resize'), 'data.eval_crop'),
         (dict(random_erasing=1.5), 'random_erasing=1.5'),
         (dict(augment='videomae', randaug_policy='rand-m7-x2'), "token 'x2'"),
         (dict(name='cifar100', eval_views=(5, 3)), 'is for video'),
         (dict(name='ucf101', image_size=16, eval_views=(5,)), 'eval_views=\\(5,\\)'),
         (dict(name='ucf101', image_size=16, eval_views=(5, 3), eval_crop='center'),
          "eval_crop='resize_center'")]
  for overrides, match in bad:
    with pytest.raises(ValueError, match=match):
      data_spec.resolve_data(data_config(**{'name': 'imagenet2012', 'image_size': 16,
                                            **overrides}))
  with pytest.raises(ValueError, match='arrows'):
    data_spec.resolve_data(data_config(random_erasing=0.25))


def test_the_pipeline_takes_a_data_spec_and_refuses_the_section_naming_resolve_data():
  cfg = data_config(num_train=24, num_eval=6, workers=1, threads=3, prefetch=4)
  spec = data_spec.resolve_data(cfg)
  assert (spec.size, spec.train_split, spec.eval_split) == (108, 'train', 'test')
  assert (spec.workers, spec.threads, spec.prefetch, spec.num_train) == (1, 3, 4, 24)
  fix = re.escape(', not a ConfigDict; resolve the data section first: '
                  'liere_jax.config.data.resolve_data(config.data)')
  for name, call in (('dataset_info', pipeline.dataset_info),
                     ('train_dataset', lambda d: pipeline.train_dataset(d, global_batch_size=4,
                                                                        seed=1)),
                     ('eval_batches', lambda d: pipeline.eval_batches(d, global_batch_size=4)),
                     ('normalisation', transform.normalisation)):
    call(spec)
    with pytest.raises(TypeError, match=f'^{name} takes a DataSpec' + fix):
      call(cfg)
  with pytest.raises(ValueError, match='threads=0'):
    data_spec.resolve_data(data_config(threads=0))


def test_the_data_spec_imports_without_tfds_or_grain():
  code = ('import sys; from liere_jax.config import data; '
          "print(sorted({'grain', 'tensorflow_datasets', 'jax'} & set(sys.modules)))")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert out.stdout.strip() == '[]', out.stdout


def test_device_normalisation_sends_the_pixels_of_the_host_batch():
  """data.normalise='device': uint8 batches whose pixels * scale + offset are the host path's
  float32 batch, exactly; mixup or erasing (normalised values) refuse it."""
  host = resolved(num_train=64)
  device = resolved(num_train=64, normalise='device')
  a = pipeline.train_dataset(host, global_batch_size=8, seed=3)[2]
  b = pipeline.train_dataset(device, global_batch_size=8, seed=3)[2]
  assert a['image'].dtype == np.float32 and b['image'].dtype == np.uint8
  scale, offset = transform.normalisation(device)
  np.testing.assert_array_equal(b['image'].astype(np.float32) * scale + offset, a['image'])
  np.testing.assert_array_equal(a['label'], b['label'])
  with pytest.raises(ValueError, match="normalise='host'"):
    pipeline.train_dataset(resolved(normalise='device', mixup=0.2), global_batch_size=8,
                           seed=0)


def test_old_run_configs_read_back_with_the_data_fields_added_since(tmp_path):
  """eval.py on a workdir written before crop, eval_views, workers, normalise, ... existed."""
  old = json.loads(checkpoint.config_to_json(load('configs/arrows.py')))
  for key in DATA.added():
    del old['data'][key]
  (tmp_path / checkpoint.CONFIG_FILE).write_text(json.dumps(old))
  data = checkpoint.read_config(str(tmp_path)).data
  assert {k: data[k] for k in DATA.added()} == DATA.added()
  assert pipeline.dataset_info(data_spec.resolve_data(data))['input_shape'] == (108, 108, 3)
