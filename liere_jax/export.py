"""Export a trained run to PyTorch (our port or the official LieRE layout) and import it back.

  python -m liere_jax.export torch --workdir DIR [--step N | --best] --out FILE.safetensors
      Torch-layout weights (Linear [out, in], patch conv [D, C, *patch]) for
      liere_jax/torch_vit.py, plus FILE.json (the model config as plain JSON) beside them.
      --fold (string_cayley runs): fold STRING's P into the query / key projections and export
      the plain rope_mixed model with the same outputs.
  python -m liere_jax.export official --workdir DIR [--step N | --best] --out FILE.pt
      A state_dict that the official StanfordMIMI/LieRE `RoPEViT` loads with strict=True, plus
      FILE.json with the RoPEViT keyword arguments. Representable: 2D (square) or 3D inputs,
      CLS pooling, no qkv bias, head_dim 64, pe = liere<b> / paper_rope_mixed (their
      rope_mixed: LieRE with b = 2) / rope_mixed (naver-ai's, as LieRE with b = 2) /
      paper_visionllama (their "tiled" VisionLlama) / abs / none. The official model uses layer
      0's rotations in every layer (a bug in its Transformer.forward), so per-layer generators
      (share='none' or 'heads', rope_mixed) export with a warning unless all layers are equal.
  python -m liere_jax.export import-torch --safetensors FILE [--config FILE.json] --out-workdir DIR
  python -m liere_jax.export import-official --state-dict FILE.pt --config CONFIG.json \
      --out-workdir DIR
      Back to a params-only JAX checkpoint that eval.py / load_params read. CONFIG.json: the
      JSON written by either export, a workdir's config.json, a plain model section, or the
      official model's own description: its RoPEViT keyword arguments, or the `model` section
      of its lightning_conf YAML as JSON (model_architecture visionllama -> pe=paper_visionllama,
      rope_mixed -> paper_rope_mixed, liere -> liere<generator_dim>, absolute -> abs).
Every error is reported before anything is written (exit status 2).
"""
import argparse
import json
import math
import os
import sys
import warnings

import ml_collections
import numpy as np

from liere_jax import model as model_lib
from liere_jax.spec import resolve

FORMAT = 'liere_jax.torch_vit'
OFFICIAL_HEAD_DIM = 64  # FlexibleAttention asserts dim_head == 64.
COMMUTING = ('comrope_ap', 'comrope_ld', 'string_cayley', 'string_circulant')  # torch only.


class Layer0BugWarning(UserWarning):
  """The official RoPEViT applies layer 0's rotations in every layer."""


# ----------------------------------------------------------------------------------------------
# Configs.


def model_fields(m) -> dict:
  """Everything torch_vit.ViT needs: the resolved model (liere_jax.spec) as plain JSON."""
  return resolve(m).to_json()


def export_json(config: ml_collections.ConfigDict) -> dict:
  """The FILE.json of `export torch`: model fields + the run's whole config."""
  return {'format': FORMAT, 'version': 1, **model_fields(config.model),
          'source_config': json.loads(config.to_json())}


def _model_section(obj: dict) -> ml_collections.ConfigDict:
  """A plain model section (JSON) over config_lib's defaults."""
  from liere_jax import config_lib
  try:
    m = config_lib.model_config(pe=obj['pe']['name'], variant=obj.get('variant') or '',
                                patch=tuple(obj['patch']), input_size=tuple(obj['input_size']),
                                channels=obj['channels'], num_classes=obj['num_classes'])
  except (KeyError, TypeError) as e:
    raise ValueError(f'The model section lacks a field: {e}') from None
  for key, value in obj.items():  # A resolved spec's derived fields (head_dim, ...) are skipped.
    if key == 'pe':
      for k, v in value.items():
        if k in m.pe:
          m.pe[k] = v
    elif key in ('patch', 'input_size'):
      m[key] = tuple(value)
    elif key in m:
      m[key] = value
  return m


# The official LiereImageClassification's model sizes (models/model_args.py size_params):
# (dim, depth, heads, mlp_dim).
OFFICIAL_SIZES = {'tiny': (384, 12, 6, 768), 'base': (768, 12, 12, 3072),
                  'large': (1024, 24, 16, 4096), 'huge': (1280, 32, 16, 5120)}
# Official (rotary_embedding_per_layer, rotary_embedding_per_head) -> our model.pe.share.
OFFICIAL_SHARE = {(True, True): 'none', (False, True): 'layers', (True, False): 'heads',
                  (False, False): 'all'}


