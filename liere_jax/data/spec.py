"""The datasets and the data section of a config, resolved and checked once into a DataSpec.

  spec = resolve_data(config.data)   # Raises one clear error on a bad field.
  train_dataset(spec, ...); eval_batches(spec, ...)   # They also take the ConfigDict.

Datasets (data.name; TFDS name, input shape, classes, default splits):
  cifar100      'cifar100'                  [32, 32, 3]             100   train / test
  imagenet2012  'imagenet2012'              [S, S, 3]               1000  train / validation
  ucf101        'ucf101/ucf101_1_256'       [num_frames, S, S, 3]   101   train / test
                (frames squashed to 256 x 256), or 'ucf101/ucf101_1' (native 320 x 240 frames,
                as the official code reads them)
  arrows        'liere_arrows/grid{G}', or  [12 G, 12 G, 3]         4     train / test
                rendered on the fly
A TFDS name with a config or version ('ucf101/ucf101_2', 'cifar100:3.0.2') may be given.

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
  workers, threads, prefetch   the training iterator (pipeline.to_iterator): Grain worker
                processes (0 = threads of the main process only), threads in each process,
                batches each computes ahead. The batches are the same whatever they are;
                `python -m liere_jax.bench data --config C` times them on stand-in data.
  normalise     'host': train batches are float32, normalised on the host; 'device': uint8
                pixels, normalised by the trainer on the accelerator (normalisation(data)): 4x
                less to copy between processes and to the device, no host time (not with mixup or
                random erasing, which work on normalised values). Eval batches are float32.
Eval has no augmentation (eval_crop, eval_views). Normalisation: (x / 255 - mean) / std per
channel with the dataset's constants. O = the official code, github.com/StanfordMIMI/LieRE.
"""
import dataclasses
from typing import Optional, Tuple

import numpy as np

from liere_jax.data import arrows
from liere_jax.data import randaugment

AUGMENTS = ('none', 'light', 'randaug', 'official_randaug', 'videomae')
CROPS = ('pad', 'rrc')
EVAL_CROPS = ('resize_center', 'center')
NORMALISE = ('host', 'device')
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
        'liere_arrows', arrows.NUM_CLASSES, ('train', 'test'), (0.5,) * 3, (0.5,) * 3,
        'run `python -c "from liere_jax.data import tfds_builders; '
        'tfds_builders.prepare_arrows(\'{root}\', grid={grid})"` (nothing to download), or set '
        'data.data_dir=None to render the examples on the fly'),
}
FIELDS = ('name', 'data_dir', 'train_split', 'eval_split', 'fraction', 'augment', 'crop',
          'randaug_policy', 'random_erasing', 'eval_crop', 'eval_views', 'mixup', 'image_size',
          'num_frames', 'frame_stride', 'grid', 'num_eval', 'num_train', 'seed',
          'workers', 'threads', 'prefetch', 'normalise')
# Fields added after runs existed, with the value that reproduces those runs (read_config).
DATA_ADDED = dict(crop='pad', randaug_policy='rand-m7-n4-mstd0.5-inc1', random_erasing=0.0,
                  eval_crop='resize_center', eval_views=(1, 1), workers=0, threads=2,
                  prefetch=2, normalise='host')


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """The data section of a config, resolved (defaults filled in) and checked."""
  name: str  # Key of DATASETS.
  tfds_name: str  # What TFDS opens, with any config or version given in data.name.
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
  size: int  # Training spatial size: data.image_size, or the native size for 0.
  num_frames: int
  frame_stride: int
  grid: int
  num_eval: int
  num_train: int  # 0 = unlimited (arrows on the fly).
  seed: int
  workers: int
  threads: int
  prefetch: int
  normalise: str  # Train batches: 'host' (float32) or 'device' (uint8, the trainer's).

  @property
  def info(self) -> Dataset:
    return DATASETS[self.name]

  def input_shape(self, size: Optional[int] = None) -> Tuple[int, ...]:
    """[num_frames,] size, size, 3 (size: default the training size)."""
    size = size or self.size
    frames = (self.num_frames,) if self.name == 'ucf101' else ()
    return frames + (size, size, 3)


def resolve_data(data_config) -> DataSpec:
  """The DataSpec of a data section (ConfigDict or dict); a DataSpec is returned unchanged."""
  if isinstance(data_config, DataSpec):
    return data_config
  cfg = data_config.to_dict() if hasattr(data_config, 'to_dict') else dict(data_config)
  unknown = sorted(set(cfg) - set(FIELDS))
  if unknown:
    raise ValueError(f'data config fields {unknown} are unknown; the fields are {FIELDS}.')
  missing = [k for k in FIELDS if k not in cfg]
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
    randaugment.parse_timm_policy(cfg['randaug_policy'])  # Raises naming the bad token.
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
    if int(cfg[key]) < low:
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
  return DataSpec(
      name=name, tfds_name=tfds_name, data_dir=cfg['data_dir'] or None,
      train_split=cfg['train_split'] or info.splits[0],
      eval_split=cfg['eval_split'] or info.splits[1],
      fraction=fraction, augment=augment, crop=crop, randaug_policy=cfg['randaug_policy'],
      random_erasing=random_erasing, eval_crop=eval_crop, eval_views=views, mixup=mixup,
      size=size or native, num_frames=num_frames, frame_stride=frame_stride, grid=grid,
      num_eval=int(cfg['num_eval']), num_train=int(cfg['num_train'] or 0),
      seed=int(cfg['seed']), workers=int(cfg['workers']), threads=int(cfg['threads']),
      prefetch=int(cfg['prefetch']), normalise=normalise)


def normalisation(data) -> Tuple[np.ndarray, np.ndarray]:
  """(scale, offset) float32 [channels]: normalised = pixels * scale + offset, i.e.
  (x / 255 - mean) / std with the dataset's constants. data: a DataSpec or data section."""
  info = resolve_data(data).info
  mean, std = np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32)
  return 1 / (255 * std), -mean / std
