"""The model section's fields (`config.model`, `config.model.pe`): each declared once, with its
default and doc; liere_jax.spec checks them and resolves the section into a ModelSpec."""
import math

import ml_collections

from liere_jax.config.fields import REQUIRED, Field, Section

PE = Section('model.pe', [
    Field('name', REQUIRED, 'The encoding: any of liere_jax.encodings.NAMES (docs/encodings.md).'),
    Field('positions', None, "Position mode (liere_jax.positions.MODES); None: the encoding's "
          'default.', kind=str),
    Field('share', 'none', "LieRE: generators shared over 'none', 'layers', 'heads' or 'all'."),
    Field('init_scale', 2 * math.pi, 'LieRE: generators ~ U[0, 1) * init_scale.'),
    Field('expm', 'fast', 'LieRE: the exponential (liere_jax.expm.METHODS).'),
    Field('expm_precision', 'auto', "LieRE: the exponential's products, 'auto' (float32 on CPU, "
          "tensor-core presets on GPU / TPU) or 'highest' (float32 everywhere).",
          added='highest'),
    Field('jitter', 0.0, "Training-time position noise (ComRoPE's perturbation intensity); "
          '0 = off.', added=0.0),
])

MODEL = Section('model', [
    Field('variant', '', "'Ti', 'S', 'B', 'L' or 'paper_tiny' (spec.VARIANTS); '' = width, "
          'depth and heads given.'),
    Field('width', 0, "Token width; 0 = the variant's."),
    Field('depth', 0, "Blocks; 0 = the variant's."),
    Field('heads', 0, "Attention heads; 0 = the variant's."),
    Field('mlp_dim', 0, "MLP hidden width; 0 = the variant's (4 x width)."),
    Field('patch', REQUIRED, 'Patch (tubelet) size per spatial axis, e.g. (16, 16).'),
    Field('input_size', REQUIRED, 'Training input size per spatial axis, e.g. (224, 224).'),
    Field('channels', REQUIRED, 'Input channels.'),
    Field('num_classes', REQUIRED, 'Classes of the head.'),
    Field('pool', 'cls', "'cls' (a CLS token) or 'mean' (mean of the tokens)."),
    Field('dropout', 0.0, 'Dropout rate at dropout_sites.'),
    Field('dropout_sites', ('embed', 'attn', 'mlp_hidden', 'mlp'),
          "Where dropout acts: the official four (model.py).", added=('embed', 'attn', 'mlp')),
    Field('qkv_bias', True, 'False matches the official LieRE layout (its to_qkv has no bias).'),
    Field('init', 'jax', "'jax' (DeiT) or 'official' (the official code's PyTorch default "
          'inits; model.py).', added='jax'),
    Field('dtype', 'float32', "Compute dtype, 'float32' or 'bfloat16' (parameters stay "
          'float32).'),
    Field('remat', 'none', "'block': recompute each block in the backward pass (memory at "
          'scale).', added='none'),
    Field('scan_layers', None, 'One lax.scan over the blocks (compile time flat in depth); '
          'None: on from depth 24 (spec.SCAN_FROM_DEPTH), off below.', added=False, kind=bool),
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
