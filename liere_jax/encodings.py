"""Every position encoding of the paper behind one interface, chosen by name (`model.pe.name`).

An encoding is an NNX module with three hooks, all optional:
  embed(x, grid, num_prefix) -> x        absolute encodings add to the tokens [B, T, D].
  context(pos, num_prefix) -> ctx        once per forward pass (never per example): rotations
                                         or biases from positions [T, n]; a pytree of arrays
                                         that can be cached per resolution.
  attend(ctx, layer, q, k) -> q, k, bias  inside attention: rotate q, k [B, T, H, d] and/or
                                         return a logit bias [H, T, T].
  project(ctx, layer, kernel, bias)      a position-free linear map of q and k folded into the
      -> kernel, bias                    qkv projection [D, 3D] once per step (string_cayley's
                                         P); only encodings with `projects = True`.
Prefix tokens (CLS) sit at position 0: the identity rotation; ALiBi gives them zero bias.

Parameters (names are an API: the PyTorch port depends on them):
  abs         embedding   [1, T_train, D]  (CLS slot first when there is a CLS token)
  rope_mixed  freqs       [n, depth, heads * d/2]   (naver-ai/rope-vit layout)
  liere<b>    generators  [L, H, n, d//b, b(b-1)/2]  L = depth or 1, H = heads or 1 (sharing)
  paper_rope_mixed     generators [L, H, n, d//2, 1]: liere2 itself (spec.PE_ALIASES), is the
                       paper's RoPE-Mixed column; not naver-ai's RoPE-Mixed (rope_mixed).
  paper_visionllama    no parameters: is the paper's VisionLlama column; not rope-vit's axial
                       RoPE (rope_axial).
  comrope_ap<b>        skew_params  [depth, heads, d//b, b, b]   block j: B_j = P_j - P_j^T
  comrope_ld<b>        skew_params  [depth, heads, d//b, b, b],  axis_scales [depth, n, d//b]
  string_cayley        freqs [n, depth, heads * d/2] (rope_mixed's),  cayley [depth, heads,
                       d(d-1)/2] (strict upper triangle of S, np.triu_indices order)
  string_circulant<b>  circulant    [depth, heads, n, d//b, b]   first columns c of C_{a,j}
  none, sincos, rope_axial, alibi: no parameters.

Commuting generators (ComRoPE, STRING; see the classes): R(x)^T R(y) depends on y - x only,
exactly, and no per-token matrix exponential is needed. Those four ignore model.pe.share,
init_scale and expm (parameters per layer and head, the papers' inits, exponentials of their
own); d//b blocks per head, dims past the last whole block stay unrotated. CLS gets the
identity except in string_cayley, where it gets R(0) = P like every token.
"""
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from liere_jax import rotations
from liere_jax.positions import grid_positions
from liere_jax.spec import PE_ALIASES

class Encoding(nnx.Module):
  """The interface; the defaults do nothing (`pe=none`)."""
  projects = False  # True: attention calls `project` on its qkv kernel and bias.

  def embed(self, x, grid: Sequence[int], num_prefix: int):
    return x

  def context(self, pos: jax.Array, num_prefix: int):
    return None

  def attend(self, ctx, layer: int, q, k):
    return q, k, None

  def project(self, ctx, layer: int, kernel, bias):
    return kernel, bias


class NoPE(Encoding):
  pass


