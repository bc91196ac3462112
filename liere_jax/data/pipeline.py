"""Input pipelines: Grain over TFDS array_record sources, deterministic and resumable.

  train = train_dataset(config.data, global_batch_size=512, seed=config.seed,
                        process_index=jax.process_index(), process_count=jax.process_count())
  for step, batch in zip(range(start, total), to_iterator(train, start=start)):
    ...  # batch == train[step]: image float32 [b, *input_shape], label float32 [b, classes]
  for batch in eval_batches(config.data, global_batch_size=512):
    ...  # image float32, label int32 [b], mask bool [b] (False on padding)

Determinism. `train[step]` is a pure function of (seed, step, process): the global example
stream is `source.seed(seed).shuffle().repeat()` (a new permutation each epoch), per-example
augmentation is a `random_map` whose generator is drawn from (seed, position in that stream),
and process p of P takes positions p, p + P, p + 2P, ... So resuming is `to_iterator(train,
start=step)`, nothing else to checkpoint, and at every step the P per-process batches are
disjoint and together are exactly the 1-process batch (without mixup, which pairs examples
inside a per-process batch). b = global_batch_size / process_count.

Datasets (data.name; TFDS name, input shape, classes, default splits):
  cifar100      'cifar100'                  [32, 32, 3]             100   train / test
  imagenet2012  'imagenet2012'              [S, S, 3]               1000  train / validation
  ucf101        'ucf101/ucf101_1_256'       [num_frames, S, S, 3]   101   train / test
                (frames squashed to 256 x 256), or 'ucf101/ucf101_1' (native 320 x 240 frames,
                as the official code reads them)
  arrows        'liere_arrows/grid{G}', or  [12 G, 12 G, 3]         4     train / test
                rendered on the fly
A TFDS name with a config or version ('ucf101/ucf101_2', 'cifar100:3.0.2') may be given.
UCF101 records are read without TFDS features (its Video feature needs TensorFlow even to read)
and only the frames used are JPEG-decoded.

Config fields (data.*):
  name          see above.
  data_dir      TFDS data directory; None = TFDS default ($TFDS_DATA_DIR or ~/tensorflow_datasets).
                For arrows, None renders on the fly: train is an unlimited stream (2**31 - 1
                examples, or num_train) of seed stream `arrows.split_seed(seed, 'train')`, eval
                the first num_eval examples of the 'test' stream; with a data_dir the prepared
                liere_arrows/grid{G} is read instead (see tfds_builders.py).
  train_split, eval_split   split names (TFDS slicing like 'train[:90%]' works for cifar100
                and imagenet2012).
  fraction      train on the first fraction of the training split, 0 < fraction <= 1 (Fig. 4).
  augment       what a training example goes through, in this order (a video clip gets the
                same transform on every frame; Arrows must use 'none': a flip changes the label):
                  'none'              nothing (decode: shorter side to S, centre crop);
                  'light'             crop, flip;
                  'randaug'           crop, flip, RandAugment(2, 14) with the project's 14
                                      torchvision-style ops (augment.randaugment);
                  'official_randaug'  the official RandAugment(2, 14) (O dataset/randomaug.py),
                                      then crop, flip: O's CIFAR-100 / ImageNet order;
                  'videomae'          timm RandAugment(randaug_policy), then crop, flip: O's
                                      UCF101 order; training clips are also sampled as VideoMAE's
                                      loader does (see num_frames).
  crop          the crop of augment != 'none': 'pad': decode to S (shorter side to S, centre
                crop), zero-pad by S/8, random S x S crop, flip; 'rrc': decode at native size,
                RandomResizedCrop to S (area 0.08-1, ratio 3/4-4/3; images: PIL's antialiased
                bilinear as torchvision on PIL; video: plain bilinear as O's torch interpolate),
                flip. RandAugment before the crop thus sees the native image under 'rrc'.
  randaug_policy   augment='videomae': the timm policy, default O's 'rand-m7-n4-mstd0.5-inc1'.
  random_erasing   probability that a training example gets one random box of N(0, 1) noise,
                after normalisation and the crop (the same box on every frame; O's UCF101: 0.25);
                0 = off.
  eval_crop     'resize_center': shorter side to S, centre crop; 'center': the centre S x S of the
                native image, zero-padded where smaller (torchvision CenterCrop; O's ImageNet).
  eval_views    ucf101: (temporal, spatial) views of every video, default (1, 1): the centred
                clip and crop. (5, 3) is O's protocol (O dataset/videodataset.py:171-296): clips
                start at 5 evenly spaced points of the stride grid 0, stride, 2 stride, ... (short
                videos repeat its last frame), and 3 S x S crops are evenly spaced along the
                longer side of frames resized to shorter side S. Eval batches then carry `video`
                and evaluation.py reports per-view (O's number) and per-video accuracy.
  mixup         Beta(alpha, alpha) mixup of each per-process batch with its reverse; 0 = off.
  image_size    S, the training size (imagenet2012 and ucf101: required; cifar100 and arrows:
                0 or their native 32 / 12 G).
  num_frames, frame_stride   ucf101 clips: frames t0, t0 + stride, ...; t0 uniform in training,
                centred in eval; short videos repeat their last frame. Under augment='videomae'
                training clips are VideoMAE's (O videodataset.py:390-417): floor(linspace) of
                num_frames points over a random window of num_frames * stride frames.
  grid          arrows: cells per side G (12 px cells).
  num_eval      arrows: examples in the eval set (ignored by other datasets).
  num_train     arrows: size of the training set (None/0 = unlimited).
  seed          arrows on the fly: picks the example streams (what the data is; the order and
                augmentation come from train_dataset(seed)). Prepared arrows are seed 0.
  workers, threads, prefetch   train.py's iterator (to_iterator): Grain worker processes (0 =
                threads of the main process only), threads in each process, batches each computes
                ahead. The batches are the same whatever they are; `python -m liere_jax.bench
                data --config C` times them on stand-in data.
  normalise     'host': train batches are float32, normalised here; 'device': uint8 pixels,
                normalised by the trainer on the accelerator (normalisation(data)): 4x less to
                copy between processes and to the device, no host time (not with mixup or
                random erasing, which work on normalised values). Eval batches are float32.
Eval has no augmentation (eval_crop, eval_views). Normalisation: (x / 255 - mean) / std per
channel with the dataset's constants. O = the official code, github.com/StanfordMIMI/LieRE.

Preparing data (no dataset is downloaded here): `python -m liere_jax.data.prepare NAME
--download_dir=DL --data_dir=DIR` turns the original download in DL into the TFDS dataset,
without TensorFlow (liere_jax/data/prepare.py; README "Data").
"""
import dataclasses
import io
import json
import math
import re
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

