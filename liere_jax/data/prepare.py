r"""Prepares cifar100, imagenet2012 and ucf101 from their original downloads, without TensorFlow.

  python -m liere_jax.data.prepare cifar100 --download_dir=DL --data_dir=DATA
  python -m liere_jax.data.prepare imagenet2012 --download_dir=DL --data_dir=DATA
  python -m liere_jax.data.prepare ucf101 --download_dir=DL --data_dir=DATA  # ucf101_1_256
  python -m liere_jax.data.prepare ucf101/ucf101_1 --download_dir=DL --data_dir=DATA  # 320x240

writes what `tfds build NAME --file_format=array_record` would: DATA/NAME[/CONFIG]/VERSION/ with
dataset_info.json, features.json and array_record shards. `tfds build` itself needs TensorFlow
here (TFDS 4.9 reads its inputs with tf.io.gfile, encodes images with tf.image, and its Video
feature cannot even be constructed without TF), so the builders (write_originals.py) subclass TFDS's
own: same name, version, configs, features, description and example keys (and so the same
record order), and they replace only what needs TensorFlow. Nothing is extracted to disk;
memory stays bounded (TFDS's writer spills to disk beyond 1 GB). Output goes to a temporary
directory renamed at the end; a prepared dataset is kept unless --overwrite.

Inputs in DL, as TFDS downloads them:
  cifar100       cifar-100-binary.tar.gz (https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz)
  imagenet2012   ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from image-net.org (after
                 registering), in DL or DL/manual; read as streams.
  ucf101[/CONFIG]  videos: UCF101_videos.zip (TFDS's mirror, write_originals.UCF_101_URL), or the
                 .avi files anywhere under DL (e.g. extracted from the official UCF101.rar);
                 split lists: UCF101TrainTestSplits-RecognitionTask.zip (write_originals.SPLITS_URL)
                 or its ucfTrainTestlist/.
                 Configs: ucf101_1_256 (default: frames squashed to 256x256), ucf101_1, ucf101_2,
                 ucf101_3 (native 320x240; split lists 1, 2, 3).

How the result differs from `tfds build`: see write_originals.py.
"""
import contextlib
import os
import pathlib
import resource
import shutil
import tempfile
import types
from typing import Optional

from absl import app, flags
from etils import epath
import tensorflow_datasets as tfds
from tensorflow_datasets.core import shuffle as tfds_shuffle

from liere_jax import command, paths
from liere_jax.data import write_originals

DATASETS = write_originals.DATASETS


@contextlib.contextmanager
def _local_shuffle_buckets():
  """TFDS's writer spills a split over 1 GB to 1000 bucket files with tf.io.gfile
  (tensorflow_datasets/core/shuffle.py); these are local files: give it Python's."""

  class Unraised(Exception):
    pass

  gfile = types.SimpleNamespace(GFile=open, exists=os.path.exists, remove=os.remove)
  shim = types.SimpleNamespace(io=types.SimpleNamespace(gfile=gfile),
                               errors=types.SimpleNamespace(ResourceExhaustedError=Unraised))
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # All the buckets are open at once.
  if soft != resource.RLIM_INFINITY:
    wanted = soft + tfds_shuffle.BUCKETS_NUMBER
    if hard != resource.RLIM_INFINITY:
      wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
  saved, tfds_shuffle.tf = tfds_shuffle.tf, shim
  try:
    yield
  finally:
    tfds_shuffle.tf = saved


