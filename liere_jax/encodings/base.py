"""The encoding interface, the per-layer contexts it hands to attention, and the builder.

An encoding is an NNX module, built for a model's prefix tokens (num_prefix: 1 with a CLS
token, else 0; they come first), with three hooks, all optional:
  embed(x, grid) -> x                 absolute encodings add to the tokens [B, T, D].
  context(pos) -> ctx                 once per forward pass (never per example), from token
                                      positions [T, n]: every layer's context, stacked (leading
                                      axis: the layers, or 1 when the layers share it).
  layer(ctx, i) -> LayerContext       layer i's share of it, all that layer's attention sees.
A LayerContext is a small pytree that acts inside attention:
  project(kernel, bias) -> kernel, bias   a position-free linear map of q and k folded into the
                                          qkv projection [D, 3D] (only when `projects`).
  attend(q, k) -> q, k, bias              rotates q, k [B, T, H, d] and / or gives a logit bias
                                          broadcastable to [H, T, T] (then
                                          `biased`).
  band(q) -> band or None                 the rotation as a TPU attention kernel's band, which
                                          the kernel applies to q and k itself (blocks up to 8;
                                          liere_jax.attention_kernel), or None: attend first.
  kernel_rows(q) -> rows or None          larger blocks as the TPU rotation kernel reads them
                                          (liere_jax.rotation_kernel: before the attention
                                          kernel; tokens past q's are padding), or None: attend.
  split_qkv(q) -> platforms               where q, k and v come from three products, not one
                                          (liere_jax.platforms' split_qkv: q and k rotated by
                                          the einsum).
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

from liere_jax import attention_kernel, rotation_kernel, rotations
from liere_jax.platforms import PLATFORMS
from liere_jax.encodings import registry
from liere_jax.encodings.registry import Facts


class LayerContext(struct.PyTreeNode):
  """One layer's context; this base acts as no encoding at all."""
  projects = False  # True: attention calls `project` on its qkv kernel and bias.
  biased = False  # True: `attend` gives a logit bias (XLA's attention on every platform).
  rotates = False  # True: `attend` transforms q and k.

  def project(self, kernel, bias):
    return kernel, bias

  def attend(self, q, k):
    return q, k, None

  def band(self, q):
    """The rotation of q and k as a TPU attention kernel's band (liere_jax.attention_kernel),
    where the kernel applies it itself; None: `attend` transforms them first."""
    return None

  def kernel_rows(self, q):
    """The rotation of q and k as the TPU rotation kernel reads it (liere_jax.rotation_kernel),
    where it takes the blocks; None: `attend` transforms them."""
    return None

  def split_qkv(self, q) -> frozenset:
    return frozenset()


class Rotate(LayerContext):
  """Block rotations of q and k: rot [H or 1, T, blocks, b, b] (rotations.rotate); tokens past
  q's are padding (rotations.liere_rotations' split_tokens)."""
  rotates = True
  rot: jax.Array

  def attend(self, q, k):
    rot = self._tokens(q)
    return rotations.rotate(q, rot), rotations.rotate(k, rot), None

  def _tokens(self, q):
    return self.rot[:, :q.shape[1]]

  def band(self, q):
    if self.rot.shape[-1] > attention_kernel.MAX_BLOCK:
      return None
    return attention_kernel.band(self._per_token(q), q.shape[-1])

  def kernel_rows(self, q):
    if not self._rotation_kernel_takes(q):
      return None
    heads = q.shape[2]  # Every token (padding too: the kernel reads them split over data).
    return rotation_kernel.rows(jnp.broadcast_to(self.rot, (heads,) + self.rot.shape[1:]))

  def _rotation_kernel_takes(self, q):
    """Whether the blocks fill q's heads as the rotation kernel takes them."""
    _, _, heads, d = q.shape
    k, b = self.rot.shape[-3], self.rot.shape[-1]
    return k * b == d and rotation_kernel.supported(b, d, heads)

  def _per_token(self, q):
    """rot as rotate takes it, [T, H, k, b, b] in q's dtype (H broadcast where shared)."""
    rot = jnp.swapaxes(self._tokens(q), 0, 1).astype(q.dtype)
    return jnp.broadcast_to(rot, rot.shape[:1] + q.shape[2:3] + rot.shape[2:])

  def split_qkv(self, q):
    """Where the einsum rotates q and k before attention: not inside a TPU's attention kernel
    (blocks up to 8) nor by the rotation kernel before it (LieRE64; it reads the one product
    in place)."""
    b, forms = self.rot.shape[-1], rotations.forms(self.rot.shape[-1])
    _, t, heads, d = q.shape
    kernels = b <= attention_kernel.MAX_BLOCK or (attention_kernel.supported(heads, d, t)
                                                  and self._rotation_kernel_takes(q))
    return frozenset(p for p, row in PLATFORMS.items() if row.split_qkv and forms[p] == 'einsum'
                     and not (row.attention == 'kernel' and kernels))


class Angles(LayerContext):
  """RoPE's rotations by their angles [H or 1, T, k]: blocks of 2, [[cos, -sin], [sin, cos]]
  (rotations.angle_rotations), made only where XLA applies them (`rot`); a TPU's attention
  kernel takes its band straight from cos and sin (attention_kernel.pair_band: no [..., 2, 2]
  arrays, which a TPU lays out in 8 x 128 tiles)."""
  rotates = True
  angles: jax.Array

  @property
  def rot(self):
    return rotations.angle_rotations(self.angles)

  def attend(self, q, k):
    rot = self.rot
    return rotations.rotate(q, rot), rotations.rotate(k, rot), None

  def band(self, q):
    return attention_kernel.pair_band(jnp.swapaxes(self.angles, 0, 1), q.shape[2], q.shape[-1],
                                      q.dtype)


class Bias(LayerContext):
  """A logit bias [H, T, T]."""
  biased = True
  bias: jax.Array

  def attend(self, q, k):
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

  def context(self, pos: jax.Array) -> LayerContext:
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
