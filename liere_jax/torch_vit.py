"""PyTorch port of the liere_jax ViT: one self-contained file (torch, numpy, safetensors only).

Copy this file into a PyTorch code base to run a model trained with liere_jax:

    from torch_vit import load_liere_safetensors
    model = load_liere_safetensors('run.safetensors')   # reads run.json beside it
    model.eval()
    logits = model(images)                              # images: [B, C, H, W] float32

Layout: inputs are channels-first, the PyTorch convention: [B, C, T] (1D), [B, C, H, W] (2D),
[B, C, T, H, W] (3D). Any size divisible by the patch size works; positions follow the
model's position mode (see `grid_positions`), the absolute embedding is resized exactly as
jax.image.resize does (Keys cubic a=-0.5 in 2D, linear otherwise, antialiased when shrinking).

The math is the JAX model's (liere_jax/model.py, encodings/, rotations.py): pre-norm blocks,
LayerNorm eps layer_norm_eps (1e-5), exact GELU, attention logits q.k / sqrt(d) in float32 plus
an optional ALiBi bias, float32 softmax; the final LayerNorm runs on every token before CLS or
mean pooling. Rotary encodings rotate q and k per head in blocks of b contiguous dims
(x' = R x); dims past the last whole block stay as they are; CLS (position 0) gets the identity.
LieRE: R(p) = expm(sum_a p_a A_a), A_a block-diagonal skew-symmetric from the strict upper
triangles (np.triu_indices(b, 1) order); torch.linalg.matrix_exp in float32 plus one
Newton-Schulz step for b > 2, the closed form [[cos t, sin t], [-sin t, cos t]] (t = A[0, 1])
for b = 2. Keep TF32 off (torch's default) for the rotations: they need float32 matmuls.

Parameter names mirror the JAX tree ('blocks/0/attn/qkv/kernel' -> 'blocks.0.attn.qkv.weight',
LayerNorm scale -> weight; Linear weights [out, in], the patch conv [D, C, *patch]); the
position-encoding parameters keep their JAX names and shapes: pe.embedding [1, T, D] (abs),
pe.freqs [n, depth, heads*d/2] (rope_mixed), pe.generators [L', H', n, d//b, b(b-1)/2]
(liere<b> and paper_rope_mixed = liere2; L' = 1 / H' = 1 when shared over layers / heads),
none for paper_visionllama (fixed frequencies); pe.skew_params
[depth, heads, d//b, b, b] (comrope_ap<b>, comrope_ld<b>, plus pe.axis_scales [depth, n, d//b]
for ld), pe.freqs + pe.cayley [depth, heads, d(d-1)/2] (string_cayley), pe.circulant
[depth, heads, n, d//b, b] (string_circulant<b>), pe.position [depth, n, heads*M] + pe.ab
[depth, D, 2*heads*M] (pape), pe.position_scales [depth, heads] + pe.a [depth, D, heads]
(pape_ri: q and k lifted by extra channels, the logits still scaled by the head size's);
pe.rotary.* + pe.lift.* for a composition (liere8+pape: rotate, then lift).
ComRoPE's exponentials run per token here (expm_rotations; the JAX model uses one
eigen-decomposition per block, same matrices).
"""
import json
import math
import os

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

POSITION_MODES = ('normalized', 'integer', 'rescaled')


class WeightsMismatchError(ValueError):
  """A weights file does not fit the model: a missing, unexpected or wrongly shaped tensor."""


# ----------------------------------------------------------------------------------------------
# Positions, tables and resizing (numpy; exactly liere_jax/positions.py and encodings/).


def grid_positions(grid, train_grid, mode, base='normalized'):
  """Patch positions [prod(grid), n] float32, row-major, in the input's axis order.

  normalized: i / (n_train - 1) (the training grid spans [0, 1], larger grids extend it);
  integer: i; rescaled: the current grid squeezed into the training grid's span in the `base`
  mode (the model's own): i / (n - 1) for normalized, i (n_train - 1) / (n - 1) for integer.
  """
  if mode not in POSITION_MODES:
    raise ValueError(f'positions={mode!r} is unknown; use one of {POSITION_MODES}.')
  if len(grid) != len(train_grid):
    raise ValueError(f'The input has a {len(grid)}D patch grid {tuple(grid)} but the model was '
                     f'built for {len(train_grid)}D grids {tuple(train_grid)}.')
  axes = []
  for n, n_train in zip(grid, train_grid):
    i = np.arange(n, dtype=np.float64)
    if mode == 'normalized':
      i = i / max(n_train - 1, 1)
    elif mode == 'rescaled':
      i = i / max(n - 1, 1) * (max(n_train - 1, 1) if base == 'integer' else 1)
    axes.append(i)
  mesh = np.meshgrid(*axes, indexing='ij')
  return np.stack([m.reshape(-1) for m in mesh], axis=-1).astype(np.float32)


def sincos_table(pos, dim, temperature=10000.):
  """Fixed sin-cos features [T, dim]: dim split evenly over the n axes (unused dims zero)."""
  n = pos.shape[-1]
  k = dim // (2 * n)
  omega = 1. / temperature ** (np.arange(k) / max(k, 1))
  angles = pos[:, :, None] * omega
  feats = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).reshape(len(pos), -1)
  return np.pad(feats, ((0, 0), (0, dim - feats.shape[-1]))).astype(np.float32)


