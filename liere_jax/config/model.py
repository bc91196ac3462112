"""The model section of a config (`config.model`, `config.model.pe`): each field declared once
with its default and doc, the builder, and `resolve`, the one place where the section becomes the
values every consumer uses (the JAX model, training, evaluation, the export, the PyTorch port).

The ConfigDict stays the user interface (configs/*.py, `--config.model.x=y`); `resolve` checks
it, fills every derived value (the variant's dims, the encoding's position mode, LieRE's
generator stacks from `share`) and returns a frozen `ModelSpec`. Nothing downstream reads a
model field with a default of its own. `ModelSpec.to_json()` is what the export writes and the
PyTorch port reads. Resolving is for a program's edges (a command line, bench, a test helper;
`resolve_stored` where a stored run's config is read): the library (ViT, the converters,
model_init, summary) takes the spec.

  spec = resolve(config.model)
  spec.width, spec.head_dim, spec.train_grid, spec.pe.positions, spec.pe.layers, ...
"""
import dataclasses
import math
from typing import Any, Dict, Optional, Tuple

import ml_collections

from liere_jax import encodings
from liere_jax.config.fields import NEW, REQUIRED, Field, Section
from liere_jax.encodings import registry
from liere_jax.positions import MODES as POSITION_MODES


def _reads(key: str, pe: dict) -> bool:
  """Whether the encoding of model.pe section `pe` reads field `key` (an option only some
  encodings read, PE_OPTION_DEFAULTS; a run of another encoding ignored it)."""
  return (key not in PE_OPTION_DEFAULTS or 'name' not in pe or
          key in registry.facts(pe['name']).option_names)


def _option_field(option: registry.Option, families) -> Field:
  """An encoding's model.pe option (declared with it, registry.Option) as a config field."""
  users = ', '.join(registry.FAMILIES[f].label.format(b='') for f in families)
  return Field(option.name, option.default, f'{users}: {option.doc}',
               added=NEW if option.added == registry.NEW else option.added)


# name, positions, every encoding's options (declared with it: registry.options()), jitter.
PE = Section('model.pe', [
    Field('name', REQUIRED, 'The encoding: any of liere_jax.encodings.NAMES (docs/encodings.md).'),
    Field('positions', None, "Position mode (liere_jax.positions.MODES); None: the encoding's "
          'default.', kind=str),
    *(_option_field(option, families) for option, families in registry.options().values()),
    Field('jitter', 0.0, "Training-time position noise (ComRoPE's perturbation intensity); "
          '0 = off.', added=0.0),
], applies=_reads)

POOLS = ('cls', 'mean')
DTYPES = ('float32', 'bfloat16')
# model.init -> the init std of the CLS token and the absolute embedding (model.py): 'jax' the
# DeiT 0.02, 'official' torch.randn (official models/vit.py:174,177).
INIT_EMBED_STD = {'jax': 0.02, 'official': 1.0}
REMAT = ('none', 'block')

