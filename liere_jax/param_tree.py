"""The ViT's parameter tree: its names and shapes are an API (checkpoints, exports, fine-tuning
and the PyTorch port read them; liere_jax/model.py lists them).

  flatten / unflatten_like          nested dict <-> {('blocks', '0', 'attn', ...): leaf}
  int_keys                          Orbax's '0', '1', ... layer keys back to ints
  to_loop_params / to_scan_params   blocks/<i>/... <-> stacked blocks/... [depth, ...]
  SHAPING, shaping_fields, first_difference   the model fields that shape the tree
"""
from typing import Any, Dict, Iterable, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import traverse_util

Path = Tuple[str, ...]

# The ModelSpec fields a config sets that shape the tree (names and shapes), in the order a
# difference is named: two models that agree on these read each other's checkpoints. Every
# other field (variant, dtype, remat, scan_layers, dropout, init, pe.positions, pe.expm, ...)
# changes how the tree is computed, not the tree; the derived ones (head_dim, train_grid,
# num_prefix, pe.layers, ...) follow from these. input_size shapes the absolute embedding only
# and num_classes the head: fine-tuning (model_init.py) may change them.
SHAPING = ('patch', 'channels', 'width', 'depth', 'heads', 'mlp_dim', 'pool', 'qkv_bias',
           'norm_pre', 'pe.name', 'pe.share', 'pe.parabolas', 'input_size', 'num_classes')


def flatten(tree) -> Dict[Path, Any]:
  """Nested dict -> {path: leaf}; every key a string (layer 0 of `blocks`: ('blocks', '0'))."""
  return {tuple(map(str, path)): leaf
          for path, leaf in traverse_util.flatten_dict(tree).items()}


def unflatten_like(reference, flat: Dict[Path, Any]) -> dict:
  """The nested dict with `reference`'s keys (integer keys stay integers) and `flat`'s leaves
  (keyed as `flatten` keys them)."""
  paths = traverse_util.flatten_dict(reference, keep_empty_nodes=True)
  return traverse_util.unflatten_dict({
      path: leaf if leaf is traverse_util.empty_node else flat[tuple(map(str, path))]
      for path, leaf in paths.items()})


def int_keys(tree):
  """Orbax returns the layer indices of `blocks` as strings; the model's tree uses ints."""
  if not isinstance(tree, dict):
    return tree
  return {int(k) if isinstance(k, str) and k.isdigit() else k: int_keys(v)
          for k, v in tree.items()}


def _blocks_of(x):
  return isinstance(x, dict) and isinstance(x.get('blocks'), dict) and bool(x['blocks'])


def _is_layer(key) -> bool:
  return isinstance(key, int) or (isinstance(key, str) and key.isdigit())


def _layer(x, i: int):
  """Layer i of a stacked leaf: an array, or a ShapeDtypeStruct (its sharding less axis 0)."""
  if not isinstance(x, jax.ShapeDtypeStruct):
    return x[i]
  sharding = x.sharding
  if isinstance(sharding, jax.sharding.NamedSharding):
    sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(
        *sharding.spec[1:]))
  return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sharding)


def to_loop_params(tree):
  """Every parameter-shaped dict in `tree` (parameters, Adam's mu and nu, shapes) with stacked
  blocks/... [depth, ...] as blocks/<i>/...; a tree in that layout already is returned as is."""
  def unstack(d):
    if all(map(_is_layer, d['blocks'])):
      return d
    depth = jax.tree.leaves(d['blocks'])[0].shape[0]
    return {**d, 'blocks': {i: jax.tree.map(lambda v, i=i: _layer(v, i), d['blocks'])
                            for i in range(depth)}}
  return jax.tree.map(lambda x: unstack(x) if _blocks_of(x) else x, tree, is_leaf=_blocks_of)


def to_scan_params(tree):
  """The inverse of to_loop_params: blocks/<i>/... (int or digit-string i) stacked into
  blocks/... [depth, ...]; a stacked tree is returned as is."""
  def stack(d):
    if not all(map(_is_layer, d['blocks'])):
      return d
    layers = sorted(d['blocks'], key=int)
    if [int(k) for k in layers] != list(range(len(layers))):
      raise ValueError(f'blocks/<i> has layers {layers}; expected 0 .. {len(layers) - 1}.')
    return {**d, 'blocks': jax.tree.map(lambda *v: jnp.stack(v),
                                        *[d['blocks'][k] for k in layers])}
  return jax.tree.map(lambda x: stack(x) if _blocks_of(x) else x, tree, is_leaf=_blocks_of)


def field_value(spec, field: str):
  """A ModelSpec's value of `field` ('width', 'pe.share', ...)."""
  return getattr(spec.pe, field[3:]) if field.startswith('pe.') else getattr(spec, field)


def shaping_fields(spec) -> Dict[str, Any]:
  """{'width': 32, 'pe.share': 'none', ...}: spec's SHAPING fields, JSON-ready (lists)."""
  value = lambda v: list(v) if isinstance(v, tuple) else v
  return {field: value(field_value(spec, field)) for field in SHAPING}


def first_difference(a, b, fields: Iterable[str] = SHAPING) -> Optional[str]:
  """The first of `fields` on which ModelSpecs a and b differ, or None."""
  return next((f for f in fields if field_value(a, f) != field_value(b, f)), None)