def _keys_cubic(x):  # Keys (1981) cubic kernel, a = -0.5 (jax.image 'cubic').
  out = ((1.5 * x - 2.5) * x) * x + 1.
  out = np.where(x >= 1., ((-0.5 * x + 2.5) * x - 4.) * x + 2., out)
  return np.where(x >= 2., 0., out)


def _triangle(x):
  return np.maximum(0., 1. - np.abs(x))


def resize_weights(in_size, out_size, method):
  """[in_size, out_size] resampling matrix of jax.image.resize(..., method, antialias=True):
  half-pixel centres, the kernel widened by in/out when shrinking, weights normalised to 1."""
  kernel = {'cubic': _keys_cubic, 'linear': _triangle}[method]
  inv_scale = in_size / out_size
  kernel_scale = max(inv_scale, 1.)
  sample = (np.arange(out_size, dtype=np.float64) + 0.5) * inv_scale - 0.5
  w = kernel(np.abs(sample[None, :] - np.arange(in_size, dtype=np.float64)[:, None])
             / kernel_scale)
  total = w.sum(axis=0, keepdims=True)
  w = np.where(np.abs(total) > 1000. * float(np.finfo(np.float32).eps),
               w / np.where(total != 0, total, 1), 0.)
  inside = (sample >= -0.5) & (sample <= in_size - 0.5)
  return np.where(inside[None, :], w, 0.).astype(np.float32)


def resize_grid(x, grid, method):
  """x: [*old_grid, D] -> [*grid, D], axis by axis (axes of equal size are left alone)."""
  for axis, n in enumerate(grid):
    if x.shape[axis] != n:
      w = torch.as_tensor(resize_weights(x.shape[axis], n, method), device=x.device)
      x = torch.movedim(torch.tensordot(x, w.to(x.dtype), dims=([axis], [0])), -1, axis)
  return x


# ----------------------------------------------------------------------------------------------
# Rotations.


def skew(params, block):
  """[..., b(b-1)/2] strict-upper-triangle entries -> [..., b, b] skew-symmetric U - U^T."""
  rows, cols = np.triu_indices(block, k=1)
  u = params.new_zeros(params.shape[:-1] + (block, block))
  u[..., torch.as_tensor(rows), torch.as_tensor(cols)] = params
  return u - u.transpose(-1, -2)


def expm_rotations(a):
  """exp(a) for skew-symmetric a [..., b, b], float32; closed form for b = 2.

  b > 2: torch.linalg.matrix_exp in float32, then one Newton-Schulz step to the nearest
  orthogonal matrix (as liere_jax's expm does): float32 scaling and squaring loses ~1e-5 on
  generators with norms in the hundreds, the step brings it back to a few 1e-6.
  """
  a = a.float()
  if a.shape[-1] == 2:
    t = a[..., 0, 1]
    c, s = torch.cos(t), torch.sin(t)
    return torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)
  r = torch.linalg.matrix_exp(a)
  return 1.5 * r - 0.5 * torch.matmul(r, torch.matmul(r.transpose(-1, -2), r))


def angle_rotations(angles):
  """[..., k] angles -> [..., k, 2, 2] rotations [[cos, -sin], [sin, cos]]."""
  c, s = torch.cos(angles), torch.sin(angles)
  return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def liere_rotations(generators, pos, block):
  """generators [L, H, n, k, b(b-1)/2], positions [T, n] -> rotations [L, H, T, k, b, b]."""
  g = generators.float()
  coeffs = sum(pos[:, a].reshape(1, 1, -1, 1, 1) * g[:, :, a, None]
               for a in range(pos.shape[-1]))
  return expm_rotations(skew(coeffs, block))


def rotate(x, rot):
  """x [B, T, H, d] rotated by rot [H or 1, T, k, b, b] (x' = R x on the first k*b dims)."""
  k, b = rot.shape[-3], rot.shape[-1]
  rot = rot.transpose(0, 1)  # [T, H or 1, k, b, b], broadcast over heads.
  xr = x[..., :k * b].float().reshape(*x.shape[:-1], k, b)
  if b == 2:
    out = torch.stack([rot[..., 0, 0] * xr[..., 0] + rot[..., 0, 1] * xr[..., 1],
                       rot[..., 1, 0] * xr[..., 0] + rot[..., 1, 1] * xr[..., 1]], -1)
  else:
    out = torch.matmul(rot, xr.unsqueeze(-1)).squeeze(-1)
  out = out.reshape(*x.shape[:-1], k * b).to(x.dtype)
  return torch.cat([out, x[..., k * b:]], dim=-1) if k * b < x.shape[-1] else out


# ----------------------------------------------------------------------------------------------
# Position encodings: embed (absolute), context (once per forward pass), attend (per layer).


class Encoding(nn.Module):
  """Built for the model's prefix tokens (num_prefix, CLS first), as the JAX encodings are."""

  def embed(self, x, grid):
    return x

  def context(self, pos):
    return None

  def attend(self, ctx, layer, q, k):
    return q, k, None

  def lift(self, ctx, layer, x, q, k):
    """q, k [B, T, H, d] -> [B, T, H, d'] from the attention's input x (PaPE); the softmax
    scale stays d**-0.5."""
    return q, k


class NoPE(Encoding):
  pass