from absl import flags
from etils import epath
import grain
import numpy as np
from PIL import Image
import tensorflow_datasets as tfds
from tensorflow_datasets.core import constants as tfds_constants
from tensorflow_datasets.proto import tf_example_pb2

from liere_jax.data import arrows
from liere_jax.data import augment as augment_lib
from liere_jax.data import tfds_builders

Example = Dict[str, Any]
AUGMENTS = ('none', 'light', 'randaug', 'official_randaug', 'videomae')
CROPS = ('pad', 'rrc')
EVAL_CROPS = ('resize_center', 'center')
ARROWS_TRAIN_SIZE = 2**31 - 1  # "Unlimited": indices are numpy seeds, any int fits.
_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class _Dataset:
  tfds_name: str
  num_classes: int
  splits: Tuple[str, str]  # Default (train, eval).
  mean: Tuple[float, ...]
  std: Tuple[float, ...]
  how_to_prepare: str


_PREPARE = ('put {download} in a folder DL, then run `python -m liere_jax.data.prepare {name} '
            '--download_dir=DL --data_dir={root}`')
DATASETS = {
    'cifar100': _Dataset(
        'cifar100', 100, ('train', 'test'), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
        _PREPARE.replace('{download}', 'cifar-100-binary.tar.gz (from '
                         'https://www.cs.toronto.edu/~kriz/)')),
    'imagenet2012': _Dataset(
        'imagenet2012', 1000, ('train', 'validation'), _IMAGENET_MEAN, _IMAGENET_STD,
        _PREPARE.replace('{download}', 'ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar')),
    # Video models commonly reuse the ImageNet constants.
    'ucf101': _Dataset(
        'ucf101/ucf101_1_256', 101, ('train', 'test'), _IMAGENET_MEAN, _IMAGENET_STD,
        _PREPARE.replace('{download}', 'UCF101_videos.zip and '
                         'UCF101TrainTestSplits-RecognitionTask.zip')),
    'arrows': _Dataset(
        'liere_arrows', arrows.NUM_CLASSES, ('train', 'test'), (0.5,) * 3, (0.5,) * 3,
        'run `python -c "from liere_jax.data import tfds_builders; '
        'tfds_builders.prepare_arrows(\'{root}\', grid={grid})"` (nothing to download), or set '
        'data.data_dir=None to render the examples on the fly'),
}
_FIELDS = ('name', 'data_dir', 'train_split', 'eval_split', 'fraction', 'augment', 'crop',
           'randaug_policy', 'random_erasing', 'eval_crop', 'eval_views', 'mixup', 'image_size',
           'num_frames', 'frame_stride', 'grid', 'num_eval', 'num_train', 'seed',
           'workers', 'threads', 'prefetch', 'normalise')
