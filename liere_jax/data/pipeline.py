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
  augment       'none'; 'light': pad by S/8, random S x S crop, horizontal flip; 'randaug':
                light + RandAugment(2 ops, magnitude 14 of 30) with the 14 torchvision ops
                (identity, shear x/y, translate x/y, rotate, brightness, color, contrast,
                sharpness, posterize, solarize, autocontrast, equalize). A video clip gets the
                same transform on every frame. Arrows must use 'none' (a flip changes the label).
  mixup         Beta(alpha, alpha) mixup of each per-process batch with its reverse; 0 = off.
  image_size    S, the training size (imagenet2012 and ucf101: required; cifar100 and arrows:
                0 or their native 32 / 12 G). Images: shorter side resized to S, centre crop.
  num_frames, frame_stride   ucf101 clips: frames t0, t0 + stride, ...; t0 uniform in training,
                centred in eval; short videos repeat their last frame.
  grid          arrows: cells per side G (12 px cells).
  num_eval      arrows: examples in the eval set (ignored by other datasets).
  num_train     arrows: size of the training set (None/0 = unlimited).
  seed          arrows on the fly: picks the example streams (what the data is; the order and
                augmentation come from train_dataset(seed)). Prepared arrows are seed 0.
Eval has no augmentation: centre crops, centred clips. Normalisation: (x / 255 - mean) / std
per channel with the dataset's constants.

