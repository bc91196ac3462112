"""The resolved model configuration: the one place where a config's `model` section becomes the
values every consumer uses (the JAX model, train.py, eval.py, the export, the PyTorch port).

The ConfigDict stays the user interface (configs/*.py, `--config.model.x=y`); `resolve` checks
it, fills every derived value (the variant's dims, the encoding's position mode, LieRE's
generator stacks from `share`) and returns a frozen `ModelSpec`. Nothing downstream reads a
model field with a default of its own. `ModelSpec.to_json()` is what the export writes and the
PyTorch port reads.

  spec = resolve(config.model)
  spec.width, spec.head_dim, spec.train_grid, spec.pe.positions, spec.pe.layers, ...
"""
import dataclasses
import math
import re
from typing import Optional, Tuple

from liere_jax.positions import MODES as POSITION_MODES

# name -> (width, depth, heads[, mlp_dim]); without mlp_dim the MLP is 4 x width. paper_tiny is
# the official code's "tiny" (models/model_args.py), the paper's "ViT-Tiny (22M)": 14.2M.
VARIANTS = {'Ti': (192, 12, 3), 'S': (384, 12, 6), 'B': (768, 12, 12), 'L': (1024, 24, 16),
            'paper_tiny': (384, 12, 6, 768)}
POOLS = ('cls', 'mean')
DTYPES = ('float32', 'bfloat16')
SHARE = ('none', 'layers', 'heads', 'all')
LN_EPS = 1e-5  # PyTorch's default, as in the official LieRE code.
# model.dropout_sites (model.py): the official code's four dropouts.
DROPOUT_SITES = ('embed', 'attn', 'mlp_hidden', 'mlp')
# model.init -> the init std of the CLS token and the absolute embedding (model.py): 'jax' the
# DeiT 0.02, 'official' torch.randn (official models/vit.py:174,177).
INIT_EMBED_STD = {'jax': 0.02, 'official': 1.0}
# The position mode each encoding's initialisation was designed for (IMPLEMENTATION_NOTES 2):
# LieRE's U[0, 2 pi) generators on [0, 1] positions, RoPE's frequencies on patch indices.
# ComRoPE's (i + 0.5) / n per axis is made inside the encoding from these positions
# (encodings.comrope_position_map); STRING builds on RoPE-Mixed's integer positions; the
# paper's VisionLlama ran on the official code's [0, 1] positions.
DEFAULT_POSITIONS = {'liere': 'normalized', 'comrope_ap': 'normalized',
                     'comrope_ld': 'normalized',
                     'paper_visionllama': 'normalized'}  # Every other encoding: 'integer'.
BLOCK_FAMILIES = ('liere', 'comrope_ap', 'comrope_ld', 'string_circulant')  # name = family<b>.
# Names that are another family at a fixed block size: the paper's RoPE-Mixed column ran the
# official code's LieRE with 2x2 blocks (Table 10's b = 2 row equals it).
PE_ALIASES = {'paper_rope_mixed': ('liere', 2)}
MODEL_FIELDS = ('variant', 'width', 'depth', 'heads', 'mlp_dim', 'patch', 'input_size',
                'channels', 'num_classes', 'pool', 'dropout', 'dropout_sites', 'qkv_bias', 'init',
                'dtype', 'remat', 'scan_layers', 'pe')
PE_FIELDS = ('name', 'positions', 'share', 'init_scale', 'expm', 'jitter')
# Fields added after runs and exports existed, with the value that reproduces those runs.
MODEL_ADDED = {'remat': 'none', 'scan_layers': False, 'dropout_sites': ('embed', 'attn', 'mlp'),
               'init': 'jax'}
PE_ADDED = {'jitter': 0.0}
REMAT = ('none', 'block')
# Encodings that read token positions (the rest ignore them): where jitter means something.
POSITIONLESS = ('none', 'abs', 'sincos')


def liere_block(name: str) -> Optional[int]:
  """The block size of a `liere<b>` name, else None."""
  m = re.fullmatch(r'liere(\d+)', name)
  return int(m.group(1)) if m else None


def parse_pe_name(name: str) -> Tuple[str, Optional[int]]:
  """(family, block) of a model.pe.name: 'liere8' -> ('liere', 8), 'comrope_ap4' ->
  ('comrope_ap', 4), 'string_circulant16' -> ('string_circulant', 16), 'paper_rope_mixed' ->
  ('liere', 2) (PE_ALIASES); other names ('rope_mixed', 'string_cayley', ...) are their own
  family with block None."""
  if name in PE_ALIASES:
    return PE_ALIASES[name]
  m = re.fullmatch(r'(%s)(\d+)' % '|'.join(BLOCK_FAMILIES), name)
  return (m.group(1), int(m.group(2))) if m else (name, None)


