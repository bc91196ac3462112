"""The converters' key checks, over the model's parameter tree (liere_jax.param_tree)."""
from typing import Dict

import numpy as np

from liere_jax.model import abstract_params
from liere_jax.param_tree import Path, flatten


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


def check_params(params, spec) -> Dict[Path, np.ndarray]:
  """`params` flattened to numpy, checked against ModelSpec `spec`'s tree (keys and shapes)."""
  expected = {'/'.join(k): v.shape for k, v in flatten(abstract_params(spec)).items()}
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  check_keys(expected, {'/'.join(k): v for k, v in flat.items()}, 'The checkpoint')
  return flat
