"""The official-format fixtures (tests/fixtures/official/): what the official StanfordMIMI/LieRE
code computed once for a few tiny models, read back without the official code.

A fixture holds numbers only: each case's RoPEViT arguments, its state_dict keys and shapes (as
the official model lists them), the seeds of its parameter values and input, and the logits the
official model gives. The values themselves are not stored: `state_dict` draws them again from
the seed (numpy's PCG64 streams are the same on every platform), the same draw the script
scripts/official_fixtures.py loaded into the official model.
"""
import json
import os

import numpy as np

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'official')
PATH = os.path.join(DIR, 'cases.json')
GENERATORS = 'position_encoder.generator_raw_params'


def state_dict(keys_shapes, seed, zeros=()):
  """Parameter values for the official keys [(key, shape)], in order: LieRE generators
  U[0, 2 pi) (the official init range), LayerNorm weights 1 + N(0, 0.1^2), the CLS token and
  the absolute embedding N(0, 1) (the official torch.randn), the rest N(0, 0.05^2); the keys
  in `zeros` (those the official model holds at zero, frozen: its pos_embedding under a
  relative encoding) stay 0."""
  rng = np.random.default_rng(seed)
  out = {}
  for key, shape in keys_shapes:
    shape = tuple(shape)
    if key in zeros:
      value = np.zeros(shape)
    elif key == GENERATORS:
      value = rng.uniform(0, 2 * np.pi, shape)
    elif key.endswith('norm.weight') or key == 'mlp_head.0.weight':
      value = 1 + 0.1 * rng.standard_normal(shape)
    elif key in ('cls_token', 'pos_embedding'):
      value = rng.standard_normal(shape)
    else:
      value = 0.05 * rng.standard_normal(shape)
    out[key] = value.astype(np.float32)
  return out


def inputs(shape, seed):
  """The fixed input, channels last [B, *spatial, C] (the official model takes it channels
  first)."""
  return np.random.default_rng(seed).normal(size=tuple(shape)).astype(np.float32)


def load():
  with open(PATH) as f:
    return json.load(f)