class Absolute(Encoding):
  """Learned embedding [1, T_train, D] (CLS slot first); resized to other grids like
  jax.image.resize ('cubic' in 2D, 'linear' otherwise)."""

  def __init__(self, dim, train_grid, num_prefix):
    super().__init__()
    self.train_grid, self.num_prefix = tuple(train_grid), num_prefix
    self.embedding = nn.Parameter(0.02 * torch.randn(1, num_prefix + math.prod(train_grid), dim))

  def embed(self, x, grid):
    emb = self.embedding
    if tuple(grid) != self.train_grid:
      prefix, patches = emb[:, :self.num_prefix], emb[0, self.num_prefix:]
      patches = patches.reshape(self.train_grid + (-1,))
      patches = resize_grid(patches, grid, 'cubic' if len(grid) == 2 else 'linear')
      emb = torch.cat([prefix, patches.reshape(1, -1, emb.shape[-1])], dim=1)
    return x + emb.to(x.dtype)


class SinCos(Encoding):
  """Fixed sin-cos table on integer positions; CLS gets zeros."""

  def __init__(self, dim, num_prefix):
    super().__init__()
    self.dim, self.num_prefix = dim, num_prefix

  def embed(self, x, grid):
    table = sincos_table(grid_positions(grid, grid, 'integer'), self.dim)
    table = np.concatenate([np.zeros((self.num_prefix, self.dim), np.float32), table])
    return x + torch.as_tensor(table, device=x.device).to(x.dtype)


class RopeAxial(Encoding):
  """Fixed frequencies 1/100^(2nj/d); pairs of axis a follow those of axis a-1."""

  def __init__(self, head_dim, n_dims, theta=100.):
    super().__init__()
    per_axis = head_dim // (2 * n_dims)
    self.set_freqs(1. / theta ** (np.arange(per_axis) * 2 * n_dims / head_dim))

  def set_freqs(self, freqs):
    self.register_buffer('freqs', torch.tensor(freqs, dtype=torch.float32), persistent=False)

  def context(self, pos):
    angles = (pos[:, :, None] * self.freqs).reshape(pos.shape[0], -1)
    return angle_rotations(angles)[None]  # [1, T, pairs, 2, 2]

  def attend(self, ctx, layer, q, k):
    return rotate(q, ctx), rotate(k, ctx), None