def rope_vit_kwargs(init_args: dict) -> dict:
  """The RoPEViT keyword arguments that the official LiereImageClassification builds from its
  init_args (the `model.init_args` of an official lightning_conf/*.yaml, as JSON)."""
  a = {'num_classes': 100, 'input_dimensionality': 1, 'generator_dim': 64, 'model_size': 'tiny',
       'rotary_embedding_per_layer': False, 'rotary_embedding_per_head': False,
       **init_args}  # models/model_args.py defaults.
  arch = a['model_architecture']
  if a['model_size'] not in OFFICIAL_SIZES:
    raise ValueError(f"model_size={a['model_size']!r} is unknown; the official sizes are "
                     f'{list(OFFICIAL_SIZES)}.')
  dim, depth, heads, mlp_dim = OFFICIAL_SIZES[a['model_size']]
  kw = dict(image_size=a['imsize'], patch_size=a['patch_size'], num_classes=a['num_classes'],
            dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
            input_dimensionality=a['input_dimensionality'])
  if arch in ('rope_mixed', 'liere'):  # rope_mixed: the official LieRE with 2x2 blocks.
    kw.update(positional_encoding_type='liere', phase_type='naver',
              generator_dim=2 if arch == 'rope_mixed' else a['generator_dim'],
              rotary_embedding_per_layer=a['rotary_embedding_per_layer'],
              rotary_embedding_per_head=a['rotary_embedding_per_head'], enable_ape=False)
  elif arch == 'visionllama':
    kw.update(positional_encoding_type='tiled', phase_type='inverse_exp')
  elif arch == 'absolute':
    kw.update(positional_encoding_type='absolute')
  else:
    raise ValueError(f'model_architecture={arch!r} is unknown; the official ones are '
                     "'absolute', 'visionllama', 'rope_mixed' and 'liere'.")
  return kw


def model_from_official(kw: dict) -> ml_collections.ConfigDict:
  """Our model section for official RoPEViT keyword arguments (what official_spec writes):
  tiled (VisionLlama) -> paper_visionllama, LieRE with 2x2 blocks (the official rope_mixed)
  -> paper_rope_mixed, LieRE with b x b blocks -> liere<b>, absolute -> abs."""
  from liere_jax import config_lib
  n = int(kw.get('input_dimensionality', 2))
  kind = kw.get('positional_encoding_type')
  if kind == 'tiled' and kw.get('phase_type') == 'inverse_exp':
    pe = 'paper_visionllama'
  elif kind == 'liere' and kw.get('phase_type') in ('naver', 'learned'):
    b = int(kw['generator_dim'])
    pe = 'paper_rope_mixed' if b == 2 else f'liere{b}'
  elif kind == 'absolute':
    pe = 'abs'
  else:
    raise ValueError(f"positional_encoding_type={kind!r} with phase_type="
                     f"{kw.get('phase_type')!r} has no liere_jax encoding.")
  if int(kw.get('dim_head', OFFICIAL_HEAD_DIM)) * int(kw['heads']) != int(kw['dim']):
    raise ValueError(f"dim={kw['dim']} is not heads={kw['heads']} x dim_head="
                     f"{kw.get('dim_head', OFFICIAL_HEAD_DIM)}; liere_jax has no inner width.")

  def axes(v):  # The 2D RoPEViT is square (its ViT reads v[1] of a list); 3D: (d, h, w).
    v = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * n
    return (v[-1],) * 2 if n == 2 else tuple(v)

  m = config_lib.model_config(pe=pe, variant='', patch=axes(kw['patch_size']),
                              input_size=axes(kw['image_size']),
                              channels=int(kw.get('channels', 3)),
                              num_classes=int(kw['num_classes']), pool=kw.get('pool', 'cls'),
                              dropout=float(kw.get('dropout', 0.1)), width=int(kw['dim']),
                              depth=int(kw['depth']), heads=int(kw['heads']),
                              mlp_dim=int(kw['mlp_dim']))
  m.qkv_bias = False
  if kind == 'liere':
    m.pe.share = OFFICIAL_SHARE[(bool(kw.get('rotary_embedding_per_layer', False)),
                                 bool(kw.get('rotary_embedding_per_head', False)))]
  return m


