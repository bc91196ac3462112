"""Every position encoding of the paper behind one interface, chosen by name (`model.pe.name`).

An encoding is an NNX module with three hooks, all optional:
  embed(x, grid, num_prefix) -> x        absolute encodings add to the tokens [B, T, D].
  context(pos, num_prefix) -> ctx        once per forward pass (never per example): rotations
                                         or biases from positions [T, n]; a pytree of arrays
                                         that can be cached per resolution.
  attend(ctx, layer, q, k) -> q, k, bias  inside attention: rotate q, k [B, T, H, d] and/or
                                         return a logit bias [H, T, T].
Prefix tokens (CLS) sit at position 0: the identity rotation; ALiBi gives them zero bias.

Parameters (names are an API: the PyTorch port depends on them):
  abs         embedding   [1, T_train, D]  (CLS slot first when there is a CLS token)
  rope_mixed  freqs       [n, depth, heads * d/2]   (naver-ai/rope-vit layout)
  liere<b>    generators  [L, H, n, d//b, b(b-1)/2]  L = depth or 1, H = heads or 1 (sharing)
  none, sincos, rope_axial, alibi: no parameters.
"""
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from liere_jax import rotations
from liere_jax.positions import grid_positions

class Encoding(nnx.Module):
  """The interface; the defaults do nothing (`pe=none`)."""

  def embed(self, x, grid: Sequence[int], num_prefix: int):
    return x

  def context(self, pos: jax.Array, num_prefix: int):
    return None

  def attend(self, ctx, layer: int, q, k):
    return q, k, None


class NoPE(Encoding):
  pass


class Absolute(Encoding):
  """Learned embedding added to the tokens (DeiT-III); resized to new grids.

  Resizing is bicubic for 2D grids and (tri)linear otherwise.
  """

  def __init__(self, *, dim, train_grid, num_prefix, rngs):
    self.train_grid = tuple(train_grid)
    tokens = num_prefix + math.prod(train_grid)
    self.embedding = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, tokens, dim)))

  def embed(self, x, grid, num_prefix):
    emb = self.embedding[...]
    if tuple(grid) != self.train_grid:
      prefix, patches = emb[:, :num_prefix], emb[:, num_prefix:]
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


class SinCos(Encoding):
  """Fixed 2D/3D sin-cos embedding (MAE style) on integer positions; CLS gets zeros."""

  def __init__(self, *, dim):
    self.dim = dim

  def embed(self, x, grid, num_prefix):
    table = sincos_table(grid_positions(grid, grid, 'integer'), self.dim)
    table = np.concatenate([np.zeros((num_prefix, self.dim), np.float32), table])
    return x + jnp.asarray(table, x.dtype)


class RopeAxial(Encoding):
  """VisionLlama / RoPE-Axial: fixed frequencies, each axis owns an equal share of the pairs.

  Pair j of axis a (j < d / (2n)) rotates by p_a / 100^(2nj/d) (naver-ai/rope-vit's RoPE-Axial
  frequencies); interleaved pairs, pairs past n * d/(2n) stay unrotated.
  """

  def __init__(self, *, head_dim, n_dims, theta=100.):
    per_axis = head_dim // (2 * n_dims)
    self.freqs = tuple(1. / theta ** (np.arange(per_axis) * 2 * n_dims / head_dim))

  def context(self, pos, num_prefix):
    angles = (pos[:, :, None] * jnp.asarray(self.freqs, jnp.float32)).reshape(pos.shape[0], -1)
    return rotations.angle_rotations(angles)[None]  # [1, T, pairs, 2, 2]

  def attend(self, ctx, layer, q, k):
    return rotations.rotate(q, ctx), rotations.rotate(k, ctx), None


def _random_frame(key, n):
  """A random orthonormal frame [n, n]; in 2D the rotation by one angle (naver-ai/rope-vit)."""
  if n == 1:
    return jnp.ones((1, 1))
  if n == 2:
    phi = jax.random.uniform(key, (), maxval=2 * jnp.pi)
    return jnp.array([[jnp.cos(phi), jnp.sin(phi)], [-jnp.sin(phi), jnp.cos(phi)]])
  q, r = jnp.linalg.qr(jax.random.normal(key, (n, n)))
  return q * jnp.sign(jnp.diag(r))