NORMALISE = ('host', 'device')
# Fields added after runs existed, with the value that reproduces those runs (read_config).
DATA_ADDED = dict(crop='pad', randaug_policy='rand-m7-n4-mstd0.5-inc1', random_erasing=0.0,
                  eval_crop='resize_center', eval_views=(1, 1), workers=0, threads=2,
                  prefetch=2, normalise='host')


@dataclasses.dataclass(frozen=True)
class _Spec:
  """The validated data config."""
  name: str  # Key of DATASETS.
  tfds_name: str
  data_dir: Optional[str]
  train_split: str
  eval_split: str
  fraction: float
  augment: str
  crop: str
  randaug_policy: str
  random_erasing: float
  eval_crop: str
  eval_views: Tuple[int, int]  # (temporal, spatial).
  mixup: float
  size: int  # Training spatial size.
  num_frames: int
  frame_stride: int
  grid: int
  num_eval: int
  num_train: int
  seed: int
  normalise: str  # Train batches: 'host' (float32 here) or 'device' (uint8, the trainer's).

  @property
  def info(self) -> _Dataset:
    return DATASETS[self.name]

  def input_shape(self, size: Optional[int] = None) -> Tuple[int, ...]:
    size = size or self.size
    frames = (self.num_frames,) if self.name == 'ucf101' else ()
    return frames + (size, size, 3)