def config_from_json(obj: dict, what: str) -> ml_collections.ConfigDict:
  """A whole liere_jax config from an exported JSON, a workdir config.json, a model section,
  or an official model description: RoPEViT keyword arguments (`rope_vit_kwargs`) or a
  LiereImageClassification's init_args (`model_architecture`, ...; also under model.init_args).
  """
  if not isinstance(obj, dict):
    raise ValueError(f'{what} is not a JSON object.')
  if 'liere_model' in obj:  # The JSON beside an official export.
    obj = obj['liere_model']
  model = obj.get('model')
  init_args = model.get('init_args') if isinstance(model, dict) else None
  if init_args is not None or 'model_architecture' in obj:
    obj = {'rope_vit_kwargs': rope_vit_kwargs(init_args or obj)}
  if 'rope_vit_kwargs' in obj or 'positional_encoding_type' in obj:
    m = model_from_official(obj.get('rope_vit_kwargs', obj))
    model_fields(m)  # Validates.
    return ml_collections.ConfigDict({'model': m})
  if obj.get('format') == FORMAT:
    if obj.get('source_config'):
      config = ml_collections.ConfigDict(obj['source_config'])
      found = json.loads(json.dumps(model_fields(config.model)))
      wanted = {k: obj[k] for k in found if k in obj}
      diff = [k for k in wanted if found[k] != wanted[k]]
      if diff:
        raise ValueError(f'{what}: field {diff[0]!r} = {wanted[diff[0]]!r} disagrees with its '
                         f'source_config ({found[diff[0]]!r}); fix or remove source_config.')
      return config
    return ml_collections.ConfigDict({'model': _model_section(obj)})
  if isinstance(obj.get('model'), dict):
    config = ml_collections.ConfigDict(obj)
  elif 'patch' in obj and 'pe' in obj:
    config = ml_collections.ConfigDict({'model': _model_section(obj)})
  else:
    raise ValueError(f'{what} is neither an exported model JSON, a liere_jax config.json nor '
                     'a model section (no "model", "patch" or "pe" field).')
  model_fields(config.model)  # Validates.
  return config


def read_json(path: str, what: str) -> dict:
  if not os.path.exists(path):
    raise FileNotFoundError(f'{what} {path} does not exist.')
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f'{what} {path} is not valid JSON: {e}') from None


# ----------------------------------------------------------------------------------------------
# Parameter trees.


def _flatten(tree, prefix=()):
  """Nested dict -> {path tuple of str: leaf}."""
  out = {}
  for key, value in tree.items():
    path = prefix + (str(key),)
    if isinstance(value, dict):
      out.update(_flatten(value, path))
    else:
      out[path] = value
  return out


def _unflatten_like(reference, flat, prefix=()):
  """Rebuilds a nested dict with `reference`'s keys (ints stay ints) from `flat`."""
  return {key: (_unflatten_like(value, flat, prefix + (str(key),)) if isinstance(value, dict)
                else flat[prefix + (str(key),)])
          for key, value in reference.items()}


def abstract_params(m) -> dict:
  """The model's parameter tree with ShapeDtypeStruct leaves (nothing allocated)."""
  from flax import nnx
  abstract = nnx.eval_shape(lambda: model_lib.ViT(resolve(m), rngs=nnx.Rngs(0)))
  return nnx.to_pure_dict(nnx.state(abstract, nnx.Param))


def check_keys(expected: dict, found: dict, what: str):
  """ValueError naming the first missing, unexpected or wrongly shaped key.

  expected: {name: shape}; found: {name: array}.
  """
  missing = [k for k in expected if k not in found]
  extra = sorted(k for k in found if k not in expected)
  if missing or extra:
    parts = []
    if missing:
      parts.append(f'missing key {missing[0]!r}' +
                   (f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''))
    if extra:
      parts.append(f'unexpected key {extra[0]!r}' +
                   (f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''))
    raise ValueError(f'{what} does not match the model config: ' + '; '.join(parts) + '.')
  for key, shape in expected.items():
    if shape is not None and tuple(found[key].shape) != tuple(shape):
      raise ValueError(f'{what} does not match the model config: {key!r} has shape '
                       f'{tuple(found[key].shape)}, the config gives {tuple(shape)}.')


def check_params(params, m) -> dict:
  """{path: np.ndarray} of `params`, checked against the config's tree (keys and shapes)."""
  expected = {'/'.join(k): v.shape for k, v in _flatten(abstract_params(m)).items()}
  flat = {k: np.asarray(v) for k, v in _flatten(params).items()}
  check_keys(expected, {'/'.join(k): v for k, v in flat.items()}, 'The checkpoint')
  return flat


def _torch_leaf(path, n_spatial):
  """(torch name, jax->torch, torch->jax, shape map) of one JAX parameter."""
  *parents, leaf = path
  ident = lambda x: x
  if leaf == 'kernel' and parents == ['patch_embed']:  # [*patch, C, D] <-> [D, C, *patch]
    n = n_spatial
    fwd_axes = (n + 1, n) + tuple(range(n))
    inv_axes = tuple(range(2, n + 2)) + (1, 0)
    return ('.'.join(parents + ['weight']), lambda k: np.transpose(k, fwd_axes),
            lambda w: np.transpose(w, inv_axes), lambda s: tuple(s[a] for a in fwd_axes))
  if leaf == 'kernel':  # Linear [in, out] <-> [out, in]
    return ('.'.join(parents + ['weight']), lambda k: k.T, lambda w: w.T,
            lambda s: tuple(reversed(s)))
  if leaf == 'scale':
    return '.'.join(parents + ['weight']), ident, ident, ident
  return '.'.join(path), ident, ident, ident


