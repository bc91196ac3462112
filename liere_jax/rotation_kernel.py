"""Rotations of large blocks (LieRE64's 64 x 64) applied to q and k as one Pallas TPU kernel a
pass, the batch as the products' M: a TPU's rotation before its attention kernel
(liere_jax.attention_kernel takes blocks up to 8 itself).

XLA applies a per-token rotation as a batched product over (token, head) with the batch as M: it
lays q out token-major for it and back, and a 64-wide minor dimension fills half of a TPU's 128
lanes (a ViT-B/16 LieRE64 step on v5e-8 spent 14% of its traffic there). Here a grid step reads
q and k as the projection writes them, [B, T, H d], a few tokens and 128 lanes at a time, and
multiplies each token's [B, 128] rows by its 128 x 128 tile of the rotation (`tiles`: the
block-diagonal rotation's diagonal tiles; zeros off the blocks add nothing, exactly). Products
of x's dtype, float32 sums, as the einsum's. The backward's tile gradient, sum_b x^T g over q and
k, accumulates on chip across the batch. On CPU the kernels run in interpret mode (tests).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

LANES = 128
MIN_BLOCK = 16  # Smaller blocks rotate inside the attention kernel (its band).
TOKENS = 8  # Tokens a grid step (a sublane tile).
ROW_BYTES = 2**18  # x's bytes a grid step, about: the batch is split above this.


def supported(block: int, head_dim: int, heads: int) -> bool:
  """Whether the kernel takes blocks of b on heads of d: b divides 128 (no block crosses a
  tile), d divides 128 or 128 divides d (no head crosses one), and H d is whole tiles."""
  return (MIN_BLOCK <= block <= LANES and LANES % block == 0 and (heads * head_dim) % LANES == 0
          and (LANES % head_dim == 0 or head_dim % LANES == 0))


@jax.named_scope('pe_rotate')  # The rotation's part of a step (bench.compile.SCOPES).
def tiles(rot: jax.Array, head_dim: int) -> jax.Array:
  """[T, H, k, b, b] block rotations -> `rotate`'s tiles [T, H d / 128, 128, 128]: the diagonal
  tiles of the block-diagonal rotation of each token's H d dims, transposed (x' = R x is the row
  product x R^T); dims past k * b of each head pass through. In rot's dtype, exact (products
  with 0 / 1)."""
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
  if head_dim <= LANES:  # A tile holds 128 / d heads.
    n = LANES // head_dim
    out = einsum('tgnij,nm->tgnimj', full.reshape(t, h // n, n, head_dim, head_dim), eye(n))
    return out.reshape(t, h // n, LANES, LANES)
  m = head_dim // LANES  # A head holds d / 128 tiles: its diagonal ones.
  full = full.reshape(t, h, m, LANES, m, LANES)
  return einsum('thaibj,ab->thaij', full, eye(m)).reshape(t, h * m, LANES, LANES)


def rotate(q, k, tile, interpret: bool = False):
  """q, k [B, T, W] (W = H d, heads' dims contiguous) rotated by `tiles` [T, W / 128, 128, 128]:
  x'[b, t, 128 c + j] = sum_i x[b, t, 128 c + i] tile[t, c, i, j] -> (q', k') in x's dtype.
  Differentiable in q, k and the tiles."""
  return _rotate(interpret, q, k, tile)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rotate(interpret, q, k, tile):
  return _pass(False, interpret)(q, k, tile)


def _rotate_fwd(interpret, q, k, tile):
  return _rotate(interpret, q, k, tile), (q, k, tile)


def _rotate_bwd(interpret, res, g):
  q, k, tile = res
  dq, dk, dt = _pass(True, interpret)(q, k, tile, *g)
  return dq, dk, dt.astype(tile.dtype)


_rotate.defvjp(_rotate_fwd, _rotate_bwd)


@functools.lru_cache(maxsize=None)
def _pass(backward, interpret):
  """The pass as one jitted function (traced once a shape: every program traces a TPU's branch)."""
  return jax.jit(functools.partial(_call, backward, interpret))


def _call(backward, interpret, q, k, tile, gq=None, gk=None):
  batch, t, width = q.shape
  dtype = q.dtype
  rows = int(np.clip(ROW_BYTES // (TOKENS * LANES * dtype.itemsize), 8, batch))
  while batch % rows:
    rows -= 1
  # Tokens, lane tiles, then the batch innermost: the tile gradient accumulates over it.
  grid = (pl.cdiv(t, TOKENS), width // LANES, batch // rows)
  x_spec = pl.BlockSpec((rows, TOKENS, LANES), lambda i, c, r: (r, i, c))
  t_spec = pl.BlockSpec((TOKENS, None, LANES, LANES), lambda i, c, r: (i, c, 0, 0))
  xs = (q, k) + ((gq, gk) if backward else ())
  outs = [jax.ShapeDtypeStruct(q.shape, dtype)] * 2
  out_specs = [x_spec] * 2
  if backward:
    outs.append(jax.ShapeDtypeStruct(tile.shape, jnp.float32))
    out_specs.append(t_spec)
  flops = (4 if backward else 2) * 2 * batch * t * width * LANES
  moved = sum(a.size * a.dtype.itemsize for a in xs + (tile,) + tuple(outs))
  if interpret:
    kw = {'interpret': True}
  else:
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
    kw = {'compiler_params': pltpu.CompilerParams(dimension_semantics=(
        'parallel', 'parallel', 'arbitrary' if backward else 'parallel'))}
  return pl.pallas_call(
      _backward_kernel if backward else _forward_kernel, out_shape=outs, grid=grid,
      in_specs=[x_spec] * len(xs) + [t_spec], out_specs=out_specs,
      name='rotate_' + ('backward' if backward else 'forward'),
      cost_estimate=pl.CostEstimate(flops=flops, transcendentals=0, bytes_accessed=moved),
      **kw)(*xs, tile)


def _forward_kernel(q_ref, k_ref, t_ref, oq_ref, ok_ref):
  for s in range(TOKENS):
    r = t_ref[s]
    for x_ref, o_ref in ((q_ref, oq_ref), (k_ref, ok_ref)):
      o_ref[:, s, :] = jnp.dot(x_ref[:, s, :], r,
                               preferred_element_type=jnp.float32).astype(o_ref.dtype)


def _backward_kernel(q_ref, k_ref, gq_ref, gk_ref, t_ref, dq_ref, dk_ref, dt_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    dt_ref[...] = jnp.zeros_like(dt_ref)

  for s in range(TOKENS):
    r = t_ref[s]
    dt = dt_ref[s]
    for x_ref, g_ref, d_ref in ((q_ref, gq_ref, dq_ref), (k_ref, gk_ref, dk_ref)):
      g = g_ref[:, s, :]
      # dx = g r^T; dr = x^T g, summed over the batch.
      d_ref[:, s, :] = jax.lax.dot_general(
          g, r, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32).astype(d_ref.dtype)
      dt += jax.lax.dot_general(x_ref[:, s, :], g, (((0,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
    dt_ref[s] = dt
