"""The encoding interface, the per-layer contexts it hands to attention, and the builder.

An encoding is an NNX module with three hooks, all optional:
  embed(x, grid, num_prefix) -> x     absolute encodings add to the tokens [B, T, D].
  context(pos, num_prefix) -> ctx     once per forward pass (never per example), from token
                                      positions [T, n]: every layer's context, stacked (leading
                                      axis: the layers, or 1 when the layers share it).
  layer(ctx, i) -> LayerContext       layer i's share of it, all that layer's attention sees.
A LayerContext is a small pytree that acts inside attention:
  project(kernel, bias) -> kernel, bias   a position-free linear map of q and k folded into the
                                          qkv projection [D, 3D] (only when `projects`).
  attend(q, k) -> q, k, bias              rotates q, k [B, T, H, d] and / or gives a logit bias
                                          broadcastable to [H, T, T].
Prefix tokens (CLS) sit at position 0: the identity rotation (string_cayley: its P), no ALiBi
bias.

Each family registers its class with `register('family')`; its facts are in registry.py.
"""
from typing import Dict, Sequence, Type

import jax
from flax import nnx
from flax import struct

from liere_jax import rotations
from liere_jax.encodings import registry


class LayerContext(struct.PyTreeNode):
  """One layer's context; this base acts as no encoding at all."""
  projects = False  # True: attention calls `project` on its qkv kernel and bias.

  def project(self, kernel, bias):
    return kernel, bias

  def attend(self, q, k):
    return q, k, None


class Rotate(LayerContext):
  """Block rotations of q and k: rot [H or 1, T, blocks, b, b] (rotations.rotate)."""
  rot: jax.Array

  def attend(self, q, k):
    return rotations.rotate(q, self.rot), rotations.rotate(k, self.rot), None


class Bias(LayerContext):
  """A logit bias [H, T, T]."""
  bias: jax.Array

  def attend(self, q, k):
    return q, k, self.bias


def layer(ctx: LayerContext, i) -> LayerContext:
  """Layer i's part of a stacked context (i an int or a traced index, as under lax.scan)."""
  return jax.tree.map(lambda a: a[0] if a.shape[0] == 1 else a[i], ctx)


class Encoding(nnx.Module):
  """The interface; the defaults do nothing (`pe=none`)."""
  facts: registry.Facts  # Set by `register`.

  @classmethod
  def from_spec(cls, spec, *, rngs: nnx.Rngs) -> 'Encoding':
    """The encoding of a resolved model (liere_jax.spec.ModelSpec)."""
    return cls()

  @classmethod
  def check(cls, *, block, head_dim: int, width: int, n_dims: int, name: str):
    """Rules of the family beyond its block range; raises a ValueError naming the fix."""

  def embed(self, x, grid: Sequence[int], num_prefix: int):
    return x

  def context(self, pos: jax.Array, num_prefix: int = 0) -> LayerContext:
    return LayerContext()

  def layer(self, ctx: LayerContext, i) -> LayerContext:
    return layer(ctx, i)


_CLASSES: Dict[str, Type[Encoding]] = {}


def register(family: str):
  """Class decorator: the implementation of `family` (a registry.FAMILIES entry)."""
  def add(cls):
    if family not in registry.FAMILIES:
      raise ValueError(f'Encoding family {family!r} has no facts; add them to '
                       'liere_jax/encodings/registry.py FAMILIES.')
    cls.facts = registry.FAMILIES[family]
    _CLASSES[family] = cls
    return cls
  return add


def validate(family: str, *, block, head_dim: int, width: int, n_dims: int, name: str = ''):
  """The encoding's own rules; raises a ValueError naming the bad value and the fix.

  name: the model.pe.name (default family<block>), for the messages (registry.ALIASES).
  """
  name = name or f"{family}{block or ''}"
  facts = registry.facts(family)
  if facts.blocks and block is None:
    raise ValueError(f'model.pe.name={family!r} needs a block size; use e.g. {family}8.')
  low = facts.min_block
  if facts.blocks and not low <= block <= head_dim:
    raise ValueError(f'model.pe.name={name}: block size {block} must be in [{low}, '
                     f'head_dim={head_dim}]; use e.g. {family}{max(low, min(8, head_dim))} or '
                     f'{family}{head_dim}.')
  _CLASSES[family].check(block=block, head_dim=head_dim, width=width, n_dims=n_dims, name=name)


def build(spec, *, rngs: nnx.Rngs) -> Encoding:
  """The encoding of a resolved model (liere_jax.spec.ModelSpec)."""
  return _CLASSES[spec.pe.family].from_spec(spec, rngs=rngs)


def create(name: str, *, grid: Sequence[int], heads: int, head_dim: int, depth: int = 1,
           num_prefix: int = 0, rngs: nnx.Rngs, **options) -> Encoding:
  """An encoding for attention outside our ViT: `depth` layers of `heads` heads of `head_dim`
  dims, tokens on `grid` (the training grid; one axis per position coordinate), `num_prefix`
  (0 or 1) prefix tokens first. options: model.pe fields (positions, share, init_scale, expm)."""
  from liere_jax import config_lib, spec as spec_lib  # Late: spec imports this package.
  m = config_lib.model_config(pe=name, variant='', patch=(1,) * len(grid), input_size=grid,
                              channels=1, num_classes=1, pool='cls' if num_prefix else 'mean',
                              width=heads * head_dim, depth=depth, heads=heads)
  m.pe.update(options)
  return build(spec_lib.resolve(m), rngs=rngs)


def families() -> Dict[str, Type[Encoding]]:
  """family -> its registered class."""
  return dict(_CLASSES)

