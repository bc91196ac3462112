"""Rotary encodings with angles (RoPE-Axial, the paper's VisionLlama, RoPE-Mixed) and ALiBi."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from liere_jax import rotations
from liere_jax.encodings.base import Angles, Bias, Encoding, register


class _Angles(Encoding):
  """Shared by the RoPE encodings: head_dim must give each position axis a pair."""

  @classmethod
  def check(cls, *, block, head_dim, width, n_dims, name):
    if head_dim < 2 * n_dims:
      raise ValueError(f'{cls.facts.family} needs head_dim >= {2 * n_dims} for {n_dims}D '
                       f'positions, got {head_dim}; use fewer heads.')


@register('rope_axial', label='Axial RoPE (rope-vit)', composes='rotary')
class RopeAxial(_Angles):
  """VisionLlama / RoPE-Axial: fixed frequencies, each axis owns an equal share of the pairs.

  Pair j of axis a (j < d / (2n)) rotates by p_a / 100^(2nj/d) (naver-ai/rope-vit's RoPE-Axial
  frequencies); interleaved pairs, pairs past n * d/(2n) stay unrotated. Not the paper's
  VisionLlama column (PaperVisionLlama: other frequencies, [0, 1] positions).
  """

  def __init__(self, *, head_dim, n_dims, theta=100.):
    per_axis = head_dim // (2 * n_dims)
    self.freqs = tuple(1. / theta ** (np.arange(per_axis) * 2 * n_dims / head_dim))

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(head_dim=spec.head_dim, n_dims=spec.n_dims)

  def context(self, pos, numerics=None):
    angles = (pos[:, :, None] * jnp.asarray(self.freqs, jnp.float32)).reshape(pos.shape[0], -1)
    return Angles(angles[None, None])  # [1, 1, T, pairs]


# The official code's [0, 1] positions.
@register('paper_visionllama', positions='normalized', official=True,
          label='VisionLlama RoPE (paper)', composes='rotary')
class PaperVisionLlama(RopeAxial):
  """The paper's VisionLlama column: the official LieRE code's "tiled" encoding (phase_type
  "inverse_exp"), rotate-by-angle RoPE with fixed axial frequencies.

  k = d // (2n) pairs per axis, frequencies omega_j = exp(-4 j / (k - 1)) (exp(-4 linspace(0,
  1, k)), omega = 1 for k = 1), the same for every axis, head and layer; pair a k + j
  (head dims 2(a k + j), 2(a k + j) + 1) turns by p_a omega_j as [[cos, -sin], [sin, cos]]
  (official rope_vit.py TiledPositionEncoder: expm of p omega [[0, -1], [1, 0]]). Default
  positions 'normalized' (the official [0, 1] "sequential" ones: the largest angle is 1 rad);
  pairs past n k stay unrotated; CLS at 0 is the identity. rope_axial differs in frequencies
  (1 / 100^(2nj/d)) and positions (integer).
  """

  def __init__(self, *, head_dim, n_dims):
    self.freqs = tuple(np.exp(-4. * np.linspace(0., 1., head_dim // (2 * n_dims))))


def _random_frame(key, n):
  """A random orthonormal frame [n, n]; in 2D the rotation by one angle (naver-ai/rope-vit)."""
  if n == 1:
    return jnp.ones((1, 1))
  if n == 2:
    phi = jax.random.uniform(key, (), maxval=2 * jnp.pi)
    return jnp.array([[jnp.cos(phi), jnp.sin(phi)], [-jnp.sin(phi), jnp.cos(phi)]])
  q, r = jnp.linalg.qr(jax.random.normal(key, (n, n)))
  return q * jnp.sign(jnp.diag(r))


@register('rope_mixed', official=True, label='RoPE-Mixed (naver-ai)', composes='rotary')
class RopeMixed(_Angles):
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

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(depth=spec.depth, heads=spec.heads, head_dim=spec.head_dim, n_dims=spec.n_dims,
               rngs=rngs)

  def angles(self, pos):
    """[L, H, T, d/2] the mixed angles."""
    n, depth, _ = self.freqs.shape
    freqs = self.freqs[...].reshape(n, depth, self.heads, -1)
    return jnp.einsum('ta,alhj->lhtj', pos, freqs, precision=jax.lax.Precision.HIGHEST)

  def rotations(self, pos):
    """[L, H, T, d/2, 2, 2] rotations by the mixed angles."""
    return rotations.angle_rotations(RopeMixed.angles(self, pos))

  def context(self, pos, numerics=None):
    return Angles(self.angles(pos))


@register('alibi', label='2D ALiBi')
class ALiBi(Encoding):
  """2D/3D ALiBi (CROMA): logit bias -m_h * ||p_q - p_k||, slopes 2^(-8(h+1)/H).

  CLS rule: a prefix token has zero bias to and from every token (it sees all tokens alike).
  """

  def __init__(self, *, heads, num_prefix):
    self.slopes = tuple(2. ** (-8. * np.arange(1, heads + 1) / heads))
    self.num_prefix = num_prefix

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(heads=spec.heads, num_prefix=spec.num_prefix)

  def context(self, pos, numerics=None):
    dist = jnp.sqrt(jnp.sum(jnp.square(pos[:, None] - pos[None]), -1))
    is_patch = jnp.arange(pos.shape[0]) >= self.num_prefix
    dist = dist * (is_patch[:, None] & is_patch[None])
    return Bias(-jnp.asarray(self.slopes, jnp.float32)[None, :, None, None] * dist)  # [1,H,T,T]