def prepare(dataset: str, download_dir: str, data_dir: Optional[str] = None,
            overwrite: bool = False) -> str:
  """Writes `dataset` (one of DATASETS) from the originals in download_dir; returns its dir.

  data_dir: the TFDS data directory (None: $TFDS_DATA_DIR or ~/tensorflow_datasets), or a
    bucket (gs://...): the dataset is written to a local temporary directory and uploaded,
    dataset_info.json last (TFDS reads a dataset as prepared once that file is there).
  overwrite: replace a prepared copy (kept until the new one is complete).
  """
  if dataset not in DATASETS:
    raise ValueError(f'dataset={dataset!r} is unknown; use one of {DATASETS}.')
  if data_dir and paths.is_url(data_dir):
    return _prepare_to_store(dataset, download_dir, data_dir, overwrite)
  name, _, config = dataset.partition('/')
  data_dir = os.path.expanduser(data_dir) if data_dir else None

  def builder():  # Checks the inputs.
    return write_originals.BUILDERS[name](download_dir=download_dir, data_dir=data_dir,
                                    config=config or None)

  b = builder()
  path = pathlib.Path(b.data_path)
  replaced = path.with_name(path.name + '.replaced')
  if path.exists():
    if not overwrite:
      raise FileExistsError(f'{path} is already prepared; pass --overwrite to replace it.')
    path.rename(replaced)  # Back in place if the new one fails.
    b = builder()  # Without the replaced copy's metadata.
  try:
    with _local_shuffle_buckets():
      b.download_and_prepare(
          download_dir=os.path.expanduser(download_dir),
          download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  except BaseException:
    if replaced.exists():
      replaced.rename(path)
    raise
  if replaced.exists():
    epath.Path(replaced).rmtree()
  splits = ', '.join(f'{s.name} {s.num_examples} examples in {s.num_shards} shards'
                     for s in b.info.splits.values())
  print(f'Wrote {dataset} {b.version} to {path}: {splits}, {b.info.dataset_size}.')
  return str(path)


def _prepare_to_store(dataset: str, download_dir: str, data_dir: str, overwrite: bool) -> str:
  """prepare() into a bucket: built locally (TFDS's writers need local files), then uploaded."""
  paths.check_store(data_dir, '--data_dir')
  name, _, config = dataset.partition('/')
  info = 'dataset_info.json'
  with tempfile.TemporaryDirectory(prefix='liere_prepare_') as local:
    # Where it goes (DATA/NAME/CONFIG/VERSION), checked before anything is built.
    rel = pathlib.Path(write_originals.BUILDERS[name](
        download_dir=download_dir, data_dir=local, config=config or None).data_path
    ).relative_to(local)
    target = paths.path(data_dir) / str(rel)
    if (target / info).exists() and not overwrite:
      raise FileExistsError(f'{target} is already prepared; pass --overwrite to replace it.')
    built = pathlib.Path(prepare(dataset, download_dir, local))
    if target.exists():
      (target / info).unlink(missing_ok=True)  # Unprepared from here until the upload ends.
      target.rmtree()
    files = sorted(p for p in built.rglob('*') if p.is_file())
    for f in sorted(files, key=lambda p: p.name == info):
      dst = target / str(f.relative_to(built))
      dst.parent.mkdir(parents=True, exist_ok=True)
      with open(f, 'rb') as src, dst.open('wb') as out:  # Streamed: shards may be large.
        shutil.copyfileobj(src, out)
  print(f'Uploaded {dataset} to {target}.')
  return str(target)


def main(argv):
  if len(argv) != 2 or argv[1] not in DATASETS:
    raise app.UsageError(f'Give one dataset, one of {DATASETS}; got {argv[1:]}.')
  args = flags.FLAGS
  if not args.download_dir:
    raise app.UsageError('--download_dir is required: the directory with the original '
                         'downloads.')
  with command.refusing():  # Missing downloads, a prepared copy: found before anything is written.
    prepare(argv[1], args.download_dir, args.data_dir, overwrite=args.overwrite)


if __name__ == '__main__':  # Flags only here: tests and tools import the module.
  flags.DEFINE_string('download_dir', None,
                      'Where the original downloads are (see the module docstring).')
  flags.DEFINE_string('data_dir', None, 'TFDS data directory to write to (default: '
                      '$TFDS_DATA_DIR or ~/tensorflow_datasets); train with '
                      '--config.data.data_dir=DATA_DIR.')
  flags.DEFINE_bool('overwrite', False, 'Replace an already prepared copy.')
  command.run(main, 'data.prepare')
