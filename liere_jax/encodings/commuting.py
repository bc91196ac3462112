"""Commuting generators: ComRoPE (Yu et al., CVPR 2025) and STRING (Schenck et al., ICML 2025).

Generators that commute give R(x)^T R(y) = R(y - x) (Cayley: P^T RoPE(y - x) P) exactly, so
the rotations need one eigen-decomposition (ComRoPE), one solve (Cayley) or one DFT
(circulant) per block and step, then only cos / sin per token. These families take no
model.pe.share, init_scale or expm (parameters per layer and head, the papers' inits,
exponentials of their own); d//b blocks per head, dims past the last whole block stay
unrotated. CLS gets the identity except in string_cayley, where it gets R(0) = P like every
token.
"""
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct

from liere_jax import rotations
from liere_jax.encodings.base import Encoding, LayerContext, Rotate, register
from liere_jax.encodings.rope import RopeMixed


@jax.custom_vjp
def _expm_skew_lines(b, t):
  return _expm_skew_lines_fwd(b, t)[0]


def _expm_skew_lines_fwd(b, t):
  # i B is Hermitian: i B = V diag(lam) V^H, so exp(t B) = V diag(exp(-i t lam)) V^H, which is
  # real: sum_i cos(t lam_i) Re(v_i v_i^H) + sin(t lam_i) Im(v_i v_i^H), one real product
  # [T, 2b] x [2b, b*b] per matrix.
  lam, v = jnp.linalg.eigh(1j * b.astype(jnp.complex64))
  outer = jnp.einsum('...ai,...ci->...iac', v, jnp.conj(v))  # v_i v_i^H
  angle = t[..., :, None] * lam[..., None, :]  # [..., T, b]
  hi = jax.lax.Precision.HIGHEST
  rot = (jnp.einsum('...ti,...iac->...tac', jnp.cos(angle), outer.real, precision=hi) +
         jnp.einsum('...ti,...iac->...tac', jnp.sin(angle), outer.imag, precision=hi))
  return rot, (t, lam, v, jnp.exp(-1j * angle))


def _expm_skew_lines_bwd(res, g):
  """The exact adjoint of X -> exp(X) at X = t B (Daleckii-Krein): for skew X it is the Frechet
  derivative at -X, V [(V^H G V) o Phi] V^H with the divided differences Phi_ij =
  (e^{i t l_i} - e^{i t l_j}) / (i t (l_i - l_j)) = e^{i t (l_i + l_j)/2} sinc(t (l_i - l_j)/2),
  finite for repeated eigenvalues (B = 0 included), where differentiating eigh gives NaN."""
  t, lam, v, e = res
  hi = jax.lax.Precision.HIGHEST
  m = jnp.einsum('...ai,...tab,...bj->...tij', jnp.conj(v), g.astype(jnp.complex64), v,
                 precision=hi)  # V^H G_t V
  tt = t[..., :, None, None]
  li, lj = lam[..., None, :, None], lam[..., None, None, :]
  phi = jnp.exp(0.5j * tt * (li + lj)) * jnp.sinc(tt * (li - lj) / (2 * np.pi))
  inner = jnp.sum(tt * m * phi, axis=-3)  # sum_t t (M_t o Phi_t)
  grad_b = jnp.einsum('...ij,...jk,...lk->...il', v, inner, jnp.conj(v), precision=hi).real
  # d exp(tB)/dt = B exp(tB): <G_t, B R_t> = Re sum_i conj(M_t,ii) (-i lam_i) e^{-i t lam_i}.
  diag = jnp.diagonal(m, axis1=-2, axis2=-1)
  grad_t = jnp.sum((jnp.conj(diag) * (-1j * lam[..., None, :]) * e).real, axis=-1)
  return grad_b.astype(jnp.float32), grad_t.astype(jnp.float32)


_expm_skew_lines.defvjp(_expm_skew_lines_fwd, _expm_skew_lines_bwd)


def expm_skew_lines(b: jax.Array, t: jax.Array) -> jax.Array:
  """exp(t B) for skew-symmetric B [..., b, b] at scalars t [..., T] (broadcast against B's
  batch dims) -> [..., T, b, b] float32 rotations.

  b = 2: the closed form [[cos tB01, sin tB01], [-sin tB01, cos tB01]]. b > 2: one Hermitian
  eigen-decomposition of i B per matrix (not per t), then cos / sin per t; the gradient is the
  exact one, finite at B = 0 and for repeated eigenvalues (see _expm_skew_lines_bwd).
  """
  b = b.astype(jnp.float32)
  t = jnp.broadcast_to(t.astype(jnp.float32), b.shape[:-2] + t.shape[-1:])
  if b.shape[-1] == 2:
    return rotations.angle_rotations(-t * b[..., None, 0, 1])
  return _expm_skew_lines(b, t)


