"""TFDS builder for the synthetic arrows task, written as array_record (no TensorFlow needed).

Configs grid9, grid14, grid23 (108, 168, 276 px). Split `train` holds examples 0..num_train-1
of the stream `arrows.split_seed(0, 'train')`, `test` examples 0..num_test-1 of the test
stream, in order (shuffling disabled): record i is `arrows.make_example(stream, i, grid)`, the
same examples as the on-the-fly pipeline with data.seed = 0. Images are stored zlib compressed
(mostly black: ~0.6 kB each at grid 9; writing runs at ~3k examples/s).

  from liere_jax.data import write_arrows
  write_arrows.prepare_arrows('/data/tfds', grid=9)            # 800k train, 2k test.
  src = tfds.data_source('liere_arrows/grid9', split='test', data_dir='/data/tfds')

Other sizes: `write_arrows.Arrows(config='grid9', num_train=1000, data_dir=...)`; the stored
dataset_info records them. The config name decides the directory: one size per data_dir.
"""
import dataclasses

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from liere_jax.data import arrows

NAME = 'liere_arrows'


@dataclasses.dataclass(eq=False)
class ArrowsConfig(tfds.core.BuilderConfig):
  grid: int = 9


class Arrows(tfds.core.GeneratorBasedBuilder):
  """Paper Sec. 5.2: the label is the direction of the arrow next to the Y's base."""

  name = NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First release.'}
  BUILDER_CONFIGS = [ArrowsConfig(name=f'grid{g}', grid=g, description=f'{12 * g} px')
                     for g in (9, 14, 23)]

  def __init__(self, *, num_train: int = 800_000, num_test: int = 2_000,
               file_format: str = 'array_record', **kwargs):
    # 800k: paper Sec. 5.2. array_record: random access for grain, and no TensorFlow needed.
    super().__init__(file_format=file_format, **kwargs)
    self.num_train, self.num_test = num_train, num_test

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS's default probes `importlib_resources`, which it does not install without TF.
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    size = arrows.CELL * self.builder_config.grid
    return tfds.core.DatasetInfo(
        builder=self,
        description='LieRE synthetic task: direction of the arrow at the base of the Y.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Tensor(shape=(size, size, 3), dtype=np.uint8,
                                          encoding=tfds.features.Encoding.ZLIB),
            'label': tfds.features.ClassLabel(names=arrows.DIRECTIONS),
        }),
        supervised_keys=('image', 'label'),
        disable_shuffling=True,  # Record i is example i of the stream.
        homepage='https://github.com/StanfordMIMI/LieRE',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {'train': self._generate_examples('train', self.num_train),
            'test': self._generate_examples('test', self.num_test)}

  def _generate_examples(self, split, num):
    seed = arrows.split_seed(0, split)
    for index in range(num):
      yield index, arrows.make_example(seed, index, self.builder_config.grid)


def prepare_arrows(data_dir: str, grid: int = 9, num_train: int = 800_000,
                   num_test: int = 2_000) -> str:
  """Writes liere_arrows/grid{grid} under data_dir; returns the dataset directory."""
  builder = Arrows(config=f'grid{grid}', data_dir=data_dir, num_train=num_train,
                   num_test=num_test)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return str(builder.data_dir)