class PaperVisionLlama(RopeAxial):
  """The paper's VisionLlama column (the official LieRE code's "tiled" encoding): RopeAxial's
  layout with frequencies exp(-4 linspace(0, 1, d // (2n))) on [0, 1] positions."""

  def __init__(self, head_dim, n_dims):
    super().__init__(head_dim, n_dims)
    self.set_freqs(np.exp(-4. * np.linspace(0., 1., head_dim // (2 * n_dims))))


def _random_frame(n):
  if n == 1:
    return torch.ones(1, 1)
  if n == 2:
    phi = float(torch.rand(()) * 2 * math.pi)
    return torch.tensor([[math.cos(phi), math.sin(phi)], [-math.sin(phi), math.cos(phi)]])
  q, r = torch.linalg.qr(torch.randn(n, n))
  return q * torch.sign(torch.diagonal(r))


class RopeMixed(Encoding):
  """Learned frequencies freqs [n, depth, heads * d/2]; angle = sum_a freqs[a] * p_a."""

  def __init__(self, depth, heads, head_dim, n_dims, theta=10.):
    super().__init__()
    pairs = head_dim // 2
    per_dir = -(-pairs // n_dims)
    mag = 1. / theta ** (np.arange(0, head_dim, 2 * n_dims)[:per_dir] / head_dim)
    frames = torch.stack([_random_frame(n_dims) for _ in range(depth * heads)])
    freqs = torch.einsum('mca,j->amcj', frames, torch.tensor(mag, dtype=torch.float32))
    freqs = freqs.reshape(n_dims, depth * heads, -1)[..., :pairs]
    self.freqs = nn.Parameter(freqs.reshape(n_dims, depth, heads * pairs).contiguous())
    self.heads = heads

  def context(self, pos):
    n, depth, _ = self.freqs.shape
    freqs = self.freqs.float().reshape(n, depth, self.heads, 1, -1)  # [n, L, H, 1, pairs]
    angles = sum(pos[:, a].reshape(1, 1, -1, 1) * freqs[a] for a in range(n))
    return angle_rotations(angles)  # [L, H, T, pairs, 2, 2]

  def attend(self, ctx, layer, q, k):
    return rotate(q, ctx[layer]), rotate(k, ctx[layer]), None


class ALiBi(Encoding):
  """Logit bias -m_h * ||p_q - p_k||, slopes 2^(-8(h+1)/H); CLS has zero bias both ways."""

  def __init__(self, heads, num_prefix):
    super().__init__()
    slopes = 2. ** (-8. * np.arange(1, heads + 1) / heads)
    self.register_buffer('slopes', torch.tensor(slopes, dtype=torch.float32), persistent=False)
    self.num_prefix = num_prefix

  def context(self, pos):
    dist = torch.sqrt(torch.sum(torch.square(pos[:, None] - pos[None]), -1))
    is_patch = torch.arange(pos.shape[0], device=pos.device) >= self.num_prefix
    dist = dist * (is_patch[:, None] & is_patch[None])
    return -self.slopes[:, None, None] * dist  # [H, T, T]

  def attend(self, ctx, layer, q, k):
    return q, k, ctx


class LieRE(Encoding):
  """generators [L', H', n, d//b, b(b-1)/2]; R(p) = expm(sum_a p_a A_a) per layer and head."""

  def __init__(self, block, layers, heads, head_dim, n_dims, init_scale):
    super().__init__()
    self.block = block
    shape = (layers, heads, n_dims, head_dim // block, block * (block - 1) // 2)
    self.generators = nn.Parameter(init_scale * torch.rand(shape))

  def context(self, pos):
    return liere_rotations(self.generators, pos, self.block)  # [L', H', T, k, b, b]

  def attend(self, ctx, layer, q, k):
    rot = ctx[layer if ctx.shape[0] > 1 else 0]
    return rotate(q, rot), rotate(k, rot), None


# Commuting generators (ComRoPE, STRING): exactly relative, R(x)^T R(y) depends on y - x only.


def comrope_position_map(train_grid, mode):
  """(scale, offset) per axis: scale * p + offset = (i + 0.5) / n_a on the training grid for the
  positions p of `mode` (normalized / rescaled: p = i / (n - 1) there; integer: p = i)."""
  scale, offset = [], []
  for n in train_grid:
    unit = 1. if mode == 'integer' else 1. / max(n - 1, 1)
    scale.append(1. / (unit * n))
    offset.append(0.5 / n)
  return scale, offset


class _ComRoPE(Encoding):
  """skew_params [depth, heads, d//b, b, b] (B = P - P^T per block); patches at
  scale * p + offset ((i + 0.5) / n at training size), CLS at 0 (the identity)."""

  def __init__(self, block, depth, heads, head_dim, train_grid, positions, num_prefix):
    super().__init__()
    self.block, self.num_prefix = block, num_prefix
    self.skew_params = nn.Parameter(torch.randn(depth, heads, head_dim // block, block, block))
    scale, offset = comrope_position_map(train_grid, positions)
    self.register_buffer('pos_scale', torch.tensor(scale, dtype=torch.float32), persistent=False)
    self.register_buffer('pos_offset', torch.tensor(offset, dtype=torch.float32),
                         persistent=False)

  def token_positions(self, pos):
    x = pos * self.pos_scale + self.pos_offset
    is_patch = torch.arange(pos.shape[0], device=pos.device) >= self.num_prefix
    return torch.where(is_patch[:, None], x, torch.zeros_like(x))

  def generators(self):
    p = self.skew_params.float()
    return p - p.transpose(-1, -2)  # [L, H, k, b, b]

  def exponentials(self, t):
    """exp(t B): t [L or 1, H or 1, k, T] -> [L, H, T, k, b, b] (expm_rotations per token: the
    JAX side's one eigen-decomposition per block gives the same matrices)."""
    a = t[..., None, None] * self.generators()[:, :, :, None]  # [L, H, k, T, b, b]
    return expm_rotations(a.contiguous()).transpose(2, 3)

  def attend(self, ctx, layer, q, k):
    return rotate(q, ctx[layer]), rotate(k, ctx[layer]), None


class ComRoPEAP(_ComRoPE):
  """ComRoPE-AP: block j turns with position axis j mod n: R = blockdiag exp(x_{j mod n} B_j)."""

  def __init__(self, block, depth, heads, head_dim, n_dims, train_grid, positions, num_prefix):
    super().__init__(block, depth, heads, head_dim, train_grid, positions, num_prefix)
    self.n_dims = n_dims

  def context(self, pos):
    x = self.token_positions(pos)
    k = self.skew_params.shape[2]
    axes = torch.as_tensor(np.arange(k) % self.n_dims, device=pos.device)
    return self.exponentials(x[:, axes].T[None, None])


class ComRoPELD(_ComRoPE):
  """ComRoPE-LD: R = blockdiag exp((sum_a theta_{a,j} x_a) S_{h,j}); axis_scales [depth, n, d//b]
  (theta, shared by the heads)."""

  def __init__(self, block, depth, heads, head_dim, n_dims, train_grid, positions, num_prefix):
    super().__init__(block, depth, heads, head_dim, train_grid, positions, num_prefix)
    self.axis_scales = nn.Parameter(torch.randn(depth, n_dims, head_dim // block))

  def context(self, pos):
    x = self.token_positions(pos)
    s = torch.einsum('ta,lak->lkt', x, self.axis_scales.float())[:, None]  # [L, 1, k, T]
    return self.exponentials(s)


class StringCayley(RopeMixed):
  """Cayley-STRING: R(x) = RoPE-Mixed(x) P, P = (I - S)(I + S)^-1 per layer and head; cayley
  [depth, heads, d(d-1)/2] (S's strict upper triangle). CLS gets R(0) = P. P can be folded into
  the query / key projections for inference."""

  def __init__(self, depth, heads, head_dim, n_dims):
    super().__init__(depth, heads, head_dim, n_dims)
    self.head_dim = head_dim
    self.cayley = nn.Parameter(torch.zeros(depth, heads, head_dim * (head_dim - 1) // 2))

  def orthogonal(self):
    s = skew(self.cayley.float(), self.head_dim)
    eye = torch.eye(self.head_dim, device=s.device)
    return torch.linalg.solve(eye + s, eye - s)  # [L, H, d, d]

  def context(self, pos):
    return super().context(pos), self.orthogonal()

  def attend(self, ctx, layer, q, k):
    rope, p = ctx

    def apply(x):
      xp = torch.einsum('hij,bthj->bthi', p[layer], x.float())
      return rotate(xp, rope[layer]).to(x.dtype)

    return apply(q), apply(k), None


class StringCirculant(Encoding):
  """Circulant-STRING: R = blockdiag exp(sum_a x_a (C_a - C_a^T)), C circulant with first column
  c (circulant [depth, heads, n, d//b, b]); applied with a real FFT: R = F^-1 diag(e^{i phi}) F,
  phi_m = sum_a x_a mu_{a,m}, mu_{a,m} = -2 sum_r c_{a,r} sin(2 pi m r / b)."""

  def __init__(self, block, depth, heads, head_dim, n_dims):
    super().__init__()
    self.block = block
    self.circulant = nn.Parameter(torch.randn(depth, heads, n_dims, head_dim // block, block)
                                  / math.sqrt(8. * block))
    b = block
    sines = np.sin(2 * np.pi * np.outer(np.arange(b), np.arange(b // 2 + 1)) / b)
    self.register_buffer('sines', torch.tensor(sines, dtype=torch.float32), persistent=False)

  def context(self, pos):
    mu = -2. * torch.einsum('lhakr,rm->lhakm', self.circulant.float(), self.sines)
    phi = torch.einsum('ta,lhakm->lhtkm', pos, mu)
    return torch.stack([torch.cos(phi), torch.sin(phi)], -1)  # [L, H, T, k, b//2 + 1, 2]

  def attend(self, ctx, layer, q, k):
    return (circulant_rotate(q, ctx[layer], self.block),
            circulant_rotate(k, ctx[layer], self.block), None)


def circulant_rotate(x, phase, block):
  """x [B, T, H, d] -> R x per block; phase [H, T, k, block//2 + 1, (cos, sin)]."""
  k, b = phase.shape[-3], block
  xr = x[..., :k * b].float().reshape(*x.shape[:-1], k, b)
  e = torch.complex(phase[..., 0], phase[..., 1]).transpose(0, 1)  # [T, H, k, m]
  out = torch.fft.irfft(torch.fft.rfft(xr, dim=-1) * e, n=b, dim=-1)
  out = out.reshape(*x.shape[:-1], k * b).to(x.dtype)
  return torch.cat([out, x[..., k * b:]], dim=-1) if k * b < x.shape[-1] else out


# Parabolic encodings (PaPE, PaPE-RI): a bias computed as extra channels of q and k.


def patch_step(train_grid, mode):
  """The distance between neighbouring patches per axis at the training grid in `mode`."""
  if mode == 'integer':
    return [1.] * len(train_grid)
  return [1. / max(n - 1, 1) for n in train_grid]  # normalized (rescaled: the same there).


def parabolic_lift(x, q, k, u, weights, isotropic):
  """q' = [q, sum (b u - a u^2), a, 2 a u - b], k' = [k, 1, -u^2, u], zeros to a multiple of 8
  channels (liere_jax.encodings.base.Lift's channels); u [H, T, M], a = softplus(x W_a),
  b = x W_b (weights [D, 2 H M], or [D, H] when isotropic: one a per head against -|u|^2, no
  b). q'.k' = q.k - sum a (u_i - u_j)^2 + sum b (u_i - u_j)."""
  heads, t, m = u.shape
  ab = (x.float() @ weights.float())
  if isotropic:
    a, b = F.softplus(ab)[..., None], None
  else:
    ab = ab.reshape(x.shape[0], t, 2, heads, m)
    a, b = F.softplus(ab[:, :, 0]), ab[:, :, 1]
  u = u.transpose(0, 1).float()  # [T, H, M]
  u = u - u.mean(0, keepdim=True)  # Centred: the bias reads u_i - u_j alone.
  u2 = (u * u).sum(-1, keepdim=True) if isotropic else u * u
  first, linear = -(a * u2).sum(-1, keepdim=True), 2 * a * u
  if b is not None:
    first, linear = first + (b * u).sum(-1, keepdim=True), linear - b
  qs, ks = torch.cat([first, a, linear], -1), torch.cat([torch.ones_like(u[..., :1]), -u2, u], -1)
  pad = -(q.shape[-1] + qs.shape[-1]) % 8

  def cat(y, features):
    features = features.expand(*y.shape[:-1], features.shape[-1]).to(y.dtype)
    return torch.cat([y, features, y.new_zeros(*y.shape[:-1], pad)], dim=-1)

  return cat(q, qs), cat(k, ks)


class _Parabolic(Encoding):
  """Patches one patch step past the prefix tokens at 0 (the official positions)."""

  def __init__(self, train_grid, positions, num_prefix):
    super().__init__()
    self.step, self.num_prefix = patch_step(train_grid, positions), num_prefix

  def official_positions(self, pos):
    is_patch = (torch.arange(pos.shape[0], device=pos.device) >= self.num_prefix)[:, None]
    step = torch.tensor(self.step, dtype=torch.float32, device=pos.device)
    return pos.float() + is_patch * step


class PaPE(_Parabolic):
  """position [L, n, H*M] (u = p position), ab [L, D, 2*H*M] (a | b, head, parabola)."""

  def __init__(self, depth, heads, width, n_dims, parabolas, train_grid, positions, num_prefix):
    super().__init__(train_grid, positions, num_prefix)
    self.heads, self.parabolas = heads, parabolas
    bound = 1. / math.sqrt(n_dims)
    self.position = nn.Parameter(torch.empty(depth, n_dims, heads * parabolas).uniform_(
        -bound, bound))
    bound = 1. / math.sqrt(width)
    self.ab = nn.Parameter(torch.empty(depth, width, 2 * heads * parabolas).uniform_(
        -bound, bound))

  def context(self, pos):
    u = torch.einsum('ta,lam->ltm', self.official_positions(pos), self.position.float())
    u = u.reshape(u.shape[0], u.shape[1], self.heads, self.parabolas)
    return u.transpose(1, 2)  # [L, H, T, M]

  def lift(self, ctx, layer, x, q, k):
    return parabolic_lift(x, q, k, ctx[layer], self.ab[layer], False)


class PaPERI(_Parabolic):
  """position_scales [L, H] (fixed), a [L, D, H]: u = s_h p, one isotropic parabola."""

  def __init__(self, depth, heads, width, n_dims, train_grid, positions, num_prefix):
    super().__init__(train_grid, positions, num_prefix)
    bound = math.sqrt(1. / n_dims)
    self.position_scales = nn.Parameter(torch.empty(depth, heads).uniform_(-bound, bound),
                                        requires_grad=False)
    bound = 1. / math.sqrt(width)
    self.a = nn.Parameter(torch.empty(depth, width, heads).uniform_(-bound, bound))

  def context(self, pos):
    return self.position_scales.float()[:, :, None, None] * self.official_positions(pos)

  def lift(self, ctx, layer, x, q, k):
    return parabolic_lift(x, q, k, ctx[layer], self.a[layer], True)


# family -> its module here, from the resolved `pe` section and the model's dims (width, depth,
# heads, head_dim, n, train_grid, num_prefix): the mirror of the JAX encodings' registry
# (liere_jax.encodings.FAMILIES, declared by each class at its registration).
BUILDERS = {
    'none': lambda pe, d: NoPE(),
    'abs': lambda pe, d: Absolute(d['width'], d['train_grid'], d['num_prefix']),
    'sincos': lambda pe, d: SinCos(d['width'], d['num_prefix']),
    'rope_axial': lambda pe, d: RopeAxial(d['head_dim'], d['n']),
    'paper_visionllama': lambda pe, d: PaperVisionLlama(d['head_dim'], d['n']),
    'rope_mixed': lambda pe, d: RopeMixed(d['depth'], d['heads'], d['head_dim'], d['n']),
    'alibi': lambda pe, d: ALiBi(d['heads'], d['num_prefix']),
    'liere': lambda pe, d: LieRE(pe['block'], pe['layers'], pe['heads'], d['head_dim'], d['n'],
                                 pe['init_scale']),
    'comrope_ap': lambda pe, d: ComRoPEAP(pe['block'], d['depth'], d['heads'], d['head_dim'],
                                          d['n'], d['train_grid'], pe['positions'],
                                          d['num_prefix']),
    'comrope_ld': lambda pe, d: ComRoPELD(pe['block'], d['depth'], d['heads'], d['head_dim'],
                                          d['n'], d['train_grid'], pe['positions'],
                                          d['num_prefix']),
    'string_cayley': lambda pe, d: StringCayley(d['depth'], d['heads'], d['head_dim'], d['n']),
    'string_circulant': lambda pe, d: StringCirculant(pe['block'], d['depth'], d['heads'],
                                                      d['head_dim'], d['n']),
    'pape': lambda pe, d: PaPE(d['depth'], d['heads'], d['width'], d['n'],
                               pe.get('parabolas', 50), d['train_grid'], pe['positions'],
                               d['num_prefix']),
    'pape_ri': lambda pe, d: PaPERI(d['depth'], d['heads'], d['width'], d['n'], d['train_grid'],
                                    pe['positions'], d['num_prefix']),
}


class Composition(Encoding):
  """'a+b' (family 'liere+pape'): the rotary encoding a (pe.rotary.*) rotates q and k, then
  the lift b (pe.lift.*) widens them; the lift reads integer positions (PaPE's), converted from
  a's mode."""

  def __init__(self, rotary, lift, scale):
    super().__init__()
    self.rotary = rotary
    self._modules['lift'] = lift  # pe.lift.*, beside the method `lift` (add_module refuses).
    self.scale = scale

  def embed(self, x, grid):
    return self._modules['lift'].embed(self.rotary.embed(x, grid), grid)

  def context(self, pos):
    scale = torch.tensor(self.scale, dtype=torch.float32, device=pos.device)
    return self.rotary.context(pos), self._modules['lift'].context(pos.float() * scale)

  def attend(self, ctx, layer, q, k):
    return self.rotary.attend(ctx[0], layer, q, k)

  def lift(self, ctx, layer, x, q, k):
    return self._modules['lift'].lift(ctx[1], layer, x, q, k)


def build_encoding(pe, *, width, depth, heads, train_grid, num_prefix):
  """The encoding of a resolved `pe` section (family, block, layers, heads, init_scale)."""
  if '+' in pe['family']:
    (rotary, lift), (rotary_name, lift_name) = pe['family'].split('+'), pe['name'].split('+')
    parts = [build_encoding({**pe, 'family': f, 'name': n, **extra}, width=width, depth=depth,
                            heads=heads, train_grid=train_grid, num_prefix=num_prefix)
             for f, n, extra in ((rotary, rotary_name, {}),
                                 (lift, lift_name, {'block': None, 'positions': 'integer'}))]
    scale = [i / r for i, r in zip(patch_step(train_grid, 'integer'),
                                   patch_step(train_grid, pe['positions']))]
    return Composition(*parts, scale)
  if pe['family'] not in BUILDERS:
    raise ValueError(f"pe.name={pe['name']!r} is unknown to this port; it knows the families "
                     f'{tuple(BUILDERS)} (names: family<b> for the blocked ones).')
  dims = dict(width=width, depth=depth, heads=heads, head_dim=width // heads,
              n=len(train_grid), train_grid=train_grid, num_prefix=num_prefix)
  return BUILDERS[pe['family']](pe, dims)


# ----------------------------------------------------------------------------------------------
# The ViT.


class Attention(nn.Module):

  def __init__(self, width, heads, qkv_bias=True):
    super().__init__()
    self.heads = heads
    self.qkv = nn.Linear(width, 3 * width, bias=qkv_bias)
    self.proj = nn.Linear(width, width)

  def forward(self, x, pe, ctx, layer):
    b, t, width = x.shape
    q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, -1).unbind(2)  # [B, T, H, d] each
    q, k, bias = pe.attend(ctx, layer, q, k)
    q, k = pe.lift(ctx, layer, x, q, k)  # PaPE: wider q, k; the scale is v's head size.
    logits = torch.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(v.shape[-1])
    logits = logits.float()
    if bias is not None:
      logits = logits + bias
    weights = torch.softmax(logits, dim=-1)
    out = torch.einsum('bhqk,bkhd->bqhd', weights.to(v.dtype), v).reshape(b, t, width)
    return self.proj(out), weights


class Mlp(nn.Module):

  def __init__(self, width, mlp_dim, hidden_dropout):
    super().__init__()
    self.fc1 = nn.Linear(width, mlp_dim)
    self.dropout = nn.Dropout(hidden_dropout)
    self.fc2 = nn.Linear(mlp_dim, width)

  def forward(self, x):
    return self.fc2(self.dropout(F.gelu(self.fc1(x))))  # exact (erf) GELU


class Block(nn.Module):
  """Pre-norm block; dropout (training only) at the `dropout_sites` among 'attn' (attention
  output), 'mlp_hidden' (after GELU) and 'mlp' (MLP output)."""

  def __init__(self, width, heads, mlp_dim, qkv_bias, dropout, eps, dropout_sites):
    super().__init__()
    self.norm1 = nn.LayerNorm(width, eps=eps)
    self.attn = Attention(width, heads, qkv_bias)
    self.norm2 = nn.LayerNorm(width, eps=eps)
    self.mlp = Mlp(width, mlp_dim, dropout if 'mlp_hidden' in dropout_sites else 0.)
    self.drop_attn = nn.Dropout(dropout if 'attn' in dropout_sites else 0.)
    self.drop_mlp = nn.Dropout(dropout if 'mlp' in dropout_sites else 0.)

  def forward(self, x, pe, ctx, layer):
    y, weights = self.attn(self.norm1(x), pe, ctx, layer)
    x = x + self.drop_attn(y)
    x = x + self.drop_mlp(self.mlp(self.norm2(x)))
    return x, weights


SPEC_FIELDS = ('width', 'depth', 'heads', 'mlp_dim', 'patch', 'input_size', 'channels',
               'num_classes', 'pool', 'qkv_bias', 'dropout', 'dropout_sites', 'layer_norm_eps',
               'norm_pre', 'pe')
# Fields added after models were exported, with the value those models were trained with.
ADDED_FIELDS = {'dropout_sites': ('embed', 'attn', 'mlp'), 'norm_pre': False}


def spec_fields(config):
  """The resolved model of an exported JSON (liere_jax.config.model.ModelSpec.to_json(): every value
  given, no default applied here)."""
  config = {**ADDED_FIELDS, **config}
  missing = [k for k in SPEC_FIELDS if k not in config]
  if missing or 'positions' not in config['pe'] or 'family' not in config['pe']:
    raise ValueError(f'The config lacks {missing or ["pe.family / pe.positions"]}: it is not '
                     'the JSON written by `python -m liere_jax.convert to_torch` (a resolved model). '
                     'Export the run to get it.')
  return {k: config[k] for k in SPEC_FIELDS}


class ViT(nn.Module):
  """ViT classifier over channels-first inputs [B, C, *spatial] (1D, 2D or 3D).

  forward(x, ctx=None, positions=None, return_attention=False): `positions` overrides the
  position mode; `ctx = model.pe_context(grid)` can be computed once and reused.
  """

  def __init__(self, *, width, depth, heads, mlp_dim, patch, input_size, channels,
               num_classes, pool, qkv_bias, pe, dropout, dropout_sites, layer_norm_eps,
               norm_pre=False):
    super().__init__()
    patch, input_size = tuple(patch), tuple(input_size)
    if len(patch) != len(input_size) or not 1 <= len(patch) <= 3:
      raise ValueError(f'patch={patch} and input_size={input_size} need 1, 2 or 3 axes each.')
    if any(s % p for s, p in zip(input_size, patch)):
      raise ValueError(f'input_size={input_size} is not divisible by patch={patch}.')
    if width % heads:
      raise ValueError(f'width={width} is not divisible by heads={heads}.')
    if pool not in ('cls', 'mean'):
      raise ValueError(f"pool={pool!r} is unknown; use 'cls' or 'mean'.")
    self.patch, self.input_size, self.channels = patch, input_size, channels
    self.train_grid = tuple(s // p for s, p in zip(input_size, patch))
    self.pool = pool
    self.num_prefix = 1 if pool == 'cls' else 0
    self.pe_config = pe
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[len(patch)]
    self.patch_embed = conv(channels, width, patch, stride=patch)
    if self.num_prefix:
      self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, width))
    self.pe = build_encoding(pe, width=width, depth=depth, heads=heads,
                             train_grid=self.train_grid, num_prefix=self.num_prefix)
    self.positions = pe['positions']
    self.dropout = nn.Dropout(dropout if 'embed' in dropout_sites else 0.)
    # The official PaPE classifiers' encoder.norm_pre: every token, before the first block.
    self.norm_pre = nn.LayerNorm(width, eps=layer_norm_eps) if norm_pre else nn.Identity()
    self.blocks = nn.ModuleList([
        Block(width, heads, mlp_dim, qkv_bias, dropout, layer_norm_eps, dropout_sites)
        for _ in range(depth)])
    self.norm = nn.LayerNorm(width, eps=layer_norm_eps)
    self.head = nn.Linear(width, num_classes)

  @classmethod
  def from_config(cls, config):
    """From the JSON written by `python -m liere_jax.convert to_torch` (a dict or a path)."""
    if isinstance(config, (str, os.PathLike)):
      with open(config) as f:
        config = json.load(f)
    return cls(**spec_fields(config))

  def grid(self, shape):
    n = len(self.patch)
    if len(shape) != n + 2 or shape[1] != self.channels:
      raise ValueError(f'Input shape {tuple(shape)} does not fit the model: it expects '
                       f'channels-first [batch, {self.channels} channels, {n} spatial axes].')
    spatial = tuple(shape[2:])
    if any(s % p for s, p in zip(spatial, self.patch)):
      raise ValueError(f'Input size {spatial} is not divisible by patch={self.patch}.')
    return tuple(s // p for s, p in zip(spatial, self.patch))

  def positions_for(self, grid, positions=None):
    """Token positions [num_prefix + prod(grid), n] (CLS at zero), float32."""
    pos = grid_positions(grid, self.train_grid, positions or self.positions, self.positions)
    pos = np.concatenate([np.zeros((self.num_prefix, pos.shape[-1]), np.float32), pos])
    return torch.as_tensor(pos, device=self.head.weight.device)

  def pe_context(self, grid, positions=None):
    """The encoding's per-forward state for a patch grid: rotations [L, H, T, k, b, b]
    (LieRE, RoPE-Mixed), [1, T, pairs, 2, 2] (RoPE-Axial), ALiBi biases [H, T, T] or None."""
    return self.pe.context(self.positions_for(grid, positions))

  def forward(self, x, ctx=None, positions=None, return_attention=False):
    grid = self.grid(x.shape)
    if ctx is None:
      ctx = self.pe_context(grid, positions)
    x = self.patch_embed(x).flatten(2).transpose(1, 2)  # [B, T, D], tokens row-major.
    if self.num_prefix:
      x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
    x = self.norm_pre(self.dropout(self.pe.embed(x, grid)))
    attention = []
    for layer, block in enumerate(self.blocks):
      x, weights = block(x, self.pe, ctx, layer)
      attention.append(weights)
    x = self.norm(x)
    x = x[:, 0] if self.pool == 'cls' else x.mean(dim=1)
    logits = self.head(x).float()
    return (logits, attention) if return_attention else logits

  def load_liere_state_dict(self, state):
    """Loads tensors named like `self.state_dict()`; every key accounted for, every shape
    checked (WeightsMismatchError naming the first mismatched key)."""
    check_state(self.state_dict(), state)
    with torch.no_grad():
      self.load_state_dict({k: v if torch.is_tensor(v) else torch.tensor(np.array(v))
                            for k, v in state.items()}, strict=True)
    return self


def check_state(expected, found):
  """Raises WeightsMismatchError on the first missing, unexpected or wrongly shaped key."""
  missing = [k for k in expected if k not in found]
  unexpected = sorted(k for k in found if k not in expected)
  if missing or unexpected:
    parts = []
    if missing:
      parts.append(f'missing key {missing[0]!r}' + (f' (and {len(missing) - 1} more)'
                                                   if len(missing) > 1 else ''))
    if unexpected:
      parts.append(f'unexpected key {unexpected[0]!r}' + (f' (and {len(unexpected) - 1} more)'
                                                         if len(unexpected) > 1 else ''))
    raise WeightsMismatchError('The weights do not match the model: ' + '; '.join(parts) +
                               '. Was the file exported from the run of this config?')
  for key, ref in expected.items():
    shape = tuple(found[key].shape)
    if shape != tuple(ref.shape):
      raise WeightsMismatchError(f'The weights do not match the model: {key!r} has shape '
                                 f'{shape}, the model expects {tuple(ref.shape)}.')


def config_path_for(path):
  """FILE.safetensors -> FILE.json (the exported model config beside the weights)."""
  root, _ = os.path.splitext(os.fspath(path))
  return root + '.json'


def load_liere_safetensors(path, config=None, device='cpu'):
  """A ViT with the weights of `path` (from `python -m liere_jax.convert to_torch`).

  config: the exported JSON (dict or path); default: FILE.json beside FILE.safetensors, else
  the copy of the model fields in the file's metadata.
  """
  from safetensors import safe_open
  from safetensors.torch import load_file
  if config is None:
    config = config_path_for(path)
    if not os.path.exists(config):  # The export also stores the model fields in the file.
      with safe_open(os.fspath(path), framework='pt') as f:
        meta = (f.metadata() or {}).get('liere_jax')
      if meta is None:
        raise FileNotFoundError(f'{config} (the model config written beside {path}) is '
                                'missing; pass config= or export again.')
      config = json.loads(meta)
  model = ViT.from_config(config)
  model.load_liere_state_dict(load_file(os.fspath(path), device='cpu'))
  return model.to(device)
