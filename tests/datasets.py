"""Tiny stand-ins of the TFDS datasets the configs read, written in the real on-disk layout.

Subprocesses (train.py, eval.py) cannot see `tfds.testing.mock_data`, so the tests write small
copies of cifar100, imagenet2012 and ucf101/ucf101_1_256 to a temporary data_dir exactly as
`tfds build NAME --file_format=array_record` lays them out: DATA_DIR/NAME[/CONFIG]/VERSION/
with dataset_info.json, features.json and array_record shards, with the real builders' names,
versions and feature specs (tensorflow_datasets 4.9: cifar.py, imagenet2012, video/ucf101.py).
The builders are liere_jax.data.write_standin's (the benchmarks' stand-ins) with tiny examples: PNG
for CIFAR, JPEG for ImageNet and the video frames, encoded with PIL, so writing needs no
TensorFlow, and neither does reading them back.

  data_dir = str(tmp_path)
  datasets.prepare(datasets.Cifar100, data_dir, sizes=dict(train=16, test=8))
  # then --config.data.data_dir=DATA_DIR

At the end, tiny originals (cifar100_archive, imagenet_tars, ucf101_downloads): the downloads
liere_jax.data.prepare turns into these datasets, in their real archive formats.
"""
import io
import os
import subprocess
import tarfile
import tempfile
from typing import Dict, Optional, Tuple
import zipfile

import numpy as np
from PIL import Image
import tensorflow_datasets as tfds

from liere_jax.data import write_standin


