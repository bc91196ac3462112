"""TFDS builders of cifar100, imagenet2012 and ucf101 that read the original downloads.

They subclass TFDS's own (same name, version, configs, features, description and example
keys, and so the same record order) and replace only what needs TensorFlow; the inputs are
found and checked before anything is written. prepare.py runs them and lists the inputs.

Where the result differs from `tfds build` (the stored pixels do not):
  cifar100       PNG encoded by PIL rather than TF: the same pixels in other bytes.
  imagenet2012   As TFDS, files are stored as downloaded except non-JPEG and CMYK ones (ILSVRC's
                 one PNG and 22 CMYK JPEGs), re-encoded as RGB JPEG at quality 100; found here by
                 content, by PIL (TFDS: by name, by TF). Validation labels are looked up by the
                 file's number (TFDS zips the sorted names with the label list: the same on the
                 real tar). No test split.
  ucf101         Frames come from TFDS's own command, `ffmpeg -i VIDEO [-vf scale=256x256]
                 %010d.jpeg` (ffmpeg's default JPEG quality, about q=25, as in TFDS), run with
                 the ffmpeg of pip's imageio-ffmpeg (or $IMAGEIO_FFMPEG_EXE), several videos at a
                 time. A listed video that is missing is an error (TFDS logs and skips it).
  dataset_info.json names this module, and has no download size.
"""
import collections
import concurrent.futures
import io
import os
import pathlib
import re
import subprocess
import tarfile
import tempfile
import zipfile
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from etils import epath
import imageio_ffmpeg
import numpy as np
from PIL import Image
import tensorflow_datasets as tfds
from tensorflow_datasets.core.features import feature as feature_lib
from tensorflow_datasets.core.proto import feature_pb2
from tensorflow_datasets.datasets.imagenet2012 import imagenet2012_dataset_builder as tfds_imagenet
from tensorflow_datasets.image_classification import cifar as tfds_cifar
from tensorflow_datasets.video import ucf101 as tfds_ucf101

UCF_101_URL = tfds_ucf101.UCF_101_URL
SPLITS_URL = tfds_ucf101.SPLITS_URL
_TAR_STREAM = tfds.download.ExtractMethod.TAR_STREAM


class _Builder:
  """Mixin: the inputs are found and checked in __init__, before anything is written."""

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS's default probes `importlib_resources`, which it does not install without TF.
    return epath.Path(__file__)

  def __init__(self, *, download_dir: str, **kwargs):
    super().__init__(file_format='array_record', **kwargs)
    self._inputs = self._find_inputs(pathlib.Path(os.path.expanduser(download_dir)))

  def _find_inputs(self, download_dir: pathlib.Path):
    """The checked input files; every builder below defines it."""
    raise NotImplementedError(f'{type(self).__name__} must define _find_inputs.')


def _missing(path: pathlib.Path, what: str) -> FileNotFoundError:
  return FileNotFoundError(f'{path} is missing: {what}.')


