"""The official StanfordMIMI/LieRE `RoPEViT` state_dict layout, both ways.

The official model uses layer 0's rotations in every layer (its Transformer.forward overwrites
them at layer 0): per-layer generators export with a Layer0BugWarning unless all layers are
equal, and an import copies layer 0 to every layer (what the official model computes).
"""
import math
import warnings

import numpy as np

from liere_jax import param_tree
from liere_jax.convert import tree
from liere_jax.convert.official_args import OFFICIAL_HEAD_DIM, official_spec

GENERATORS = 'position_encoder.generator_raw_params'
_BLOCK = {('norm1', 'scale'): '0.norm.weight', ('norm1', 'bias'): '0.norm.bias',
          ('attn', 'qkv', 'kernel'): '0.fn.to_qkv.weight',
          ('attn', 'qkv', 'bias'): None,  # The official to_qkv has no bias.
          ('attn', 'proj', 'kernel'): '0.fn.to_out.0.weight',
          ('attn', 'proj', 'bias'): '0.fn.to_out.0.bias',
          ('norm2', 'scale'): '1.norm.weight', ('norm2', 'bias'): '1.norm.bias',
          ('mlp', 'fc1', 'kernel'): '1.fn.net.0.weight', ('mlp', 'fc1', 'bias'): '1.fn.net.0.bias',
          ('mlp', 'fc2', 'kernel'): '1.fn.net.3.weight', ('mlp', 'fc2', 'bias'): '1.fn.net.3.bias'}
_TOP = {('patch_embed', 'kernel'): 'to_patch_embedding.1.weight',
        ('patch_embed', 'bias'): 'to_patch_embedding.1.bias', ('cls_token',): 'cls_token',
        ('norm', 'scale'): 'mlp_head.0.weight', ('norm', 'bias'): 'mlp_head.0.bias',
        ('head', 'kernel'): 'mlp_head.1.weight', ('head', 'bias'): 'mlp_head.1.bias'}


class Layer0BugWarning(UserWarning):
  """The official RoPEViT applies layer 0's rotations in every layer."""


def _position_scale(ms):
  """c_a with (our positions on the training grid) = c_a * (official positions i / (n_a - 1))."""
  if ms.pe.positions == 'integer':
    return np.asarray([max(n - 1, 1) for n in ms.train_grid], np.float32)
  return np.ones(ms.n_dims, np.float32)  # normalized / rescaled: i / (n - 1) on that grid.


def _official_leaf(path):
  """Official name of a non-pe JAX parameter path (tuple of str); None for the qkv bias."""
  if path[0] == 'blocks':
    name = _BLOCK[tuple(path[2:])]
    return None if name is None else f'transformer.layers.{path[1]}.{name}'
  return _TOP[tuple(path)]


def _to_official(path, value):
  if path == ('patch_embed', 'kernel'):  # [*patch, C, D] -> [D, prod(patch) * C], (p.. c) order
    return value.reshape(-1, value.shape[-1]).T
  return value.T if path[-1] == 'kernel' else value


def _from_official(path, value, shape):
  if path == ('patch_embed', 'kernel'):
    return value.T.reshape(shape)
  return value.T if path[-1] == 'kernel' else value


def official_layout(params, ms):
  """JAX params -> (official state_dict {name: np.ndarray}, RoPEViT kwargs) of ModelSpec `ms`.

  Warns (Layer0BugWarning) when the generators differ between layers: the official model
  would use layer 0's rotations everywhere.
  """
  kw = official_spec(ms)
  flat = tree.check_params(params, ms)
  name = ms.pe.name
  qkv_bias = [v for k, v in flat.items() if k[-3:] == ('attn', 'qkv', 'bias')]
  if any(np.any(b != 0) for b in qkv_bias):
    raise ValueError('Cannot export to the official LieRE layout: the model has a non-zero qkv '
                     'bias (the official to_qkv has none); train with model.qkv_bias=False.')
  state = {}
  if name == 'abs':
    state['pos_embedding'] = flat[('pe', 'embedding')]
  else:
    state['pos_embedding'] = np.zeros((1, math.prod(ms.train_grid) + 1, ms.width), np.float32)
  for path, value in flat.items():
    key = None if path[0] == 'pe' else _official_leaf(path)
    if key is not None:
      state[key] = np.ascontiguousarray(_to_official(path, value))
  if kw['positional_encoding_type'] == 'liere':
    state[GENERATORS] = _export_generators(flat, ms, kw['generator_dim'])
  state = {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}
  return state, kw


