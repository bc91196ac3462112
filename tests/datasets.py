"""Tiny stand-ins of the TFDS datasets the configs read, written in the real on-disk layout.

Subprocesses (train.py, eval.py) cannot see `tfds.testing.mock_data`, so the tests write small
copies of cifar100, imagenet2012 and ucf101/ucf101_1_256 to a temporary data_dir exactly as
`tfds build NAME --file_format=array_record` lays them out: DATA_DIR/NAME[/CONFIG]/VERSION/
with dataset_info.json, features.json and array_record shards, with the real builders' names,
versions and feature specs (tensorflow_datasets 4.9: cifar.py, imagenet2012, video/ucf101.py).
Images are encoded here with PIL (PNG for CIFAR, JPEG for ImageNet and the video frames), so
writing needs no TensorFlow, and neither does reading them back.

  data_dir = str(tmp_path)
  datasets.prepare(datasets.Cifar100, data_dir, sizes=dict(train=16, test=8))
  # then --config.data.data_dir=DATA_DIR
"""
import io
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
from PIL import Image
import tensorflow_datasets as tfds


def png(image: np.ndarray) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(image).save(buf, format='PNG')
  return buf.getvalue()


def jpeg(image: np.ndarray, quality: int = 95) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(image).save(buf, format='JPEG', quality=quality)
  return buf.getvalue()


def _noise(rng: np.random.Generator, shape: Tuple[int, ...]) -> np.ndarray:
  """A smooth random RGB image (JPEG-friendly): a coarse random grid, upsampled."""
  h, w = shape[:2]
  coarse = rng.integers(0, 256, (max(2, h // 4), max(2, w // 4), 3), dtype=np.uint8)
  return np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))


class _StandIn(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes `sizes` = {split: number of examples}; subclasses give name, version, features."""

  SIZES: Dict[str, int] = {}

  def __init__(self, *, sizes: Optional[Dict[str, int]] = None, **kwargs):
    self._sizes = dict(sizes or self.SIZES)
    super().__init__(**kwargs)

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):  # Defined in tests/, not under a TFDS dataset folder.
    return None

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split, num) for split, num in self._sizes.items()}

  def _generate_examples(self, split: str, num: int) -> Iterator[Tuple[int, dict]]:
    rng = np.random.default_rng(sorted(self._sizes).index(split))
    for i in range(num):
      yield i, self._example(split, i, rng)

  def _example(self, split: str, index: int, rng: np.random.Generator) -> dict:
    raise NotImplementedError


class Cifar100(_StandIn, skip_registration=True):
  """cifar100 3.0.2: id Text, image Image(32, 32, 3) PNG, label ClassLabel(100), coarse_label
  ClassLabel(20)."""
  name = 'cifar100'
  VERSION = tfds.core.Version('3.0.2')
  SIZES = {'train': 16, 'test': 8}

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'id': tfds.features.Text(),
        'image': tfds.features.Image(shape=(32, 32, 3)),
        'label': tfds.features.ClassLabel(num_classes=100),
        'coarse_label': tfds.features.ClassLabel(num_classes=20),
    }))

  def _example(self, split, index, rng):
    label = int(rng.integers(100))
    return {'id': f'{split}_{index:05d}', 'image': png(_noise(rng, (32, 32))), 'label': label,
            'coarse_label': label // 5}


class Imagenet2012(_StandIn, skip_registration=True):
  """imagenet2012 5.1.0: image Image(None, None, 3) JPEG of varying sizes, label
  ClassLabel(1000), file_name Text."""
  name = 'imagenet2012'
  VERSION = tfds.core.Version('5.1.0')
  SIZES = {'train': 16, 'validation': 8}

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(encoding_format='jpeg'),
        'label': tfds.features.ClassLabel(num_classes=1000),
        'file_name': tfds.features.Text(),
    }))

  def _example(self, split, index, rng):
    shape = (int(rng.integers(36, 60)), int(rng.integers(36, 60)))  # Portrait and landscape.
    label = int(rng.integers(1000))
    return {'image': jpeg(_noise(rng, shape)), 'label': label,
            'file_name': f'n{label:08d}_{index}.JPEG'}


class Ucf101(_StandIn, skip_registration=True):
  """ucf101/ucf101_1_256 2.0.0: video = a Sequence of JPEG frames, label ClassLabel(101).

  The real feature is Video((None, 256, 256, 3), encoding_format='jpeg'), which is stored as
  exactly this Sequence(Image) but cannot even be constructed without TensorFlow; the records
  are the same bytes (only features.json names the class differently).

  Video v has 32 frames of value 8 * f (f = frame index), except video 2 with 10 (shorter
  than an 8-frame clip at stride 4); labels are 50 + v. Frames are flat unless texture > 0:
  then a smooth random pattern in [0, texture) is added (the same on every frame of a video).
  """
  name = 'ucf101'
  VERSION = tfds.core.Version('2.0.0')
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name='ucf101_1_256')]
  SIZES = {'train': 6, 'test': 3}
  FRAME_SHAPE = (20, 24)

  def __init__(self, *, texture: int = 0, **kwargs):
    self._texture = texture
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'video': tfds.features.Sequence(tfds.features.Image(shape=self.FRAME_SHAPE + (3,),
                                                            encoding_format='jpeg')),
        'label': tfds.features.ClassLabel(num_classes=101),
    }))

  def _example(self, split, index, rng):
    del split
    length = 10 if index == 2 else 32
    pattern = np.zeros(self.FRAME_SHAPE + (3,), np.int32)
    if self._texture:
      pattern += _noise(rng, self.FRAME_SHAPE).astype(np.int32) * self._texture // 256
    frames = [jpeg(np.clip(8 * f + pattern, 0, 255).astype(np.uint8)) for f in range(length)]
    return {'video': frames, 'label': 50 + index}


def prepare(builder_cls, data_dir: str, sizes: Optional[Dict[str, int]] = None,
            **kwargs) -> str:
  """Writes the stand-in to data_dir (array_record, as `tfds build` would); returns data_dir.

  sizes: examples per split, e.g. dict(train=16, test=8) (default: the class's SIZES);
  kwargs: the builder's own options (Ucf101: texture).
  """
  builder = builder_cls(data_dir=data_dir, file_format='array_record', sizes=sizes, **kwargs)
  shown = getattr(tfds.core.utils.tqdm_utils, '_active', True)
  tfds.display_progress_bar(False)
  try:
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  finally:
    tfds.display_progress_bar(shown)
  return data_dir
