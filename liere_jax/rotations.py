"""Rotations from positions: LieRE generators and the RoPE angle maps, as pure functions.

A token at position p in R^n gets R(p) = expm(sum_i p_i A_i), with A_i block-diagonal
skew-symmetric (blocks of size b on contiguous head dims; dims past the last whole block stay
unrotated). Every rotation is stored as its blocks, [..., T, n_blocks, b, b], and applied
blockwise, so LieRE8 costs O(d * 8) per token instead of O(d^2). RoPE is the b = 2 case
with angles instead of generators.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from liere_jax.expm import expm


def num_free(block: int) -> int:
  """Free parameters of one b x b skew-symmetric block: its strict upper triangle."""
  return block * (block - 1) // 2


def skew(params: jax.Array, block: int) -> jax.Array:
  """[..., b(b-1)/2] strict-upper-triangle entries -> [..., b, b] skew-symmetric A = U - U^T."""
  rows, cols = np.triu_indices(block, k=1)
  u = jnp.zeros(params.shape[:-1] + (block, block), params.dtype).at[..., rows, cols].set(params)
  return u - jnp.swapaxes(u, -1, -2)


def liere_rotations(generators: jax.Array, positions: jax.Array, block: int,
                    method: str = 'fast') -> jax.Array:
  """R(p) per layer, head and token.

  Args:
    generators: [L, H, n, n_blocks, b(b-1)/2] raw parameters (L, H may be 1 when shared).
    positions: [T, n] token positions.
  Returns:
    [L, H, T, n_blocks, b, b] float32 rotations.
  """
  return split_over_data(lambda a: expm(a, method),
                         liere_generators(generators, positions, block))


def liere_generators(generators: jax.Array, positions: jax.Array, block: int) -> jax.Array:
  """sum_i p_i A_i per layer, head and token: [L, H, T, n_blocks, b, b] skew-symmetric."""
  # The generator is linear in p: combine the raw entries first, build the skew matrix once.
  coeffs = jnp.einsum('tn,lhnkf->lhtkf', jnp.asarray(positions, jnp.float32),
                      jnp.asarray(generators, jnp.float32), precision=jax.lax.Precision.HIGHEST)
  return skew(coeffs, block)


def split_over_data(fn, a: jax.Array) -> jax.Array:
  """fn over a stack of matrices [..., b, b], each device of the context mesh's 'data' axis
  (`jax.set_mesh`) computing 1/n of it (and of its backward), then all-gathered.

  The rotations depend only on replicated parameters and positions: without this, data
  parallelism has every device compute all of them. Without a mesh, or with one device, it is
  fn(a).
  """
  mesh = jax.sharding.get_abstract_mesh()
  n = 1 if mesh.empty or 'data' not in mesh.axis_names else mesh.shape['data']
  if n == 1:
    return fn(a)
  flat = a.reshape((-1,) + a.shape[-2:])
  pad = -flat.shape[0] % n
  flat = jnp.pad(flat, ((0, pad), (0, 0), (0, 0)))  # expm(0) = I: padding costs a few products.
  out = jax.shard_map(lambda x: jax.lax.all_gather(fn(x), 'data', tiled=True),
                      in_specs=P('data'), out_specs=P(), check_vma=False)(flat)
  return out[:out.shape[0] - pad].reshape(a.shape)


def angle_rotations(angles: jax.Array) -> jax.Array:
  """[..., k] angles -> [..., k, 2, 2] rotations [[cos, -sin], [sin, cos]] (complex x * e^{it})."""
  c, s = jnp.cos(angles), jnp.sin(angles)
  return jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)


def rotate(x: jax.Array, rot: jax.Array) -> jax.Array:
  """Applies per-token block rotations to queries or keys.

  Args:
    x: [B, T, H, d].
    rot: [H or 1, T, k, b, b] float32; the first k * b dims of each head rotate, the rest pass
      through.
  Returns:
    x rotated (x' = R x per block), in x's dtype. The product runs in x's dtype (float32 at
    highest precision; bf16 models multiply bf16-rounded rotations, accumulating in float32:
    relative error 2.3e-3 against the float32 product of the same bf16 input, LieRE8).
  """
  k, b = rot.shape[-3], rot.shape[-1]
  h = x.shape[2]
  rot = jnp.swapaxes(jnp.broadcast_to(rot, (h,) + rot.shape[1:]), 0, 1).astype(x.dtype)
  xr = x[..., :k * b].reshape(*x.shape[:-1], k, b)  # [B, T, H, k, b]
  if b == 2:  # elementwise beats a batched 2x2 matmul.
    out = jnp.stack([rot[..., 0, 0] * xr[..., 0] + rot[..., 0, 1] * xr[..., 1],
                     rot[..., 1, 0] * xr[..., 0] + rot[..., 1, 1] * xr[..., 1]], -1)
  else:
    precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
    out = jnp.einsum('thkij,bthkj->bthki', rot, xr, precision=precision,
                     preferred_element_type=jnp.float32)
  out = out.reshape(*x.shape[:-1], k * b).astype(x.dtype)
  return jnp.concatenate([out, x[..., k * b:]], axis=-1) if k * b < x.shape[-1] else out
