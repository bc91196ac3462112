"""Sources: random access to the raw examples of a split, checked before a pipeline is built.

TFDS array_record datasets through `tfds.data_source`; UCF101 records read without TFDS
features (its Video feature needs TensorFlow even to read), as dict(frames=[JPEG bytes], label);
arrows rendered on the fly or read prepared. A dataset that is not prepared raises how to
prepare it.
"""
import contextlib
import json
import logging
import re
from typing import Any, Dict, Optional, Sequence

from etils import epath
import grain
import tensorflow_datasets as tfds
from tensorflow_datasets.core import constants as tfds_constants
from tensorflow_datasets.proto import tf_example_pb2

from liere_jax import paths
from liere_jax.data import arrows
from liere_jax.data import write_arrows
from liere_jax.config.data import DataSpec
from liere_jax.config.datasets import DATASETS

Example = Dict[str, Any]
ARROWS_TRAIN_SIZE = 2**31 - 1  # "Unlimited": indices are numpy seeds, any int fits.


def _not_prepared(spec: DataSpec, name: str, split: str, grid: int,
                  error: Exception) -> Exception:
  """The error to raise when TFDS cannot open `name`: how to prepare it, or what went wrong."""
  root = spec.data_dir or tfds_constants.DATA_DIR
  how = spec.info.how_to_prepare.format(name=name.split(':')[0], root=root, grid=grid)
  try:
    builder = tfds.builder(name, data_dir=spec.data_dir)
    path, prepared = builder.data_dir, builder.is_prepared()
    file_format = builder.info.file_format
  except Exception:  # pylint: disable=broad-except  # Not even the code is known: not prepared.
    path, prepared, file_format = f'{root}/{name}', False, None
  if not prepared:
    return FileNotFoundError(f'{name} is not prepared in data_dir={root} (looked for {path}): '
                             f'{how}.')
  if file_format is not None and file_format.value != 'array_record':
    return FileNotFoundError(
        f'{name} at {path} is stored as {file_format.value}, and Grain needs array_record '
        f'(`tfds convert_format` needs TensorFlow): {how}.')
  return ValueError(f'TFDS could not open {name} split={split!r} at {path}: {error}')


def check_store(spec: DataSpec):
  """Raises, in one line, why a data_dir on a store (gs://) cannot be read, if it cannot."""
  paths.check_store(spec.data_dir, 'data.data_dir')


@contextlib.contextmanager
def _held_logs():
  """Holds what TFDS logs (absl) meanwhile and lets it out if the block succeeds: probing a
  data_dir that is not prepared warns of every folder it lacks, and the refusal, one line,
  says it all."""
  held, logger = [], logging.getLogger('absl')

  def hold(record):  # A filter that lets nothing through now.
    held.append(record)
    return False
  logger.addFilter(hold)
  try:
    yield
  finally:
    logger.removeFilter(hold)
  for record in held:
    logger.handle(record)


def _tfds_source(spec: DataSpec, name: str, split: str, grid: Optional[int] = None):
  check_store(spec)
  with _held_logs():
    try:
      return tfds.data_source(name, split=split, data_dir=spec.data_dir, download=False)
    except Exception as e:  # pylint: disable=broad-except  # TFDS raises many kinds here.
      raise _not_prepared(spec, name, split, grid or spec.grid, e) from e


class VideoSource:
  """Records of a TFDS video dataset as dict(frames=[JPEG bytes], label=int), without TF."""

  def __init__(self, paths: Sequence[str], name: str = ''):
    self._records = grain.sources.ArrayRecordDataSource(list(paths))
    self._name = name

  def __len__(self) -> int:
    return len(self._records)

  def __getitem__(self, index: int) -> Example:
    feature = tf_example_pb2.Example.FromString(self._records[index]).features.feature
    return dict(frames=list(feature['video'].bytes_list.value),
                label=feature['label'].int64_list.value[0])

  def __repr__(self) -> str:
    return f'VideoSource({self._name}, {len(self)} records)'


def video_source(spec: DataSpec, split: str) -> VideoSource:
  """Finds DIR/name/config/version/ from dataset_info.json, as TFDS would, and opens `split`."""
  check_store(spec)
  name, _, version = spec.tfds_name.partition(':')
  if '/' not in name:
    name = f'{name}/{DATASETS[spec.name].tfds_name.split("/")[1]}'
  root = spec.data_dir or tfds_constants.DATA_DIR
  config_dir = epath.Path(root) / name
  versions = [d for d in (config_dir.iterdir() if config_dir.exists() else [])
              if re.fullmatch(r'\d+\.\d+\.\d+', d.name) and (d / 'dataset_info.json').exists()
              and (not version or d.name == version)]
  if not versions:
    raise FileNotFoundError(
        f'{name}{":" + version if version else ""} is not prepared in data_dir={root} (looked '
        f'for {config_dir}/<version>/dataset_info.json): '
        + spec.info.how_to_prepare.format(name=name, root=root) + '.')
  path = max(versions, key=lambda d: tfds.core.Version(d.name))
  info = json.loads((path / 'dataset_info.json').read_text())
  if 'array_record' not in [info.get('fileFormat')] + info.get('alternativeFileFormats', []):
    raise FileNotFoundError(
        f'{name} at {path} is stored as {info.get("fileFormat", "tfrecord")}, and Grain needs '
        'array_record (`tfds convert_format` needs TensorFlow): '
        + spec.info.how_to_prepare.format(name=name, root=root) + '.')
  splits = {s['name']: s for s in info['splits']}
  if split not in splits:
    raise ValueError(f'split={split!r} is not in {name} at {path}; it has {sorted(splits)} '
                     '(use data.fraction rather than split slicing for ucf101).')
  template = splits[split].get('filepathTemplate', '{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}')
  num_shards = len(splits[split]['shardLengths'])
  paths = []
  for shard in range(num_shards):
    filename = (template.replace('{DATASET}', info['name']).replace('{SPLIT}', split)
                .replace('{FILEFORMAT}', 'array_record')
                .replace('{SHARD_X_OF_Y}', f'{shard:05d}-of-{num_shards:05d}'))
    if not (path / filename).exists():
      raise FileNotFoundError(f'{path / filename} is missing: copy the whole {path}.')
    paths.append(str(path / filename))
  return VideoSource(paths, f'{name}:{path.name} {split}')


def source(spec: DataSpec, split: str, *, train: bool,
           grid: Optional[int] = None) -> grain.MapDataset:
  """The raw examples of `split`; raises if they are not prepared."""
  if spec.name == 'arrows':
    grid = grid or spec.grid
    if spec.data_dir is None:
      size = (spec.num_train or ARROWS_TRAIN_SIZE) if train else spec.num_eval
      return grain.MapDataset.source(
          arrows.ArrowsSource(arrows.split_seed(spec.seed, split), size, grid))
    records = _tfds_source(spec, f'{write_arrows.NAME}/grid{grid}', split, grid)
    size = spec.num_train if train else spec.num_eval
    if size > len(records):
      raise ValueError(f'data.num_{"train" if train else "eval"}={size} but the prepared '
                       f'{write_arrows.NAME}/grid{grid} {split} split has {len(records)}.')
    return grain.MapDataset.source(records)[:size or len(records)]
  if spec.name == 'ucf101':
    return grain.MapDataset.source(video_source(spec, split))
  return grain.MapDataset.source(_tfds_source(spec, spec.tfds_name, split))


def train_source(spec: DataSpec) -> grain.MapDataset:
  """The raw training examples: the first data.fraction of the training split."""
  examples = source(spec, spec.train_split, train=True)
  return examples[:max(1, int(spec.fraction * len(examples)))]