def _spec(data_config) -> _Spec:
  cfg = data_config.to_dict() if hasattr(data_config, 'to_dict') else dict(data_config)
  unknown = sorted(set(cfg) - set(_FIELDS))
  if unknown:
    raise ValueError(f'data config fields {unknown} are unknown; the fields are {_FIELDS}.')
  missing = [k for k in _FIELDS if k not in cfg]
  if missing:
    raise ValueError(f'data.{missing[0]} is missing; build the data section with '
                     'liere_jax.config_lib.data_config (it sets every field).')
  full_name = cfg['name'] or ''
  name = full_name.split('/')[0].split(':')[0]
  if name not in DATASETS:
    raise ValueError(f'data.name={full_name!r} is unknown; use one of {list(DATASETS)}.')
  info = DATASETS[name]
  tfds_name = full_name if full_name != name else info.tfds_name
  augment = cfg['augment']
  if augment not in AUGMENTS:
    raise ValueError(f'data.augment={augment!r} is unknown; use one of {AUGMENTS}.')
  if name == 'arrows' and augment != 'none':
    raise ValueError(f"data.augment={augment!r} would flip or rotate arrows and change their "
                     "label; the arrows task needs augment='none'.")
  if augment == 'videomae':
    augment_lib.parse_timm_policy(cfg['randaug_policy'])  # Raises naming the bad token.
  crop, eval_crop = cfg['crop'], cfg['eval_crop']
  if crop not in CROPS:
    raise ValueError(f'data.crop={crop!r} is unknown; use one of {CROPS}.')
  if eval_crop not in EVAL_CROPS:
    raise ValueError(f'data.eval_crop={eval_crop!r} is unknown; use one of {EVAL_CROPS}.')
  random_erasing = float(cfg['random_erasing'])
  if not 0 <= random_erasing <= 1 or (name == 'arrows' and random_erasing):
    raise ValueError(f'data.random_erasing={random_erasing} must be a probability in [0, 1] '
                     '(0 = off), and 0 for arrows (erasing can hide the arrow that is the label).')
  views = cfg['eval_views']
  if not (isinstance(views, (tuple, list)) and len(views) == 2
          and all(isinstance(v, int) and v >= 1 for v in views)):
    raise ValueError(f'data.eval_views={views!r} must be (temporal, spatial) counts >= 1, e.g. '
                     "(5, 3), the official UCF101 protocol.")
  views = tuple(views)
  if views != (1, 1) and name != 'ucf101':
    raise ValueError(f'data.eval_views={views} is for video; {name} has one view: set (1, 1).')
  if views[1] > 1 and eval_crop != 'resize_center':
    raise ValueError(f"data.eval_views={views}: spatial views are crops along the longer side of "
                     "frames resized to shorter side S; they need eval_crop='resize_center'.")
  fraction = float(cfg['fraction'])
  if not 0 < fraction <= 1:
    raise ValueError(f'data.fraction={fraction} must be in (0, 1] (paper Fig. 4: 0.2-0.9).')
  mixup = float(cfg['mixup'])
  if mixup < 0:
    raise ValueError(f'data.mixup={mixup} is the Beta(alpha, alpha) alpha: >= 0 (0 = off).')
  grid = int(cfg['grid'])
  size = int(cfg['image_size'])
  native = {'cifar100': 32, 'arrows': arrows.CELL * grid}.get(name)
  if native is None and size <= 0:
    raise ValueError(f'data.image_size={size}: {name} images are resized to image_size x '
                     'image_size; set it (the paper uses 224).')
  if native is not None and size not in (0, native):
    raise ValueError(
        f'data.image_size={size} but {name} images are {native}x{native}'
        + (f' (grid={grid} cells of {arrows.CELL} px; set data.grid={size // arrows.CELL})'
           if name == 'arrows' else '')
        + '; set image_size=0 (native), and use eval input_size to test other resolutions.')
  for key, low, what in (('workers', 0, 'worker processes; 0 = none'),
                         ('threads', 1, 'threads in each process'),
                         ('prefetch', 1, 'batches computed ahead by each process')):
    if int(cfg[key]) < low:  # Read by to_iterator (train.py passes them).
      raise ValueError(f'data.{key}={cfg[key]} must be >= {low} ({what}).')
  normalise = cfg['normalise']
  if normalise not in NORMALISE:
    raise ValueError(f'data.normalise={normalise!r} is unknown; use one of {NORMALISE}.')
  if normalise == 'device' and (mixup or random_erasing):
    raise ValueError(f"data.normalise='device' sends uint8 pixels, but mixup={mixup} and "
                     f'random_erasing={random_erasing} work on normalised values; set '
                     "data.normalise='host' (or both to 0).")
  num_frames, frame_stride = int(cfg['num_frames']), int(cfg['frame_stride'])
  if name == 'ucf101' and (num_frames < 1 or frame_stride < 1):
    raise ValueError(f'data.num_frames={num_frames} and data.frame_stride={frame_stride} must '
                     'be >= 1.')
  return _Spec(
      name=name, tfds_name=tfds_name, data_dir=cfg['data_dir'] or None,
      train_split=cfg['train_split'] or info.splits[0],
      eval_split=cfg['eval_split'] or info.splits[1],
      fraction=fraction, augment=augment, crop=crop, randaug_policy=cfg['randaug_policy'],
      random_erasing=random_erasing, eval_crop=eval_crop, eval_views=views, mixup=mixup,
      size=size or native, num_frames=num_frames, frame_stride=frame_stride, grid=grid,
      num_eval=int(cfg['num_eval']), num_train=int(cfg['num_train'] or 0),
      seed=int(cfg['seed']), normalise=normalise)