def torch_layout(params, m) -> dict:
  """JAX params -> {torch name: np.ndarray} for torch_vit.ViT (checked against the config)."""
  flat = check_params(params, m)
  n = resolve(m).n_dims
  out = {}
  for path, value in flat.items():
    name, fwd, _, _ = _torch_leaf(path, n)
    out[name] = np.ascontiguousarray(fwd(value))
  return out


def from_torch_layout(state, m) -> dict:
  """{torch name: array} -> JAX params (to_pure_dict layout); the key set and every shape are
  checked (ValueError naming the first mismatched key)."""
  reference = abstract_params(m)
  n = resolve(m).n_dims
  expected, inverse = {}, {}
  for path, leaf in _flatten(reference).items():
    name, _, inv, shape = _torch_leaf(path, n)
    expected[name] = shape(tuple(leaf.shape))
    inverse[path] = (name, inv, leaf.dtype)
  check_keys(expected, state, 'The weights file')
  flat = {path: np.ascontiguousarray(inv(np.asarray(state[name]))).astype(dtype, copy=False)
          for path, (name, inv, dtype) in inverse.items()}
  return _unflatten_like(reference, flat)


# ----------------------------------------------------------------------------------------------
# The official StanfordMIMI/LieRE layout.


def _position_scale(m):
  """c_a with (our positions on the training grid) = c_a * (official positions i / (n_a - 1))."""
  ms = resolve(m)
  if ms.pe.positions == 'integer':
    return np.asarray([max(n - 1, 1) for n in ms.train_grid], np.float32)
  return np.ones(ms.n_dims, np.float32)  # normalized / rescaled: i / (n - 1) on that grid.


def official_spec(m) -> dict:
  """RoPEViT keyword arguments for the model, or ValueError naming why it is not representable."""
  ms = resolve(m)
  width, depth, heads, mlp_dim = ms.width, ms.depth, ms.heads, ms.mlp_dim
  n, name, block = ms.n_dims, ms.pe.name, ms.pe.block
  why = None
  if ms.pe.family in COMMUTING:
    why = (f'pe={name}: the official LieRE code has no ComRoPE / STRING encoding (export it with '
           '`python -m liere_jax.export torch` for liere_jax/torch_vit.py instead)')
  elif n not in (2, 3):
    why = f'{n}D inputs (the official RoPEViT handles 2D images and 3D volumes only)'
  elif n == 2 and (ms.patch[0] != ms.patch[1] or ms.input_size[0] != ms.input_size[1]):
    why = (f'non-square 2D input_size={tuple(ms.input_size)} / patch={tuple(ms.patch)} (the '
           'official 2D ViT is square)')
  elif ms.pool != 'cls':
    why = ("pool='mean' (ours has no CLS token; the official mean pooling averages the CLS "
           'token too)')
  elif width // heads != OFFICIAL_HEAD_DIM:
    why = f'head_dim={width // heads} (the official FlexibleAttention asserts dim_head == 64)'
  elif heads == 1 and width == OFFICIAL_HEAD_DIM:
    why = 'heads=1 with width=64 (the official attention then has no output projection)'
  elif name == 'rope_axial':
    why = ('pe=rope_axial: the official VisionLlama ("tiled") uses phases exp(-4 j/15) on '
           'positions in [0, 1], ours 1/100^(4j/d) on integer positions; different rotations '
           '(pe=paper_visionllama is the official one)')
  elif name == 'paper_visionllama' and ms.pe.positions == 'integer':
    why = ('pe=paper_visionllama with positions=integer: the official "tiled" encoding turns by '
           'its fixed frequencies times [0, 1] positions and has no parameter to rescale; use '
           'positions=normalized')
  elif name in ('sincos', 'alibi'):
    why = f'pe={name} (the official code has no {name} encoding)'
  if why:
    raise ValueError(f'Cannot export to the official LieRE layout: {why}.')
  kw = dict(image_size=int(ms.input_size[0]) if n == 2 else [int(s) for s in ms.input_size],
            patch_size=int(ms.patch[0]) if n == 2 else [int(p) for p in ms.patch],
            num_classes=int(m.num_classes), dim=width, depth=depth, heads=heads,
            mlp_dim=mlp_dim, input_dimensionality=n, pool='cls', channels=int(m.channels),
            dim_head=OFFICIAL_HEAD_DIM)
  if name == 'paper_visionllama':  # As the official LiereImageClassification builds it.
    kw.update(positional_encoding_type='tiled', phase_type='inverse_exp')
  elif block is not None or name == 'rope_mixed':
    share = ms.pe.share
    kw.update(positional_encoding_type='liere', phase_type='naver',
              generator_dim=block or 2, enable_ape=False,
              rotary_embedding_per_layer=share in ('none', 'heads'),
              rotary_embedding_per_head=share in ('none', 'layers'))
  else:  # abs, or none as an all-zero absolute embedding.
    kw.update(positional_encoding_type='absolute', enable_ape=True)
  return kw


