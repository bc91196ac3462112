"""Shared pieces of the configs in liere_jax/configs/: argument parsing and the model, data and
run sections (the ConfigDict every program takes; liere_jax.run_spec resolves and checks it)."""
import importlib.util
import math
import re
import sys
from typing import Optional

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


# What the official LieRE code ran for Table 1 (liere_jax/recipes.py): dropout 0.1 at its four
# sites, no qkv bias, PyTorch's default inits, bf16 compute with float32 parameters.
OFFICIAL_MODEL = dict(dropout=0.1, qkv_bias=False, init='official', dtype='bfloat16')


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
  m.dropout_sites = ('embed', 'attn', 'mlp_hidden', 'mlp')  # The official four (model.py).
  m.qkv_bias = True  # False matches the official LieRE layout (its to_qkv has no bias).
  m.init = 'jax'  # 'official': the official code's PyTorch default inits (model.py).
  m.dtype = 'float32'
  m.remat = 'none'  # 'block': recompute each block in the backward pass (memory at scale).
  # One lax.scan over the blocks (compile time flat in depth); None: on from depth 24
  # (spec.SCAN_FROM_DEPTH, where it is the faster step), off below.
  m.scan_layers = ml_collections.config_dict.placeholder(bool)
  m.pe = ml_collections.ConfigDict()
  m.pe.name = pe
  m.pe.positions = ml_collections.config_dict.placeholder(str)  # None: the encoding's default.
  m.pe.share = 'none'
  m.pe.init_scale = 2 * math.pi
  m.pe.expm = 'fast'
  # Products of the exponential: 'auto' (float32 on CPU, tensor-core presets on GPU / TPU) or
  # 'highest' (float32 everywhere); liere_jax.expm.
  m.pe.expm_precision = 'auto'
  m.pe.jitter = 0.0  # Training-time position noise (ComRoPE's perturbation intensity); 0 = off.
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
  c.model_parallel = 1  # Devices on the mesh's 'model' axis: heads and MLP split over them.
  c.log_every = 50
  c.eval_every = 0  # 0: evaluate at the end only.
  c.checkpoint_every = 500
  c.keep = 2  # Latest checkpoints kept (the best by eval accuracy is kept too).
  c.eval_batch_size = batch_size
  c.resolutions = ()  # eval.py: also evaluate at these input sizes (paper Fig. 7), e.g. (384,).
  c.model_init = ''  # Start from these parameters: DIR[:best|:STEP], FILE.safetensors, FILE.ckpt.
  c.model_init_head = 'load'  # 'reinit': a new head (e.g. other classes); see model_init.py.
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
  # 'none' | 'light' (crop + flip) | 'randaug' (crop, flip, our RandAugment(2, 14)) |
  # 'official_randaug' (the official RandAugment(2, 14), crop, flip) | 'videomae' (timm
  # RandAugment(randaug_policy), crop, flip).
  d.augment = 'none'
  d.crop = 'pad'  # 'pad' (pad S/8, random crop) | 'rrc' (RandomResizedCrop of the native image).
  d.randaug_policy = 'rand-m7-n4-mstd0.5-inc1'  # augment='videomae': the timm policy.
  d.random_erasing = 0.0  # Probability of erasing one random box per training example.
  d.eval_crop = 'resize_center'  # Or 'center': the native image's centre S x S, zero-padded.
  d.eval_views = (1, 1)  # Video eval (temporal, spatial) views; (5, 3) = the official protocol.
  d.mixup = 0.0  # Mixup alpha; 0 = off.
  d.image_size = 0  # Resize to this size (imagenet2012, ucf101); 0 = native.
  d.num_frames = 8
  d.frame_stride = 4
  d.grid = 9  # arrows: cells per side.
  d.num_eval = 2000  # arrows: held-out examples.
  d.num_train = 0  # arrows: training-set size (0 = unlimited when rendered on the fly).
  d.seed = 0
  # The train iterator (to_iterator): N > 0 Grain worker processes (train.py runs under app.run,
  # as they need); threads in each process; batches computed ahead by each.
  d.workers = 0
  d.threads = 2
  d.prefetch = 2
  d.normalise = 'host'  # 'device': uint8 train batches, normalised by the trainer (data/spec.py).
  d.update(overrides)
  return d


def load(spec: str) -> ml_collections.ConfigDict:
  """'configs/x.py[:args]' -> the config that file's get_config(args) returns."""
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('liere_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def unknown_override(config: ml_collections.ConfigDict, key: str) -> Optional[str]:
  """For an override --config.KEY: None if KEY names a field, else one line naming the first
  unknown part of KEY and the valid fields of its section."""
  section, where = config, 'config'
  for part in key.split('.'):
    if not isinstance(section, ml_collections.ConfigDict) or part not in section:
      fields = sorted(section.keys()) if isinstance(section, ml_collections.ConfigDict) else []
      return (f'--config.{key}: {where} has no field {part!r}; its fields are {fields}.'
              if fields else f'--config.{key}: {where} is a value, not a section.')
    section, where = section[part], f'{where}.{part}'
  return None


def parse_flags(argv):
  """absl flags parser for the entry points (app.run(main, flags_parser=parse_flags)): an
  override of a key the config lacks gets one line naming it and its section's fields."""
  from absl import flags
  try:
    return flags.FLAGS(argv)
  except Exception:  # ml_collections raises AttributeError / KeyError from inside parsing.
    spec = next((a.split('=', 1)[1] if '=' in a else argv[i + 1]
                 for i, a in enumerate(argv) if re.fullmatch(r'--?config(=.*)?', a)
                 and ('=' in a or i + 1 < len(argv))), None)
    keys = [a.lstrip('-').split('=', 1)[0].split('.', 1)[1] for a in argv
            if re.match(r'--?config\.', a)]
    if spec:
      config = load(spec)
      problems = [p for p in map(lambda k: unknown_override(config, k), keys) if p]
      if problems:
        print(problems[0], file=sys.stderr)
        sys.exit(2)
    raise