def _noise(rng: np.random.Generator, shape: Tuple[int, ...]) -> np.ndarray:
  """A smooth random RGB image (JPEG-friendly): a coarse random grid, upsampled."""
  h, w = shape[:2]
  coarse = rng.integers(0, 256, (max(2, h // 4), max(2, w // 4), 3), dtype=np.uint8)
  return np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))


def _jpeg(image: np.ndarray) -> bytes:
  return write_standin.encode(image, 'JPEG', quality=95)


class Cifar100(write_standin.Cifar100, skip_registration=True):
  """cifar100 3.0.2 with smooth random images."""
  SIZES = {'train': 16, 'test': 8}

  def _example(self, split, index, rng):
    label = int(rng.integers(100))
    return {'id': f'{split}_{index:05d}', 'image': write_standin.encode(_noise(rng, (32, 32)), 'PNG'),
            'label': label, 'coarse_label': label // 5}


class Imagenet2012(write_standin.Imagenet2012, skip_registration=True):
  """imagenet2012 5.1.0 with JPEGs of 36-59 px sides, portrait and landscape."""
  SIZES = {'train': 16, 'validation': 8}

  def _example(self, split, index, rng):
    shape = (int(rng.integers(36, 60)), int(rng.integers(36, 60)))
    label = int(rng.integers(1000))
    return {'image': _jpeg(_noise(rng, shape)), 'label': label,
            'file_name': f'n{label:08d}_{index}.JPEG'}


class Ucf101(write_standin.Ucf101, skip_registration=True):
  """ucf101/ucf101_1_256 2.0.0 with 20 x 24 frames.

  Video v has 32 frames of value 8 * f (f = frame index), except video 2 with 10 (shorter
  than an 8-frame clip at stride 4); labels are 50 + v. Frames are flat unless texture > 0:
  then a smooth random pattern in [0, texture) is added (the same on every frame of a video).
  """
  BUILDER_CONFIGS = [write_standin.VideoConfig(name='ucf101_1_256', height=20, width=24)]
  SIZES = {'train': 6, 'test': 3}

  def __init__(self, *, texture: int = 0, **kwargs):
    self._texture = texture
    super().__init__(**kwargs)

  def _example(self, split, index, rng):
    del split
    shape = (self.builder_config.height, self.builder_config.width)
    length = 10 if index == 2 else 32
    pattern = np.zeros(shape + (3,), np.int32)
    if self._texture:
      pattern += _noise(rng, shape).astype(np.int32) * self._texture // 256
    frames = [_jpeg(np.clip(8 * f + pattern, 0, 255).astype(np.uint8)) for f in range(length)]
    return {'video': frames, 'label': 50 + index}


class Ucf101Native(Ucf101, skip_registration=True):
  """ucf101/ucf101_1 2.0.0 (frames at the videos' own size; the real ones are 320 x 240): as
  Ucf101 but for the config name and a landscape 24 x 32 frame."""
  name = 'ucf101'  # TFDS names a builder after its class otherwise.
  BUILDER_CONFIGS = [write_standin.VideoConfig(name='ucf101_1', height=24, width=32)]


def prepare(builder_cls, data_dir: str, sizes: Optional[Dict[str, int]] = None,
            **kwargs) -> str:
  """Writes the stand-in to data_dir (array_record, as `tfds build` would); returns data_dir.

  sizes: examples per split, e.g. dict(train=16, test=8) (default: the class's SIZES);
  kwargs: the builder's own options (Ucf101: texture).
  """
  return write_standin.write(builder_cls, data_dir, sizes, **kwargs)


# Originals: tiny copies of the downloads that liere_jax.data.prepare reads, in their real
# formats (archive layouts, file names, label files), with made-up pixels.


def _tar_add(tar: tarfile.TarFile, name: str, data: bytes):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def cifar100_archive(directory: str, sizes: Dict[str, int]) -> Dict[str, Tuple[np.ndarray,
                                                                                np.ndarray]]:
  """Writes DIRECTORY/cifar-100-binary.tar.gz as TFDS downloads it (cifar-100-binary/train.bin,
  test.bin: rows of coarse label, fine label, 3072 CHW bytes; the two label-name files).

  Returns {split: (images uint8 [n, 32, 32, 3], labels int [n, 2] as (coarse, fine))}.
  """
  rng = np.random.default_rng(0)
  out = {}
  with tarfile.open(os.path.join(directory, 'cifar-100-binary.tar.gz'), 'w:gz') as tar:
    for split, num in sizes.items():
      images = np.stack([_noise(rng, (32, 32)) for _ in range(num)])
      fine = rng.integers(100, size=num)
      labels = np.stack([fine // 5, fine], axis=1)
      rows = np.concatenate([labels.astype(np.uint8),
                             images.transpose(0, 3, 1, 2).reshape(num, 3072)], axis=1)
      _tar_add(tar, f'cifar-100-binary/{split}.bin', rows.tobytes())
      out[split] = (images, labels)
    for kind, num in (('coarse', 20), ('fine', 100)):
      names = ''.join(f'{kind}_{i}\n' for i in range(num))
      _tar_add(tar, f'cifar-100-binary/{kind}_label_names.txt', names.encode())
  return out


def imagenet_tars(directory: str, num_classes: int = 3, per_class: int = 2,
                  num_val: int = 4) -> Dict[str, Tuple[str, str, np.ndarray]]:
  """Writes ILSVRC2012_img_train.tar (a tar of per-class tars n01440764.tar, ... of JPEGs) and
  ILSVRC2012_img_val.tar (ILSVRC2012_val_00000001.JPEG, ...) for the first num_classes synsets
  of TFDS's labels.txt. As in ILSVRC, a few training files are odd: class 0's first is a CMYK
  JPEG, class 1's first a PNG named .JPEG.

  Returns {file name: (split, synset, RGB pixels written, file bytes)} (validation synsets:
  'val').
  """
  rng = np.random.default_rng(1)
  synsets = tfds.core.tfds_path('datasets/imagenet2012/labels.txt').read_text().split()
  out = {}

  def image(name, split, synset, fmt='JPEG', mode='RGB'):
    pixels = _noise(rng, (int(rng.integers(30, 50)), int(rng.integers(30, 50))))
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, format=fmt, quality=95)
    out[name] = (split, synset, pixels, buf.getvalue())
    return buf.getvalue()

  with tarfile.open(os.path.join(directory, 'ILSVRC2012_img_train.tar'), 'w') as train:
    for c, synset in enumerate(synsets[:num_classes]):
      buf = io.BytesIO()
      with tarfile.open(fileobj=buf, mode='w') as inner:
        for i in range(per_class):
          odd = dict(mode='CMYK') if (c, i) == (0, 0) else (
              dict(fmt='PNG') if (c, i) == (1, 0) else {})
          name = f'{synset}_{100 + i}.JPEG'
          _tar_add(inner, name, image(name, 'train', synset, **odd))
      _tar_add(train, f'{synset}.tar', buf.getvalue())
  with tarfile.open(os.path.join(directory, 'ILSVRC2012_img_val.tar'), 'w') as val:
    for i in range(1, num_val + 1):
      name = f'ILSVRC2012_val_{i:08d}.JPEG'
      _tar_add(val, name, image(name, 'validation', 'val'))
  return out


UCF101_CLASSES = ('ApplyEyeMakeup', 'HandstandPushups')  # Labels 0 and 36 in TFDS's list.


def write_avi(path: str, frames: np.ndarray):
  """frames uint8 [t, h, w, 3] (h, w even) -> an MPEG-4 part 2 .avi as in UCF101, near lossless."""
  import imageio_ffmpeg  # pylint: disable=g-import-not-at-top  # Only the video tests need it.
  t, h, w, _ = frames.shape
  subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), '-loglevel', 'error', '-f', 'rawvideo',
                  '-pix_fmt', 'rgb24', '-s', f'{w}x{h}', '-r', '25', '-i', 'pipe:',
                  '-c:v', 'mpeg4', '-q:v', '1', path], input=frames.tobytes(), check=True)


