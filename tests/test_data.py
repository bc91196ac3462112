"""Tests of liere_jax.data: the arrows task, its TFDS builder and the Grain pipelines (offline)."""
import ml_collections
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

from liere_jax.data import arrows
from liere_jax.data import pipeline
from liere_jax.data import tfds_builders
from tests import datasets


def data_config(**overrides):
  d = ml_collections.ConfigDict(dict(
      name='arrows', data_dir=None, train_split='train', eval_split='test', fraction=1.0,
      augment='none', mixup=0.0, image_size=0, num_frames=8, frame_stride=4, grid=9,
      num_eval=50, num_train=0, seed=0))
  d.update(overrides)
  return d


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
  tfds_builders.prepare_arrows(data_dir, grid=9, num_train=40, num_test=12)
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
  cfg = data_config(num_eval=12)
  stored = list(pipeline.eval_batches(data_config(num_eval=12, data_dir=arrows_dir), **kw))
  fly = list(pipeline.eval_batches(cfg, **kw))
  for a, b in zip(stored, fly, strict=True):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  info = pipeline.dataset_info(data_config(data_dir=arrows_dir, num_eval=12, fraction=0.5))
  assert info['num_train'] == 20 and info['num_eval'] == 12
  with pytest.raises(FileNotFoundError, match='prepare_arrows'):
    pipeline.dataset_info(data_config(data_dir=arrows_dir, grid=14, num_eval=12))
  with pytest.raises(ValueError, match='num_eval=50'):
    pipeline.dataset_info(data_config(data_dir=arrows_dir))


# The pipelines.


def test_train_batches_are_a_function_of_seed_and_step():
  cfg = data_config()
  a = pipeline.train_dataset(cfg, global_batch_size=8, seed=1)
  b = pipeline.train_dataset(cfg, global_batch_size=8, seed=1)
  c = pipeline.train_dataset(cfg, global_batch_size=8, seed=2)
  assert a[7]['image'].shape == (8, 108, 108, 3) and a[7]['label'].shape == (8, 4)
  assert a[7]['image'].dtype == a[7]['label'].dtype == np.float32
  np.testing.assert_array_equal(a[7]['image'], b[7]['image'])
  np.testing.assert_array_equal(a[7]['label'], b[7]['label'])
  assert not np.array_equal(a[7]['image'], c[7]['image'])
  assert not np.array_equal(a[7]['image'], a[8]['image'])
  assert a[7]['image'].min() == -1 and a[7]['image'].max() == 1  # (x/255 - 0.5) / 0.5.
  resumed = next(pipeline.to_iterator(a, start=7))
  np.testing.assert_array_equal(resumed['image'], a[7]['image'])


def test_process_shards_are_disjoint_and_make_the_global_batch():
  cfg = data_config(num_train=30)  # 30 examples: steps cross epochs too.
  one = pipeline.train_dataset(cfg, global_batch_size=12, seed=0)
  shards = [pipeline.train_dataset(cfg, global_batch_size=12, seed=0, process_index=p,
                                   process_count=3) for p in range(3)]
  for step in (0, 2, 3, 5):
    flat = [image_bytes(s[step], i) for s in shards for i in range(4)]
    assert sorted(flat) == sorted(image_bytes(one[step], i) for i in range(12))
    if step != 2:  # Step 2 spans the end of epoch 0 (positions 24..35), so it may repeat one.
      assert len(set(flat)) == 12  # Disjoint.
  with pytest.raises(ValueError, match='multiple of process_count=3'):
    pipeline.train_dataset(cfg, global_batch_size=8, seed=0, process_count=3)


def test_fraction_trains_on_the_first_examples_and_repeats():
  cfg = data_config(num_train=100, fraction=0.2)
  assert pipeline.dataset_info(cfg)['num_train'] == 20
  first = {((arrows.make_example(0, i)['image'] / 255 - .5) / .5).astype(np.float32).tobytes()
           for i in range(20)}
  ds = pipeline.train_dataset(cfg, global_batch_size=10, seed=0)
  seen = [image_bytes(ds[s], i) for s in range(4) for i in range(10)]
  assert set(seen) == first  # Two epochs of exactly the first 20.
  assert seen[:20] != seen[20:]  # Reshuffled each epoch.
  for bad in (0.0, 1.5):
    with pytest.raises(ValueError, match='fraction'):
      pipeline.dataset_info(data_config(fraction=bad))


@pytest.mark.parametrize('process_count', [1, 2])
def test_eval_never_drops_examples(process_count):
  cfg = data_config(num_eval=50)
  expected = sorted(((arrows.make_example(1, i)['image'] / 255 - .5) / .5).astype(np.float32)
                    .tobytes() for i in range(50))
  seen, num_batches = [], []
  for p in range(process_count):
    batches = list(pipeline.eval_batches(cfg, global_batch_size=16, process_index=p,
                                         process_count=process_count))
    num_batches.append(len(batches))
    for b in batches:
      assert b['image'].shape[0] == 16 // process_count and b['label'].dtype == np.int32
      seen += [image_bytes(b, i) for i in np.flatnonzero(b['mask'])]
  assert num_batches == [4] * process_count  # ceil(50 / 16), equal on every process.
  assert sorted(seen) == expected


