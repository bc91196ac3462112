"""liere_jax.data.prepare, offline: tiny originals in their real formats (tests/datasets.py)
-> the TFDS datasets (no TensorFlow) -> read back through TFDS and the real pipeline."""
import io
import json
import os
import subprocess
import sys
import zipfile

import grain
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core import shuffle as tfds_shuffle
from tensorflow_datasets.proto import tf_example_pb2

from liere_jax import data
from liere_jax.config import load
from liere_jax.data import write_originals as builders
from liere_jax.data import prepare
from liere_jax.config.data import resolve_data
from tests import datasets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(path, data_dir, **overrides):
  cfg = load(os.path.join(ROOT, 'configs', path))
  cfg.data.update(dict(data_dir=data_dir, **overrides))
  return cfg


def _reads_through_the_pipeline(cfg, expected_info, batch_shape):
  spec = resolve_data(cfg.data)
  assert data.dataset_info(spec) == expected_info
  batch = data.train_dataset(spec, global_batch_size=4, seed=0)[0]
  assert batch['image'].shape == batch_shape and np.isfinite(batch['image']).all()
  assert batch['label'].shape == (4, expected_info['num_classes'])


def _records(version_dir, name, split):
  """The raw tf.Example features of a split's records, in stored order."""
  info = json.loads(open(os.path.join(version_dir, 'dataset_info.json')).read())
  shards = [s for s in info['splits'] if s['name'] == split][0]['shardLengths']
  paths = [os.path.join(version_dir, f'{name}-{split}.array_record-{i:05d}-of-{len(shards):05d}')
           for i in range(len(shards))]
  source = grain.sources.ArrayRecordDataSource(paths)
  return [tf_example_pb2.Example.FromString(source[i]).features.feature
          for i in range(len(source))]


def _decode(jpeg: bytes) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(jpeg)).convert('RGB')).astype(np.int32)


def test_cifar100_from_the_binary_archive(tmp_path):
  download_dir, data_dir = str(tmp_path / 'dl'), str(tmp_path / 'tfds')
  os.makedirs(download_dir)
  originals = datasets.cifar100_archive(download_dir, dict(train=10, test=5))
  path = prepare.prepare('cifar100', download_dir, data_dir)
  assert path == os.path.join(data_dir, 'cifar100', '3.0.2')
  # TFDS's ids, labels and label names; PNG is lossless: exactly the pixels of the archive.
  for split, (images, labels) in originals.items():
    examples = {ex['id'].decode(): ex
                for ex in tfds.data_source('cifar100', split=split, data_dir=data_dir)}
    assert sorted(examples) == [f'{split}_{i:05d}' for i in range(len(images))]
    for i, image in enumerate(images):
      ex = examples[f'{split}_{i:05d}']
      np.testing.assert_array_equal(ex['image'], image)
      assert (ex['coarse_label'], ex['label']) == tuple(labels[i])
  features = tfds.builder('cifar100', data_dir=data_dir).info.features
  assert features['label'].names == [f'fine_{i}' for i in range(100)]
  assert features['coarse_label'].names == [f'coarse_{i}' for i in range(20)]
  _reads_through_the_pipeline(
      _config('cifar100.py', data_dir),
      dict(input_shape=(32, 32, 3), num_classes=100, num_train=10, num_eval=5), (4, 32, 32, 3))