class Cifar100(_Builder, tfds_cifar.Cifar100, skip_registration=True):
  """TFDS's cifar100 3.0.2, from cifar-100-binary.tar.gz (rows: coarse, fine, 3072 CHW bytes)."""
  name = 'cifar100'

  def _find_inputs(self, download_dir):
    info = self._cifar_info
    path = download_dir / os.path.basename(info.url)
    if not path.is_file():
      raise _missing(path, f'download it from {info.url}')
    try:
      with tarfile.open(path, 'r:gz') as tar:
        names = set(tar.getnames())
    except (tarfile.TarError, OSError) as e:
      raise FileNotFoundError(f'{path} is not a .tar.gz ({e}): download it again from '
                              f'{info.url}.') from e
    wanted = info.train_files + info.test_files + info.label_files
    absent = [f for f in wanted if info.prefix + f not in names]
    if absent:
      raise FileNotFoundError(f'{path} has no {info.prefix}{absent[0]}: it is not {info.url}.')
    return path

  def _split_generators(self, dl_manager):
    del dl_manager  # The archive is read in place.
    info = self._cifar_info
    with tarfile.open(self._inputs, 'r:gz') as tar:
      for key, filename in zip(info.label_keys, info.label_files):
        text = tar.extractfile(info.prefix + filename).read().decode()
        self.info.features[key].names = [n for n in text.split('\n') if n]
    return {'train': self._generate_examples('train_', info.train_files),
            'test': self._generate_examples('test_', info.test_files)}

  def _generate_examples(self, split_prefix, filepaths):
    """TFDS's keys and ids: the index in the split, 'train_00000'..."""
    info = self._cifar_info
    num_labels = len(info.label_keys)
    index = 0
    with tarfile.open(self._inputs, 'r:gz') as tar:
      for filename in filepaths:
        data = tar.extractfile(info.prefix + filename).read()  # 150 MB for train.
        rows = np.frombuffer(data, np.uint8).reshape(-1, num_labels + 3072)
        for row in rows:
          image = row[num_labels:].reshape(3, 32, 32).transpose(1, 2, 0)
          yield index, dict(zip(info.label_keys, row[:num_labels]),
                            id=f'{split_prefix}{index:05d}', image=_png(image))
          index += 1


def _png(image: np.ndarray) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(image).save(buf, format='PNG')
  return buf.getvalue()


class Imagenet2012(_Builder, tfds_imagenet.Builder, skip_registration=True):
  """TFDS's imagenet2012 5.1.0 (train, validation) from the two ILSVRC2012 tars."""
  name = 'imagenet2012'
  pkg_dir_path = tfds.core.tfds_path('datasets/imagenet2012')  # TFDS's README, citation.
  TARS = {'train': 'ILSVRC2012_img_train.tar', 'validation': 'ILSVRC2012_img_val.tar'}

  def _find_inputs(self, download_dir):
    found = {}
    for split, filename in self.TARS.items():
      paths = [download_dir / filename, download_dir / 'manual' / filename]
      found[split] = next((p for p in paths if p.is_file()), None)
      if found[split] is None:
        raise _missing(paths[0], f'put {" and ".join(self.TARS.values())} from '
                       f'https://image-net.org in {download_dir} (or its manual/, as TFDS)')
      if not tarfile.is_tarfile(found[split]):
        raise FileNotFoundError(f'{found[split]} is not a tar file: download it again.')
    return found

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split) for split in self.TARS}

  def _generate_examples(self, split):  # pylint: disable=arguments-renamed
    """Keys are the file names, as TFDS's; a class tar is streamed, not read into memory."""
    labels = _validation_labels() if split == 'validation' else None
    with open(self._inputs[split], 'rb') as f:
      for name, fobj in tfds.download.iter_archive(f, _TAR_STREAM):
        if labels is not None:
          yield name, dict(file_name=name, image=_rgb_jpeg(fobj.read()), label=labels(name))
          continue
        if not name.endswith('.tar'):
          raise ValueError(f'{self._inputs[split]} holds {name}, not a per-class tar '
                           '(n01440764.tar, ...): it is not ILSVRC2012_img_train.tar.')
        for image_name, image in tfds.download.iter_archive(fobj, _TAR_STREAM):
          yield image_name, dict(file_name=image_name, image=_rgb_jpeg(image.read()),
                                 label=name[:-len('.tar')])


def _validation_labels() -> Callable[[str], str]:
  """'ILSVRC2012_val_00000001.JPEG' -> its synset, from TFDS's validation_labels.txt."""
  path = tfds.core.tfds_path('datasets/imagenet2012/validation_labels.txt')
  synsets = path.read_text().strip().splitlines()

  def label(name: str) -> str:
    match = re.fullmatch(r'ILSVRC2012_val_(\d{8})\.JPEG', name)
    if not match or not 1 <= int(match.group(1)) <= len(synsets):
      raise ValueError(f'{name} in the validation tar is not ILSVRC2012_val_NNNNNNNN.JPEG with '
                       f'NNNNNNNN in 1..{len(synsets)}: it is not ILSVRC2012_img_val.tar.')
    return synsets[int(match.group(1)) - 1]
  return label


