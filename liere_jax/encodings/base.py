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
  attend(q, k, numerics) -> q, k, bias     the context applied by XLA to q, k [B, T, H, d];
  Lift(u, weights)                         PaPE's parabolic bias as channels added to q and k
                                           (`lifts`): attention calls lift(x, q, k) after
                                           attend, with x its input [B, T, D], for q', k'
                                           [B, T, H, d'] (d' > d); the softmax keeps the scale
                                           d**-0.5 and v its d channels (XLA lifts; the
                                           softmax runs where attention.path says: a TPU's
                                           kernel, cuDNN, or XLA's explicit one).
Prefix tokens (CLS) sit at position 0: the identity rotation (string_cayley: its P), no ALiBi
bias.

Each family declares itself where its class is defined: `@register('family', **facts)` gives
the facts the rest of the library reads (registry.py reads these declarations without importing
jax), among them its model.pe options (`options=(Option(name, default, doc), ...)`: the config's
fields, declared nowhere else; `from_spec` passes their values, `spec.pe.options`, to __init__
as keywords without defaults), and the class's `check` / `check_options` hold its rules.
"""
import dataclasses
from typing import Dict, Mapping, Sequence, Type

import jax
import jax.numpy as jnp
from flax import nnx
from flax import struct

from liere_jax import positions, rotations
from liere_jax.encodings import registry
from liere_jax.encodings.registry import Facts


class LayerContext(struct.PyTreeNode):
  """One layer's context; this base acts as no encoding at all."""
  projects = False  # True: attention calls `project` on its qkv kernel and bias.
  biased = False  # True: `attend` gives a logit bias (XLA's attention on every platform).
  rotates = False  # True: `attend` transforms q and k.
  lifts = False  # True: attention lifts q and k after `attend` (`lift`, `features`).

  def project(self, kernel, bias):
    return kernel, bias

  def attend(self, q, k, numerics):
    del numerics
    return q, k, None

  def lift(self, x, q, k):
    """q, k [B, T, H, d] -> q', k' [B, T, H, d'] given the attention's input x [B, T, D]; only
    called when `lifts` (the softmax scale stays d**-0.5, v keeps its d channels)."""
    del x
    return q, k

  def features(self, x):
    """The lift as the channels it adds to q ([B, T, H, c], from x) and to k ([T, H, c]):
    q'.k' = q.k + their product; None: no channels (no lift)."""
    del x
    return None


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


class RotateEntries(LayerContext):
  """Block rotations of 4 or 8 as the attention kernel reads them (rotations.liere_entries: a
  TPU's LieRE8 where the kernel rotates by their band): entries [b, T', H d], E[m, t, h d + i] =
  R[i mod b, m] of dim i's block (kernels.attention.entries), in the model's dtype, T' >= T
  (padding tokens), split over a mesh's 'data' axis by tokens. `rot` is them as blocks, for the
  paths where XLA rotates (a lift after them, the attention maps)."""
  rotates = True
  entries: jax.Array
  head_dim: int = struct.field(pytree_node=False)

  @property
  def block(self) -> int:
    return self.entries.shape[0]

  @property
  def rot(self) -> jax.Array:
    """[H, T', k, b, b] as Rotate's (k = head_dim // b whole blocks)."""
    b, t, d = self.block, self.entries.shape[1], self.head_dim
    e = self.entries.reshape(b, t, -1, d)[..., :d // b * b].reshape(b, t, -1, d // b, b)
    return jnp.transpose(e, (2, 1, 3, 4, 0))  # [H, T', k, i, m]

  def attend(self, q, k, numerics):
    return Rotate(self.rot).attend(q, k, numerics)


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


class Lift(LayerContext):
  """PaPE's parabolic bias as a lift of q and k (arXiv 2602.01418).

  u [H, T, M]: each token's coordinates along the head's M parabola axes (PaPE: a linear map of
  its position; PaPE-RI: its M = n position coordinates times one fixed scale per head).
  weights [D, 2 H M] (PaPE: a | b, laid out (2, H, M)) or [D, H] (`isotropic`, PaPE-RI: one a
  per head for all M coordinates, no b): from the attention's input x, per token,
  a = softplus(x weights_a) > 0 and b = x weights_b. The lift
    q' = [q, sum_m (b u - a u^2), a,    2 a u - b, 0...]
    k' = [k, 1,                    -u^2, u,         0...]   (PaPE-RI: one a against -|u|^2)
  padded with zeros to a multiple of 8 channels (u centred over the tokens), gives
  q'_i . k'_j = q_i . k_j + bias_ij with
    bias_ij = -sum_m a_m(i) (u_m(i) - u_m(j))^2 + sum_m b_m(i) (u_m(i) - u_m(j)),
  a function of u(i) - u(j) only, with the query's a and b (tests/test_pape.py holds the lift
  to this T x T form). The official code lifts to the same products in d + 3M + 2 channels
  (PaPE-RI d + 2n + 1): there b's terms have channels of their own ([.., sum b u, b] .
  [.., 1, -u]); here b u_j joins 2 a u_i u_j and the two query-only terms share one channel,
  so PaPE lifts by 2M + 1 (PaPE-RI n + 2) for the same scores. The softmax scale is the
  unlifted head's d**-0.5, on the bias too. XLA's softmax adds the lift's product to q k^T
  without building q' and k' (`features`: k's channels need no batch axis); a TPU's attention
  kernel and cuDNN's take q' and k' (`lift`; liere_jax.attention.path).
  """
  lifts = True
  u: jax.Array
  weights: jax.Array
  isotropic: bool = struct.field(pytree_node=False, default=False)

  @staticmethod
  def channels(head_dim: int, m: int, isotropic: bool = False) -> int:
    """d': the lifted head size, d + 2M + 1 (PaPE-RI: d + n + 2) rounded up to a multiple of 8
    (the official code's padding)."""
    total = head_dim + (m + 2 if isotropic else 2 * m + 1)
    return -(-total // 8) * 8

  def coefficients(self, x):
    """(a [B, T, H, M] (isotropic: [B, T, H, 1]), b [B, T, H, M] or None) in float32, from x
    [B, T, D]."""
    heads, _, m = self.u.shape
    ab = jnp.dot(x, self.weights.astype(x.dtype),
                 preferred_element_type=jnp.float32).astype(jnp.float32)
    if self.isotropic:
      return jax.nn.softplus(ab)[..., None], None
    ab = ab.reshape(*x.shape[:2], 2, heads, m)
    return jax.nn.softplus(ab[:, :, 0]), ab[:, :, 1]

  def features(self, x):
    """The channels the lift adds, in float32: q's [B, T, H, c] (from x [B, T, D]) and k's
    [T, H, c] (the positions' alone), c = 2M + 1 (PaPE-RI n + 2)."""
    a, b = self.coefficients(x)
    u = jnp.swapaxes(self.u, 0, 1)  # [T, H, M]
    # Centred over the tokens: the bias reads u(i) - u(j) alone, and smaller u^2 terms cancel
    # with less float32 (or bf16) rounding in q'.k'.
    u = u - jnp.mean(u, 0, keepdims=True)
    u2 = u * u
    if self.isotropic:
      u2 = jnp.sum(u2, -1, keepdims=True)
    first, linear = -jnp.sum(a * u2, -1, keepdims=True), 2 * a * u
    if b is not None:
      first, linear = first + jnp.sum(b * u, -1, keepdims=True), linear - b
    return (jnp.concatenate([first, a, linear], -1),
            jnp.concatenate([jnp.ones(u.shape[:-1] + (1,), u.dtype), -u2, u], -1))

  def lift(self, x, q, k):
    """(q', k') [B, T, H, d'] from x [B, T, D] and q, k [B, T, H, d]."""
    qs, ks = self.features(x)
    pad = self.channels(q.shape[-1], self.u.shape[-1], self.isotropic) - q.shape[-1] - qs.shape[-1]

    def cat(x, features):
      features = jnp.broadcast_to(features, x.shape[:-1] + features.shape[-1:]).astype(x.dtype)
      return jnp.concatenate([x, features, jnp.zeros(x.shape[:-1] + (pad,), x.dtype)], -1)

    return cat(q, qs), cat(k, ks)


class Composed(LayerContext):
  """A rotary encoding's context, then a lift's: `attend` rotates q and k (`first`), `lift`
  adds the lift's channels to the rotated q and k (`then`), as in 'liere8+pape'."""
  rotates = lifts = True
  first: LayerContext
  then: LayerContext

  @property
  def projects(self):
    return self.first.projects

  def project(self, kernel, bias):
    return self.first.project(kernel, bias)

  def attend(self, q, k, numerics):
    return self.first.attend(q, k, numerics)

  def lift(self, x, q, k):
    return self.then.lift(x, q, k)

  def features(self, x):
    return self.then.features(x)


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


class Composition(Encoding):
  """'a+b': the rotary encoding a (`rotary`, its parameters under pe/rotary/) and the lift b
  (`lift`, under pe/lift/), each built as alone with its own position mode: the positions
  reach the lift converted from a's mode to b's (e.g. LieRE's i / (n - 1) to PaPE's patch
  index i). Subclassed per pair by `composition`."""
  parts: tuple = ()  # (rotary class, lift class).

  def __init__(self, rotary: Encoding, lift: Encoding, scale):
    self.rotary, self.lift, self.scale = rotary, lift, tuple(float(s) for s in scale)

  @classmethod
  def from_spec(cls, spec, *, rngs):
    (rotary_cls, lift_cls), (a, b) = cls.parts, registry.split(spec.pe.name)
    mode = lift_cls.facts.positions
    part = lambda name, family, block, part_mode: dataclasses.replace(spec, pe=dataclasses.replace(
        spec.pe, name=name, family=family, block=block, positions=part_mode))
    rotary = rotary_cls.from_spec(part(a, rotary_cls.facts.family, spec.pe.block,
                                       spec.pe.positions), rngs=rngs)
    lift = lift_cls.from_spec(part(b, lift_cls.facts.family, None, mode), rngs=rngs)
    grid = spec.train_grid
    scale = (positions.patch_step(grid, grid, mode, mode)
             / positions.patch_step(grid, grid, spec.pe.positions, spec.pe.positions))
    return cls(rotary, lift, scale)

  @classmethod
  def check_options(cls, pe, *, name):
    for part, part_name in zip(cls.parts, registry.split(name)):
      part.check_options(pe, name=part_name)

  def embed(self, x, grid):
    return self.lift.embed(self.rotary.embed(x, grid), grid)

  def context(self, pos, numerics=None):
    lift_pos = jnp.asarray(pos, jnp.float32) * jnp.asarray(self.scale, jnp.float32)
    return Composed(self.rotary.context(pos, numerics), self.lift.context(lift_pos, numerics))

  def layer(self, ctx, i):
    return Composed(self.rotary.layer(ctx.first, i), self.lift.layer(ctx.then, i))


_COMPOSITIONS: Dict[str, Type[Encoding]] = {}


def encoding_class(family: str) -> Type[Encoding]:
  """The class of a family, or of a composed family 'liere+pape' (made once per pair)."""
  if '+' not in family:
    return _CLASSES[family]
  if family not in _COMPOSITIONS:
    parts = tuple(_CLASSES[f] for f in registry.split(family))
    _COMPOSITIONS[family] = type(''.join(p.__name__ for p in parts), (Composition,),
                                 dict(parts=parts, facts=registry.facts(family)))
  return _COMPOSITIONS[family]


def validate(family: str, *, block, head_dim: int, width: int, n_dims: int, name: str = ''):
  """The encoding's own rules; raises a ValueError naming the bad value and the fix.

  name: the model.pe.name (default family<block>), for the messages (Facts.aliases).
  """
  if '+' in family:  # Each part by its own rules, under its own name.
    for part, part_name, part_block in zip(registry.split(family), registry.split(name),
                                           (block, None)):
      try:
        validate(part, block=part_block, head_dim=head_dim, width=width, n_dims=n_dims,
                 name=part_name)
      except ValueError as e:
        raise ValueError(f'{e} (In model.pe.name={name!r}.)') from None
    return
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
  return encoding_class(spec.pe.family).from_spec(spec, rngs=rngs)


def families() -> Dict[str, Type[Encoding]]:
  """family -> its registered class, in registration order."""
  return dict(_CLASSES)
