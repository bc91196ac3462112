"""The data section of a config (`config.data`): each field declared once with its default and
doc, the builder, and `resolve_data`, which checks the section once into a DataSpec.
O = the official code, github.com/StanfordMIMI/LieRE; S = the training size (image_size, or the
native one). The datasets themselves are in liere_jax/config/datasets.py.

  spec = resolve_data(config.data)   # Raises one clear error on a bad field.
  train_dataset(spec, ...); eval_batches(spec, ...)   # They take the spec only.

More on some fields:
  augment='videomae' also samples training clips as VideoMAE's loader does (O
                videodataset.py:390-417): floor(linspace) of num_frames points over a random
                window of num_frames * stride frames; RandAugment before the crop sees the native
                image under crop='rrc' (images: PIL's antialiased bilinear as torchvision on PIL;
                video: plain bilinear as O's torch interpolate).
  eval_views    (5, 3), O's protocol (O dataset/videodataset.py:171-296): clips start at 5 evenly
                spaced points of the stride grid (short videos repeat their last frame), and 3
                S x S crops are evenly spaced along the longer side of frames resized to shorter
                side S. Eval batches then carry `video`; evaluation.py reports per-view (O's
                number) and per-video accuracy.
  data_dir      arrows with None: train is an unlimited stream (2**31 - 1 examples, or
                num_train) of seed stream `arrows.split_seed(seed, 'train')`, eval the first
                num_eval examples of the 'test' stream; with a data_dir the prepared
                liere_arrows/grid{G} is read instead (see data/write_arrows.py).
  workers, threads, prefetch   the batches are the same whatever they are; `python -m
                liere_jax.bench data --config C` times them on stand-in data.
Eval has no augmentation (eval_crop, eval_views). Normalisation: (x / 255 - mean) / std per
channel with the dataset's constants.
"""
import dataclasses
from typing import Optional, Tuple

import ml_collections

from liere_jax.config.fields import REQUIRED, Field, Section
from liere_jax.config import timm_policy
from liere_jax.config.datasets import ARROWS_CELL, DATASETS, Dataset

AUGMENTS = ('none', 'light', 'randaug', 'official_randaug', 'videomae')
CROPS = ('pad', 'rrc')
EVAL_CROPS = ('resize_center', 'center')
NORMALISE = ('host', 'device')
_RRC = "'rrc'"
DATA = Section('data', [
    Field('name', REQUIRED, "'cifar100', 'imagenet2012', 'ucf101' or 'arrows' (see "
          "liere_jax/config/datasets.py), or a TFDS name with a config or version "
          "('ucf101/ucf101_1', 'cifar100:3.0.2')."),
    Field('data_dir', None, 'TFDS data directory; None: the TFDS default ($TFDS_DATA_DIR or '
          '~/tensorflow_datasets), and arrows rendered on the fly.', kind=str),
    Field('train_split', 'train', "Training split (TFDS slicing like 'train[:90%]' works for "
          'cifar100 and imagenet2012).'),
    Field('eval_split', 'test', 'Evaluation split.'),
    Field('fraction', 1.0, 'Train on the first fraction of the training split, in (0, 1] '
          '(paper Fig. 4).', plain=True),
    Field('augment', 'none', "What a training example goes through: 'none'; 'light' (crop, "
          "flip); 'randaug' (crop, flip, our RandAugment(2, 14)); 'official_randaug' (O's "
          "RandAugment(2, 14), then crop, flip); 'videomae' (timm RandAugment(randaug_policy), "
          "then crop, flip, VideoMAE's clip sampling). Arrows needs 'none'.", plain=True),
    Field('crop', 'pad', "The crop of augment != 'none': 'pad' (decode to S, zero-pad S/8, "
          f"random S x S crop) or {_RRC} (RandomResizedCrop of the native image, area "
          '0.08-1, ratio 3/4-4/3).', added='pad', plain=True),
    Field('randaug_policy', 'rand-m7-n4-mstd0.5-inc1', "augment='videomae': the timm policy "
          "(O's default).", added='rand-m7-n4-mstd0.5-inc1', plain=True),
    Field('random_erasing', 0.0, 'Probability of one random N(0, 1) box per training example, '
          "after normalisation (O's UCF101: 0.25); 0 = off.", added=0.0, plain=True),
    Field('eval_crop', 'resize_center', "'resize_center' (shorter side to S, centre crop) or "
          "'center' (the native image's centre S x S, zero-padded: O's ImageNet).",
          added='resize_center', plain=True),
    Field('eval_views', (1, 1), 'ucf101: (temporal, spatial) views of every video; (5, 3) is '
          "O's protocol (accuracy per view and per video).", added=(1, 1)),
    Field('mixup', 0.0, 'Beta(alpha, alpha) mixup of each batch with its reverse: alpha; '
          '0 = off.', plain=True),
    Field('image_size', 0, 'S: imagenet2012 and ucf101 are resized to it (required there); '
          'cifar100 and arrows: 0 (native 32 / 12 grid).'),
    Field('num_frames', 8, 'ucf101: frames per clip.', plain=True),
    Field('frame_stride', 4, 'ucf101: frames t0, t0 + stride, ... (t0 random in training, '
          'centred in eval).', plain=True),
    Field('grid', 9, 'arrows: cells per side (12 px cells).', plain=True),
    Field('num_eval', 2000, 'arrows: held-out examples.', plain=True),
    Field('num_train', 0, 'arrows: training-set size; 0 = unlimited (rendered on the fly).',
          plain=True),
    Field('seed', 0, 'arrows on the fly: the example streams (the order and augmentation come '
          'from the run seed).', plain=True),
    Field('workers', 0, 'The train iterator: Grain worker processes; 0 = none.', added=0,
          plain=True),
    Field('threads', 2, 'The train iterator: threads in each process.', added=2, plain=True),
    Field('prefetch', 2, 'The train iterator: batches computed ahead by each process.',
          added=2, plain=True),
    Field('normalise', 'host', "'host' (float32 train batches) or 'device' (uint8 pixels, "
          'normalised by the trainer: 4x less to copy; not with mixup or random erasing).',
          added='host', plain=True),
])