def test_eval_at_another_resolution_renders_more_cells():
  b = next(pipeline.eval_batches(data_config(), global_batch_size=4, input_size=168))
  assert b['image'].shape == (4, 168, 168, 3)
  ref = arrows.make_example(1, 0, grid=14)
  np.testing.assert_array_equal(b['image'][0], (ref['image'] / 255 - .5) / .5)
  with pytest.raises(ValueError, match='multiple of the 12 px'):
    pipeline.eval_batches(data_config(), global_batch_size=4, input_size=100)


def test_config_errors_name_the_bad_value():
  with pytest.raises(ValueError, match="augment='light'.*label"):
    pipeline.train_dataset(data_config(augment='light'), global_batch_size=4, seed=0)
  with pytest.raises(ValueError, match='augmentation'):
    pipeline.dataset_info(data_config(augmentation='none'))
  with pytest.raises(ValueError, match='image_size=64'):
    pipeline.dataset_info(data_config(name='cifar100', image_size=64))
  with pytest.raises(ValueError, match='image_size'):
    pipeline.dataset_info(data_config(name='imagenet2012'))


def test_unprepared_datasets_say_how_to_prepare(tmp_path):
  with pytest.raises(FileNotFoundError, match='tfds build cifar100 --file_format=array_record'):
    pipeline.train_dataset(data_config(name='cifar100', data_dir=str(tmp_path)),
                           global_batch_size=4, seed=0)
  with pytest.raises(FileNotFoundError, match='ILSVRC2012_img_train.tar'):
    pipeline.dataset_info(data_config(name='imagenet2012', image_size=224,
                                      eval_split='validation', data_dir=str(tmp_path)))
  with pytest.raises(FileNotFoundError, match='tfds build ucf101'):
    pipeline.dataset_info(data_config(name='ucf101', image_size=224, data_dir=str(tmp_path)))
  with pytest.raises(FileNotFoundError, match='prepare_arrows'):
    pipeline.dataset_info(data_config(data_dir=str(tmp_path)))


def test_cifar100_on_mock_data():
  cfg = data_config(name='cifar100', augment='randaug', data_dir='/unused')
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
  cfg = data_config(name='imagenet2012', image_size=40, augment='light',
                    eval_split='validation', data_dir='/unused')
  with tfds.testing.mock_data(num_examples=10):
    assert pipeline.dataset_info(cfg)['input_shape'] == (40, 40, 3)
    a = pipeline.train_dataset(cfg, global_batch_size=4, seed=0)[2]
    assert a['image'].shape == (4, 40, 40, 3) and a['label'].shape == (4, 1000)
    b = next(pipeline.eval_batches(cfg, global_batch_size=4, input_size=24))
    assert b['image'].shape == (4, 24, 24, 3) and b['mask'].all()


@pytest.mark.parametrize('op', sorted(pipeline.RANDAUG_OPS))
def test_randaugment_ops_keep_shape_and_treat_frames_alike(op):
  rng = np.random.default_rng(0)
  frame = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
  clip = np.stack([frame] * 3)
  for m in (-0.5, 1.0):
    out = pipeline.RANDAUG_OPS[op](clip, m)
    assert out.shape == clip.shape and out.dtype == np.uint8
    assert (out == out[:1]).all()
    np.testing.assert_array_equal(pipeline.RANDAUG_OPS[op](frame, m), out[0])


def test_crop_flip_is_a_window_of_the_padded_image():
  x = np.random.default_rng(0).integers(1, 256, (16, 16, 3), dtype=np.uint8)
  padded = np.pad(x, ((2, 2), (2, 2), (0, 0)))  # 16 / 8 = 2.
  windows = {(np.ascontiguousarray(w[:, ::f]).tobytes(), f)
             for t in range(5) for l in range(5) for f in (1, -1)
             for w in [padded[t:t + 16, l:l + 16]]}
  outs = [pipeline.crop_flip(x, np.random.default_rng(i)) for i in range(40)]
  found = [{f for b, f in windows if b == np.ascontiguousarray(o).tobytes()} for o in outs]
  assert all(found)  # Every output is some window, flipped or not.
  assert {1, -1} <= set.union(*found) and len({o.tobytes() for o in outs}) > 10


# UCF101: its Video feature needs TensorFlow, so mock_data cannot make it; tests/datasets.py
# writes a tiny copy in the same on-disk format (a Sequence of JPEG frames under 'video').


@pytest.fixture(scope='module')
def ucf_dir(tmp_path_factory):
  return datasets.prepare(datasets.Ucf101, str(tmp_path_factory.mktemp('ucf')))


def test_ucf101_clips(ucf_dir):
  cfg = data_config(name='ucf101', data_dir=ucf_dir, image_size=16, mixup=0.8,
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
  mean, std = np.array(pipeline.DATASETS['ucf101'].mean), np.array(pipeline.DATASETS['ucf101'].std)
  pixels = ((b['image'] * std + mean) * 255)[..., 0].mean(axis=(-1, -2))  # [4, frames]
  for clip, label in zip(pixels, b['label'][:3]):
    # 32 frames: the centred clip is frames 1, 5, ..., 29; 10 frames: 0, 4, 8, then the last.
    frames = [1 + 4 * t for t in range(8)] if label != 52 else [0, 4, 8] + [9] * 5
    np.testing.assert_allclose(clip, 8 * np.array(frames), atol=2)
