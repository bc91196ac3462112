"""The datasets a config may name (data.name; the data section: liere_jax/config/data.py), as
the pipeline (liere_jax/data/) reads them.

Datasets (data.name; TFDS name, input shape, classes, default splits):
  cifar100      'cifar100'                  [32, 32, 3]             100   train / test
  imagenet2012  'imagenet2012'              [S, S, 3]               1000  train / validation
  ucf101        'ucf101/ucf101_1_256'       [num_frames, S, S, 3]   101   train / test
                (frames squashed to 256 x 256), or 'ucf101/ucf101_1' (native 320 x 240 frames,
                as the official code reads them)
  arrows        'liere_arrows/grid{G}', or  [12 G, 12 G, 3]         4     train / test
                rendered on the fly
A TFDS name with a config or version ('ucf101/ucf101_2', 'cifar100:3.0.2') may be given.
O = the official code, github.com/StanfordMIMI/LieRE.
"""
import dataclasses
from typing import Tuple

# The arrows task's numbers (liere_jax/data/arrows.py renders it): a grid cell's side in pixels
# and its classes (the target arrow's four directions).
ARROWS_CELL = 12
ARROWS_CLASSES = 4

_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class Dataset:
  """What the pipeline knows of a dataset."""
  tfds_name: str
  num_classes: int
  splits: Tuple[str, str]  # Default (train, eval).
  mean: Tuple[float, ...]
  std: Tuple[float, ...]
  how_to_prepare: str  # Formatted with name, root (the data_dir) and grid.


_PREPARE = ('put {download} in a folder DL, then run `python -m liere_jax.data.prepare {name} '
            '--download_dir=DL --data_dir={root}`')
DATASETS = {
    'cifar100': Dataset(
        'cifar100', 100, ('train', 'test'), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
        _PREPARE.replace('{download}', 'cifar-100-binary.tar.gz (from '
                         'https://www.cs.toronto.edu/~kriz/)')),
    'imagenet2012': Dataset(
        'imagenet2012', 1000, ('train', 'validation'), _IMAGENET_MEAN, _IMAGENET_STD,
        _PREPARE.replace('{download}', 'ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar')),
    # Video models commonly reuse the ImageNet constants.
    'ucf101': Dataset(
        'ucf101/ucf101_1_256', 101, ('train', 'test'), _IMAGENET_MEAN, _IMAGENET_STD,
        _PREPARE.replace('{download}', 'UCF101_videos.zip and '
                         'UCF101TrainTestSplits-RecognitionTask.zip')),
    'arrows': Dataset(
        'liere_arrows', ARROWS_CLASSES, ('train', 'test'), (0.5,) * 3, (0.5,) * 3,
        'run `python -c "from liere_jax.data import write_arrows; '
        'write_arrows.prepare_arrows(\'{root}\', grid={grid})"` (nothing to download), or set '
        'data.data_dir=None to render the examples on the fly'),
}