def data_config(*, name: str, **values) -> ml_collections.ConfigDict:
  """The data section: DATA's defaults, `values` over them."""
  return DATA.build(name=name, **values)


@dataclasses.dataclass(frozen=True)
class _DataSpec:
  """The data section of a config, resolved (defaults filled in) and checked (DataSpec: these
  fields, which resolve_data computes, then DATA's plain fields as they are)."""
  name: str  # Key of DATASETS.
  tfds_name: str  # What TFDS opens, with any config or version given in data.name.
  data_dir: Optional[str]
  train_split: str
  eval_split: str
  eval_views: Tuple[int, int]  # (temporal, spatial).
  size: int  # Training spatial size: data.image_size, or the native size for 0.

  @property
  def info(self) -> Dataset:
    return DATASETS[self.name]

  def input_shape(self, size: Optional[int] = None) -> Tuple[int, ...]:
    """[num_frames,] size, size, 3 (size: default the training size)."""
    size = size or self.size
    frames = (self.num_frames,) if self.name == 'ucf101' else ()
    return frames + (size, size, 3)


DataSpec = dataclasses.make_dataclass('DataSpec', DATA.spec_fields(), bases=(_DataSpec,),
                                      frozen=True)
DataSpec.__module__, DataSpec.__doc__ = __name__, _DataSpec.__doc__


def resolve_data(data_config) -> DataSpec:
  """The DataSpec of a data section (ConfigDict or dict), at a program's edge (a RunSpec's data
  is one already)."""
  cfg = data_config.to_dict() if hasattr(data_config, 'to_dict') else dict(data_config)
  unknown = sorted(set(cfg) - set(DATA.names))
  if unknown:
    raise ValueError(f'data config fields {unknown} are unknown; the fields are {DATA.names}.')
  missing = [k for k in DATA.names if k not in cfg]
  if missing:
    raise ValueError(f'data.{missing[0]} is missing; build the data section with '
                     'liere_jax.config.data_config (it sets every field).')
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
    timm_policy.parse_timm_policy(cfg['randaug_policy'])  # Raises naming the bad token.
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
  native = {'cifar100': 32, 'arrows': ARROWS_CELL * grid}.get(name)
  if native is None and size <= 0:
    raise ValueError(f'data.image_size={size}: {name} images are resized to image_size x '
                     'image_size; set it (the paper uses 224).')
  if native is not None and size not in (0, native):
    raise ValueError(
        f'data.image_size={size} but {name} images are {native}x{native}'
        + (f' (grid={grid} cells of {ARROWS_CELL} px; set data.grid={size // ARROWS_CELL})'
           if name == 'arrows' else '')
        + '; set image_size=0 (native), and use eval input_size to test other resolutions.')
  for key, low, what in (('workers', 0, 'worker processes; 0 = none'),
                         ('threads', 1, 'threads in each process'),
                         ('prefetch', 1, 'batches computed ahead by each process'),
                         ('num_eval', 1, 'held-out examples'),
                         ('num_train', 0, 'training examples; 0 = unlimited')):
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise ValueError(f'--config.data.{key}={value!r} must be an integer >= {low} ({what}); '
                       f'the default is --config.data.{key}={DATA[key].default!r}.')
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
      eval_split=cfg['eval_split'] or info.splits[1], eval_views=views, size=size or native,
      **DATA.resolve_plain(cfg))


def spec_of(data, what: str) -> DataSpec:
  """`data` if it is a DataSpec, else a TypeError saying how to make one (`what` takes it)."""
  if not isinstance(data, DataSpec):
    raise TypeError(f'{what} takes a DataSpec, not a {type(data).__name__}; resolve the data '
                    'section first: liere_jax.config.data.resolve_data(config.data) (or use '
                    'the RunSpec\'s .data).')
  return data