def _export_generators(flat, ms, b):
  """generator_raw_params [n, L', N', b, b] (upper triangles) of our LieRE or rope_mixed."""
  c = _position_scale(ms)
  if ms.pe.name == 'rope_mixed':  # rotation e^{i theta} = LieRE b=2 with generator -theta.
    freqs = flat[('pe', 'freqs')]  # [n, L, H * pairs]
    p = np.zeros(freqs.shape + (2, 2), np.float32)
    p[..., 0, 1] = -freqs * c[:, None, None]
  else:
    g = flat[('pe', 'generators')]  # [L', H', n, k, F]
    layers, heads, n, k, _ = g.shape
    rows, cols = np.triu_indices(b, 1)
    p = np.zeros((n, layers, heads * k, b, b), np.float32)
    p[..., rows, cols] = np.transpose(g, (2, 0, 1, 3, 4)).reshape(n, layers, heads * k, -1) \
        * c[:, None, None, None]
  if p.shape[1] > 1 and any(np.any(p[:, i] != p[:, 0]) for i in range(1, p.shape[1])):
    warnings.warn(
        f'pe={ms.pe.name} (share={ms.pe.share}) has per-layer generators, but the '
        'official RoPEViT uses layer 0\'s rotations in every layer (its Transformer.forward '
        'overwrites them at layer 0): the exported model will NOT match this one. Use '
        'share=layers or share=all for an exact export.', Layer0BugWarning, stacklevel=3)
  return p


def from_official_layout(state, ms) -> dict:
  """Official state_dict -> JAX params of ModelSpec `ms` (the faithful conversion of what the
  official model computes: layer 0's generators serve every layer)."""
  kw = official_spec(ms)
  reference = tree.abstract_params(ms)
  ref_flat = param_tree.flatten(reference)
  name = ms.pe.name
  state = {k: np.asarray(v, np.float32) for k, v in state.items()}
  # Every key accounted for, every shape checked.
  expected = {'pos_embedding': ref_flat[('pe', 'embedding')].shape if name == 'abs' else
              (1, math.prod(ms.train_grid) + 1, ms.width)}
  for path, leaf in ref_flat.items():
    key = None if path[0] == 'pe' else _official_leaf(path)
    if key is not None:
      expected[key] = _to_official(path, np.empty(leaf.shape, np.uint8)).shape
  if kw['positional_encoding_type'] == 'liere':
    expected[GENERATORS] = None  # Checked below (per_layer / per_head are free).
  tree.check_keys(expected, state, 'The official state_dict')
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
                     f'force_absolute_encodings=True), which pe={name} cannot hold; import it '
                     'with pe=abs.')
  if kw['positional_encoding_type'] == 'liere':
    flat.update(_import_generators(state[GENERATORS], ms, kw['generator_dim']))
  return param_tree.unflatten_like(reference, flat)


def _import_generators(p, ms, b):
  depth, heads, n = ms.depth, ms.heads, ms.n_dims
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
  g = upper[:, 0] / _position_scale(ms)[:, None, None]  # [n, N', F]
  g = g.reshape(n, -1, k, upper.shape[-1])  # [n, H_official (1 or heads), k, F]
  if ms.pe.name == 'rope_mixed':
    freqs = np.broadcast_to(-g[..., 0], (n, heads, k)).reshape(n, 1, heads * k)
    return {('pe', 'freqs'): np.ascontiguousarray(np.broadcast_to(freqs, (n, depth, heads * k)))}
  share, layers, pe_heads = ms.pe.share, ms.pe.layers, ms.pe.heads
  if pe_heads == 1 and g.shape[1] > 1:
    if np.any(g != g[:, :1]):
      raise ValueError(f'The official generators are per head, but the config shares them '
                       f'over heads (share={share}); use share=none or share=layers.')
    g = g[:, :1]
  g = np.broadcast_to(np.transpose(g, (1, 0, 2, 3))[None], (layers, pe_heads, n, k, g.shape[-1]))
  return {('pe', 'generators'): np.ascontiguousarray(g, np.float32)}