# Sources: random access to raw examples, checked before any pipeline is built.


def _not_prepared(spec: _Spec, name: str, split: str, grid: int,
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


def _tfds_source(spec: _Spec, name: str, split: str, grid: Optional[int] = None):
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


def _video_source(spec: _Spec, split: str) -> VideoSource:
  """Finds DIR/name/config/version/ from dataset_info.json, as TFDS would, and opens `split`."""
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


def _source(spec: _Spec, split: str, *, train: bool,
            grid: Optional[int] = None) -> grain.MapDataset:
  """The raw examples of `split`; raises if they are not prepared."""
  if spec.name == 'arrows':
    grid = grid or spec.grid
    if spec.data_dir is None:
      size = (spec.num_train or ARROWS_TRAIN_SIZE) if train else spec.num_eval
      return grain.MapDataset.source(
          arrows.ArrowsSource(arrows.split_seed(spec.seed, split), size, grid))
    source = _tfds_source(spec, f'{tfds_builders.NAME}/grid{grid}', split, grid)
    size = spec.num_train if train else spec.num_eval
    if size > len(source):
      raise ValueError(f'data.num_{"train" if train else "eval"}={size} but the prepared '
                       f'{tfds_builders.NAME}/grid{grid} {split} split has {len(source)}.')
    return grain.MapDataset.source(source)[:size or len(source)]
  if spec.name == 'ucf101':
    return grain.MapDataset.source(_video_source(spec, split))
  return grain.MapDataset.source(_tfds_source(spec, spec.tfds_name, split))


def _train_source(spec: _Spec) -> grain.MapDataset:
  source = _source(spec, spec.train_split, train=True)
  return source[:max(1, int(spec.fraction * len(source)))]


# Decoding to uint8 of the model's shape, and augmentation.


def _resize_crop(image: np.ndarray, size: int, view: int = 0, views: int = 1) -> np.ndarray:
  """[h, w, c] -> [size, size, c]: shorter side to `size` (bilinear, antialiased), then crop
  `view` of `views` evenly spaced along the longer side (views = 1: the centre; O
  videodataset.py:264-287 spaces 3 at int(k * (long - size) / 2))."""
  h, w = image.shape[:2]
  scale = size / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  if (nh, nw) != (h, w):
    image = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BILINEAR))
  slack = max(nh, nw) - size
  start = slack // 2 if views == 1 else int(view * (slack / (views - 1)))
  top, left = (start, 0) if nh > nw else (0, start)
  return image[top:top + size, left:left + size]