def _official_leaf(path):
  """Official name of a non-pe JAX parameter path (tuple of str)."""
  if path[0] == 'blocks':
    i, sub = path[1], path[2:]
    table = {('norm1', 'scale'): '0.norm.weight', ('norm1', 'bias'): '0.norm.bias',
             ('attn', 'qkv', 'kernel'): '0.fn.to_qkv.weight',
             ('attn', 'qkv', 'bias'): None,
             ('attn', 'proj', 'kernel'): '0.fn.to_out.0.weight',
             ('attn', 'proj', 'bias'): '0.fn.to_out.0.bias',
             ('norm2', 'scale'): '1.norm.weight', ('norm2', 'bias'): '1.norm.bias',
             ('mlp', 'fc1', 'kernel'): '1.fn.net.0.weight',
             ('mlp', 'fc1', 'bias'): '1.fn.net.0.bias',
             ('mlp', 'fc2', 'kernel'): '1.fn.net.3.weight',
             ('mlp', 'fc2', 'bias'): '1.fn.net.3.bias'}
    name = table[tuple(sub)]
    return None if name is None else f'transformer.layers.{i}.{name}'
  return {('patch_embed', 'kernel'): 'to_patch_embedding.1.weight',
          ('patch_embed', 'bias'): 'to_patch_embedding.1.bias',
          ('cls_token',): 'cls_token',
          ('norm', 'scale'): 'mlp_head.0.weight', ('norm', 'bias'): 'mlp_head.0.bias',
          ('head', 'kernel'): 'mlp_head.1.weight', ('head', 'bias'): 'mlp_head.1.bias'}[path]


def _to_official(path, value):
  if path == ('patch_embed', 'kernel'):  # [*patch, C, D] -> [D, prod(patch) * C], (p.. c) order
    return value.reshape(-1, value.shape[-1]).T
  return value.T if path[-1] == 'kernel' else value


def _from_official(path, value, shape):
  if path == ('patch_embed', 'kernel'):
    return value.T.reshape(shape)
  return value.T if path[-1] == 'kernel' else value


def official_layout(params, m):
  """JAX params -> (official state_dict {name: np.ndarray}, RoPEViT kwargs).

  Warns (Layer0BugWarning) when the generators differ between layers: the official model
  would use layer 0's rotations everywhere.
  """
  kw = official_spec(m)
  flat = check_params(params, m)
  ms = resolve(m)
  width, name = ms.width, ms.pe.name
  qkv_bias = [v for k, v in flat.items() if k[-3:] == ('attn', 'qkv', 'bias')]
  if any(np.any(b != 0) for b in qkv_bias):
    raise ValueError('Cannot export to the official LieRE layout: the model has a non-zero qkv '
                     'bias (the official to_qkv has none); train with model.qkv_bias=False.')
  n_patches = math.prod(ms.train_grid)
  state = {}
  if name == 'abs':
    state['pos_embedding'] = flat[('pe', 'embedding')]
  else:
    state['pos_embedding'] = np.zeros((1, n_patches + 1, width), np.float32)
  state['cls_token'] = flat[('cls_token',)]
  for path, value in flat.items():
    if path[0] in ('pe', 'cls_token'):
      continue
    key = _official_leaf(path)
    if key is not None:
      state[key] = np.ascontiguousarray(_to_official(path, value))
  if kw['positional_encoding_type'] == 'liere':
    c = _position_scale(m)
    b = kw['generator_dim']
    if name == 'rope_mixed':  # rotation e^{i theta} = LieRE b=2 with generator -theta.
      freqs = flat[('pe', 'freqs')]  # [n, L, H * pairs]
      p = np.zeros(freqs.shape + (2, 2), np.float32)
      p[..., 0, 1] = -freqs * c[:, None, None]
    else:
      g = flat[('pe', 'generators')]  # [L', H', n, k, F]
      L_, H_, n, k, _ = g.shape
      rows, cols = np.triu_indices(b, 1)
      p = np.zeros((n, L_, H_ * k, b, b), np.float32)
      p[..., rows, cols] = np.transpose(g, (2, 0, 1, 3, 4)).reshape(n, L_, H_ * k, -1) \
          * c[:, None, None, None]
    if p.shape[1] > 1 and any(np.any(p[:, i] != p[:, 0]) for i in range(1, p.shape[1])):
      warnings.warn(
          f'pe={name} (share={ms.pe.share}) has per-layer generators, but the '
          'official RoPEViT uses layer 0\'s rotations in every layer (its Transformer.forward '
          'overwrites them at layer 0): the exported model will NOT match this one. Use '
          'share=layers or share=all for an exact export.',
          Layer0BugWarning, stacklevel=2)
    state['position_encoder.generator_raw_params'] = p
  state = {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}
  return state, kw


