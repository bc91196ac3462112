"""Parameter trees: nested dicts <-> {path: leaf}, the model's abstract tree, key checks."""
from typing import Any, Dict, Tuple

import numpy as np
from flax import traverse_util

from liere_jax import model as model_lib
from liere_jax.spec import resolve

Path = Tuple[str, ...]


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


def abstract_params(m) -> dict:
  """The parameter tree of model section `m` as checkpoints and exports hold it (blocks/<i>/...,
  whatever model.scan_layers), with ShapeDtypeStruct leaves (nothing allocated)."""
  from flax import nnx
  abstract = nnx.eval_shape(lambda: model_lib.ViT(resolve(m), rngs=nnx.Rngs(0)))
  return model_lib.to_loop_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))


def check_keys(expected: dict, found: dict, what: str):
  """ValueError naming the first missing, unexpected or wrongly shaped key.

  expected: {name: shape, or None for any shape}; found: {name: array}.
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


def check_params(params, m) -> Dict[Path, np.ndarray]:
  """`params` flattened to numpy, checked against model section `m` (keys and shapes)."""
  expected = {'/'.join(k): v.shape for k, v in flatten(abstract_params(m)).items()}
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  check_keys(expected, {'/'.join(k): v for k, v in flat.items()}, 'The checkpoint')
  return flat