def _center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """[h, w, c] -> [size, size, c]: the centre of the image as it is, zero-padded where it is
  smaller (torchvision CenterCrop, O's ImageNet eval: data_image.py:209)."""
  h, w = image.shape[:2]
  ph, pw = max(0, size - h), max(0, size - w)
  image = np.pad(image, ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
  h, w = image.shape[:2]
  top, left = round((h - size) / 2), round((w - size) / 2)  # Half to even, as torchvision.
  return image[top:top + size, left:left + size]


def _frame_indices(num_video_frames: int, num: int, stride: int,
                   rng: Optional[np.random.Generator]) -> np.ndarray:
  """num frames at `stride` from a uniform (rng) or centred start; clipped to the video."""
  slack = max(0, num_video_frames - ((num - 1) * stride + 1))
  start = rng.integers(slack + 1) if rng is not None else slack // 2
  return np.minimum(start + stride * np.arange(num), num_video_frames - 1)


def _train_clip(n: int, num: int, stride: int, rng: np.random.Generator,
                videomae: bool) -> np.ndarray:
  """Training frame indices [num] of an n-frame video: at `stride` from a uniform start, or
  VideoMAE's (O videodataset.py:390-417): floor(linspace) of num points over a random window of
  num * stride frames; a video no longer than that: linspace(0, n, n // stride), then n - 1."""
  if not videomae:
    return _frame_indices(n, num, stride, rng)
  window = num * stride
  if n <= window:
    k = n // stride
    return np.clip(np.concatenate([np.linspace(0, n, k), np.full(num - k, n)]), 0,
                   n - 1).astype(np.int64)
  end = rng.integers(window, n)
  return np.clip(np.linspace(end - window, end, num), end - window, end - 1).astype(np.int64)


def _eval_clip(n: int, num: int, stride: int, view: int, views: int) -> np.ndarray:
  """Eval frame indices [num]: views = 1: the centred clip; else clip `view` of `views` whose
  starts are evenly spaced on the grid 0, stride, 2 stride, ... < n, whose last point short
  videos repeat (O videodataset.py:264-276, 382-388)."""
  if views == 1:
    return _frame_indices(n, num, stride, None)
  points = -(-n // stride)
  start = int(view * (max(points - num, 0) / (views - 1)))
  return stride * np.minimum(start + np.arange(num), points - 1)


def _decode_jpeg(jpeg: bytes, draft: int = 0) -> np.ndarray:
  with Image.open(io.BytesIO(jpeg)) as image:
    if draft:  # JPEG: decode at a reduced scale whose sides are >= draft, when there is one.
      image.draft('RGB', (draft, draft))
    return np.asarray(image.convert('RGB'))


def _decoder(spec: _Spec, size: int, grid: int, *,
             train: bool) -> Callable[[Example, Any, int], Example]:
  """(raw example, rng or None, view) -> dict(image=uint8 [*input_shape], label=int32).

  Training under crop='rrc' (and an augment) keeps the native size: the augmentation crops.
  Eval: view v of the prod(eval_views) views, temporal v // spatial, spatial v % spatial.
  """
  expected = {'cifar100': (32, 32, 3),
              'arrows': (arrows.CELL * grid, arrows.CELL * grid, 3)}.get(spec.name)
  if train:
    mode = 'native' if spec.augment != 'none' and spec.crop == 'rrc' else 'resize_center'
    temporal, spatial = 1, 1
  else:
    mode, (temporal, spatial) = spec.eval_crop, spec.eval_views

  def fit(image: np.ndarray, view: int) -> np.ndarray:
    if mode == 'native':
      return image
    if mode == 'center':
      return _center_crop(image, size)
    return _resize_crop(image, size, view, spatial)

  def decode(raw: Example, rng: Optional[np.random.Generator], view: int = 0) -> Example:
    label = np.int32(raw['label'])
    t, s = divmod(view, spatial)
    if spec.name == 'ucf101':
      frames, n = raw['frames'], len(raw['frames'])
      idx = (_train_clip(n, spec.num_frames, spec.frame_stride, rng, spec.augment == 'videomae')
             if train else _eval_clip(n, spec.num_frames, spec.frame_stride, t, temporal))
      # A draft is a reduced-scale decode: only where the frame is downscaled to S anyway.
      draft = size if mode == 'resize_center' else 0
      return dict(image=np.stack([fit(_decode_jpeg(frames[i], draft), s) for i in idx]),
                  label=label)
    image = np.asarray(raw['image'])
    if expected is not None and image.shape != expected:
      raise ValueError(f'{spec.tfds_name} gave an image of shape {image.shape}, expected '
                       f'{expected} from the data config (grid={grid}); prepare the matching '
                       'dataset or fix data.grid / data.name.')
    if image.ndim != 3 or image.shape[-1] != 3:
      raise ValueError(f'{spec.tfds_name} gave an image of shape {image.shape}; expected RGB '
                       '[height, width, 3].')
    return dict(image=fit(image, s), label=label)
  return decode


def _augment(spec: _Spec, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """uint8 [..., h, w, c] (native size under crop='rrc') -> [..., S, S, c], in the order of
  data.augment; the official RandAugments come before the crop, as in O (data_image.py:96-104,
  193-205; videodataset.py:306-341)."""
  if spec.augment == 'none':
    return x
  if spec.augment == 'official_randaug':
    x = augment_lib.official_randaugment(x, rng)
  elif spec.augment == 'videomae':
    x = augment_lib.timm_randaugment(x, rng, spec.randaug_policy)
  if spec.crop == 'pad':
    x = augment_lib.crop_flip(x, rng)
  else:
    box = augment_lib.rrc_box(rng, *x.shape[-3:-1])
    x = augment_lib.hflip(augment_lib.resized_crop(x, box, spec.size,
                                                   antialias=spec.name != 'ucf101'), rng)
  return augment_lib.randaugment(x, rng) if spec.augment == 'randaug' else x


def _stack(examples: Sequence[Example]) -> Example:
  return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def normalisation(data_config) -> Tuple[np.ndarray, np.ndarray]:
  """(scale, offset) float32 [channels]: normalised = pixels * scale + offset, i.e.
  (x / 255 - mean) / std with the dataset's constants."""
  return _scale_offset(_spec(data_config).info)


def _scale_offset(info: _Dataset) -> Tuple[np.ndarray, np.ndarray]:
  mean, std = np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32)
  return 1 / (255 * std), -mean / std


def _normalise(spec: _Spec, images: np.ndarray) -> np.ndarray:
  """uint8 [..., c] -> float32 (x / 255 - mean) / std; in place in one float32 copy (0.6x the
  time of `x * a + b`, the same values)."""
  scale, offset = _scale_offset(spec.info)
  out = images.astype(np.float32)
  out *= scale
  out += offset
  return out


# The public API.


def dataset_info(data_config) -> Dict[str, Any]:
  """dict(input_shape, num_classes, num_train (after fraction), num_eval); checks the data."""
  spec = _spec(data_config)
  return dict(input_shape=spec.input_shape(), num_classes=spec.info.num_classes,
              num_train=len(_train_source(spec)),
              num_eval=len(_source(spec, spec.eval_split, train=False)))


def train_dataset(data_config, *, global_batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> grain.MapDataset:
  """Infinite MapDataset of this process's batches; ds[step] is the batch of that step.

  Yields dict(image=float32 [b, *input_shape] normalised (data.normalise='device': uint8
  pixels), label=float32 [b, num_classes] one-hot, or mixed with mixup),
  b = global_batch_size // process_count.
  """
  spec = _spec(data_config)
  batch = _per_process(global_batch_size, process_index, process_count)
  decode = _decoder(spec, spec.size, spec.grid, train=True)

  def example(raw, rng):
    ex = decode(raw, rng)
    image = _augment(spec, ex['image'], rng)
    if spec.normalise == 'host':
      image = _normalise(spec, image)
    if spec.random_erasing:  # On normalised values (O videodataset.py:343-353).
      image = augment_lib.random_erasing(image, rng, p=spec.random_erasing)
    return dict(image=image, label=ex['label'])

  def finish(batch: Example, rng: np.random.Generator) -> Example:
    images = batch['image']
    labels = np.eye(spec.info.num_classes, dtype=np.float32)[batch['label']]
    if spec.mixup > 0:
      lam = np.float32(rng.beta(spec.mixup, spec.mixup))
      # lam x + (1 - lam) x[::-1] in one new array, not three (the batch is ours to change).
      mixed = (1 - lam) * images[::-1]
      images *= lam
      images += mixed
      labels = lam * labels + (1 - lam) * labels[::-1]
    return dict(image=images, label=labels)

  ds = _train_source(spec).seed(seed).shuffle().repeat().random_map(example)
  ds = ds[process_index::process_count].batch(batch, drop_remainder=True, batch_fn=_stack)
  return ds.random_map(finish)


def eval_batches(data_config, *, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1, input_size: Optional[int] = None) -> Iterator[Example]:
  """All of the eval split once, in order, padded: dict(image, label int32 [b], mask bool [b]).

  Every process yields ceil(num_eval * views / global_batch_size) batches; padding has mask
  False. Video with views = prod(data.eval_views) > 1: the items are (video, view) pairs, the
  views of a video consecutive, and batches also carry video int32 [b] (the video's index in
  the eval split; -1 on padding). Process p of P takes items p, p + P, ... (disjoint slices).
  input_size: evaluate at another spatial size (images are resized; arrows are rendered with
  grid = input_size // 12, more cells of the same 12 px).
  """
  spec = _spec(data_config)
  batch = _per_process(global_batch_size, process_index, process_count)
  size, grid = spec.size, spec.grid
  if input_size:
    if not isinstance(input_size, (int, np.integer)):
      raise ValueError(f'input_size={input_size!r} must be an int: the side of the square input '
                       '(for video, of each frame).')
    size = int(input_size)
    if spec.name == 'arrows':
      if size % arrows.CELL:
        raise ValueError(f'input_size={size} is not a multiple of the {arrows.CELL} px arrows '
                         f'cells; use e.g. {arrows.CELL * max(4, size // arrows.CELL)}.')
      grid = size // arrows.CELL
  source = _source(spec, spec.eval_split, train=False, grid=grid)
  decode = _decoder(spec, size, grid, train=False)
  views = math.prod(spec.eval_views)
  num = len(source) * views
  pad = dict(image=np.zeros(spec.input_shape(size), np.uint8), label=np.int32(0), mask=False)
  if views > 1:
    pad['video'] = np.int32(-1)

  def example(index: int) -> Example:
    if index >= num:
      return pad
    video, view = divmod(index, views)
    ex = dict(decode(source[video], None, view), mask=True)
    if views > 1:
      ex['video'] = np.int32(video)
    return ex

  def finish(batch: Example) -> Example:
    return dict(batch, image=_normalise(spec, batch['image']))

  total = math.ceil(num / global_batch_size) * global_batch_size
  ds = grain.MapDataset.range(total)[process_index::process_count].map(example)
  return to_iterator(ds.batch(batch, batch_fn=_stack).map(finish))


def _per_process(global_batch_size: int, process_index: int, process_count: int) -> int:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} must be in [0, process_count='
                     f'{process_count}).')
  if global_batch_size < 1 or global_batch_size % process_count:
    raise ValueError(f'global_batch_size={global_batch_size} must be a positive multiple of '
                     f'process_count={process_count}.')
  return global_batch_size // process_count


def to_iterator(ds: grain.MapDataset, *, start: int = 0, workers: int = 0, threads: int = 2,
                prefetch: int = 2) -> Iterator[Example]:
  """Iterates ds[start], ds[start + 1], ..., computed ahead; the same items for any settings.

  workers = 0: `threads` threads of this process compute up to `prefetch` items ahead.
  workers = N > 0: N Grain worker processes (mp_prefetch); worker i computes ds[start + i::N]
  with its own `threads` and `prefetch`, holds one more finished, and the items come back in
  order through shared memory (so about N (prefetch + 2) items exist at once). Workers are
  spawned and import the main module: call this under `if __name__ == '__main__'` with absl
  flags parsed (app.run), and close() the iterator when done (else they end when it is
  collected).
  """
  if workers and not flags.FLAGS.is_parsed():
    raise RuntimeError(f'workers={workers}: Grain worker processes read absl flags; run under '
                       'absl.app.run (as train.py does), or call '
                       'absl.flags.FLAGS.mark_as_parsed() first.')
  it = ds[start:].to_iter_dataset(
      grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch))
  if workers:
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
  return iter(it)