def test_imagenet2012_from_the_manual_tars_through_tfds_disk_shuffle(tmp_path, monkeypatch):
  # Past 1 GB a split goes through TFDS's on-disk buckets, which use tf.io.gfile: force it.
  monkeypatch.setattr(tfds_shuffle, 'MAX_MEM_BUFFER_SIZE', 0)
  download_dir, data_dir = tmp_path / 'dl', str(tmp_path / 'tfds')
  os.makedirs(download_dir / 'manual')  # TFDS's manual_dir.
  originals = datasets.imagenet_tars(str(download_dir / 'manual'))
  path = prepare.prepare('imagenet2012', str(download_dir), data_dir)
  names = tfds.builder('imagenet2012', data_dir=data_dir).info.features['label'].names
  val_synsets = tfds.core.tfds_path(
      'datasets/imagenet2012/validation_labels.txt').read_text().split()
  seen = []
  for split in ('train', 'validation'):
    for feature in _records(path, 'imagenet2012', split):
      file_name = feature['file_name'].bytes_list.value[0].decode()
      image = feature['image'].bytes_list.value[0]
      want_split, synset, pixels, original = originals[file_name]
      if split == 'validation':
        synset = val_synsets[int(file_name[-13:-5]) - 1]
      assert (split, names[feature['label'].int64_list.value[0]]) == (want_split, synset)
      stored = Image.open(io.BytesIO(image))
      assert (stored.format, stored.mode) == ('JPEG', 'RGB'), file_name  # CMYK, PNG fixed.
      if Image.open(io.BytesIO(original)).mode == 'RGB' and original[:2] == b'\xff\xd8':
        assert image == original, f'{file_name} was re-encoded'
      else:  # Quality 100 with 4:2:0 chroma, as TF's encode_jpeg: within JPEG error.
        assert np.abs(_decode(image) - _decode(original)).mean() < 8, file_name
      assert _decode(image).shape == pixels.shape
      seen.append(file_name)
  assert sorted(seen) == sorted(originals)
  _reads_through_the_pipeline(
      _config('imagenet.py', data_dir, image_size=24),
      dict(input_shape=(24, 24, 3), num_classes=1000, num_train=6, num_eval=4), (4, 24, 24, 3))


def _check_videos(version_dir, originals, frame_shape):
  """Every record is one original video: all its frames, resized as ffmpeg does, its label.

  Within 12 grey levels on average (MPEG-4, 4:2:0 chroma, ffmpeg's default JPEG quality); the
  other videos are ~55 away.
  """
  names = tfds.features.ClassLabel(
      names_file=tfds.core.tfds_path('video/ucf101_labels.txt')).names
  for split in ('train', 'test'):
    want = {k: v for k, v in originals.items() if v[0] == split}
    matched = []
    for feature in _records(version_dir, 'ucf101', split):
      frames = np.stack([_decode(f) for f in feature['video'].bytes_list.value])
      assert frames.shape[1:] == frame_shape + (3,)
      errors = {}
      for key, (_, cls, original) in want.items():
        if len(original) == len(frames):
          resized = np.stack([np.asarray(Image.fromarray(f).resize(frame_shape[::-1],
                                                                   Image.BICUBIC))
                              for f in original])
          errors[key] = np.abs(frames - resized).mean()
      key = min(errors, key=errors.get)
      assert errors[key] < 12, errors
      assert names[feature['label'].int64_list.value[0]] == want[key][1]
      matched.append(key)
    assert sorted(matched) == sorted(want)


def test_ucf101_256_from_tfds_zips_and_native_from_extracted_files(tmp_path):
  zips, extracted, data_dir = tmp_path / 'zips', tmp_path / 'rar', str(tmp_path / 'tfds')
  os.makedirs(zips)
  os.makedirs(extracted)
  originals = datasets.ucf101_downloads(str(zips))
  path = prepare.prepare('ucf101', str(zips), data_dir)
  assert path == os.path.join(data_dir, 'ucf101', 'ucf101_1_256', '2.0.0')
  _check_videos(path, originals, (256, 256))
  video = json.loads(open(os.path.join(path, 'features.json')).read())
  video = video['featuresDict']['features']['video']
  assert video == {  # What TFDS's Video feature writes.
      'pythonClassName': 'tensorflow_datasets.core.features.video_feature.Video',
      'video': {'dtype': 'uint8', 'encodingFormat': 'jpeg', 'ffmpegExtraArgs':
                ['-vf', 'scale=256x256'], 'shape': {'dimensions': ['-1', '256', '256', '3']}}}

  originals = datasets.ucf101_downloads(str(extracted), extracted=True)
  path = prepare.prepare('ucf101/ucf101_1', str(extracted), data_dir)
  _check_videos(path, originals, (24, 32))
  info = dict(input_shape=(4, 16, 16, 3), num_classes=101, num_train=4, num_eval=2)
  for name in ('ucf101', 'ucf101/ucf101_1'):
    _reads_through_the_pipeline(
        _config('ucf101.py', data_dir, name=name, image_size=16, num_frames=4, frame_stride=2),
        info, (4, 4, 16, 16, 3))