def from_official_layout(state, m) -> dict:
  """Official state_dict -> JAX params for config `m` (the faithful conversion of what the
  official model computes: layer 0's generators serve every layer)."""
  kw = official_spec(m)
  ms = resolve(m)
  if ms.pool != 'cls':
    raise ValueError("Importing the official layout needs pool='cls'.")
  reference = abstract_params(m)
  ref_flat = _flatten(reference)
  width, name = ms.width, ms.pe.name
  state = {k: np.asarray(v, np.float32) for k, v in state.items()}
  # Every key accounted for, every shape checked.
  expected = {'pos_embedding': ref_flat[('pe', 'embedding')].shape if name == 'abs' else
              (1, math.prod(ms.train_grid) + 1, width)}
  for path, leaf in ref_flat.items():
    if path[0] == 'pe':
      continue
    key = _official_leaf(path)
    if key is not None:
      expected[key] = _to_official(path, np.empty(leaf.shape, np.uint8)).shape
  gen_key = 'position_encoder.generator_raw_params'
  if kw['positional_encoding_type'] == 'liere':
    expected[gen_key] = None  # Checked below (per_layer / per_head are free).
  check_keys(expected, state, 'The official state_dict')
  flat = {}
  for path, leaf in ref_flat.items():
    if path[0] == 'pe':
      continue
    key = _official_leaf(path)
    if key is None:  # qkv bias (config qkv_bias=True): the official model has none.
      flat[path] = np.zeros(leaf.shape, np.float32)
    else:
      flat[path] = np.ascontiguousarray(_from_official(path, state[key], leaf.shape))
  pos = state['pos_embedding']
  if name == 'abs':
    flat[('pe', 'embedding')] = pos
  elif np.any(pos != 0):
    raise ValueError(f'The official pos_embedding is non-zero (an absolute embedding, e.g. '
                     f'force_absolute_encodings=True), which pe={name} cannot hold.')
  if kw['positional_encoding_type'] == 'liere':
    flat.update(_import_generators(state[gen_key], m, kw))
  return _unflatten_like(reference, flat)


def _import_generators(p, m, kw):
  ms = resolve(m)
  depth, heads = ms.depth, ms.heads
  n, b = ms.n_dims, kw['generator_dim']
  k = OFFICIAL_HEAD_DIM // b
  if p.ndim != 5 or p.shape[0] != n or p.shape[1] not in (1, depth) or \
      p.shape[2] not in (k, heads * k) or p.shape[3:] != (b, b):
    raise ValueError(f'The official generator_raw_params has shape {p.shape}; the config '
                     f'(pe={ms.pe.name}) needs ({n}, 1 or {depth}, {k} or {heads * k}, {b}, {b}).')
  rows, cols = np.triu_indices(b, 1)
  upper = p[..., rows, cols]  # [n, L', N', F]: the entries the official model uses.
  if upper.shape[1] > 1 and np.any(upper[:, 1:] != upper[:, :1]):
    warnings.warn('The official generators differ between layers, but the official RoPEViT '
                  'uses layer 0\'s in every layer (its layer-0 bug): importing layer 0 for '
                  'every layer, which is what the official model computes.', Layer0BugWarning,
                  stacklevel=3)
  g = upper[:, 0] / _position_scale(m)[:, None, None]  # [n, N', F]
  g = g.reshape(n, -1, k, upper.shape[-1])  # [n, H_official (1 or heads), k, F]
  if ms.pe.name == 'rope_mixed':
    freqs = np.broadcast_to(-g[..., 0], (n, heads, k)).reshape(n, 1, heads * k)
    return {('pe', 'freqs'): np.ascontiguousarray(np.broadcast_to(freqs, (n, depth, heads * k)))}
  share, L_, H_ = ms.pe.share, ms.pe.layers, ms.pe.heads
  if H_ == 1 and g.shape[1] > 1:
    if np.any(g != g[:, :1]):
      raise ValueError(f'The official generators are per head, but the config shares them '
                       f'over heads (share={share}); use share=none or share=layers.')
    g = g[:, :1]
  g = np.broadcast_to(np.transpose(g, (1, 0, 2, 3))[None], (L_, H_, n, k, g.shape[-1]))
  return {('pe', 'generators'): np.ascontiguousarray(g, np.float32)}