def comrope_position_map(train_grid: Sequence[int], mode: str):
  """(scale, offset) per axis with scale * p + offset = (i + 0.5) / n_a on the training grid,
  for the positions p of `mode` (liere_jax.positions): ComRoPE's patch centres in units of the
  training image. normalized and rescaled give the same map (p = i / (n - 1) at training size):
  normalized then extrapolates with the training spacing, rescaled interpolates; integer
  extrapolates like normalized."""
  scale, offset = [], []
  for n in train_grid:
    unit = 1. if mode == 'integer' else 1. / max(n - 1, 1)  # p of neighbouring patches.
    scale.append(1. / (unit * n))
    offset.append(0.5 / n)
  return tuple(scale), tuple(offset)


class _ComRoPE(Encoding):
  """Shared by ComRoPE-AP and -LD: parameters and positions."""

  def __init__(self, *, block, depth, heads, head_dim, train_grid, positions, num_prefix,
               init_std, rngs):
    self.block, self.num_prefix = block, num_prefix
    shape = (depth, heads, head_dim // block, block, block)
    self.skew_params = nnx.Param(init_std * jax.random.normal(rngs.params(), shape))
    self.pos_scale, self.pos_offset = comrope_position_map(train_grid, positions)

  def token_positions(self, pos):
    """The positions ComRoPE uses: scale * p + offset for patches, 0 (identity) for CLS."""
    x = pos * jnp.asarray(self.pos_scale, jnp.float32) + jnp.asarray(self.pos_offset,
                                                                     jnp.float32)
    return jnp.where((jnp.arange(pos.shape[0]) >= self.num_prefix)[:, None], x, 0.)

  def generators(self):
    p = self.skew_params[...].astype(jnp.float32)
    return p - jnp.swapaxes(p, -1, -2)  # [L, H, k, b, b]

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(block=spec.pe.block, depth=spec.depth, heads=spec.heads, head_dim=spec.head_dim,
               n_dims=spec.n_dims, train_grid=spec.train_grid, positions=spec.pe.positions,
               num_prefix=spec.num_prefix, rngs=rngs)


COMROPE_INIT_STD = 1.0


# ComRoPE's centred patch coordinates on [0, 1] positions.
@register('comrope_ap', blocks=True, positions='normalized', label='ComRoPE-AP{b}',
          composes='rotary')
class ComRoPEAP(_ComRoPE):
  """ComRoPE-AP (axis partition): R(x) = blockdiag_j exp(x_{j mod n} B_j), B_j = P_j - P_j^T.

  Per layer, head and block j (d//b blocks of b contiguous dims); block j turns with position
  axis j mod n only, so the generators of different axes live in different blocks and commute.
  Init P ~ N(0, 1) (the official ComRoPE code's default init_std; b = 2 is an axial RoPE with
  learned frequencies -B_j[0, 1]). Positions: (i + 0.5) / n_a per axis on the training grid
  (the official code's centred patch coordinates, made here from model.pe.positions by
  comrope_position_map; 3D uses each axis' own n where the official code divides frames by the
  spatial n too). CLS sits at 0, the identity (the official code puts it at the centre 0.5).
  exp: one eigen-decomposition of each B_j per step (expm_skew_lines), cos / sin per token.
  """

  def __init__(self, *, block, depth, heads, head_dim, n_dims, train_grid, positions,
               num_prefix, rngs):
    super().__init__(block=block, depth=depth, heads=heads, head_dim=head_dim,
                     train_grid=train_grid, positions=positions, num_prefix=num_prefix,
                     init_std=COMROPE_INIT_STD, rngs=rngs)
    self.n_dims = n_dims

  @classmethod
  def check(cls, *, block, head_dim, width, n_dims, name):
    if head_dim // block < n_dims:
      raise ValueError(f'comrope_ap{block} gives head_dim // {block} = {head_dim // block} '
                       f'blocks per head, fewer than the {n_dims} position axes (block j follows '
                       f'axis j mod {n_dims}); use a block size <= {head_dim // n_dims}.')

  def context(self, pos, numerics=None):
    x = self.token_positions(pos)  # [T, n]
    k = self.skew_params.shape[2]
    t = x[:, np.arange(k) % self.n_dims].T  # [k, T]: block j follows axis j mod n.
    rot = expm_skew_lines(self.generators(), t)  # [L, H, k, T, b, b]
    return Rotate(jnp.swapaxes(rot, 2, 3))  # [L, H, T, k, b, b]


@register('comrope_ld', blocks=True, positions='normalized', label='ComRoPE-LD{b}',
          composes='rotary')
class ComRoPELD(_ComRoPE):
  """ComRoPE-LD (linearly dependent): R(x) = blockdiag_j exp((sum_a theta_{a,j} x_a) S_{h,j}).

  S_{h,j} = P - P^T per layer, head and block; theta (axis_scales) per layer, axis and block,
  shared by the heads (as in the official code). Init P ~ N(0, 1), theta ~ N(0, 1) (official
  defaults). Positions and CLS as ComRoPEAP. exp: one eigen-decomposition of each S per step;
  the per-token scalar s = theta . x only enters the cos / sin.
  """

  def __init__(self, *, block, depth, heads, head_dim, n_dims, train_grid, positions,
               num_prefix, rngs):
    super().__init__(block=block, depth=depth, heads=heads, head_dim=head_dim,
                     train_grid=train_grid, positions=positions, num_prefix=num_prefix,
                     init_std=COMROPE_INIT_STD, rngs=rngs)
    self.axis_scales = nnx.Param(jax.random.normal(rngs.params(),
                                                   (depth, n_dims, head_dim // block)))

  def context(self, pos, numerics=None):
    x = self.token_positions(pos)
    s = jnp.einsum('ta,lak->lkt', x, self.axis_scales[...].astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST)[:, None]  # [L, 1, k, T]
    return Rotate(jnp.swapaxes(expm_skew_lines(self.generators(), s), 2, 3))  # [L,H,T,k,b,b]


def cayley_orthogonal(cayley, head_dim: int):
  """STRING's P [..., d, d] = (I + S)^-1 (I - S) (= (I - S)(I + S)^-1: the factors commute),
  S skew-symmetric from its free entries `cayley` [..., d(d-1)/2]."""
  s = rotations.skew(jnp.asarray(cayley, jnp.float32), head_dim)
  eye = jnp.eye(head_dim, dtype=jnp.float32)
  return jnp.linalg.solve(eye + s, eye - s)


class Projected(Rotate):
  """STRING-Cayley's layer context: P [H, d, d] folded into the q and k projections, then the
  RoPE-Mixed rotations rot [H, T, d/2, 2, 2] (attend: P is in q and k already)."""
  projects = True
  orth: jax.Array

  def project(self, kernel, bias):
    """q_h P_h^T = x (W_q,h P_h^T) + b_q,h P_h^T (and k): [D, 3D] kernel, [3D] bias."""
    heads, d = self.orth.shape[0], self.orth.shape[-1]

    def fold(w):  # [..., 3D]: q and k columns of each head times P_h^T.
      w3 = w.reshape(w.shape[:-1] + (3, heads, d)).astype(jnp.float32)
      qk = jnp.einsum('...jhe,hfe->...jhf', w3[..., :2, :, :], self.orth,
                      precision=jax.lax.Precision.HIGHEST)
      return jnp.concatenate([qk, w3[..., 2:, :, :]], axis=-3).reshape(w.shape).astype(w.dtype)

    return fold(kernel), None if bias is None else fold(bias)


@register('string_cayley', label='STRING (Cayley)', composes='rotary')
class StringCayley(RopeMixed):
  """Cayley-STRING: R(x) = RoPE-Mixed(x) P, P = (I - S)(I + S)^-1 per layer and head.

  S (d x d skew-symmetric, from `cayley`) gives an orthogonal P with one solve per step (not per
  token); R(x)^T R(y) = P^T RoPE(y - x) P, exactly relative. The RoPE-Mixed part is rope_mixed
  itself (same `freqs`, init and integer positions). Init S = 0: training starts at RoPE-Mixed
  (the STRING paper's point that it contains RoPE; a paper init for S is not used here). CLS
  (position 0) gets R(0) = P like every token, so the relative property covers it too. P is
  applied by folding it into the query / key projections (W_q,h <- W_q,h P_h^T, and the bias)
  once per step, not per token; `python -m liere_jax.convert to_torch --fold` exports that folded
  model as plain RoPE-Mixed (convert.fold_string_cayley).
  """

  def __init__(self, *, depth, heads, head_dim, n_dims, rngs):
    super().__init__(depth=depth, heads=heads, head_dim=head_dim, n_dims=n_dims, rngs=rngs)
    self.head_dim = head_dim
    self.cayley = nnx.Param(jnp.zeros((depth, heads, rotations.num_free(head_dim))))

  def orthogonal(self):
    return cayley_orthogonal(self.cayley[...], self.head_dim)

  def context(self, pos, numerics=None):
    return Projected(rot=self.rotations(pos), orth=self.orthogonal())


class Circulant(LayerContext):
  """STRING-circulant's layer context: phase [H, T, k, block//2 + 1, (cos, sin)]."""
  rotates = True
  phase: jax.Array
  block: int = struct.field(pytree_node=False)

  def attend(self, q, k, numerics):
    del numerics
    return (circulant_rotate(q, self.phase, self.block),
            circulant_rotate(k, self.phase, self.block), None)


# min_block 3: a 2 x 2 circulant is symmetric, C - C^T = 0.
@register('string_circulant', blocks=True, min_block=3, label='STRING (circulant {b})',
          composes='rotary')
class StringCirculant(Encoding):
  """Circulant-STRING: R(x) = blockdiag_j exp(sum_a x_a L_{a,j}), L = C - C^T, C circulant.

  C_{a,j} (per layer, head, axis a and block j of b dims) has first column c (`circulant`,
  C_rs = c_{(r - s) mod b}). Circulants share the DFT eigenbasis, so the L commute and
  exp(sum_a x_a L_a) = F^-1 diag(e^{i phi}) F with phi_m = sum_a x_a mu_{a,m}, where
  i mu_{a,m} = 2 i Im(DFT(c_a))_m = -2 i sum_r c_{a,r} sin(2 pi m r / b) are L's (purely
  imaginary) eigenvalues: the context holds cos / sin phi per token, attend applies R with a
  real FFT, O(b log b) per block. Modes 0 and b/2 never turn, so a block has (b - 1) // 2
  frequencies (b >= 3; c_0 is inert). b = head_dim is the paper's full-head circulant.
  Init c ~ N(0, 1 / (8 b)): each mode's frequency along each axis is then N(0, 1/4), 0.5 rad per
  patch RMS, close to the RMS of RoPE-Mixed's init frequencies (0.46 for theta 10); no paper
  init used. Integer positions (RoPE-Mixed's); CLS at 0 is the identity.
  """

  def __init__(self, *, block, depth, heads, head_dim, n_dims, rngs):
    self.block = block
    std = 1. / math.sqrt(8. * block)
    shape = (depth, heads, n_dims, head_dim // block, block)
    self.circulant = nnx.Param(std * jax.random.normal(rngs.params(), shape))

  @classmethod
  def from_spec(cls, spec, *, rngs):
    return cls(block=spec.pe.block, depth=spec.depth, heads=spec.heads, head_dim=spec.head_dim,
               n_dims=spec.n_dims, rngs=rngs)

  def frequencies(self):
    """mu [L, H, n, k, b//2 + 1]: L = F^-1 diag(i mu) F per axis and block."""
    b = self.block
    sines = np.sin(2 * np.pi * np.outer(np.arange(b), np.arange(b // 2 + 1)) / b)
    return -2. * jnp.einsum('lhakr,rm->lhakm', self.circulant[...].astype(jnp.float32),
                            jnp.asarray(sines, jnp.float32), precision=jax.lax.Precision.HIGHEST)

  def context(self, pos, numerics=None):
    phi = jnp.einsum('ta,lhakm->lhtkm', jnp.asarray(pos, jnp.float32), self.frequencies(),
                     precision=jax.lax.Precision.HIGHEST)
    phase = jnp.stack([jnp.cos(phi), jnp.sin(phi)], -1)  # [L, H, T, k, b//2 + 1, 2]
    return Circulant(phase, self.block)


@jax.named_scope('pe_rotate')
def circulant_rotate(x: jax.Array, phase: jax.Array, block: int) -> jax.Array:
  """x [B, T, H, d] -> R x per block of `block` dims, R = F^-1 diag(e^{i phi}) F (a real
  circulant rotation), phase [H, T, k, block//2 + 1, (cos, sin)]; product in float32."""
  k, b = phase.shape[-3], block
  xr = x[..., :k * b].astype(jnp.float32).reshape(*x.shape[:-1], k, b)
  e = jax.lax.complex(phase[..., 0], phase[..., 1])
  e = jnp.swapaxes(e, 0, 1)  # [T, H, k, m]
  out = jnp.fft.irfft(jnp.fft.rfft(xr, axis=-1) * e, n=b, axis=-1)
  out = out.reshape(*x.shape[:-1], k * b).astype(x.dtype)
  return jnp.concatenate([out, x[..., k * b:]], axis=-1) if k * b < x.shape[-1] else out