def ucf101_downloads(directory: str, extracted: bool = False, num_frames: int = 6,
                     shape: Tuple[int, int] = (24, 32)) -> Dict[str, Tuple[str, str, np.ndarray]]:
  """UCF101 as TFDS downloads it: UCF101_videos.zip (UCF101/v_*.avi, flat) and
  UCF101TrainTestSplits-RecognitionTask.zip (ucfTrainTestlist/trainlist01.txt, testlist01.txt,
  CRLF lines); with extracted=True, as the official UCF101.rar and the lists extract instead
  (UCF-101/CLASS/v_*.avi, ucfTrainTestlist/). Two classes, 2 train and 1 test video each. As
  in the real files, the lists spell HandStandPushups in file names, TFDS's mirror does not.

  Returns {TFDS key (file name): (split, class, frames [t, h, w, 3] written)}.
  """
  rng = np.random.default_rng(2)
  out, lists = {}, {'train': [], 'test': []}
  videos = {}
  for c, cls in enumerate(UCF101_CLASSES):
    listed = cls.replace('Handstand', 'HandStand')
    for split, group in (('train', 8), ('train', 9), ('test', 1)):
      name = f'v_{listed}_g{group:02d}_c01.avi'
      lists[split].append(f'{cls}/{name}' + (f' {c + 1}' if split == 'train' else ''))
      base = _noise(rng, shape).astype(np.int32)
      frames = np.stack([np.clip(base + 20 * f - 50, 0, 255).astype(np.uint8)
                         for f in range(num_frames)])
      key = name.replace('HandStand', 'Handstand')
      out[key] = (split, cls, frames)
      videos[f'UCF-101/{cls}/{name}' if extracted else f'UCF101/{key}'] = frames
  with tempfile.TemporaryDirectory() as tmp:
    for member, frames in videos.items():
      path = os.path.join(directory if extracted else tmp, member)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      write_avi(path, frames)
    if not extracted:
      with zipfile.ZipFile(os.path.join(directory, 'UCF101_videos.zip'), 'w') as z:
        for member in videos:
          z.write(os.path.join(tmp, member), member)
  texts = {f'ucfTrainTestlist/{split}list01.txt': ''.join(f'{l}\r\n' for l in lines)
           for split, lines in lists.items()}
  texts['ucfTrainTestlist/classInd.txt'] = ''.join(
      f'{i + 1} {cls}\r\n' for i, cls in enumerate(UCF101_CLASSES))
  if extracted:
    for member, text in texts.items():
      os.makedirs(os.path.join(directory, 'ucfTrainTestlist'), exist_ok=True)
      with open(os.path.join(directory, member), 'w', newline='') as f:
        f.write(text)
  else:
    with zipfile.ZipFile(os.path.join(directory, 'UCF101TrainTestSplits-RecognitionTask.zip'),
                         'w') as z:
      for member, text in texts.items():
        z.writestr(member, text)
  return out