MODEL = Section('model', [
    Field('variant', '', "'Ti', 'S', 'B', 'L' or 'paper_tiny' (VARIANTS); '' = width, "
          'depth and heads given.'),
    Field('width', 0, "Token width; 0 = the variant's."),
    Field('depth', 0, "Blocks; 0 = the variant's."),
    Field('heads', 0, "Attention heads; 0 = the variant's."),
    Field('mlp_dim', 0, "MLP hidden width; 0 = the variant's (4 x width)."),
    Field('patch', REQUIRED, 'Patch (tubelet) size per spatial axis, e.g. (16, 16).'),
    Field('input_size', REQUIRED, 'Training input size per spatial axis, e.g. (224, 224).'),
    Field('channels', REQUIRED, 'Input channels.', kind=int, plain=True),
    Field('num_classes', REQUIRED, 'Classes of the head.', kind=int, plain=True),
    Field('pool', 'cls', "'cls' (a CLS token) or 'mean' (mean of the tokens).", plain=True,
          choices=POOLS),
    Field('dropout', 0.0, 'Dropout rate at dropout_sites.', plain=True),
    Field('dropout_sites', ('embed', 'attn', 'mlp_hidden', 'mlp'),
          "Where dropout acts: the official four (model.py).", added=('embed', 'attn', 'mlp')),
    Field('norm_pre', False, 'A LayerNorm on every token (CLS too) before the first block: the '
          "official PaPE classifiers' encoder.norm_pre.", added=False, plain=True),
    Field('qkv_bias', True, 'False matches the official LieRE layout (its to_qkv has no bias).',
          plain=True),
    Field('init', 'jax', "'jax' (DeiT) or 'official' (the official code's PyTorch default "
          'inits; model.py).', added='jax', plain=True, choices=tuple(INIT_EMBED_STD)),
    Field('dtype', 'float32', "Compute dtype, 'float32' or 'bfloat16' (parameters stay "
          'float32).', plain=True, choices=DTYPES),
    Field('remat', 'none', "'block': recompute each block in the backward pass (memory at "
          'scale).', added='none', plain=True, choices=REMAT),
    Field('scan_layers', None, 'One lax.scan over the blocks (compile time flat in depth); '
          'None: on from depth 24 (SCAN_FROM_DEPTH), off below.', added=False, kind=bool),
    Field('pe', PE, 'The position encoding (model.pe.* above).'),
])

# What the official LieRE code ran for Table 1 (liere_jax/recipes.py): dropout 0.1 at its four
# sites, no qkv bias, PyTorch's default inits, bf16 compute with float32 parameters.
OFFICIAL_MODEL = dict(dropout=0.1, qkv_bias=False, init='official', dtype='bfloat16')


def model_config(*, pe: str, **values) -> ml_collections.ConfigDict:
  """The model section: MODEL's defaults, `values` over them (width / depth / heads / mlp_dim
  override the variant's), encoding `pe` with model.pe's defaults."""
  for key in ('patch', 'input_size'):
    if key in values:
      values[key] = tuple(values[key])
  return MODEL.build(**values, pe=PE.build(name=pe))


# name -> (width, depth, heads[, mlp_dim]); without mlp_dim the MLP is 4 x width. paper_tiny is
# the official code's "tiny" (models/model_args.py), the paper's "ViT-Tiny (22M)": 14.2M.
VARIANTS = {'Ti': (192, 12, 3), 'S': (384, 12, 6), 'B': (768, 12, 12), 'L': (1024, 24, 16),
            'paper_tiny': (384, 12, 6, 768)}
LN_EPS = 1e-5  # PyTorch's default, as in the official LieRE code.
# model.dropout_sites (model.py): the official code's four dropouts.
DROPOUT_SITES = ('embed', 'attn', 'mlp_hidden', 'mlp')
# model.scan_layers=None (the configs' default) scans models this deep and loops shallower ones
# (docs/decisions/018-scan-from-depth.md).
SCAN_FROM_DEPTH = 24
# The model.pe options that only some encodings read (encodings.Facts.options), at their
# defaults (PE); any other value is refused for the other encodings.
PE_OPTION_DEFAULTS = {key: option.default for key, (option, _) in registry.options().items()}


@dataclasses.dataclass(frozen=True)
class _PESpec:
  """The position encoding, resolved (PESpec: these fields, then every encoding's options)."""
  name: str  # 'none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere<b>',
  #             'comrope_ap<b>', 'comrope_ld<b>', 'string_cayley', 'string_circulant<b>',
  #             'paper_rope_mixed', 'paper_visionllama' (encodings.registry.NAMES).
  family: str  # name without its block size: 'liere' for every liere<b> and for
  #               paper_rope_mixed (encodings.Facts.aliases), 'comrope_ap', ...
  block: Optional[int]  # The block size b of a <b> name; None for the others.
  positions: str  # Position mode at the training grid (one of POSITION_MODES).
  layers: int  # LieRE generator stacks over layers: depth, or 1 when shared over layers.
  heads: int  # ... and over heads: heads, or 1 when shared over heads.
  jitter: float  # Training: patch positions += clip(N(0, 1) * jitter / 2, -1/2, 1/2) patches.

  @property
  def options(self) -> Dict[str, Any]:
    """{name: value} of the options its encoding reads (the keywords of its __init__)."""
    return {key: getattr(self, key) for key in registry.FAMILIES[self.family].option_names}