class Absolute(Encoding):
  """Learned embedding added to the tokens (DeiT-III); resized to new grids.

  Resizing is bicubic for 2D grids and (tri)linear otherwise.
  """

  def __init__(self, *, dim, train_grid, num_prefix, rngs, std=0.02):
    self.train_grid = tuple(train_grid)
    tokens = num_prefix + math.prod(train_grid)  # std: ModelSpec.embed_std (model.init).
    self.embedding = nnx.Param(std * jax.random.normal(rngs.params(), (1, tokens, dim)))

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
  frequencies); interleaved pairs, pairs past n * d/(2n) stay unrotated. Not the paper's
  VisionLlama column (PaperVisionLlama: other frequencies, [0, 1] positions).
  """

  def __init__(self, *, head_dim, n_dims, theta=100.):
    per_axis = head_dim // (2 * n_dims)
    self.freqs = tuple(1. / theta ** (np.arange(per_axis) * 2 * n_dims / head_dim))

  def context(self, pos, num_prefix):
    angles = (pos[:, :, None] * jnp.asarray(self.freqs, jnp.float32)).reshape(pos.shape[0], -1)
    return rotations.angle_rotations(angles)[None]  # [1, T, pairs, 2, 2]

  def attend(self, ctx, layer, q, k):
    return rotations.rotate(q, ctx), rotations.rotate(k, ctx), None


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


# ----------------------------------------------------------------------------------------------
# Commuting generators: ComRoPE (Yu et al., CVPR 2025) and STRING (Schenck et al., ICML 2025).
# Generators that commute give R(x)^T R(y) = R(y - x) (Cayley: P^T RoPE(y - x) P) exactly, so
# the rotations need one eigen-decomposition (ComRoPE), one solve (Cayley) or one DFT
# (circulant) per block and step, then only cos / sin per token.


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
  """Shared by ComRoPE-AP and -LD: parameters, positions and the attend hook."""

  def __init__(self, *, block, depth, heads, head_dim, train_grid, positions, init_std, rngs):
    self.block = block
    shape = (depth, heads, head_dim // block, block, block)
    self.skew_params = nnx.Param(init_std * jax.random.normal(rngs.params(), shape))
    self.pos_scale, self.pos_offset = comrope_position_map(train_grid, positions)

  def token_positions(self, pos, num_prefix):
    """The positions ComRoPE uses: scale * p + offset for patches, 0 (identity) for CLS."""
    x = pos * jnp.asarray(self.pos_scale, jnp.float32) + jnp.asarray(self.pos_offset,
                                                                     jnp.float32)
    return jnp.where((jnp.arange(pos.shape[0]) >= num_prefix)[:, None], x, 0.)

  def generators(self):
    p = self.skew_params[...].astype(jnp.float32)
    return p - jnp.swapaxes(p, -1, -2)  # [L, H, k, b, b]

  def attend(self, ctx, layer, q, k):
    return rotations.rotate(q, ctx[layer]), rotations.rotate(k, ctx[layer]), None


COMROPE_INIT_STD = 1.0


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

  def __init__(self, *, block, depth, heads, head_dim, n_dims, train_grid, positions, rngs):
    super().__init__(block=block, depth=depth, heads=heads, head_dim=head_dim,
                     train_grid=train_grid, positions=positions, init_std=COMROPE_INIT_STD,
                     rngs=rngs)
    self.n_dims = n_dims

  def context(self, pos, num_prefix):
    x = self.token_positions(pos, num_prefix)  # [T, n]
    k = self.skew_params.shape[2]
    t = x[:, np.arange(k) % self.n_dims].T  # [k, T]: block j follows axis j mod n.
    rot = expm_skew_lines(self.generators(), t)  # [L, H, k, T, b, b]
    return jnp.swapaxes(rot, 2, 3)  # [L, H, T, k, b, b]


class ComRoPELD(_ComRoPE):
  """ComRoPE-LD (linearly dependent): R(x) = blockdiag_j exp((sum_a theta_{a,j} x_a) S_{h,j}).

  S_{h,j} = P - P^T per layer, head and block; theta (axis_scales) per layer, axis and block,
  shared by the heads (as in the official code). Init P ~ N(0, 1), theta ~ N(0, 1) (official
  defaults). Positions and CLS as ComRoPEAP. exp: one eigen-decomposition of each S per step;
  the per-token scalar s = theta . x only enters the cos / sin.
  """

  def __init__(self, *, block, depth, heads, head_dim, n_dims, train_grid, positions, rngs):
    super().__init__(block=block, depth=depth, heads=heads, head_dim=head_dim,
                     train_grid=train_grid, positions=positions, init_std=COMROPE_INIT_STD,
                     rngs=rngs)
    self.axis_scales = nnx.Param(jax.random.normal(rngs.params(),
                                                   (depth, n_dims, head_dim // block)))

  def context(self, pos, num_prefix):
    x = self.token_positions(pos, num_prefix)
    s = jnp.einsum('ta,lak->lkt', x, self.axis_scales[...].astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST)[:, None]  # [L, 1, k, T]
    return jnp.swapaxes(expm_skew_lines(self.generators(), s), 2, 3)  # [L, H, T, k, b, b]


def cayley_orthogonal(cayley, head_dim: int):
  """STRING's P [..., d, d] = (I + S)^-1 (I - S) (= (I - S)(I + S)^-1: the factors commute),
  S skew-symmetric from its free entries `cayley` [..., d(d-1)/2]."""
  s = rotations.skew(jnp.asarray(cayley, jnp.float32), head_dim)
  eye = jnp.eye(head_dim, dtype=jnp.float32)
  return jnp.linalg.solve(eye + s, eye - s)


class StringCayley(RopeMixed):
  """Cayley-STRING: R(x) = RoPE-Mixed(x) P, P = (I - S)(I + S)^-1 per layer and head.

  S (d x d skew-symmetric, from `cayley`) gives an orthogonal P with one solve per step (not per
  token); R(x)^T R(y) = P^T RoPE(y - x) P, exactly relative. The RoPE-Mixed part is rope_mixed
  itself (same `freqs`, init and integer positions). Init S = 0: training starts at RoPE-Mixed
  (the STRING paper's point that it contains RoPE; a paper init for S is not used here). CLS
  (position 0) gets R(0) = P like every token, so the relative property covers it too. P is
  applied by folding it into the query / key projections (W_q,h <- W_q,h P_h^T, and the bias)
  once per step, not per token; `python -m liere_jax.export torch --fold` exports that folded
  model as plain RoPE-Mixed (export.fold_string_cayley).
  """
  projects = True

  def __init__(self, *, depth, heads, head_dim, n_dims, rngs):
    super().__init__(depth=depth, heads=heads, head_dim=head_dim, n_dims=n_dims, rngs=rngs)
    self.head_dim = head_dim
    self.cayley = nnx.Param(jnp.zeros((depth, heads, rotations.num_free(head_dim))))

  def orthogonal(self):
    return cayley_orthogonal(self.cayley[...], self.head_dim)

  def context(self, pos, num_prefix):
    return super().context(pos, num_prefix), self.orthogonal()

  def project(self, ctx, layer, kernel, bias):
    """q_h P_h^T = x (W_q,h P_h^T) + b_q,h P_h^T (and k): [D, 3D] kernel, [3D] bias."""
    p = ctx[1][layer]  # [H, d, d]
    heads, d = p.shape[0], p.shape[-1]

    def fold(w):  # [..., 3D]: q and k columns of each head times P_h^T.
      w3 = w.reshape(w.shape[:-1] + (3, heads, d)).astype(jnp.float32)
      qk = jnp.einsum('...jhe,hfe->...jhf', w3[..., :2, :, :], p,
                      precision=jax.lax.Precision.HIGHEST)
      return jnp.concatenate([qk, w3[..., 2:, :, :]], axis=-3).reshape(w.shape).astype(w.dtype)

    return fold(kernel), None if bias is None else fold(bias)

  def attend(self, ctx, layer, q, k):
    return super().attend(ctx[0], layer, q, k)  # P is in q and k already (project).


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

  def frequencies(self):
    """mu [L, H, n, k, b//2 + 1]: L = F^-1 diag(i mu) F per axis and block."""
    b = self.block
    sines = np.sin(2 * np.pi * np.outer(np.arange(b), np.arange(b // 2 + 1)) / b)
    return -2. * jnp.einsum('lhakr,rm->lhakm', self.circulant[...].astype(jnp.float32),
                            jnp.asarray(sines, jnp.float32), precision=jax.lax.Precision.HIGHEST)

  def context(self, pos, num_prefix):
    phi = jnp.einsum('ta,lhakm->lhtkm', pos.astype(jnp.float32), self.frequencies(),
                     precision=jax.lax.Precision.HIGHEST)
    return jnp.stack([jnp.cos(phi), jnp.sin(phi)], -1)  # [L, H, T, k, b//2 + 1, 2]

  def attend(self, ctx, layer, q, k):
    return circulant_rotate(q, ctx[layer], self.block), circulant_rotate(k, ctx[layer],
                                                                         self.block), None


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


NAMES = ('none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere<b>',
         'comrope_ap<b>', 'comrope_ld<b>', 'string_cayley', 'string_circulant<b>',
         'paper_rope_mixed', 'paper_visionllama')
FAMILIES = tuple(name.replace('<b>', '') for name in NAMES if name not in PE_ALIASES)
BLOCK_FAMILIES = tuple(name[:-3] for name in NAMES if name.endswith('<b>'))
MIN_BLOCK = {'string_circulant': 3}  # A 2x2 circulant is symmetric: C - C^T = 0.
AXIAL = ('rope_axial', 'paper_visionllama')  # d // (2n) pairs per axis.


def validate(family: str, *, block, head_dim: int, width: int, n_dims: int, name: str = ''):
  """The encoding's own rules; raises a ValueError naming the bad value and the fix.

  name: the model.pe.name (default family<block>), for the messages (spec.PE_ALIASES).
  """
  name = name or f"{family}{block or ''}"
  if family not in FAMILIES:
    raise ValueError(f'model.pe.name={family!r} is unknown; use one of {NAMES} '
                     '(e.g. pe=liere8 or pe=rope_mixed).')
  if family in BLOCK_FAMILIES and block is None:
    raise ValueError(f'model.pe.name={family!r} needs a block size; use e.g. {family}8.')
  if family == 'liere' and not 2 <= block <= head_dim:
    raise ValueError(f'model.pe.name={name}: block size {block} must be in [2, head_dim='
                     f'{head_dim}]; use e.g. liere8 or liere{head_dim}.')
  low = MIN_BLOCK.get(family, 2)
  if family in BLOCK_FAMILIES and not low <= block <= head_dim:
    raise ValueError(f'model.pe.name={family}{block}: block size {block} must be in [{low}, '
                     f'head_dim={head_dim}]; use e.g. {family}{max(low, min(8, head_dim))} or '
                     f'{family}{head_dim}.')
  if family == 'comrope_ap' and head_dim // block < n_dims:
    raise ValueError(f'comrope_ap{block} gives head_dim // {block} = {head_dim // block} blocks '
                     f'per head, fewer than the {n_dims} position axes (block j follows axis j '
                     f'mod {n_dims}); use a block size <= {head_dim // n_dims}.')
  if family in AXIAL + ('rope_mixed', 'string_cayley') and head_dim < 2 * n_dims:
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
                              num_prefix=spec.num_prefix, rngs=rngs, std=spec.embed_std),
      'sincos': lambda: SinCos(dim=spec.width),
      'rope_axial': lambda: RopeAxial(head_dim=spec.head_dim, n_dims=n),
      'paper_visionllama': lambda: PaperVisionLlama(head_dim=spec.head_dim, n_dims=n),
      'rope_mixed': lambda: RopeMixed(depth=spec.depth, heads=spec.heads,
                                      head_dim=spec.head_dim, n_dims=n, rngs=rngs),
      'alibi': lambda: ALiBi(heads=spec.heads),
      'liere': lambda: LieRE(block=pe.block, layers=pe.layers, heads=pe.heads,
                             head_dim=spec.head_dim, n_dims=n, init_scale=pe.init_scale,
                             expm=pe.expm, rngs=rngs),
      'comrope_ap': lambda: ComRoPEAP(block=pe.block, depth=spec.depth, heads=spec.heads,
                                      head_dim=spec.head_dim, n_dims=n,
                                      train_grid=spec.train_grid, positions=pe.positions,
                                      rngs=rngs),
      'comrope_ld': lambda: ComRoPELD(block=pe.block, depth=spec.depth, heads=spec.heads,
                                      head_dim=spec.head_dim, n_dims=n,
                                      train_grid=spec.train_grid, positions=pe.positions,
                                      rngs=rngs),
      'string_cayley': lambda: StringCayley(depth=spec.depth, heads=spec.heads,
                                            head_dim=spec.head_dim, n_dims=n, rngs=rngs),
      'string_circulant': lambda: StringCirculant(block=pe.block, depth=spec.depth,
                                                  heads=spec.heads, head_dim=spec.head_dim,
                                                  n_dims=n, rngs=rngs),
  }[pe.family]()
