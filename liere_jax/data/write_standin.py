"""Stand-ins of cifar100, imagenet2012 and ucf101 at their real sizes, for input benchmarks.

Written exactly as `tfds build NAME --file_format=array_record` lays them out (the builders'
names, versions and feature specs of tensorflow_datasets 4.9), so the real pipeline reads them
unchanged, with no TensorFlow to write or read. What decoding costs depends on the pixel
count and the entropy of the compressed bytes, so the pictures are natural-image-like: smooth
noise of a power-law spectrum, flat shapes with sharp edges, and sensor grain, tuned to the
JPEG / PNG sizes of the real datasets.

                  stored as                                       bytes per example
  cifar100        PNG 32 x 32                                       ~2.2 kB (real: ~2.2 kB)
  imagenet2012    JPEG q90, 500 x 375 / 500 x 333 / 375 x 500        ~100 kB (real: ~110 kB)
  ucf101          ~150 JPEG q90 frames (a camera pan) of 256 x 256    ~4 MB
                  (ucf101_1_256) or 320 x 240 (ucf101_1)

Few examples are needed (an epoch repeats them; reading from the OS page cache is what a local
disk gives after the first), but enough that Grain's per-epoch shuffle is a small part of an
example's time.

  data_dir = write_standin.prepare('imagenet2012', '/tmp/standin', num_train=64)
  train_dataset(resolve_data(data_config(name='imagenet2012', data_dir=data_dir, ...)), ...)

The builders (StandIn, Cifar100, Imagenet2012, Ucf101) and `write` are also what the tests'
tiny datasets (tests/datasets.py) are made with: they subclass them with other examples.
"""
import dataclasses
import io
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
from PIL import Image, ImageDraw
import tensorflow_datasets as tfds

from liere_jax.config import datasets


def natural_image(rng: np.random.Generator, height: int, width: int,
                  grain: float = 16) -> np.ndarray:
  """A natural-image-like uint8 [height, width, 3]: power-law noise, shapes, grain (its std)."""
  fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
  f = np.hypot(fy, fx)
  # Amplitude 1 / f^0.6: flatter than photographs' ~1 / f, for ImageNet's ~110 kB JPEGs.
  amp = np.where(f > 0, np.maximum(f, 1e-6) ** -0.6, 0)
  spectrum = amp[..., None] * (rng.standard_normal(f.shape + (3,))
                               + 1j * rng.standard_normal(f.shape + (3,)))
  x = np.fft.irfft2(spectrum, s=(height, width), axes=(0, 1))
  x = x @ np.array([[1, .8, .6], [.8, 1, .8], [.6, .8, 1]])  # Correlated channels.
  x = (x - x.mean()) / x.std() * 45 + rng.uniform(80, 150, 3)
  image = Image.fromarray(np.clip(x, 0, 255).astype(np.uint8))
  draw = ImageDraw.Draw(image)
  for _ in range(12):
    cx, cy = rng.uniform(0, width), rng.uniform(0, height)
    r = rng.uniform(4, min(height, width) / 2)
    box = [cx - r, cy - r * rng.uniform(.3, 1), cx + r, cy + r * rng.uniform(.3, 1)]
    fill = tuple(int(c) for c in rng.integers(0, 256, 3))
    (draw.ellipse if rng.random() < .5 else draw.rectangle)(box, fill=fill)
  noise = rng.normal(0, grain, (height, width, 1)) + rng.normal(0, grain / 3, (height, width, 3))
  return np.clip(np.asarray(image) + noise, 0, 255).astype(np.uint8)


def encode(image: np.ndarray, fmt: str, quality: int = 90) -> bytes:
  """uint8 [h, w, 3] -> the bytes of a PNG or JPEG file (quality: JPEG only)."""
  buf = io.BytesIO()
  Image.fromarray(image).save(buf, format=fmt, **({'quality': quality} if fmt == 'JPEG' else {}))
  return buf.getvalue()


