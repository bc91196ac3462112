"""Encodings added to the tokens: none, a learned absolute embedding, fixed sin-cos features."""
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from liere_jax.encodings.base import Encoding, register
from liere_jax.positions import grid_positions


@register('none', reads_positions=False, official=True, label='None')
class NoPE(Encoding):
  pass


@register('abs', reads_positions=False, official=True, label='Absolute')
class Absolute(Encoding):
  """Learned embedding added to the tokens (DeiT-III); resized to new grids.

  Resizing is bicubic for 2D grids and (tri)linear otherwise.
  """

  def __init__(self, *, dim, train_grid, num_prefix, rngs, std=0.02):
    self.train_grid, self.num_prefix = tuple(train_grid), num_prefix
    tokens = num_prefix + math.prod(train_grid)  # std: ModelSpec.embed_std (model.init).
    self.embedding = nnx.Param(std * jax.random.normal(rngs.params(), (1, tokens, dim)))

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(dim=spec.width, train_grid=spec.train_grid, num_prefix=spec.num_prefix,
               rngs=rngs, std=spec.embed_std)

  def embed(self, x, grid):
    emb = self.embedding[...]
    if tuple(grid) != self.train_grid:
      prefix, patches = emb[:, :self.num_prefix], emb[:, self.num_prefix:]
      patches = patches.reshape(self.train_grid + (-1,))
      method = 'cubic' if len(grid) == 2 else 'linear'
      patches = jax.image.resize(patches, tuple(grid) + patches.shape[-1:], method)
      emb = jnp.concatenate([prefix, patches.reshape(1, -1, emb.shape[-1])], axis=1)
    return x + emb.astype(x.dtype)


def sincos_table(pos: np.ndarray, dim: int, temperature: float = 10000.) -> np.ndarray:
  """Fixed sin-cos features [T, dim]: dim split evenly over the n axes (unused dims zero)."""
  n = pos.shape[-1]
  k = dim // (2 * n)
  omega = 1. / temperature ** (np.arange(k) / max(k, 1))
  angles = pos[:, :, None] * omega  # [T, n, k]
  feats = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).reshape(len(pos), -1)
  return np.pad(feats, ((0, 0), (0, dim - feats.shape[-1]))).astype(np.float32)


@register('sincos', reads_positions=False, label='Sin-cos')
class SinCos(Encoding):
  """Fixed 2D/3D sin-cos embedding (MAE style) on integer positions; CLS gets zeros."""

  def __init__(self, *, dim, num_prefix):
    self.dim, self.num_prefix = dim, num_prefix

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(dim=spec.width, num_prefix=spec.num_prefix)

  @classmethod
  def check(cls, *, block, head_dim, width, n_dims, name):
    if width < 2 * n_dims:
      raise ValueError(f'sincos needs width >= {2 * n_dims}, got {width}.')

  def embed(self, x, grid):
    table = sincos_table(grid_positions(grid, grid, 'integer'), self.dim)
    table = np.concatenate([np.zeros((self.num_prefix, self.dim), np.float32), table])
    return x + jnp.asarray(table, x.dtype)
