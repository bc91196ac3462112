"""PaPE and PaPE-RI: parabolic position encodings (arXiv 2602.01418; official PyTorch code
DTU-PAS/parabolic-position-encoding, pape/nn/positions/pape.py and pape_ri.py).

Both add a logit bias that is a sum of parabolas in the positions, per layer and head, with
curvatures from the token:
  PaPE     bias_ij = -sum_m a_m(i) (u_m(i) - u_m(j))^2 + sum_m b_m(i) (u_m(i) - u_m(j)),
           u = the position times a learned [n, H M] map (M parabolas per head, default 50),
           a = softplus, b = linear maps of the attention's input x (after norm1);
  PaPE-RI  bias_ij = -a(i) s_h^2 ||p_i - p_j||^2, a = softplus(linear map of x) per head, s_h a
           fixed per-head scale ~ U(-sqrt(1/n), sqrt(1/n)) (a buffer: not trained).
Neither is computed as a T x T bias: the context is a `Lift` (liere_jax.encodings.base), which
attention turns into d + 2M + 1 (PaPE-RI d + n + 2) channels of q and k, padded to a multiple
of 8 as the official code pads its d + 3M + 2 (d + 2n + 1): the same scores, with b's terms
sharing the channels of a's linear ones; the softmax scale is the unlifted head size's d**-0.5
(official pape/nn/encoder.py), v is not lifted. Relative in u (PaPE: a shift of every position
leaves the scores as they are) and, for PaPE-RI, in the Euclidean distance (a rotation too).

Where it runs (liere_jax.attention.path; `python -m liere_jax.bench plan --config C --platform
P`): XLA lifts q and k on every platform; the softmax is a TPU's attention kernel ('kernel,
lift': each head's q' and k' padded with zeros to whole lane tiles, 168 -> 256 for ViT-B's
PaPE, 72 -> 128 for PaPE-RI, where kernels.attention.supported takes them: heads of 64 up to
512 tokens), cuDNN's on a GPU ('cudnn, lift': v padded with zeros to d', lifted heads up to
256 from Hopper on), else XLA's explicit softmax of q k^T plus the lift's product ('xla', the
CPU's).

Positions: 'integer', as the official ImageNet recipe (`--normalize` off by default: patch
indices, not divided by the grid), and its CLS geometry: the official patches sit at 1..n per
axis with CLS at 0, ours at 0..n-1 with CLS at 0, so these encodings move the patch tokens (not
the prefix tokens) by one patch step of the model's position mode at the training grid before
use. One difference is kept: the official 2D image positions are (col, row), ours (row, col) as
every encoding here ((time, row, col) in 3D, the official video order); a 2D PaPE checkpoint
maps by swapping the two rows of `position`'s n axis (PaPE-RI is isotropic: nothing to swap).

Parameters (per layer: a leading layer axis L = depth; the names are the official modules'):
  pape     position         [L, n, H*M]   official `position.weight` [H*M, n] transposed
           ab               [L, D, 2*H*M] official `ab.weight` [2*H*M, D] transposed, output
                                          (a | b, head, parabola)
  pape_ri  position_scales  [L, H]        official buffer `position_scales` [1, H, 1, 1];
                                          stored as a parameter, used under stop_gradient (a
                                          weight decay would move it: none by default)
           a                [L, D, H]     official `a.weight` [H, D] transposed
Init as the official (PyTorch's Linear default): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in n
for `position`, D for `ab` and `a`; whatever model.init.
"""
import math

import jax
import jax.numpy as jnp
from flax import nnx

from liere_jax import positions as positions_lib
from liere_jax.encodings.base import Encoding, Lift, register
from liere_jax.encodings.registry import Option


def _uniform(key, shape, bound):
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


class _Parabolic(Encoding):
  """Shared: the official positions (patches one step past the prefix tokens at 0)."""

  def __init__(self, *, train_grid, positions, num_prefix):
    step = positions_lib.patch_step(train_grid, train_grid, positions, positions)
    self.step, self.num_prefix = tuple(float(s) for s in step), num_prefix

  def official_positions(self, pos):
    """[T, n]: the patch tokens moved one patch step away from the origin (CLS stays at 0)."""
    pos = jnp.asarray(pos, jnp.float32)
    is_patch = (jnp.arange(pos.shape[0]) >= self.num_prefix)[:, None]
    return pos + jnp.where(is_patch, jnp.asarray(self.step, jnp.float32), 0.)

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(depth=spec.depth, heads=spec.heads, width=spec.width, n_dims=spec.n_dims,
               train_grid=spec.train_grid, positions=spec.pe.positions,
               num_prefix=spec.num_prefix, rngs=rngs, **spec.pe.options)


@register('pape', label='PaPE', composes='lift', options=(
    Option('parabolas', 50, 'parabolas per head (M; the official default 50).'),))
class PaPE(_Parabolic):
  """PaPE: M parabolas per layer and head along learned directions of the position (module
  doc); context Lift(u [L, H, T, M], ab [L, D, 2 H M])."""

  def __init__(self, *, depth, heads, width, n_dims, train_grid, positions, num_prefix, rngs,
               parabolas):
    super().__init__(train_grid=train_grid, positions=positions, num_prefix=num_prefix)
    self.heads, self.parabolas = heads, parabolas
    self.position = nnx.Param(_uniform(rngs.params(), (depth, n_dims, heads * parabolas),
                                       1. / math.sqrt(n_dims)))
    self.ab = nnx.Param(_uniform(rngs.params(), (depth, width, 2 * heads * parabolas),
                                 1. / math.sqrt(width)))

  @classmethod
  def check_options(cls, pe, *, name):
    m = pe['parabolas']
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
      raise ValueError(f'model.pe.parabolas={m!r} must be a positive integer (PaPE: 50).')

  def context(self, pos, numerics=None):
    p = self.official_positions(pos)
    u = jnp.einsum('ta,lam->ltm', p, self.position[...],
                   precision=jax.lax.Precision.HIGHEST)  # [L, T, H M]
    u = u.reshape(*u.shape[:2], self.heads, self.parabolas)
    return Lift(jnp.swapaxes(u, 1, 2), self.ab[...])  # u [L, H, T, M]


@register('pape_ri', label='PaPE-RI', composes='lift')
class PaPERI(_Parabolic):
  """PaPE-RI: one isotropic parabola per layer and head, a fixed scale s_h per head (module
  doc); context Lift(u = s_h p [L, H, T, n], a [L, D, H], isotropic)."""

  def __init__(self, *, depth, heads, width, n_dims, train_grid, positions, num_prefix, rngs):
    super().__init__(train_grid=train_grid, positions=positions, num_prefix=num_prefix)
    self.position_scales = nnx.Param(_uniform(rngs.params(), (depth, heads),
                                              math.sqrt(1. / n_dims)))
    self.a = nnx.Param(_uniform(rngs.params(), (depth, width, heads), 1. / math.sqrt(width)))

  def context(self, pos, numerics=None):
    p = self.official_positions(pos)
    scales = jax.lax.stop_gradient(self.position_scales[...])  # A buffer in the official code.
    return Lift(scales[:, :, None, None] * p, self.a[...], isotropic=True)  # u [L, H, T, n]
