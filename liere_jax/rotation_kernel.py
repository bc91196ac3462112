"""Rotations of large blocks (LieRE64's 64 x 64) applied to q and k as one Pallas TPU kernel a
pass, the batch as the products' M, then the attention kernel: a TPU's attention for them
(liere_jax.attention_kernel takes blocks up to 8 itself).

XLA applies a per-token rotation as a batched product over (token, head) with the batch as M: it
lays q out token-major for it and back, and a 64-wide minor dimension fills half of a TPU's 128
lanes (a ViT-B/16 LieRE64 step on v5e-8 spent 14% of its traffic there). Here a grid step reads
q or k in place from the projection's one array [B, T, 3 H d], a few tokens and 128 lanes at a
time, and multiplies each token's [B, 128] rows by its 128 x 128 tile of the rotation (`tiles`:
the block-diagonal rotation's diagonal tiles; zeros off the blocks add nothing, exactly).
Products of x's dtype, float32 sums, as the einsum's. The attention kernel then reads q' and k'
and v where the projection left it (slicing q, k, v out of the one array cost XLA copies: the
2-layer v5e-8 ImageNet proxy moved 20.57 GB a step with them, 18.82 without). The backward turns the attention kernel's gradient of q'
and k' back in place in its one array, and the tile gradient, sum_b x^T g over q and k,
accumulates on chip across the batch. On CPU the kernels run in interpret mode (tests).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from liere_jax import attention_kernel

LANES = 128
MIN_BLOCK = 16  # Smaller blocks rotate inside the attention kernel (its band).
TOKENS = 8  # Tokens a grid step (a sublane tile).
ROW_BYTES = 2**18  # x's bytes a grid step, about: the batch is split above this.


def supported(block: int, head_dim: int, heads: int) -> bool:
  """Whether the kernel takes blocks of b on heads of d: b divides 128 (no block crosses a
  tile), d divides 128 (no head crosses one; the attention kernel's heads) and H d is whole
  tiles."""
  return (MIN_BLOCK <= block <= min(head_dim, LANES) and LANES % block == 0
          and LANES % head_dim == 0 and (heads * head_dim) % LANES == 0)


@jax.named_scope('pe_rotate')  # The rotation's part of a step (bench.compile.SCOPES).
def tiles(rot: jax.Array, head_dim: int) -> jax.Array:
  """[T, H, k, b, b] block rotations -> the kernel's tiles [T, H d / 128, 128, 128]: the
  diagonal tiles of the block-diagonal rotation of each token's H d dims, transposed (x' = R x
  is the row product x R^T); dims past k * b of each head pass through. In rot's dtype, exact
  (products with 0 / 1)."""
  t, h, k, b, _ = rot.shape
  eye = lambda n: jnp.eye(n, dtype=rot.dtype)
  einsum = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  full = einsum('thkji,kl->thkilj', rot, eye(k)).reshape(t, h, k * b, k * b)
  if k * b < head_dim:  # Pass-through dims: the identity.
    n = head_dim - k * b
    full = jnp.concatenate([
        jnp.concatenate([full, jnp.zeros((t, h, k * b, n), rot.dtype)], -1),
        jnp.broadcast_to(jnp.concatenate([jnp.zeros((n, k * b), rot.dtype), eye(n)], -1),
                         (t, h, n, head_dim))], -2)
  n = LANES // head_dim  # A tile holds 128 / d heads.
  out = einsum('tgnij,nm->tgnimj', full.reshape(t, h // n, n, head_dim, head_dim), eye(n))
  return out.reshape(t, h // n, LANES, LANES)


def attention(qkv, tile, head_dim: int, interpret: bool = False):
  """Self-attention of q, k, v in the projection's one array qkv [B, T, 3 W] (W = H d), q and k
  rotated by `tiles` [T, W / 128, 128, 128] (x'[b, t, 128 c + j] = sum_i x[b, t, 128 c + i]
  tile[t, c, i, j]) -> [B, T, W] in qkv's dtype. The rotation kernel writes q' and k'
  [B, T, 2 W]; the attention kernel (liere_jax.attention_kernel) reads them, and v in place.
  Differentiable in qkv and the tiles: the attention kernel's gradient [B, T, 3 W], whose q and
  k parts the rotation's backward turns back in place (dv stays), and the tiles'."""
  return _attention(interpret, head_dim, qkv, tile)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(interpret, d, qkv, tile):
  return _attention_fwd(interpret, d, qkv, tile)[0]


def _attention_fwd(interpret, d, qkv, tile):
  qk = _pass(False, interpret)(qkv, tile)
  out = attention_kernel.forward((qk, qkv), None, d, interpret)
  return out, (qkv, qk, tile, out)


def _attention_bwd(interpret, d, res, g):
  qkv, qk, tile, out = res
  (grad,) = attention_kernel.backward((qk, qkv), None, out, g, d, interpret)
  grad, dt = _pass(True, interpret)(qkv, tile, grad)
  return grad, dt.astype(tile.dtype)


_attention.defvjp(_attention_fwd, _attention_bwd)


@functools.lru_cache(maxsize=None)
def _pass(backward, interpret):
  """The pass as one jitted function (traced once a shape: every program traces a TPU's branch)."""
  return jax.jit(functools.partial(_call, backward, interpret))


def _call(backward, interpret, qkv, tile, g=None):
  """Forward: q and k of qkv [B, T, 3 W] -> q', k' [B, T, 2 W]. Backward: g, the gradient of
  q', k', v as one [B, T, 3 W], -> the gradient of qkv in g's place (its q and k parts turned
  back, v's left as it is) and the tiles' (float32)."""
  batch, t, width = qkv.shape
  blocks, dtype = width // 3 // LANES, qkv.dtype
  rows = int(np.clip(ROW_BYTES // (TOKENS * LANES * dtype.itemsize), 8, batch))
  while batch % rows:
    rows -= 1
  # Tokens, lane tiles, q or k, then the batch innermost: the tile gradient accumulates over
  # the last two.
  grid = (pl.cdiv(t, TOKENS), blocks, 2, batch // rows)
  x_spec = pl.BlockSpec((rows, TOKENS, LANES), lambda i, c, p, r: (r, i, p * blocks + c))
  t_spec = pl.BlockSpec((TOKENS, None, LANES, LANES), lambda i, c, *_: (i, c, 0, 0))
  if backward:
    ins, outs = (qkv, g, tile), [g, jax.ShapeDtypeStruct(tile.shape, jnp.float32)]
  else:
    ins, outs = (qkv, tile), [jax.ShapeDtypeStruct((batch, t, 2 * blocks * LANES), dtype)]
  outs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
  flops = (4 if backward else 2) * 2 * batch * t * 2 * blocks * LANES * LANES
  xs_bytes = 2 * batch * t * blocks * LANES * dtype.itemsize  # q and k of one array
  moved = (xs_bytes * (4 if backward else 2)
           + sum(a.size * a.dtype.itemsize for a in [tile] + outs[1:]))
  if interpret:
    kw = {'interpret': True}
  else:
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
    kw = {'compiler_params': pltpu.CompilerParams(dimension_semantics=(
        ('parallel', 'parallel') + (('arbitrary',) * 2 if backward else ('parallel',) * 2)))}
  res = pl.pallas_call(
      _backward_kernel if backward else _forward_kernel, out_shape=outs, grid=grid,
      in_specs=[x_spec] * (len(ins) - 1) + [t_spec],
      out_specs=[x_spec, t_spec] if backward else [x_spec],
      input_output_aliases={1: 0} if backward else {},
      name='rotate_' + ('backward' if backward else 'forward'),
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=0, bytes_accessed=moved),
      **kw)(*ins)
  return res if backward else res[0]


def _forward_kernel(x_ref, t_ref, o_ref):
  for s in range(TOKENS):
    o_ref[:, s, :] = jnp.dot(x_ref[:, s, :], t_ref[s],
                             preferred_element_type=jnp.float32).astype(o_ref.dtype)


def _backward_kernel(x_ref, g_ref, t_ref, dx_ref, dt_ref):
  @pl.when((pl.program_id(2) == 0) & (pl.program_id(3) == 0))
  def _():
    dt_ref[...] = jnp.zeros_like(dt_ref)

  for s in range(TOKENS):
    g = g_ref[:, s, :]
    # dx = g r^T; dr = x^T g, summed over the batch (and over q and k).
    dx_ref[:, s, :] = jax.lax.dot_general(
        g, t_ref[s], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    ).astype(dx_ref.dtype)
    dt_ref[s] += jax.lax.dot_general(x_ref[:, s, :], g, (((0,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)