def test_inputs_are_checked_before_anything_is_written(tmp_path):
  download_dir, data_dir = tmp_path / 'dl', str(tmp_path / 'tfds')
  os.makedirs(download_dir)
  for dataset, message in (('cifar100', 'cifar-100-binary.tar.gz is missing: download it from '
                                        'https://www.cs.toronto.edu/~kriz/'),
                           ('imagenet2012', 'ILSVRC2012_img_train.tar is missing'),
                           ('ucf101', 'UCF101_videos.zip is missing')):
    with pytest.raises(FileNotFoundError, match=message):
      prepare.prepare(dataset, str(download_dir), data_dir)
  datasets.ucf101_downloads(str(download_dir))
  _drop_from_zip(download_dir / 'UCF101_videos.zip', 'UCF101/v_ApplyEyeMakeup_g08_c01.avi')
  with pytest.raises(FileNotFoundError, match=r'1 of the 4 videos in trainlist01.txt .* '
                                              r'\(first: v_ApplyEyeMakeup_g08_c01.avi\)'):
    prepare.prepare('ucf101', str(download_dir), data_dir)
  with pytest.raises(ValueError, match="dataset='ucf101/ucf101_4' is unknown"):
    prepare.prepare('ucf101/ucf101_4', str(download_dir), data_dir)
  assert not os.path.exists(os.path.join(data_dir, 'ucf101', 'ucf101_1_256'))


def _drop_from_zip(path, member):
  with zipfile.ZipFile(path) as z:
    kept = {m: z.read(m) for m in z.namelist() if m != member}
  with zipfile.ZipFile(path, 'w') as z:
    for m, content in kept.items():
      z.writestr(m, content)


def test_cli_refuses_to_overwrite_and_overwrite_is_atomic(tmp_path, monkeypatch):
  download_dir, data_dir = str(tmp_path / 'dl'), str(tmp_path / 'tfds')
  os.makedirs(download_dir)
  datasets.cifar100_archive(download_dir, dict(train=6, test=3))
  command = [sys.executable, '-m', 'liere_jax.data.prepare', 'cifar100',
             f'--download_dir={download_dir}', f'--data_dir={data_dir}']
  env = dict(os.environ, PYTHONPATH=ROOT)
  run = lambda: subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                               timeout=300)
  proc = run()
  version_dir = os.path.join(data_dir, 'cifar100', '3.0.2')
  assert proc.returncode == 0, proc.stderr
  assert (f'Wrote cifar100 3.0.2 to {version_dir}: train 6 examples in 1 shards, test 3 '
          'examples in 1 shards') in proc.stdout
  proc = run()
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
      f'python -m liere_jax.data.prepare: error: {version_dir} is already prepared; pass '
      '--overwrite to replace it.')

  # A failed overwrite leaves the prepared copy in place; a good one replaces it.
  datasets.cifar100_archive(download_dir, dict(train=8, test=4))
  def fail(*args):
    del args
    raise RuntimeError('interrupted')
    yield  # pylint: disable=unreachable
  with monkeypatch.context() as m:
    m.setattr(builders.Cifar100, '_generate_examples', fail)
    with pytest.raises(RuntimeError, match='interrupted'):
      prepare.prepare('cifar100', download_dir, data_dir, overwrite=True)
  assert sorted(os.listdir(os.path.join(data_dir, 'cifar100'))) == ['3.0.2']
  assert len(tfds.data_source('cifar100', split='train', data_dir=data_dir)) == 6
  prepare.prepare('cifar100', download_dir, data_dir, overwrite=True)
  assert sorted(os.listdir(os.path.join(data_dir, 'cifar100'))) == ['3.0.2']
  assert len(tfds.data_source('cifar100', split='train', data_dir=data_dir)) == 8