def _rgb_jpeg(data: bytes) -> bytes:
  """The bytes as downloaded if they are an RGB or grayscale JPEG, else an RGB JPEG (quality 100,
  as TFDS's jpeg_cmyk_to_rgb and png_to_jpeg)."""
  with Image.open(io.BytesIO(data)) as image:  # Reads the header only.
    if image.format == 'JPEG' and image.mode in ('RGB', 'L'):
      return data
    buf = io.BytesIO()
    image.convert('RGB').save(buf, format='JPEG', quality=100)
  return buf.getvalue()


class _Video(tfds.features.Sequence):
  """tfds.features.Video as TFDS stores it: a Sequence of encoded frames, and the same
  features.json entry. (Video's constructor needs TF.)"""

  def __init__(self, shape: Tuple[Optional[int], ...], ffmpeg_extra_args: List[str]):
    super().__init__(tfds.features.Image(shape=shape[1:], encoding_format='jpeg'),
                     length=shape[0])
    self.ffmpeg_extra_args = ffmpeg_extra_args

  @property
  def _fully_qualified_class_name(self):
    return 'tensorflow_datasets.core.features.video_feature.Video'

  def to_json_content(self) -> feature_pb2.VideoFeature:
    return feature_pb2.VideoFeature(
        shape=feature_lib.to_shape_proto(self.shape),
        dtype=feature_lib.dtype_to_str(self.np_dtype), encoding_format='jpeg',
        use_colormap=False, ffmpeg_extra_args=self.ffmpeg_extra_args)


class Ucf101(_Builder, tfds_ucf101.Ucf101, skip_registration=True):
  """TFDS's ucf101 2.0.0 (configs ucf101_1_256, ucf101_1, ucf101_2, ucf101_3)."""
  name = 'ucf101'
  VIDEOS_ZIP = 'UCF101_videos.zip'
  SPLITS_ZIP = 'UCF101TrainTestSplits-RecognitionTask.zip'

  def _info(self):
    # TFDS's, with _Video for tfds.features.Video.
    config = self.builder_config
    scale = ['-vf', f'scale={config.height}x{config.width}'] if config.width else []
    labels = tfds.core.tfds_path(tfds_ucf101._LABELS_FNAME)  # pylint: disable=protected-access
    return tfds.core.DatasetInfo(
        builder=self,
        description='A 101-label video classification dataset.',
        features=tfds.features.FeaturesDict({
            'video': _Video((None, config.height, config.width, 3), scale),
            'label': tfds.features.ClassLabel(names_file=labels),
        }),
        homepage='https://www.crcv.ucf.edu/data-sets/ucf101/',
        citation=tfds_ucf101._CITATION,  # pylint: disable=protected-access
    )

  def _find_inputs(self, download_dir):
    videos = _index_videos(download_dir, self.VIDEOS_ZIP)
    lists = {}
    for split in ('train', 'test'):
      filename = f'{split}list{self.builder_config.split_number:02d}.txt'
      lists[split] = _split_list(_read_split_list(download_dir, self.SPLITS_ZIP, filename))
      missing = [path for path, _ in lists[split] if path.lower() not in videos]
      if missing:
        raise FileNotFoundError(
            f'{len(missing)} of the {len(lists[split])} videos in {filename} are not in '
            f'{download_dir} (first: {missing[0]}): use the whole {self.VIDEOS_ZIP} '
            f'({UCF_101_URL}) or all of UCF101.rar extracted.')
    return dict(videos=videos, lists=lists)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split) for split in ('train', 'test')}

  def _generate_examples(self, split):  # pylint: disable=arguments-renamed
    """TFDS's keys: the file names, in the sorted order of the split list."""
    videos, items = self._inputs['videos'], self._inputs['lists'][split]
    args = self.info.features['video'].ffmpeg_extra_args

    def decode(item):
      path, label = item
      return path, dict(video=_ffmpeg_frames(videos[path.lower()], args), label=label)
    yield from _ordered_map(decode, items, workers=os.cpu_count() or 1)