# The fields above, then one per option (model.pe.<option>: the config's value, as it is).
PESpec = dataclasses.make_dataclass(
    'PESpec', [(key, type(default)) for key, default in PE_OPTION_DEFAULTS.items()],
    bases=(_PESpec,), frozen=True)
PESpec.__module__, PESpec.__doc__ = __name__, _PESpec.__doc__


@dataclasses.dataclass(frozen=True)
class _ModelSpec:
  """A ViT, resolved: every field a consumer needs, no defaults left to apply (ModelSpec: these
  fields, which resolve computes, then MODEL's plain fields as they are: channels, num_classes,
  pool, dropout, qkv_bias, init, dtype, remat)."""
  variant: str
  width: int
  depth: int
  heads: int
  head_dim: int
  mlp_dim: int
  patch: Tuple[int, ...]
  input_size: Tuple[int, ...]
  train_grid: Tuple[int, ...]  # input_size // patch.
  num_prefix: int  # 1 with a CLS token (pool='cls'), else 0.
  dropout_sites: Tuple[str, ...]  # Where the dropout acts: DROPOUT_SITES, in that order.
  scan_layers: bool  # Blocks run under one lax.scan (compile time flat in depth); resolved.
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
    """The ModelSpec of to_json()'s output, of any vintage (config.model.MODEL.upgrade)."""
    obj = MODEL.upgrade(obj)
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = sorted(fields - set(obj))
    if missing:
      raise ValueError(f'A resolved model spec needs {missing}; write it with '
                       'liere_jax.config.model.resolve(config.model).to_json().')
    kw = {k: tuple(obj[k]) if k in ('patch', 'input_size', 'train_grid', 'dropout_sites')
          else obj[k] for k in fields}
    kw['pe'] = PESpec(**{f.name: obj['pe'][f.name] for f in dataclasses.fields(PESpec)})
    return cls(**kw)


ModelSpec = dataclasses.make_dataclass('ModelSpec', MODEL.spec_fields(), bases=(_ModelSpec,),
                                       frozen=True)