def fold_string_cayley(params, config: ml_collections.ConfigDict):
  """A string_cayley run -> (params, config) of the rope_mixed model with the same outputs.

  The encoding turns each head's q and k by P = (I - S)(I + S)^-1 before RoPE-Mixed:
  q_h P^T = x (W_q,h P^T) + b_q,h P^T, so P goes into the qkv kernel and bias (q and k
  columns of every layer and head) and `cayley` is dropped; `freqs` stay RoPE-Mixed's.
  """
  import jax
  from liere_jax import encodings
  spec = resolve(config.model)
  if spec.pe.name != 'string_cayley':
    raise ValueError(f'--fold folds string_cayley runs; this run has pe={spec.pe.name!r}.')
  pe = {k: np.asarray(v) for k, v in params['pe'].items()}
  with jax.default_device(jax.devices('cpu')[0]):
    orth = np.asarray(encodings.cayley_orthogonal(pe['cayley'], spec.head_dim), np.float64)
  out = jax.tree.map(np.asarray, params)
  out['pe'] = {'freqs': pe['freqs']}
  h, d = spec.heads, spec.head_dim
  for i in range(spec.depth):
    qkv = out['blocks'][i]['attn']['qkv']
    kernel = qkv['kernel'].reshape(spec.width, 3, h, d).astype(np.float64)
    kernel[:, :2] = np.einsum('xjhe,hfe->xjhf', kernel[:, :2], orth[i])
    qkv['kernel'] = kernel.reshape(spec.width, 3 * spec.width).astype(np.float32)
    if 'bias' in qkv:
      bias = qkv['bias'].reshape(3, h, d).astype(np.float64)
      bias[:2] = np.einsum('jhe,hfe->jhf', bias[:2], orth[i])
      qkv['bias'] = bias.reshape(-1).astype(np.float32)
  folded = ml_collections.ConfigDict(config.to_dict())
  folded.model.pe.name = 'rope_mixed'
  return out, folded


# ----------------------------------------------------------------------------------------------
# Files.


def _atomic_write(path, write):
  tmp = path + '.tmp'
  write(tmp)
  os.replace(tmp, path)


def _check_out(path, suffix, flag='--out'):
  if not path.endswith(suffix):
    raise ValueError(f'{flag} {path} should end with {suffix}.')
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise FileNotFoundError(f'{flag} {path}: the folder {parent} does not exist.')


def _json_path(path):
  return os.path.splitext(path)[0] + '.json'


def _load_run(workdir, step, best):
  from liere_jax import checkpoint
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'--workdir {workdir} does not exist.')
  loaded = checkpoint.load_params(workdir, step, best=best)  # (config, params[, step])
  return loaded[0], loaded[1]


def export_torch(workdir, out, step=None, best=False, fold=False):
  _check_out(out, '.safetensors')
  config, params = _load_run(workdir, step, best)
  if fold:
    params, config = fold_string_cayley(params, config)
  state = torch_layout(params, config.model)
  meta = export_json(config)
  from safetensors.numpy import save_file
  _atomic_write(out, lambda p: save_file(state, p, metadata={
      'format': 'pt', 'liere_jax': json.dumps({k: v for k, v in meta.items()
                                               if k != 'source_config'})}))
  _atomic_write(_json_path(out), lambda p: _write_json(p, meta))
  return out, _json_path(out)


def export_official(workdir, out, step=None, best=False):
  _check_out(out, '.pt')
  config, params = _load_run(workdir, step, best)
  state, kw = official_layout(params, config.model)
  import torch
  tensors = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}
  _atomic_write(out, lambda p: torch.save(tensors, p))
  _atomic_write(_json_path(out), lambda p: _write_json(
      p, {'rope_vit_kwargs': kw, 'liere_model': export_json(config)}))
  return out, _json_path(out)


def _write_json(path, obj):
  with open(path, 'w') as f:
    json.dump(obj, f, indent=1, sort_keys=True)


def _check_out_workdir(out_workdir, config):
  from liere_jax import checkpoint
  if os.path.isdir(os.path.join(out_workdir, 'checkpoints')) and \
      os.listdir(os.path.join(out_workdir, 'checkpoints')):
    raise ValueError(f'--out-workdir {out_workdir} already holds checkpoints; use a new one.')
  checkpoint.check_same_model(out_workdir, config)