class RopeMixed(Encoding):
  """RoPE-Mixed (Heo et al. 2024): learned frequencies per layer and head, mixed over axes.

  angle_{l,h,j}(p) = sum_a freqs[a, l, h*d/2 + j] * p_a on interleaved pairs. Init as
  naver-ai/rope-vit: magnitudes 1 / theta^(4j/d), theta = 10, directions from one random
  angle per layer and head; integer positions.
  """

  def __init__(self, *, depth, heads, head_dim, n_dims, theta=10., rngs):
    pairs = head_dim // 2
    per_dir = -(-pairs // n_dims)
    mag = 1. / theta ** (np.arange(0, head_dim, 2 * n_dims)[:per_dir] / head_dim)
    keys = jax.random.split(rngs.params(), depth * heads)
    frames = jax.vmap(lambda key: _random_frame(key, n_dims))(keys)  # [L*H, dir, axis]
    # freqs[a, (l, h), (dir, j)] = frame[dir, a] * mag[j], truncated to d/2 pairs.
    freqs = jnp.einsum('mca,j->amcj', frames, jnp.asarray(mag, jnp.float32))
    freqs = freqs.reshape(n_dims, depth * heads, -1)[..., :pairs]
    self.freqs = nnx.Param(freqs.reshape(n_dims, depth, heads * pairs))
    self.heads = heads

  def context(self, pos, num_prefix):
    n, depth, _ = self.freqs.shape
    freqs = self.freqs[...].reshape(n, depth, self.heads, -1)
    angles = jnp.einsum('ta,alhj->lhtj', pos, freqs, precision=jax.lax.Precision.HIGHEST)
    return rotations.angle_rotations(angles)  # [L, H, T, d/2, 2, 2]

  def attend(self, ctx, layer, q, k):
    return rotations.rotate(q, ctx[layer]), rotations.rotate(k, ctx[layer]), None


class ALiBi(Encoding):
  """2D/3D ALiBi (CROMA): logit bias -m_h * ||p_q - p_k||, slopes 2^(-8(h+1)/H).

  CLS rule: a prefix token has zero bias to and from every token (it sees all tokens alike).
  """

  def __init__(self, *, heads):
    self.slopes = tuple(2. ** (-8. * np.arange(1, heads + 1) / heads))

  def context(self, pos, num_prefix):
    dist = jnp.sqrt(jnp.sum(jnp.square(pos[:, None] - pos[None]), -1))
    is_patch = jnp.arange(pos.shape[0]) >= num_prefix
    dist = dist * (is_patch[:, None] & is_patch[None])
    return -jnp.asarray(self.slopes, jnp.float32)[:, None, None] * dist  # [H, T, T]

  def attend(self, ctx, layer, q, k):
    return q, k, ctx


class LieRE(Encoding):
  """LieRE: R(p) = expm(sum_i p_i A_i) with learned block-diagonal skew-symmetric A_i.

  Raw parameters are the strict upper triangles, init U[0, 1) * init_scale (2 pi default);
  rotations in float32 at highest precision, once per forward pass. `layers` / `heads`: the
  generator stacks (1 when shared; liere_jax.spec resolves model.pe.share).
  """

  def __init__(self, *, block, layers, heads, head_dim, n_dims, init_scale, expm, rngs):
    self.block, self.expm = block, expm
    shape = (layers, heads, n_dims, head_dim // block, rotations.num_free(block))
    self.generators = nnx.Param(init_scale * jax.random.uniform(rngs.params(), shape))

  def context(self, pos, num_prefix):
    return rotations.liere_rotations(self.generators[...], pos, self.block, self.expm)

  def attend(self, ctx, layer, q, k):
    rot = ctx[layer if ctx.shape[0] > 1 else 0]
    return rotations.rotate(q, rot), rotations.rotate(k, rot), None


NAMES = ('none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere<b>')


def validate(family: str, *, block, head_dim: int, width: int, n_dims: int):
  """The encoding's own rules; raises a ValueError naming the bad value and the fix."""
  if family not in NAMES[:-1] + ('liere',):
    raise ValueError(f'model.pe.name={family!r} is unknown; use one of {NAMES} '
                     '(e.g. pe=liere8 or pe=rope_mixed).')
  if block is not None and not 2 <= block <= head_dim:
    raise ValueError(f'model.pe.name=liere{block}: block size {block} must be in [2, head_dim='
                     f'{head_dim}]; use e.g. liere8 or liere{head_dim}.')
  if family in ('rope_axial', 'rope_mixed') and head_dim < 2 * n_dims:
    raise ValueError(f'{family} needs head_dim >= {2 * n_dims} for {n_dims}D positions, got '
                     f'{head_dim}; use fewer heads.')
  if family == 'sincos' and width < 2 * n_dims:
    raise ValueError(f'sincos needs width >= {2 * n_dims}, got {width}.')


def build(spec, *, rngs) -> Encoding:
  """The encoding of a resolved model (liere_jax.spec.ModelSpec)."""
  pe, n = spec.pe, spec.n_dims
  return {
      'none': lambda: NoPE(),
      'abs': lambda: Absolute(dim=spec.width, train_grid=spec.train_grid,
                              num_prefix=spec.num_prefix, rngs=rngs),
      'sincos': lambda: SinCos(dim=spec.width),
      'rope_axial': lambda: RopeAxial(head_dim=spec.head_dim, n_dims=n),
      'rope_mixed': lambda: RopeMixed(depth=spec.depth, heads=spec.heads,
                                      head_dim=spec.head_dim, n_dims=n, rngs=rngs),
      'alibi': lambda: ALiBi(heads=spec.heads),
      'liere': lambda: LieRE(block=pe.block, layers=pe.layers, heads=pe.heads,
                             head_dim=spec.head_dim, n_dims=n, init_scale=pe.init_scale,
                             expm=pe.expm, rngs=rngs),
  }[pe.family]()
