"""The encoding interface, the per-layer contexts it hands to attention, and the builder.

An encoding is an NNX module, built for a model's prefix tokens (num_prefix: 1 with a CLS
token, else 0; they come first), with three hooks, all optional:
  embed(x, grid) -> x                 absolute encodings add to the tokens [B, T, D].
  context(pos, numerics) -> ctx       once per forward pass (never per example), from token
                                      positions [T, n]: every layer's context, stacked (leading
                                      axis: the layers, or 1 when the layers share it).
  layer(ctx, i) -> LayerContext       layer i's share of it, all that layer's attention sees.
A LayerContext is a small pytree of what the encoding gives attention (liere_jax.attention
decides how it runs: `python -m liere_jax.bench plan`):
  Rotate(rot), Angles(angles)              block rotations of q and k, or RoPE's angles;
  Bias(bias)                               a logit bias broadcastable to [H, T, T] (`biased`);
  project(kernel, bias) -> kernel, bias    a position-free linear map of q and k folded into the
                                           qkv projection [D, 3D] (only when `projects`);
  attend(q, k, numerics) -> q, k, bias     the context applied by XLA to q, k [B, T, H, d].
Prefix tokens (CLS) sit at position 0: the identity rotation (string_cayley: its P), no ALiBi
bias.

Each family declares itself where its class is defined: `@register('family', **facts)` gives
the facts the rest of the library reads (registry.py reads these declarations without importing
jax), among them its model.pe options (`options=(Option(name, default, doc), ...)`: the config's
fields, declared nowhere else; `from_spec` passes their values, `spec.pe.options`, to __init__
as keywords without defaults), and the class's `check` / `check_options` hold its rules.
"""
from typing import Dict, Mapping, Sequence, Type

import jax
import jax.numpy as jnp
from flax import nnx
from flax import struct

from liere_jax import rotations
from liere_jax.encodings import registry
from liere_jax.encodings.registry import Facts


class LayerContext(struct.PyTreeNode):
  """One layer's context; this base acts as no encoding at all."""
  projects = False  # True: attention calls `project` on its qkv kernel and bias.
  biased = False  # True: `attend` gives a logit bias (XLA's attention on every platform).
  rotates = False  # True: `attend` transforms q and k.

  def project(self, kernel, bias):
    return kernel, bias

  def attend(self, q, k, numerics):
    del numerics
    return q, k, None


class Rotate(LayerContext):
  """Block rotations of q and k: rot [H or 1, T, blocks, b, b] (rotations.rotate); tokens past
  q's are padding (rotations.liere_rotations' split_tokens)."""
  rotates = True
  rot: jax.Array

  @property
  def block(self) -> int:
    return self.rot.shape[-1]

  def attend(self, q, k, numerics):
    rot = self.rot[:, :q.shape[1]]
    return rotations.rotate(q, rot, numerics), rotations.rotate(k, rot, numerics), None


class Angles(LayerContext):
  """RoPE's rotations by their angles [H or 1, T, k]: blocks of 2, [[cos, -sin], [sin, cos]]
  (rotations.angle_rotations), made only where they are applied as blocks (`rot`)."""
  rotates = True
  block = 2
  angles: jax.Array

  @property
  def rot(self):
    return rotations.angle_rotations(self.angles)

  def attend(self, q, k, numerics):
    rot = self.rot
    return rotations.rotate(q, rot, numerics), rotations.rotate(k, rot, numerics), None


class Bias(LayerContext):
  """A logit bias [H, T, T]."""
  biased = True
  bias: jax.Array

  def attend(self, q, k, numerics):
    del numerics
    return q, k, self.bias


def layer(ctx: LayerContext, i) -> LayerContext:
  """Layer i's part of a stacked context (i an int or a traced index, as under lax.scan)."""
  return jax.tree.map(lambda a: a[0] if a.shape[0] == 1 else a[i], ctx)


class Encoding(nnx.Module):
  """The interface; the defaults do nothing (`pe=none`)."""
  facts: Facts  # Set by `register`.

  @classmethod
  def from_spec(cls, spec, *, rngs: nnx.Rngs) -> 'Encoding':
    """The encoding of a resolved model (liere_jax.config.model.ModelSpec)."""
    return cls()

  @classmethod
  def check(cls, *, block, head_dim: int, width: int, n_dims: int, name: str):
    """Rules of the family beyond its block range; raises a ValueError naming the fix."""

  @classmethod
  def check_options(cls, pe: Mapping, *, name: str):
    """Rules of the model.pe options it reads (facts.options); raises a ValueError naming the
    value and the fix. The options it does not read are checked by the caller (left at their
    defaults)."""

  def embed(self, x, grid: Sequence[int]):
    return x

  def context(self, pos: jax.Array, numerics=None) -> LayerContext:
    """numerics: the plan (liere_jax.numerics; default this backend's), for encodings whose
    context is computed in a platform's form (LieRE's exponential)."""
    return LayerContext()

  def layer(self, ctx: LayerContext, i) -> LayerContext:
    return layer(ctx, i)


_CLASSES: Dict[str, Type[Encoding]] = {}


def register(family: str, **facts):
  """Class decorator: `cls` implements `family`, with these facts (registry.Facts' fields, as
  literals: registry.py reads them from the source)."""
  def add(cls):
    if family in _CLASSES:
      raise ValueError(f'Encoding family {family!r} is registered twice.')
    cls.facts = Facts(family, **facts)
    if registry.FAMILIES.get(family) != cls.facts:
      raise ValueError(f'registry.py reads the facts of {family!r} otherwise than @register '
                       f'gives them ({registry.FAMILIES.get(family)} != {cls.facts}); declare '
                       'them as literals in a module of registry.MODULES.')
    _CLASSES[family] = cls
    return cls
  return add


def validate(family: str, *, block, head_dim: int, width: int, n_dims: int, name: str = ''):
  """The encoding's own rules; raises a ValueError naming the bad value and the fix.

  name: the model.pe.name (default family<block>), for the messages (Facts.aliases).
  """
  name = name or f"{family}{block or ''}"
  cls = _CLASSES[family]
  facts = cls.facts
  if facts.blocks and block is None:
    raise ValueError(f'model.pe.name={family!r} needs a block size; use e.g. {family}8.')
  low = facts.min_block
  if facts.blocks and not low <= block <= head_dim:
    raise ValueError(f'model.pe.name={name}: block size {block} must be in [{low}, '
                     f'head_dim={head_dim}]; use e.g. {family}{max(low, min(8, head_dim))} or '
                     f'{family}{head_dim}.')
  cls.check(block=block, head_dim=head_dim, width=width, n_dims=n_dims, name=name)


def build(spec, *, rngs: nnx.Rngs) -> Encoding:
  """The encoding of a resolved model (a ModelSpec)."""
  return _CLASSES[spec.pe.family].from_spec(spec, rngs=rngs)


def families() -> Dict[str, Type[Encoding]]:
  """family -> its registered class, in registration order."""
  return dict(_CLASSES)
