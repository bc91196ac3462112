"""Parameter values and inputs for the official StanfordMIMI/LieRE model drawn from a seed
(numpy's PCG64 streams are the same on every platform): the official model and ours can then be
compared on the same numbers, the official code run once and only the seeds and its outputs
kept (tests/fixtures/official/, written by scripts/official_fixtures.py).
"""
import numpy as np

from liere_jax.convert.official_layout import GENERATORS


def draw_state_dict(keys_shapes, seed, zeros=()) -> dict:
  """Parameter values for the official keys [(key, shape)], in order: LieRE generators
  U[0, 2 pi) (the official init range), LayerNorm weights 1 + N(0, 0.1^2), the CLS token and
  the absolute embedding N(0, 1) (the official torch.randn), the rest N(0, 0.05^2); the keys
  in `zeros` (those the official model holds at zero, frozen: its pos_embedding under a
  relative encoding) stay 0. float32 numpy arrays."""
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


def draw_input(shape, seed) -> np.ndarray:
  """A float32 input N(0, 1), channels last [B, *spatial, C] (the official model takes it
  channels first)."""
  return np.random.default_rng(seed).normal(size=tuple(shape)).astype(np.float32)