class StandIn(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes `sizes` = {split: number of examples} (default SIZES) of `_example`.

  Subclasses give name, VERSION, _info and _example; split k of the sorted split names draws
  from np.random.default_rng(k).
  """

  SIZES: Dict[str, int] = {}

  def __init__(self, *, sizes: Optional[Dict[str, int]] = None, **kwargs):
    self._sizes = dict(sizes or self.SIZES)
    super().__init__(**kwargs)

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):  # Not under a TFDS dataset folder.
    return None

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split, num) for split, num in self._sizes.items()}

  def _generate_examples(self, split: str, num: int) -> Iterator[Tuple[int, dict]]:
    rng = np.random.default_rng(sorted(self._sizes).index(split))
    for i in range(num):
      yield i, self._example(split, i, rng)

  def _example(self, split: str, index: int, rng: np.random.Generator) -> dict:
    """One example's features; every stand-in builder defines it."""
    raise NotImplementedError(f'{type(self).__name__} must define _example.')


class Cifar100(StandIn, skip_registration=True):
  """cifar100 3.0.2 (its builder needs TensorFlow to run): id Text, image Image(32, 32, 3) PNG,
  label ClassLabel(100), coarse_label ClassLabel(20)."""
  name = 'cifar100'
  VERSION = tfds.core.Version('3.0.2')

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'id': tfds.features.Text(),
        'image': tfds.features.Image(shape=(32, 32, 3)),
        'label': tfds.features.ClassLabel(num_classes=100),
        'coarse_label': tfds.features.ClassLabel(num_classes=20),
    }))

  def _example(self, split, index, rng):
    label = int(rng.integers(100))
    return {'id': f'{split}_{index:05d}', 'image': encode(natural_image(rng, 32, 32, 4), 'PNG'),
            'label': label, 'coarse_label': label // 5}


class Imagenet2012(StandIn, skip_registration=True):
  """imagenet2012 5.1.0: image Image(None, None, 3) JPEG, label ClassLabel(1000), file_name."""
  name = 'imagenet2012'
  VERSION = tfds.core.Version('5.1.0')
  SHAPES = ((375, 500), (333, 500), (500, 375))  # The commonest ImageNet sizes.

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(encoding_format='jpeg'),
        'label': tfds.features.ClassLabel(num_classes=1000),
        'file_name': tfds.features.Text(),
    }))

  def _example(self, split, index, rng):
    label = int(rng.integers(1000))
    shape = self.SHAPES[index % len(self.SHAPES)]
    return {'image': encode(natural_image(rng, *shape), 'JPEG'), 'label': label,
            'file_name': f'n{label:08d}_{index}.JPEG'}


@dataclasses.dataclass(eq=False)
class VideoConfig(tfds.core.BuilderConfig):
  """A ucf101 config: its frame size."""
  height: int = 256
  width: int = 256


class Ucf101(StandIn, skip_registration=True):
  """ucf101/ucf101_1_256 (frames squashed to 256 x 256) and ucf101/ucf101_1 (native 320 x 240).

  The real Video((None, H, W, 3), 'jpeg') feature is stored as this Sequence(Image) (Video
  needs TensorFlow even to be constructed); the records are the same bytes. 100-200 frames:
  UCF101 averages 7 s at 25 fps.
  """
  name = 'ucf101'
  VERSION = tfds.core.Version('2.0.0')
  BUILDER_CONFIGS = [VideoConfig(name='ucf101_1_256'),
                     VideoConfig(name='ucf101_1', height=240, width=320)]

  def _info(self):
    shape = (self.builder_config.height, self.builder_config.width, 3)
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'video': tfds.features.Sequence(tfds.features.Image(shape=shape,
                                                            encoding_format='jpeg')),
        'label': tfds.features.ClassLabel(num_classes=101),
    }))

  def _example(self, split, index, rng):
    h, w = self.builder_config.height, self.builder_config.width
    num_frames = int(rng.integers(100, 200))
    # A camera pan over one scene; video is smoother than photographs (less grain).
    scene = natural_image(rng, h + 64, w + num_frames, grain=4)
    frames = [encode(scene[32 + round(16 * np.sin(f / 20)):][:h, f:f + w], 'JPEG')
              for f in range(num_frames)]
    return {'video': frames, 'label': int(rng.integers(101))}


BUILDERS: Dict[str, type] = {'cifar100': Cifar100, 'imagenet2012': Imagenet2012,
                             'ucf101': Ucf101}


def prepare(name: str, data_dir: str, num_train: int, num_eval: int = 2) -> str:
  """Writes the stand-in of TFDS dataset `name` to data_dir; returns data_dir.

  name: a key of BUILDERS, or with its config: 'ucf101/ucf101_1' (default 'ucf101_1_256').
  """
  base, _, config = name.split(':')[0].partition('/')  # A version (':3.0.2') is ignored.
  if base not in BUILDERS:
    raise ValueError(f'No stand-in of {name!r}; there are {sorted(BUILDERS)}.')
  train, test = datasets.DATASETS[base].splits
  return write(BUILDERS[base], data_dir, {train: num_train, test: num_eval},
               **({'config': config} if config else {}))


def write(builder_cls: type, data_dir: str, sizes: Optional[Dict[str, int]] = None,
          **kwargs) -> str:
  """Writes builder_cls(sizes, **kwargs) to data_dir as `tfds build --file_format=array_record`
  would, offline and without TFDS's progress bars; returns data_dir."""
  builder = builder_cls(data_dir=data_dir, file_format='array_record', sizes=sizes, **kwargs)
  shown = getattr(tfds.core.utils.tqdm_utils, '_active', True)
  tfds.display_progress_bar(False)
  try:
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  finally:
    tfds.display_progress_bar(shown)
  return data_dir