@dataclasses.dataclass(frozen=True)
class PESpec:
  """The position encoding, resolved."""
  name: str  # 'none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere<b>',
  #             'comrope_ap<b>', 'comrope_ld<b>', 'string_cayley', 'string_circulant<b>',
  #             'paper_rope_mixed', 'paper_visionllama' (encodings.NAMES).
  family: str  # name without its block size: 'liere' for every liere<b> and for
  #               paper_rope_mixed (PE_ALIASES), 'comrope_ap', ...
  block: Optional[int]  # The block size b of a <b> name; None for the others.
  positions: str  # Position mode at the training grid (one of POSITION_MODES).
  share: str  # LieRE generators shared over 'none', 'layers', 'heads' or 'all'.
  layers: int  # LieRE generator stacks over layers: depth, or 1 when shared over layers.
  heads: int  # ... and over heads: heads, or 1 when shared over heads.
  init_scale: float  # LieRE generators ~ U[0, 1) * init_scale.
  expm: str  # The exponential (liere_jax.expm.METHODS).
  jitter: float  # Training: patch positions += clip(N(0, 1) * jitter / 2, -1/2, 1/2) patches.


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A ViT, resolved: every field a consumer needs, no defaults left to apply."""
  variant: str
  width: int
  depth: int
  heads: int
  head_dim: int
  mlp_dim: int
  patch: Tuple[int, ...]
  input_size: Tuple[int, ...]
  train_grid: Tuple[int, ...]  # input_size // patch.
  channels: int
  num_classes: int
  pool: str
  num_prefix: int  # 1 with a CLS token (pool='cls'), else 0.
  dropout: float
  dropout_sites: Tuple[str, ...]  # Where the dropout acts: DROPOUT_SITES, in that order.
  qkv_bias: bool
  init: str  # 'jax' or 'official' (the official code's PyTorch defaults; model.py).
  dtype: str
  remat: str  # 'block': each block's activations are recomputed in the backward pass.
  scan_layers: bool  # Blocks run under one lax.scan (compile time flat in depth).
  layer_norm_eps: float
  pe: PESpec

  @property
  def n_dims(self) -> int:
    return len(self.patch)

  @property
  def embed_std(self) -> float:
    """Init std of the CLS token and the absolute embedding."""
    return INIT_EMBED_STD[self.init]

  def to_json(self) -> dict:
    return json_ready(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, obj: dict) -> 'ModelSpec':
    obj = {**MODEL_ADDED, **obj}
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = sorted(fields - set(obj))
    if missing:
      raise ValueError(f'A resolved model spec needs {missing}; write it with '
                       'liere_jax.spec.resolve(config.model).to_json().')
    kw = {k: tuple(obj[k]) if k in ('patch', 'input_size', 'train_grid', 'dropout_sites')
          else obj[k] for k in fields}
    pe = {**PE_ADDED, **obj['pe']}
    kw['pe'] = PESpec(**{f.name: pe[f.name] for f in dataclasses.fields(PESpec)})
    return cls(**kw)


def json_ready(x):
  """Tuples to lists, recursively (what json.dumps + json.loads would give)."""
  if isinstance(x, dict):
    return {k: json_ready(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [json_ready(v) for v in x]
  return x


def _check_fields(section: dict, fields, where: str):
  unknown = sorted(set(section) - set(fields))
  if unknown:
    raise ValueError(f'{where}.{unknown[0]} is not a field; the fields of {where} are '
                     f'{list(fields)}.')


def resolve(model) -> ModelSpec:
  """The model section (ConfigDict or dict) -> ModelSpec; raises a ValueError naming the value
  and the fix. A ModelSpec is returned as it is."""
  if isinstance(model, ModelSpec):
    return model
  from liere_jax import encodings, expm  # Late: keeps this module light for tools.
  m = {**MODEL_ADDED, **(model.to_dict() if hasattr(model, 'to_dict') else dict(model))}
  _check_fields(m, MODEL_FIELDS, 'model')
  missing = [k for k in MODEL_FIELDS if k not in m]
  if missing:
    raise ValueError(f'model.{missing[0]} is missing; build the model section with '
                     'liere_jax.config_lib.model_config.')
  pe = {**PE_ADDED, **m['pe']}
  _check_fields(pe, PE_FIELDS, 'model.pe')
  missing = [k for k in PE_FIELDS if k not in pe]
  if missing:
    raise ValueError(f'model.pe.{missing[0]} is missing; build the model section with '
                     'liere_jax.config_lib.model_config.')

  variant = m['variant'] or ''
  if variant and variant not in VARIANTS:
    raise ValueError(f'model.variant={variant!r} is unknown; use one of {list(VARIANTS)} '
                     "or variant='' with width, depth and heads.")
  dims = VARIANTS.get(variant, (0, 0, 0))
  width, depth, heads = (int(m[k] or v) for k, v in zip(('width', 'depth', 'heads'), dims))
  for key, value in (('width', width), ('depth', depth), ('heads', heads)):
    if value <= 0:
      raise ValueError(f'model.{key} is {m[key]!r} and no variant gives it; set '
                       f'--config.model.variant (one of {list(VARIANTS)}) or model.{key}.')
  if width % heads:
    raise ValueError(f'model.width={width} is not divisible by model.heads={heads}.')
  mlp_dim = int(m['mlp_dim'] or (dims[3] if len(dims) > 3 else 4 * width))
  patch, size = tuple(int(p) for p in m['patch']), tuple(int(s) for s in m['input_size'])
  if not 1 <= len(patch) <= 3 or len(patch) != len(size):
    raise ValueError(f'model.patch={patch} and model.input_size={size} need one entry per '
                     'spatial axis (1, 2 or 3 axes), the same number in both.')
  if any(p <= 0 for p in patch) or any(s % p for s, p in zip(size, patch)):
    raise ValueError(f'model.input_size={size} is not divisible by model.patch={patch}.')
  for key in ('channels', 'num_classes'):
    if int(m[key]) <= 0:
      raise ValueError(f'model.{key}={m[key]} must be positive.')
  if m['pool'] not in POOLS:
    raise ValueError(f"model.pool={m['pool']!r} is unknown; use one of {POOLS}.")
  if m['dtype'] not in DTYPES:
    raise ValueError(f"model.dtype={m['dtype']!r} is unknown; use one of {DTYPES}.")
  if m['remat'] not in REMAT:
    raise ValueError(f"model.remat={m['remat']!r} is unknown; use one of {REMAT}.")
  if not 0 <= float(m['dropout']) < 1:
    raise ValueError(f"model.dropout={m['dropout']} must be in [0, 1).")
  sites = m['dropout_sites']
  sites = (sites,) if isinstance(sites, str) else tuple(sites)
  unknown = [site for site in sites if site not in DROPOUT_SITES]
  if unknown:
    raise ValueError(f'model.dropout_sites has {unknown[0]!r}, not a site; use some of '
                     f'{DROPOUT_SITES} (e.g. --config.model.dropout_sites="(\'embed\', '
                     f'\'attn\')").')
  if m['init'] not in INIT_EMBED_STD:
    raise ValueError(f"model.init={m['init']!r} is unknown; use one of {tuple(INIT_EMBED_STD)}.")

  name = pe['name']
  family, block = parse_pe_name(name)
  head_dim = width // heads
  encodings.validate(family, block=block, head_dim=head_dim, width=width, n_dims=len(patch),
                     name=name)
  positions = pe['positions'] or DEFAULT_POSITIONS.get(family, 'integer')
  if positions not in POSITION_MODES:
    raise ValueError(f'model.pe.positions={positions!r} is unknown; use one of '
                     f'{POSITION_MODES} or None for the encoding default.')
  if pe['share'] not in SHARE:
    raise ValueError(f"model.pe.share={pe['share']!r} is unknown; use one of {SHARE}.")
  if pe['expm'] not in expm.METHODS:
    raise ValueError(f"model.pe.expm={pe['expm']!r} is unknown; use one of {expm.METHODS} "
                     '(e.g. --config.model.pe.expm=fast).')
  init_scale = float(pe['init_scale'])
  if not init_scale > 0:
    raise ValueError(f'model.pe.init_scale={init_scale} must be positive (LieRE: 2 pi).')
  jitter = float(pe['jitter'])
  if not (math.isfinite(jitter) and jitter >= 0) or (jitter and family in POSITIONLESS):
    raise ValueError(f'model.pe.jitter={jitter} must be >= 0 (0 = off; ComRoPE trains with 1)'
                     + (f', and pe={name!r} reads no positions: set it to 0.'
                        if family in POSITIONLESS else '.'))
  share = pe['share'] if family == 'liere' else 'none'
  return ModelSpec(
      variant=variant, width=width, depth=depth, heads=heads, head_dim=head_dim,
      mlp_dim=mlp_dim, patch=patch, input_size=size,
      train_grid=tuple(s // p for s, p in zip(size, patch)), channels=int(m['channels']),
      num_classes=int(m['num_classes']), pool=m['pool'], num_prefix=int(m['pool'] == 'cls'),
      dropout=float(m['dropout']),
      dropout_sites=tuple(site for site in DROPOUT_SITES if site in sites),
      qkv_bias=bool(m['qkv_bias']), init=m['init'], dtype=m['dtype'],
      remat=m['remat'], scan_layers=bool(m['scan_layers']), layer_norm_eps=LN_EPS,
      pe=PESpec(name=name, family=family, block=block, positions=positions, share=share,
                layers=1 if share in ('layers', 'all') else depth,
                heads=1 if share in ('heads', 'all') else heads,
                init_scale=init_scale, expm=pe['expm'], jitter=jitter))
