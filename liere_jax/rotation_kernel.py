"""Rotations of large blocks (LieRE64's 64 x 64) applied to q and k as one Pallas TPU kernel a
pass, the batch as the products' M, then the attention kernel: a TPU's attention for them
(liere_jax.attention_kernel takes blocks up to 8 itself).

XLA applies a per-token rotation as a batched product over (token, head) with the batch as M: it
lays q out token-major for it and back, and a 64-wide minor dimension fills half of a TPU's 128
lanes (a ViT-B/16 LieRE64 step on v5e-8 spent 14% of its traffic there). Here a grid step reads
q or k in place from the projection's one array [B, T, 3 H d], a few tokens and 128 lanes at a
time, and multiplies each token's [B, 128] rows by its 128 x 128 tile of the rotation: the
block-diagonal rotation's diagonal tile, built on chip from the float32 blocks as the
exponential wrote them (`rows`), rounded to x's dtype (zeros off the blocks add nothing,
exactly). Products of x's dtype, float32 sums, as the einsum's. The attention kernel then reads
q' and k', and v where the projection left it (slicing q, k, v out of the one array cost XLA
copies: the 2-layer v5e-8 ImageNet proxy moved 20.57 GB a step with them, 18.82 without). The
backward turns the attention kernel's gradient of q' and k' back in place in its one array, and
the blocks' gradient, sum_b g^T x over q and k, accumulates on chip across the batch. On CPU the
kernels run in interpret mode (tests).
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
  """Whether the kernel takes blocks of b filling heads of d: b divides d, d divides 128 (no
  head crosses a tile; the attention kernel's heads) and H d is whole tiles."""
  return (MIN_BLOCK <= block <= head_dim and head_dim % block == 0 and LANES % head_dim == 0
          and (heads * head_dim) % LANES == 0)


def rows(rot: jax.Array) -> jax.Array:
  """[H, T, k, b, b] block rotations (k b = d) -> the kernel's operand [H, T, d, b]: each
  head's blocks stacked (a reshape, no copy)."""
  h, t, k, b, _ = rot.shape
  return rot.reshape(h, t, k * b, b)


def attention(qkv, rot, interpret: bool = False, gather=None):
  """Self-attention of q, k, v in the projection's one array qkv [B, T, 3 W] (W = H d), q and k
  rotated by `rows` of their block rotations, [H, T' >= T, d, b] float32 (x' = R x per block, in
  x's dtype; tokens past T are padding) -> [B, T, W] in qkv's dtype. The rotation kernel writes
  q' and k' [B, T, 2 W]; the attention kernel (liere_jax.attention_kernel) reads them, and v in
  place. Differentiable in qkv and rot: the attention kernel's gradient [B, T, 3 W], whose q and
  k parts the rotation's backward turns back in place (dv stays), and rot's (summed in float32).

  gather: inside shard_map, the mesh axis over which rot's tokens are split: all-gathered in
  qkv's dtype (the kernel rounds them to it), their gradient reduce-scattered in float32.
  """
  return _attention(interpret, gather, qkv, rot)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attention(interpret, gather, qkv, rot):
  return _attention_fwd(interpret, gather, qkv, rot)[0]


def _attention_fwd(interpret, gather, qkv, rot):
  rot = rot.astype(qkv.dtype)
  if gather:
    rot = jax.lax.all_gather(rot, gather, axis=1, tiled=True)
  qk = _pass(False, interpret)(qkv, rot)
  out = attention_kernel.forward((qk, qkv), None, rot.shape[2], interpret)
  return out, (qkv, qk, rot, out)


def _attention_bwd(interpret, gather, res, g):
  qkv, qk, rot, out = res
  (grad,) = attention_kernel.backward((qk, qkv), None, out, g, rot.shape[2], interpret)
  dqkv, drot = _pass(True, interpret)(qkv, rot, grad)
  if gather:
    drot = jax.lax.psum_scatter(drot, gather, scatter_dimension=1, tiled=True)
  return dqkv, drot


_attention.defvjp(_attention_fwd, _attention_bwd)


@functools.lru_cache(maxsize=None)
def _pass(backward, interpret):
  """The pass as one jitted function (traced once a shape: every program traces a TPU's branch)."""
  return jax.jit(functools.partial(_call, backward, interpret))


@jax.named_scope('pe_rotate')  # The rotation's part of a step (bench.compile.SCOPES).
def _call(backward, interpret, qkv, rot, g=None):
  """Forward: q and k of qkv [B, T, 3 W] -> q', k' [B, T, 2 W]. Backward: g, the gradient of
  q', k', v as one [B, T, 3 W], -> the gradient of qkv in g's place (its q and k parts turned
  back, v's left as it is) and rot's (float32; rot in qkv's dtype)."""
  batch, t, width = qkv.shape
  _, _, d, b = rot.shape
  blocks, dtype = width // 3 // LANES, qkv.dtype
  n = LANES // d  # heads a tile
  rows_a_step = int(np.clip(ROW_BYTES // (TOKENS * LANES * dtype.itemsize), 8, batch))
  while batch % rows_a_step:
    rows_a_step -= 1
  # Tokens, lane tiles, q or k, then the batch innermost: a tile is built at its first step and
  # its gradient accumulates over the last two.
  grid = (pl.cdiv(t, TOKENS), blocks, 2, batch // rows_a_step)
  x_spec = pl.BlockSpec((rows_a_step, TOKENS, LANES), lambda i, c, p, r: (r, i, p * blocks + c))
  r_spec = pl.BlockSpec((n, TOKENS, d, b), lambda i, c, *_: (c, i, 0, 0))
  scratch = [_vmem((TOKENS, LANES, LANES), dtype)]  # the tiles
  if backward:
    # rot's gradient: 0 past T (padding), and where no grid step writes (past T's last block).
    visited = (rot.shape[0], min(rot.shape[1], pl.cdiv(t, TOKENS) * TOKENS)) + rot.shape[2:]
    ins, outs = (qkv, g, rot), [g, jax.ShapeDtypeStruct(visited, jnp.float32)]
    scratch.append(_vmem((TOKENS, LANES, LANES), jnp.float32))  # the tiles' gradient
  else:
    ins, outs = (qkv, rot), [jax.ShapeDtypeStruct((batch, t, 2 * blocks * LANES), dtype)]
  outs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
  flops = (4 if backward else 2) * 2 * batch * t * 2 * blocks * LANES * LANES
  xs_bytes = 2 * batch * t * blocks * LANES * dtype.itemsize  # q and k of one array
  moved = xs_bytes * (4 if backward else 2) + rot.size * (rot.dtype.itemsize + 4 * backward)
  kw = ({'interpret': True} if interpret else {'compiler_params': _tpu_params()})
  res = pl.pallas_call(
      functools.partial(_backward_kernel, b, t) if backward else
      functools.partial(_forward_kernel, b),
      out_shape=outs, grid=grid, in_specs=[x_spec] * (len(ins) - 1) + [r_spec],
      out_specs=[x_spec, r_spec] if backward else [x_spec], scratch_shapes=scratch,
      input_output_aliases={1: 0} if backward else {},
      name='rotate_' + ('backward' if backward else 'forward'),
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=0, bytes_accessed=moved),
      **kw)(*ins)
  if not backward:
    return res[0]
  dx, dr = res
  return dx, jnp.pad(dr, ((0, 0), (0, rot.shape[1] - dr.shape[1]), (0, 0), (0, 0)))


def _vmem(shape, dtype):
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  return pltpu.VMEM(shape, dtype)


def _tpu_params():
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  return pltpu.CompilerParams(
      dimension_semantics=('parallel', 'parallel', 'arbitrary', 'arbitrary'))


def _spread(b):
  """E [b, 128], E[r, j] = (j mod b == r), and the mask of a tile's diagonal b x b blocks."""
  iota = lambda shape, axis: jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  shift = b.bit_length() - 1  # b divides 128: a power of 2 (no % or //: Mosaic lowers them
  # through sign, which asks the device's TPU generation)
  e = (iota((b, LANES), 1) & (b - 1)) == iota((b, LANES), 0)
  return e, (iota((LANES, LANES), 0) >> shift) == (iota((LANES, LANES), 1) >> shift)


def _tiles(b, r_ref, t_ref):
  """t_ref[s] = token s's tile T, T[j, i] = R[j mod b, i mod b] of the block holding j and i
  (0 off the blocks): the blocks stacked, [128, b], spread across the lanes by a product with
  E (exact: one term each)."""
  e, mask = _spread(b)
  e = e.astype(t_ref.dtype)
  for s in range(TOKENS):
    stacked = jnp.concatenate([r_ref[m, s] for m in range(r_ref.shape[0])], axis=0)
    spread = jnp.dot(stacked.astype(t_ref.dtype), e, preferred_element_type=jnp.float32)
    t_ref[s] = jnp.where(mask, spread, 0).astype(t_ref.dtype)


def _nt(a, b):
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _forward_kernel(b, x_ref, r_ref, o_ref, t_ref):
  first = (pl.program_id(2) == 0) & (pl.program_id(3) == 0)
  pl.when(first)(lambda: _tiles(b, r_ref, t_ref))
  for s in range(TOKENS):  # x' = x T^T: x'[j] = sum_i R[j, i] x[i] per block
    o_ref[:, s, :] = _nt(x_ref[:, s, :], t_ref[s]).astype(o_ref.dtype)


def _backward_kernel(b, tokens, x_ref, g_ref, r_ref, dx_ref, dr_ref, t_ref, acc_ref):
  first = (pl.program_id(2) == 0) & (pl.program_id(3) == 0)
  last = (pl.program_id(2) == 1) & (pl.program_id(3) == pl.num_programs(3) - 1)
  first_token = pl.program_id(0) * TOKENS

  @pl.when(first)
  def _():
    _tiles(b, r_ref, t_ref)
    acc_ref[...] = jnp.zeros_like(acc_ref)

  for s in range(TOKENS):
    g = g_ref[:, s, :]
    # dx = g T; dT = g^T x, summed over the batch (and over q and k).
    dx_ref[:, s, :] = jnp.dot(g, t_ref[s], preferred_element_type=jnp.float32).astype(
        dx_ref.dtype)
    acc_ref[s] += jax.lax.dot_general(g, x_ref[:, s, :], (((0,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32)

  @pl.when(last)
  def _():  # dR[j, r] = sum_i dT[j, i] E[r, i] on the blocks: the stacked blocks' gradient
    e, mask = _spread(b)
    d = dr_ref.shape[2]
    for s in range(TOKENS):
      real = first_token + s < tokens  # past the last token: x, g undefined
      stacked = _nt(jnp.where(mask & real, acc_ref[s], 0), e.astype(jnp.float32))
      for m in range(dr_ref.shape[0]):
        dr_ref[m, s] = stacked[m * d:(m + 1) * d]
