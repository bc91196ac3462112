"""Shared pieces of the configs in configs/: argument parsing and the model section."""
import math

import ml_collections


def parse_arg(arg: str, **defaults):
  """'pe=liere8,variant=B' -> ConfigDict over `defaults` (values take the defaults' types)."""
  cfg = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep or key not in defaults:
      raise ValueError(f'Config argument {item!r} is not one of {sorted(defaults)} '
                       '(write key=value pairs separated by commas).')
    default = defaults[key]
    if isinstance(default, bool):
      value = value.lower() in ('1', 'true', 'yes')
    elif default is not None:
      value = type(default)(value)
    cfg[key] = value
  return cfg


def model_config(*, pe: str, variant, patch, input_size, channels, num_classes, pool='cls',
                 dropout=0.0, **dims):
  """The model section; width/depth/heads/mlp_dim override the variant."""
  m = ml_collections.ConfigDict()
  m.variant = variant or ''
  for key in ('width', 'depth', 'heads', 'mlp_dim'):
    m[key] = dims.get(key, 0)  # 0: take the variant's.
  m.patch = tuple(patch)
  m.input_size = tuple(input_size)
  m.channels = channels
  m.num_classes = num_classes
  m.pool = pool
  m.dropout = dropout
  m.qkv_bias = True  # False matches the official LieRE layout (its to_qkv has no bias).
  m.dtype = 'float32'
  m.pe = ml_collections.ConfigDict()
  m.pe.name = pe
  m.pe.positions = ml_collections.config_dict.placeholder(str)  # None: the encoding's default.
  m.pe.share = 'none'
  m.pe.init_scale = 2 * math.pi
  m.pe.expm = 'fast'
  return m


def base_config(*, model, data, batch_size, total_steps, lr, warmup_steps=0, **extra):
  """A whole experiment: model, data and the training schedule (Adam + cosine)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.model = model
  c.data = data
  c.batch_size = batch_size  # Global, over all devices and processes.
  c.total_steps = total_steps
  c.lr = lr
  c.warmup_steps = warmup_steps
  c.b1, c.b2, c.eps = 0.9, 0.999, 1e-8
  c.weight_decay = 0.0
  c.grad_clip = 0.0  # Global-norm clipping; 0 = off.
  c.sharding = 'data'  # 'data' (replicated parameters) or 'fsdp' (parameters sharded too).
  c.log_every = 50
  c.eval_every = 0  # 0: evaluate at the end only.
  c.checkpoint_every = 500
  c.keep = 2  # Latest checkpoints kept (the best by eval accuracy is kept too).
  c.eval_batch_size = batch_size
  c.update(extra)
  return c


def data_config(*, name, **overrides):
  """The data section read by liere_jax.data (see its docstring for each field)."""
  d = ml_collections.ConfigDict()
  d.name = name
  d.data_dir = ml_collections.config_dict.placeholder(str)  # None: TFDS default.
  d.train_split = 'train'
  d.eval_split = 'test'
  d.fraction = 1.0  # Train on this fraction of the training set (paper Fig. 4).
  d.augment = 'none'  # 'none' | 'light' (crop + flip) | 'randaug' (RandAugment(2, 14)).
  d.mixup = 0.0  # Mixup alpha; 0 = off.
  d.image_size = 0  # Resize to this size (imagenet2012, ucf101); 0 = native.
  d.num_frames = 8
  d.frame_stride = 4
  d.grid = 9  # arrows: cells per side.
  d.num_eval = 2000  # arrows: held-out examples.
  d.seed = 0
  d.update(overrides)
  return d
