"""Rotations of large blocks (LieRE64's 64 x 64) applied to q and k as one Pallas TPU kernel a
pass, the batch as the products' M, then the attention kernel: a TPU's attention for them
(liere_jax.kernels.attention takes blocks up to 8 itself).

XLA applies a per-token rotation as a batched product over (token, head) with the batch as M: it
lays q out token-major for it and back, and a 64-wide minor dimension fills half of a TPU's 128
lanes (docs/decisions/003-rotation-kernel.md). Here a grid step reads q or k in place from the
projection's one array [B, T, 3 H d], a few tokens and 128 lanes at a time, and multiplies each token's [B, 128] rows by its 128 x 128 tile of the rotation: the
block-diagonal rotation's diagonal tile, built on chip from the blocks of the tile's heads side
by side (`rows`: whole lanes), rounded to x's dtype (zeros off the blocks add nothing,
exactly). Products of x's dtype, float32 sums, as the einsum's. The attention kernel then reads
q' and k', and v where the projection left it (slicing q, k, v out of the one array cost XLA
copies). The backward turns the attention kernel's gradient of q' and k' back in place in its one array, and
the blocks' gradient, sum_b g^T x over q and k, accumulates on chip across the batch. On CPU the
kernels run in interpret mode (tests).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from liere_jax.kernels import attention as attention_kernel
from liere_jax.kernels.common import LANES, call_kw, hbm, nt as _nt, vmem
from liere_jax.kernels.common import Cost, estimate, padded

MIN_BLOCK = 16  # Smaller blocks rotate inside the attention kernel (its band).
TOKENS = 8  # Tokens a grid step (a sublane tile).
ROW_BYTES = 2**18  # x's bytes a grid step, about: the batch is split above this.


def supported(block: int, head_dim: int, heads: int) -> bool:
  """Whether the kernel takes blocks of b filling heads of d: b divides d, d divides 128 (no
  head crosses a tile; the attention kernel's heads) and H d is whole tiles."""
  return (MIN_BLOCK <= block <= head_dim and head_dim % block == 0 and LANES % head_dim == 0
          and (heads * head_dim) % LANES == 0)


def rows(rot: jax.Array) -> jax.Array:
  """[H, T, k, b, b] block rotations (k b = d) -> the kernel's operand [H / n, T, d, n b], the n
  = 128 / d heads of a lane tile side by side: P[r, m b + c] = R_m[r, c] for head m of the tile
  and row r of its stacked blocks (LieRE64: [6, T, 64, 128], whole lanes; [.., 64, 64] would fill
  half of them)."""
  h, t, k, b, _ = rot.shape
  n = LANES // (k * b)
  rot = rot.reshape(h // n, n, t, k * b, b)
  return jnp.moveaxis(rot, 1, 3).reshape(h // n, t, k * b, n * b)


def attention(qkv, rot, interpret: bool = False, gather=None):
  """Self-attention of q, k, v in the projection's one array qkv [B, T, 3 W] (W = H d), q and k
  rotated by `rows` of their block rotations, [H / n, T' >= T, d, n b] float32 (x' = R x per
  block, in x's dtype; tokens past T are padding) -> [B, T, W] in qkv's dtype. The rotation
  kernel writes q' and k' [B, T, 2 W] to HBM; the attention kernel (liere_jax.kernels.attention)
  reads them from there, and v in place. Differentiable in qkv and rot: the attention kernel's
  gradient [B, T, 3 W], whose q and k parts the rotation's backward turns back in place (dv
  stays), and rot's (summed in float32).

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
  dqkv, drot = _pass(True, interpret)(qkv, rot, grad)  # drot token-major: [T', H / n, d, n b]
  if gather:  # Over the leading axis: a reduce-scatter, not an all-reduce and a slice.
    drot = jax.lax.psum_scatter(drot, gather, scatter_dimension=0, tiled=True)
  return dqkv, jnp.swapaxes(drot, 0, 1)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _pass(backward, interpret):
  """The pass as one jitted function (traced once a shape)."""
  return functools.partial(_call_jit, backward, interpret)


@jax.named_scope('pe_rotate')  # The rotation's part of a step (bench.compile.SCOPES).
def _call(backward, interpret, qkv, rot, g=None):
  """Forward: q and k of qkv [B, T, 3 W] -> q', k' [B, T, 2 W]. Backward: g, the gradient of
  q', k', v as one [B, T, 3 W], -> the gradient of qkv in g's place (its q and k parts turned
  back, v's left as it is) and rot's (float32; rot in qkv's dtype)."""
  batch, t, width = qkv.shape
  _, _, d, nb = rot.shape
  blocks, dtype = width // 3 // LANES, qkv.dtype
  n = LANES // d  # heads a tile
  b = nb // n
  rows_a_step = int(np.clip(ROW_BYTES // (TOKENS * LANES * dtype.itemsize), 8, batch))
  while batch % rows_a_step:
    rows_a_step -= 1
  # Tokens, lane tiles, q or k, then the batch innermost: a tile is built at its first step and
  # its gradient accumulates over the last two.
  grid = (pl.cdiv(t, TOKENS), blocks, 2, batch // rows_a_step)
  x_spec = pl.BlockSpec((rows_a_step, TOKENS, LANES), lambda i, c, p, r: (r, i, p * blocks + c))
  r_spec = pl.BlockSpec((1, TOKENS, d, nb), lambda i, c, *_: (c, i, 0, 0))
  dr_spec = pl.BlockSpec((TOKENS, 1, d, nb), lambda i, c, *_: (i, c, 0, 0))  # token-major
  scratch = [vmem((TOKENS, LANES, LANES), dtype)]  # the tiles
  if backward:
    # rot's gradient: 0 past T (padding), and where no grid step writes (past T's last block).
    visited = (min(rot.shape[1], pl.cdiv(t, TOKENS) * TOKENS), rot.shape[0]) + rot.shape[2:]
    ins, outs = (qkv, g, rot), [g, jax.ShapeDtypeStruct(visited, jnp.float32)]
    scratch.append(vmem((TOKENS, LANES, LANES), jnp.float32))  # the tiles' gradient
  else:
    ins, outs = (qkv, rot), [jax.ShapeDtypeStruct((batch, t, 2 * blocks * LANES), dtype)]
  outs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
  if not backward and not interpret:
    # q' and k' straight to HBM: left to it, the compiler wrote them to VMEM, copied them out
    # and prefetched them back in slices for the attention backward
    # (docs/decisions/005-memory-space-pins.md).
    outs = [hbm(o.shape, o.dtype) for o in outs]
  kw = call_kw(interpret, ('parallel', 'parallel', 'arbitrary', 'arbitrary'))
  res = pl.pallas_call(
      functools.partial(_backward_kernel, b, t) if backward else
      functools.partial(_forward_kernel, b),
      out_shape=outs, grid=grid, in_specs=[x_spec] * (len(ins) - 1) + [r_spec],
      out_specs=[x_spec, dr_spec] if backward else [x_spec], scratch_shapes=scratch,
      input_output_aliases={1: 0} if backward else {},
      name='rotate_' + ('backward' if backward else 'forward'),
      cost_estimate=estimate('rotate_' + ('backward' if backward else 'forward'),
                             cost(batch, t, width // 3, rot, rows_a_step, backward)),
      **kw)(*ins)
  if not backward:
    return res[0]
  dx, dr = res
  return dx, jnp.pad(dr, ((0, rot.shape[1] - dr.shape[0]), (0, 0), (0, 0), (0, 0)))


_call_jit = jax.jit(_call, static_argnums=(0, 1))


def cost(batch, tokens, width, rot, rows_a_step, backward=False) -> Cost:
  """What a pass does (`_call`; common.Cost): q and k [batch, tokens, width] each in one array,
  rot its `rows` [H / n, T', d, n b] in x's dtype, rows_a_step batch rows a grid step. Per
  lane tile of q or k and 8 tokens (the grid's steps over the batch run inside), with a tile's
  rows P [d, n b] (n = 128 / d heads), c = 1 where x is not float32:
    the tiles, built at the first step (both passes): E and the block mask (7 n b 128 + 3 x 128^2
      integer ops: shifts, ands, compares), E in x's dtype (n b 128), and per token P's n copies
      times E (2 x 128^2 n b MXU flops), off-block entries masked (128^2) and rounded to x's
      dtype (c 128^2);
    forward, each batch row and token: x T^T (2 x 128^2) in x's dtype (c 128);
    backward, each batch row and token: g T and g^T x (2 x 2 x 128^2), dx in x's dtype (c 128);
      each step, the 8 tokens' g^T x added to their tiles' sums (8 x 128^2); at the last step,
      E and the mask again, and per token the sum masked (2 x 128^2: the block mask and the
      token's), E in float32 (n b 128), times E (2 x 128^2 n b) and its n row groups summed
      (128 n b).
  Tokens run in steps of 8 (T padded: its last rows are computed and thrown away). HBM: q and
  k read, q' and k' written (backward: x, g read and dx written), 8 tokens' rows a step; each
  tile's rows read once (backward: its float32 gradient written once), as laid out."""
  steps_t = -(-tokens // TOKENS)
  blocks = width // LANES
  _, t_rot, d, nb = rot.shape
  c = int(rot.dtype != jnp.float32)
  tiles = steps_t * blocks  # (token step, lane tile) pairs: a tile each
  spread = 7 * nb * LANES + 3 * LANES * LANES
  build = Cost(TOKENS * 2 * LANES * LANES * nb,
               spread + nb * LANES + TOKENS * (1 + c) * LANES * LANES, 0, 0)
  rows = batch * steps_t * TOKENS * 2 * blocks  # (batch row, token, q or k, lane tile)
  apply = Cost((2 if backward else 1) * 2 * LANES * LANES, c * LANES, 0, 0)
  total = build * tiles + apply * rows
  if backward:
    steps = tiles * 2 * (batch // rows_a_step)
    total += Cost(0, TOKENS * LANES * LANES, 0, 0) * steps
    last = Cost(TOKENS * 2 * LANES * LANES * nb,
                spread + TOKENS * (2 * LANES * LANES + nb * LANES + LANES * nb), 0, 0)
    total += last * tiles
  x_rows = min(steps_t * TOKENS, padded(tokens, rot.dtype))
  xs = 2 * batch * x_rows * width * rot.dtype.itemsize  # q and k (or q' and k', g, dx)
  tile = padded(d, rot.dtype) * padded(nb) * rot.dtype.itemsize
  visited = min(t_rot, steps_t * TOKENS) * blocks
  moved = xs * (3 if backward else 2) + visited * tile
  if backward:
    moved += visited * padded(d, jnp.float32) * padded(nb) * 4
  return total + Cost(0, 0, 0, moved)


def _spread(b, d):
  """E [n b, 128], E[m b + c, j] = (j div d == m and j mod b == c) for the n = 128 / d heads of
  a tile, and the mask of its diagonal b x b blocks."""
  iota = lambda shape, axis: jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  log = lambda x: x.bit_length() - 1  # b, d divide 128: powers of 2 (no % or //: Mosaic lowers
  # them through sign, which asks the device's TPU generation)
  shape = (LANES // d * b, LANES)
  row, lane = iota(shape, 0), iota(shape, 1)
  e = ((lane >> log(d)) == (row >> log(b))) & ((lane & (b - 1)) == (row & (b - 1)))
  return e, (iota((LANES, LANES), 0) >> log(b)) == (iota((LANES, LANES), 1) >> log(b))


def _tiles(b, d, r_ref, t_ref):
  """t_ref[s] = token s's tile T, T[j, i] = R[j mod b, i mod b] of the block holding j and i
  (0 off the blocks): the heads' rows P [d, n b] repeated n times down, spread across the lanes
  by a product with E (exact: one term each), off-block entries masked."""
  e, mask = _spread(b, d)
  e = e.astype(t_ref.dtype)
  n = LANES // d
  for s in range(TOKENS):
    stacked = jnp.concatenate([r_ref[0, s]] * n, axis=0)
    spread = jnp.dot(stacked.astype(t_ref.dtype), e, preferred_element_type=jnp.float32)
    t_ref[s] = jnp.where(mask, spread, 0).astype(t_ref.dtype)


def _forward_kernel(b, x_ref, r_ref, o_ref, t_ref):
  first = (pl.program_id(2) == 0) & (pl.program_id(3) == 0)
  pl.when(first)(lambda: _tiles(b, r_ref.shape[2], r_ref, t_ref))
  for s in range(TOKENS):  # x' = x T^T: x'[j] = sum_i R[j, i] x[i] per block
    o_ref[:, s, :] = _nt(x_ref[:, s, :], t_ref[s]).astype(o_ref.dtype)


def _backward_kernel(b, tokens, x_ref, g_ref, r_ref, dx_ref, dr_ref, t_ref, acc_ref):
  first = (pl.program_id(2) == 0) & (pl.program_id(3) == 0)
  last = (pl.program_id(2) == 1) & (pl.program_id(3) == pl.num_programs(3) - 1)
  first_token = pl.program_id(0) * TOKENS

  @pl.when(first)
  def _():
    _tiles(b, r_ref.shape[2], r_ref, t_ref)
    acc_ref[...] = jnp.zeros_like(acc_ref)

  for s in range(TOKENS):
    g = g_ref[:, s, :]
    # dx = g T; dT = g^T x, summed over the batch (and over q and k).
    dx_ref[:, s, :] = jnp.dot(g, t_ref[s], preferred_element_type=jnp.float32).astype(
        dx_ref.dtype)
    acc_ref[s] += jax.lax.dot_general(g, x_ref[:, s, :], (((0,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32)

  @pl.when(last)
  def _():  # dP[r, c] = sum over the n row groups of sum_i dT[m d + r, i] E[c, i] (on blocks)
    d = dr_ref.shape[2]
    e, mask = _spread(b, d)
    for s in range(TOKENS):
      real = first_token + s < tokens  # past the last token: x, g undefined
      stacked = _nt(jnp.where(mask & real, acc_ref[s], 0), e.astype(jnp.float32))
      dr_ref[s, 0] = sum(stacked[m * d:(m + 1) * d] for m in range(LANES // d))