# A video: (zip file or None, member name or path); see _index_videos.
_VideoRef = Tuple[Optional[pathlib.Path], str]


def _index_videos(download_dir: pathlib.Path, zip_name: str) -> Dict[str, _VideoRef]:
  """Lower-cased file name -> where the .avi is: in the zip if there is one, else on disk.

  Lower case: the lists say v_HandStandPushups_*, TFDS's mirror has v_HandstandPushups_*."""
  archive = download_dir / zip_name
  if archive.is_file():
    with zipfile.ZipFile(archive) as z:
      return {os.path.basename(m).lower(): (archive, m) for m in z.namelist()
              if m.lower().endswith('.avi')}
  found = {p.name.lower(): (None, str(p)) for p in download_dir.rglob('*')
           if p.suffix.lower() == '.avi'}
  if not found:
    raise _missing(archive, f'download it from {UCF_101_URL}, or extract the .avi files of '
                   f'UCF101.rar under {download_dir}')
  return found


def _read_split_list(download_dir: pathlib.Path, zip_name: str, filename: str) -> str:
  archive = download_dir / zip_name
  if archive.is_file():
    with zipfile.ZipFile(archive) as z:
      return z.read(f'ucfTrainTestlist/{filename}').decode()
  extracted = sorted(download_dir.rglob(f'ucfTrainTestlist/{filename}'))
  if not extracted:
    raise _missing(archive, f'download it from {SPLITS_URL} (or extract its ucfTrainTestlist/ '
                   f'under {download_dir})')
  return extracted[0].read_text()


def _split_list(text: str) -> List[Tuple[str, str]]:
  """[(file name, class)] as TFDS reads a list: sorted lines 'Class/v_Class_g08_c01.avi [n]'."""
  items = []
  for line in sorted(text.splitlines()):
    if line.strip():
      label, path = os.path.split(line.strip().split(' ')[0])
      # TFDS: "Fix an inconsistency between the names in the list and in the zip file."
      items.append((path.replace('HandStandPushups', 'HandstandPushups'), label))
  return items


def _ffmpeg_frames(video: _VideoRef, args: List[str]) -> List[bytes]:
  """TFDS's Video._ffmpeg_decode: `ffmpeg -i VIDEO ARGS %010d.jpeg`, the files in name order."""
  archive, name = video
  with tempfile.TemporaryDirectory() as tmp:
    path = name
    if archive is not None:  # The .avi demuxer needs a seekable file.
      path = os.path.join(tmp, 'video.avi')
      with zipfile.ZipFile(archive) as z, open(path, 'wb') as f:
        f.write(z.read(name))
    command = [imageio_ffmpeg.get_ffmpeg_exe(), '-i', path, *args,
               os.path.join(tmp, '%010d.jpeg')]
    proc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, check=False)
    frames = [p.read_bytes() for p in sorted(pathlib.Path(tmp).glob('*.jpeg'))]
  if proc.returncode or not frames:
    error = (proc.stderr.decode(errors='replace').strip().splitlines() or ['no frames'])[-1]
    raise ValueError(f'ffmpeg could not decode {name}: {error}')
  return frames


def _ordered_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
  """fn over items in `workers` threads, in order, at most 2 * workers results held."""
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    pending = collections.deque()
    for item in items:
      pending.append(pool.submit(fn, item))
      if len(pending) > 2 * workers:
        yield pending.popleft().result()
    while pending:
      yield pending.popleft().result()


BUILDERS = {'cifar100': Cifar100, 'imagenet2012': Imagenet2012, 'ucf101': Ucf101}
DATASETS = tuple(BUILDERS) + tuple(f'ucf101/{c.name}' for c in Ucf101.BUILDER_CONFIGS)