def import_torch(safetensors_path, out_workdir, config_path=None, step=0):
  from liere_jax import checkpoint
  if not os.path.exists(safetensors_path):
    raise FileNotFoundError(f'--safetensors {safetensors_path} does not exist.')
  config_path = config_path or _json_path(safetensors_path)
  config = config_from_json(read_json(config_path, 'config'), config_path)
  from safetensors.numpy import load_file
  params = from_torch_layout(load_file(safetensors_path), config.model)
  _check_out_workdir(out_workdir, config)
  checkpoint.save_params(out_workdir, config, params, step=step)
  return config, params


def load_official_state_dict(path) -> dict:
  """A state_dict from FILE.pt (torch.load(weights_only=True) only: no arbitrary unpickling);
  a Lightning checkpoint's 'state_dict' with its 'model.' prefix is accepted too."""
  import torch
  if not os.path.exists(path):
    raise FileNotFoundError(f'--state-dict {path} does not exist.')
  try:
    obj = torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:  # pickle.UnpicklingError and friends: refuse, never unpickle.
    raise ValueError(f'--state-dict {path} cannot be read with torch.load(weights_only=True) '
                     f'({type(e).__name__}): it is no plain state_dict of tensors, and this tool '
                     'never unpickles arbitrary objects.') from None
  if isinstance(obj, dict) and isinstance(obj.get('state_dict'), dict):
    obj = obj['state_dict']
  if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
    raise ValueError(f'--state-dict {path} is not a dict of tensors.')
  if obj and all(k.startswith('model.') for k in obj):
    obj = {k[len('model.'):]: v for k, v in obj.items()}
  return {k: v.detach().float().numpy() for k, v in obj.items()}


def import_official(state_dict_path, config_path, out_workdir, step=0):
  from liere_jax import checkpoint
  config = config_from_json(read_json(config_path, '--config'), config_path)
  state = load_official_state_dict(state_dict_path)
  params = from_official_layout(state, config.model)
  _check_out_workdir(out_workdir, config)
  checkpoint.save_params(out_workdir, config, params, step=step)
  return config, params


# ----------------------------------------------------------------------------------------------
# CLI.


def _parser():
  p = argparse.ArgumentParser(prog='python -m liere_jax.export',
                              description=__doc__.split('\n\n')[0])
  sub = p.add_subparsers(dest='command', required=True)
  for name, suffix in (('torch', '.safetensors'), ('official', '.pt')):
    target = 'torch_vit' if name == 'torch' else 'official RoPEViT'
    s = sub.add_parser(name, help=f'a run -> {suffix} ({target})')
    s.add_argument('--workdir', required=True, help='the training run (config.json + checkpoints)')
    s.add_argument('--step', type=int, default=None, help='checkpoint step (default: latest)')
    s.add_argument('--best', action='store_true', help='the best checkpoint by eval accuracy')
    s.add_argument('--out', required=True, help=f'output FILE{suffix}; FILE.json goes beside it')
    if name == 'torch':
      s.add_argument('--fold', action='store_true', help="string_cayley: fold P into the q/k "
                     'projections, export the equivalent rope_mixed model')
  s = sub.add_parser('import-torch', help='FILE.safetensors (torch_vit layout) -> a JAX workdir')
  s.add_argument('--safetensors', required=True)
  s.add_argument('--config', default=None, help='model JSON (default: FILE.json beside it)')
  s.add_argument('--out-workdir', required=True)
  s = sub.add_parser('import-official', help='official RoPEViT state_dict -> a JAX workdir')
  s.add_argument('--state-dict', required=True, help='FILE.pt (read with weights_only=True)')
  s.add_argument('--config', required=True,
                 help='the model: the JSON of an export, a config.json, a model section, or the '
                 'official RoPEViT kwargs / lightning_conf model section as JSON')
  s.add_argument('--out-workdir', required=True)
  return p


def main(argv=None) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  try:
    if args.command in ('torch', 'official'):
      if args.best and args.step is not None:
        raise ValueError('Give --step or --best, not both.')
      if args.command == 'torch':
        paths = export_torch(args.workdir, args.out, args.step, args.best, fold=args.fold)
      else:
        paths = export_official(args.workdir, args.out, args.step, args.best)
      for path in paths:
        print(f'wrote {path}')
    elif args.command == 'import-torch':
      import_torch(args.safetensors, args.out_workdir, args.config)
      print(f'wrote a params-only checkpoint to {args.out_workdir}')
    else:
      import_official(args.state_dict, args.config, args.out_workdir)
      print(f'wrote a params-only checkpoint to {args.out_workdir}')
  except (ValueError, FileNotFoundError, KeyError) as e:
    msg = e.args[0] if isinstance(e, KeyError) and e.args else e
    parser.exit(2, f'{parser.prog} {args.command}: error: {msg}\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