Preparing data (no dataset is downloaded here): `tfds build cifar100 --file_format=array_record
--data_dir=DIR` on a machine with internet, then copy DIR/cifar100; a tfrecord copy converts
with `tfds convert_format --dataset_version_dir=DIR/cifar100/3.0.2 --out_file_format=array_record`.
"""
import dataclasses
import io
import json
import math
import re
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

from etils import epath
import grain
import numpy as np
from PIL import Image, ImageEnhance, ImageOps
import tensorflow_datasets as tfds
from tensorflow_datasets.core import constants as tfds_constants
from tensorflow_datasets.proto import tf_example_pb2

from liere_jax.data import arrows
from liere_jax.data import tfds_builders

Example = Dict[str, Any]
AUGMENTS = ('none', 'light', 'randaug')
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


_BUILD = ('on a machine with internet run `tfds build {name} --file_format=array_record '
          '--data_dir={root}` and copy the result to {root}')
DATASETS = {
    'cifar100': _Dataset(
        'cifar100', 100, ('train', 'test'), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
        _BUILD),
    'imagenet2012': _Dataset(
        'imagenet2012', 1000, ('train', 'validation'), _IMAGENET_MEAN, _IMAGENET_STD,
        'put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar in {root}/downloads/manual, '
        'then run `tfds build {name} --file_format=array_record --data_dir={root}`'),
    # Video models commonly reuse the ImageNet constants.
    'ucf101': _Dataset(
        'ucf101/ucf101_1_256', 101, ('train', 'test'), _IMAGENET_MEAN, _IMAGENET_STD,
        _BUILD + ' (building needs TensorFlow and ffmpeg; reading here needs neither)'),
    'arrows': _Dataset(
        'liere_arrows', arrows.NUM_CLASSES, ('train', 'test'), (0.5,) * 3, (0.5,) * 3,
        'run `python -c "from liere_jax.data import tfds_builders; '
        'tfds_builders.prepare_arrows(\'{root}\', grid={grid})"` (nothing to download), or set '
        'data.data_dir=None to render the examples on the fly'),
}
_FIELDS = ('name', 'data_dir', 'train_split', 'eval_split', 'fraction', 'augment', 'mixup',
           'image_size', 'num_frames', 'frame_stride', 'grid', 'num_eval', 'num_train', 'seed')


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
  mixup: float
  size: int  # Training spatial size.
  num_frames: int
  frame_stride: int
  grid: int
  num_eval: int
  num_train: int
  seed: int

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
  num_frames, frame_stride = int(cfg['num_frames']), int(cfg['frame_stride'])
  if name == 'ucf101' and (num_frames < 1 or frame_stride < 1):
    raise ValueError(f'data.num_frames={num_frames} and data.frame_stride={frame_stride} must '
                     'be >= 1.')
  return _Spec(
      name=name, tfds_name=tfds_name, data_dir=cfg['data_dir'] or None,
      train_split=cfg['train_split'] or info.splits[0],
      eval_split=cfg['eval_split'] or info.splits[1],
      fraction=fraction, augment=augment, mixup=mixup, size=size or native,
      num_frames=num_frames, frame_stride=frame_stride, grid=grid,
      num_eval=int(cfg['num_eval']), num_train=int(cfg['num_train'] or 0),
      seed=int(cfg['seed']))


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
        f'{name} at {path} is stored as {file_format.value}, and Grain needs array_record: run '
        f'`tfds convert_format --dataset_version_dir={path} --out_file_format=array_record`, '
        f'or {how}.')
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
        f'array_record: run `tfds convert_format --dataset_version_dir={path} '
        '--out_file_format=array_record`.')
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


def _resize_crop(image: np.ndarray, size: int) -> np.ndarray:
  """[h, w, c] -> [size, size, c]: shorter side to `size` (bilinear, antialiased), centre crop."""
  h, w = image.shape[:2]
  if (h, w) == (size, size):
    return image
  scale = size / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  image = np.asarray(Image.fromarray(image).resize((nw, nh), Image.BILINEAR))
  top, left = (nh - size) // 2, (nw - size) // 2
  return image[top:top + size, left:left + size]


def _frame_indices(num_video_frames: int, num: int, stride: int,
                   rng: Optional[np.random.Generator]) -> np.ndarray:
  """num frames at `stride` from a uniform (rng) or centred start; clipped to the video."""
  slack = max(0, num_video_frames - ((num - 1) * stride + 1))
  start = rng.integers(slack + 1) if rng is not None else slack // 2
  return np.minimum(start + stride * np.arange(num), num_video_frames - 1)


def _decode_frame(jpeg: bytes, size: int) -> np.ndarray:
  with Image.open(io.BytesIO(jpeg)) as image:
    image.draft('RGB', (size, size))  # JPEG: decode at a reduced scale >= size when possible.
    return _resize_crop(np.asarray(image.convert('RGB')), size)


def _decoder(spec: _Spec, size: int, grid: int) -> Callable[[Example, Any], Example]:
  """(raw example, rng or None) -> dict(image=uint8 [*input_shape], label=int32)."""
  expected = {'cifar100': (32, 32, 3),
              'arrows': (arrows.CELL * grid, arrows.CELL * grid, 3)}.get(spec.name)

  def decode(raw: Example, rng: Optional[np.random.Generator]) -> Example:
    label = np.int32(raw['label'])
    if spec.name == 'ucf101':
      frames = raw['frames']
      idx = _frame_indices(len(frames), spec.num_frames, spec.frame_stride, rng)
      return dict(image=np.stack([_decode_frame(frames[i], size) for i in idx]), label=label)
    image = np.asarray(raw['image'])
    if expected is not None and image.shape != expected:
      raise ValueError(f'{spec.tfds_name} gave an image of shape {image.shape}, expected '
                       f'{expected} from the data config (grid={grid}); prepare the matching '
                       'dataset or fix data.grid / data.name.')
    if image.ndim != 3 or image.shape[-1] != 3:
      raise ValueError(f'{spec.tfds_name} gave an image of shape {image.shape}; expected RGB '
                       '[height, width, 3].')
    return dict(image=_resize_crop(image, size), label=label)
  return decode


def _frames(fn: Callable[[Image.Image], Image.Image], x: np.ndarray) -> np.ndarray:
  """Applies a PIL op to an image [h, w, c] or to every frame of a clip [t, h, w, c]."""
  flat = x.reshape((-1,) + x.shape[-3:])
  out = np.stack([np.asarray(fn(Image.fromarray(f))) for f in flat])
  return out.reshape(x.shape)


def _blend(a: np.ndarray, b: np.ndarray, factor: float) -> np.ndarray:
  """PIL ImageEnhance semantics: b + factor * (a - b), clipped."""
  out = b.astype(np.float32) + factor * (a.astype(np.float32) - b)
  return np.clip(out, 0, 255).astype(np.uint8)


def _gray(x: np.ndarray) -> np.ndarray:
  return (x @ np.array([0.299, 0.587, 0.114], np.float32))[..., None]


_FILL = (128, 128, 128)
_AFFINE = dict(resample=Image.BILINEAR, fillcolor=_FILL)


def _shear(x, m, axis):
  s = 0.3 * m
  h, w = x.shape[-3:-1]
  data = (1, s, -s * h / 2, 0, 1, 0) if axis == 1 else (1, 0, 0, s, 1, -s * w / 2)
  return _frames(lambda im: im.transform(im.size, Image.AFFINE, data, **_AFFINE), x)


def _translate(x, m, axis):
  t = 0.45 * m * x.shape[-2 if axis == 1 else -3]  # torchvision: 150/331 of the size.
  data = (1, 0, t, 0, 1, 0) if axis == 1 else (1, 0, 0, 0, 1, t)
  return _frames(lambda im: im.transform(im.size, Image.AFFINE, data, **_AFFINE), x)


def _equalize(x, m):
  del m
  return _frames(ImageOps.equalize, x)


def _autocontrast(x, m):
  del m
  lo = x.min(axis=(-3, -2), keepdims=True).astype(np.float32)
  hi = x.max(axis=(-3, -2), keepdims=True).astype(np.float32)
  scale = np.where(hi > lo, 255 / np.maximum(hi - lo, 1), 1)
  return np.clip((x - lo) * scale + np.where(hi > lo, 0, lo), 0, 255).astype(np.uint8)


# name -> (x [..., h, w, c] uint8, signed magnitude in [-1, 1]) -> same shape; magnitude 1 is
# torchvision's RandAugment bin 30.
RANDAUG_OPS = {
    'identity': lambda x, m: x,
    'shear_x': lambda x, m: _shear(x, m, 1),
    'shear_y': lambda x, m: _shear(x, m, 0),
    'translate_x': lambda x, m: _translate(x, m, 1),
    'translate_y': lambda x, m: _translate(x, m, 0),
    'rotate': lambda x, m: _frames(lambda im: im.rotate(30 * m, **_AFFINE), x),
    'brightness': lambda x, m: _blend(x, np.zeros_like(x), 1 + 0.9 * m),
    'color': lambda x, m: _blend(x, _gray(x), 1 + 0.9 * m),
    'contrast': lambda x, m: _blend(x, np.full_like(x, _gray(x).mean()), 1 + 0.9 * m),
    'sharpness': lambda x, m: _frames(lambda im: ImageEnhance.Sharpness(im).enhance(1 + 0.9 * m),
                                      x),
    'posterize': lambda x, m: x & np.uint8((0xFF << int(4 * abs(m))) & 0xFF),  # 8 -> 4 bits.
    'solarize': lambda x, m: np.where(x >= 255 * (1 - abs(m)), 255 - x, x).astype(np.uint8),
    'autocontrast': _autocontrast,
    'equalize': _equalize,
}


def randaugment(x: np.ndarray, rng: np.random.Generator, num_ops: int = 2,
                magnitude: int = 14) -> np.ndarray:
  """RandAugment (Cubuk et al. 2020), torchvision flavour: num_ops uniform ops, random sign."""
  names = list(RANDAUG_OPS)
  for op in rng.integers(len(names), size=num_ops):
    sign = 1 if rng.random() < 0.5 else -1
    x = RANDAUG_OPS[names[op]](x, sign * magnitude / 30)
  return x


def crop_flip(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Zero-pad by size/8, random crop back to size, flip half the time: [..., h, w, c]."""
  h, w = x.shape[-3:-1]
  pad = max(1, h // 8)
  lead = [(0, 0)] * (x.ndim - 3)
  padded = np.pad(x, lead + [(pad, pad), (pad, pad), (0, 0)])
  top, left = rng.integers(2 * pad + 1, size=2)
  x = padded[..., top:top + h, left:left + w, :]
  return x[..., ::-1, :] if rng.random() < 0.5 else x


def _augment(spec: _Spec, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  if spec.augment == 'none':
    return x
  x = crop_flip(x, rng)
  return randaugment(x, rng) if spec.augment == 'randaug' else x


def _stack(examples: Sequence[Example]) -> Example:
  return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def _normalise(spec: _Spec, images: np.ndarray) -> np.ndarray:
  mean, std = np.asarray(spec.info.mean, np.float32), np.asarray(spec.info.std, np.float32)
  return images.astype(np.float32) * (1 / (255 * std)) - mean / std


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

  Yields dict(image=float32 [b, *input_shape] normalised, label=float32 [b, num_classes]
  one-hot, or mixed with mixup), b = global_batch_size // process_count.
  """
  spec = _spec(data_config)
  batch = _per_process(global_batch_size, process_index, process_count)
  decode = _decoder(spec, spec.size, spec.grid)

  def example(raw, rng):
    ex = decode(raw, rng)
    return dict(image=_augment(spec, ex['image'], rng), label=ex['label'])

  def finish(batch: Example, rng: np.random.Generator) -> Example:
    images = _normalise(spec, batch['image'])
    labels = np.eye(spec.info.num_classes, dtype=np.float32)[batch['label']]
    if spec.mixup > 0:
      lam = np.float32(rng.beta(spec.mixup, spec.mixup))
      images = lam * images + (1 - lam) * images[::-1]
      labels = lam * labels + (1 - lam) * labels[::-1]
    return dict(image=images, label=labels)

  ds = _train_source(spec).seed(seed).shuffle().repeat().random_map(example)
  ds = ds[process_index::process_count].batch(batch, drop_remainder=True, batch_fn=_stack)
  return ds.random_map(finish)


def eval_batches(data_config, *, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1, input_size: Optional[int] = None) -> Iterator[Example]:
  """All of the eval split once, in order, padded: dict(image, label int32 [b], mask bool [b]).

  Every process yields ceil(num_eval / global_batch_size) batches; padding has mask False.
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
  decode = _decoder(spec, size, grid)
  num = len(source)
  pad = dict(image=np.zeros(spec.input_shape(size), np.uint8), label=np.int32(0), mask=False)

  def example(index: int) -> Example:
    if index >= num:
      return pad
    return dict(decode(source[index], None), mask=True)

  def finish(batch: Example) -> Example:
    return dict(image=_normalise(spec, batch['image']), label=batch['label'],
                mask=batch['mask'])

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


def to_iterator(ds: grain.MapDataset, *, start: int = 0, num_threads: int = 2,
                prefetch: int = 2, num_workers: int = 0) -> Iterator[Example]:
  """Iterates ds[start], ds[start + 1], ..., computed ahead by threads (or processes).

  num_workers > 0 uses Grain worker processes: call it under `if __name__ == '__main__'`
  after absl flags are parsed (app.run), as Grain's multiprocessing requires.
  """
  it = ds[start:].to_iter_dataset(
      grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch))
  if num_workers:
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  return iter(it)