ModelSpec.__module__, ModelSpec.__doc__ = __name__, _ModelSpec.__doc__


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
  """The model section (ConfigDict or dict) -> ModelSpec, at a program's edge (the library takes
  the spec); raises a ValueError naming the value and the fix."""
  if isinstance(model, ModelSpec):
    raise TypeError('The model is resolved already (a ModelSpec); pass the spec on as it is.')
  m = model.to_dict() if hasattr(model, 'to_dict') else dict(model)
  _check_fields(m, MODEL.names, 'model')
  missing = [k for k in MODEL.names if k not in m]
  if missing:
    raise ValueError(f'model.{missing[0]} is missing; build the model section with '
                     'liere_jax.config.model_config.')
  pe = m['pe']
  _check_fields(pe, PE.names, 'model.pe')
  missing = [k for k in PE.names if k not in pe]
  if missing:
    raise ValueError(f'model.pe.{missing[0]} is missing; build the model section with '
                     'liere_jax.config.model_config.')

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
  if not 0 <= float(m['dropout']) < 1:
    raise ValueError(f"model.dropout={m['dropout']} must be in [0, 1).")
  sites = m['dropout_sites']
  sites = (sites,) if isinstance(sites, str) else tuple(sites)
  unknown = [site for site in sites if site not in DROPOUT_SITES]
  if unknown:
    raise ValueError(f'model.dropout_sites has {unknown[0]!r}, not a site; use some of '
                     f'{DROPOUT_SITES} (e.g. --config.model.dropout_sites="(\'embed\', '
                     f'\'attn\')").')

  plain = MODEL.resolve_plain(m)  # Each as declared: its type, one of its choices.
  head_dim = width // heads
  pe_spec = _resolve_pe(pe, width=width, depth=depth, heads=heads, n_dims=len(patch))
  return ModelSpec(
      variant=variant, width=width, depth=depth, heads=heads, head_dim=head_dim,
      mlp_dim=mlp_dim, patch=patch, input_size=size,
      train_grid=tuple(s // p for s, p in zip(size, patch)),
      num_prefix=int(plain['pool'] == 'cls'),
      dropout_sites=tuple(site for site in DROPOUT_SITES if site in sites),
      layer_norm_eps=LN_EPS, scan_layers=(
          depth >= SCAN_FROM_DEPTH if m['scan_layers'] is None else bool(m['scan_layers'])),
      pe=pe_spec, **plain)


def resolve_stored(model) -> ModelSpec:
  """The ModelSpec of the model section a run stored (its config.json, read back through
  liere_jax.config.run.upgrade): the one way a stored run's model is resolved. An option its
  encoding ignored then and refuses now is reset to its default, which is what it meant."""
  m = model.to_dict() if hasattr(model, 'to_dict') else dict(model)
  try:
    return resolve(m)
  except ValueError:
    pe = _reset_unread_options(m['pe'])
    if pe == m['pe']:
      raise
    return resolve({**m, 'pe': pe})


def _reset_unread_options(pe: dict) -> dict:
  """The model.pe section `pe` with every option its encoding does not read (Facts.options,
  positions and jitter where it reads no positions) at its default."""
  facts = registry.facts(pe['name'])
  unread = {k: v for k, v in PE_OPTION_DEFAULTS.items() if k not in facts.option_names}
  return {**pe, **unread, **({} if facts.reads_positions else dict(positions=None, jitter=0.0))}


def _resolve_pe(pe: dict, *, width: int, depth: int, heads: int, n_dims: int) -> PESpec:
  """The model.pe section -> PESpec; options the encoding does not read must be unset."""
  name = pe['name']
  family, block = registry.parse(name)
  facts = registry.facts(name)  # Raises on an unknown name.
  encodings.validate(family, block=block, head_dim=width // heads, width=width, n_dims=n_dims,
                     name=name)
  for key, default in PE_OPTION_DEFAULTS.items():
    value = pe[key]
    if key not in facts.option_names and (value != default if isinstance(default, str) else
                                          not math.isclose(float(value), default, rel_tol=1e-9)):
      users = [f.family + '<b>' * f.blocks for f in registry.FAMILIES.values()
               if key in f.option_names]
      raise ValueError(f'model.pe.{key}={value!r} does not apply to pe={name} (only to '
                       f"{', '.join(users)}); leave it at {default!r}.")
  encodings.encoding_class(family).check_options(pe, name=name)
  if pe['positions'] is not None and not facts.reads_positions:
    raise ValueError(f"model.pe.positions={pe['positions']!r} does not apply to pe={name} (it "
                     'reads no positions); leave it at None.')
  positions = pe['positions'] or facts.positions
  if positions not in POSITION_MODES:
    raise ValueError(f'model.pe.positions={positions!r} is unknown; use one of '
                     f'{POSITION_MODES} or None for the encoding default.')
  jitter = float(pe['jitter'])
  if not (math.isfinite(jitter) and jitter >= 0) or (jitter and not facts.reads_positions):
    raise ValueError(f'model.pe.jitter={jitter} must be >= 0 (0 = off; ComRoPE trains with 1)'
                     + (f', and pe={name!r} reads no positions: set it to 0.'
                        if not facts.reads_positions else '.'))
  share = pe['share']
  return PESpec(name=name, family=family, block=block, positions=positions,
                layers=1 if share in ('layers', 'all') else depth,
                heads=1 if share in ('heads', 'all') else heads, jitter=jitter,
                **{key: _typed(pe[key], default) for key, default in PE_OPTION_DEFAULTS.items()})


def _typed(value, default):
  """An option's value as its default's type (an int for a float option, a JSON list for a
  tuple one)."""
  if isinstance(default, (float, tuple)) or type(default) is int:
    return type(default)(value)
  return value
