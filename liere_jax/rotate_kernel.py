"""Small block rotations (b <= 8) as one Pallas TPU kernel a pass: a TPU's form for blocks
above 2 (LieRE8; liere_jax.platforms). Blocks of 2 keep XLA's lane shifts there: the kernel was
within 1% of them on the v5e-8 cost cell, in more memory (docs/benchmarks.md).

A rotation of blocks of b contiguous head dims is a band of 2b - 1 diagonals:

  x'[i] = sum_s D_s[i] x[i + s],  s = -(b-1) .. b-1,  D_s[i] = R[i % b, i % b + s] (0 off the
  block; D_0 = 1 on pass-through dims),

so a kernel reads x once, shifts it along the head dims in registers (`pltpu.roll`) and writes
x' once. XLA materialises each shift as its own array, or runs an einsum on [..., b, b] tiles
(the TPU compiler: a 2-layer ViT-B/16 LieRE8 step's rotations were 14% of its traffic). The
backward is one kernel too: dx = sum_s shift(D_s g, -s) and dD_s = the batch's sum of g x[. + s],
accumulated on chip across the batch. D is made from the blocks by `diagonals`, in XLA (a batch
element's size), in x's dtype: a bf16 model rotates by bf16-rounded rotations, as the XLA forms.

x is [B, H, d, T]: tokens on the lanes, head dims on the sublanes, the layout in which a TPU's
attention reads q and k (so the transposes around the kernel are mostly layout, not copies). A
grid over heads (outer: a head's band stays in VMEM) and batch tiles. On CPU the same kernel
runs in interpret mode (tests); there pltpu.roll is jnp.roll, and Mosaic's rotate matches it.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

MAX_BLOCK = 8  # Above it the band is too wide: blocks rotate as one einsum (liere_jax.rotations).
TILE_BYTES = 2**19  # x's bytes a grid step, about: fewer steps, each within VMEM's default.


def supported(block: int) -> bool:
  """Whether the kernel takes blocks of `block` (the band's width)."""
  return 2 <= block <= MAX_BLOCK


def diagonals(rot: jax.Array, head_dim: int) -> jax.Array:
  """[T, H, k, b, b] block rotations -> [2b - 1, H, head_dim, T] diagonals D_s (s = -(b-1)
  .. b-1; module doc), in rot's dtype; dims past k * b pass through (D_0 = 1)."""
  t, h, k, b, _ = rot.shape
  rows = np.arange(b)
  out = []
  for s in range(-(b - 1), b):
    cols = rows + s
    ok = (cols >= 0) & (cols < b)
    band = jnp.where(ok, rot[..., rows, np.clip(cols, 0, b - 1)], 0)  # [T, H, k, b]
    band = band.reshape(t, h, k * b)
    if k * b < head_dim:
      band = jnp.pad(band, ((0, 0), (0, 0), (0, head_dim - k * b)),
                     constant_values=1 if s == 0 else 0)
    out.append(jnp.transpose(band, (1, 2, 0)))
  return jnp.stack(out)


def rotate(x: jax.Array, diag: jax.Array, interpret: bool = False) -> jax.Array:
  """x [B, H, d, T] rotated by the band diag [2b - 1, H, d, T] (`diagonals`) along d, in x's
  dtype with float32 products and sums; differentiable in both."""
  return _rotate(interpret, x, diag)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rotate(interpret, x, diag):
  return _pass(_forward_kernel, interpret)(x, diag)


def _rotate_fwd(interpret, x, diag):
  return _rotate(interpret, x, diag), (x, diag)


def _rotate_bwd(interpret, res, g):
  x, diag = res
  dx, ddiag = _pass(_backward_kernel, interpret)(x, diag, g)
  return dx, ddiag.astype(diag.dtype)


_rotate.defvjp(_rotate_fwd, _rotate_bwd)


@functools.lru_cache(maxsize=None)
def _pass(kernel, interpret):
  """The pass as one jitted function: its kernel is traced once a shape, not once a call (every
  program traced on any platform traces a TPU's branch too: platform_dependent)."""
  return jax.jit(functools.partial(_call, kernel, interpret))


def _rows(x):
  """Batch rows of a grid step (one head)."""
  batch, _, d, t = x.shape
  rows = int(np.clip(TILE_BYTES // (d * t * x.dtype.itemsize), 1, batch))
  while batch % rows:
    rows -= 1
  return rows


def _call(kernel, interpret, x, diag, g=None):
  """The forward (x, diag -> x') or the backward (x, diag, g -> dx, ddiag float32) pass."""
  batch, heads, d, t = x.shape
  n = diag.shape[0]
  rows = _rows(x)
  grid = (heads, batch // rows)  # Heads outer: a head's band stays in VMEM while the batch runs.
  x_spec = pl.BlockSpec((rows, None, d, t), lambda h, i: (i, h, 0, 0))
  d_spec = pl.BlockSpec((n, None, d, t), lambda h, i: (0, h, 0, 0))
  backward = g is not None
  item = x.dtype.itemsize
  moved = (3 if backward else 2) * x.size * item + diag.size * diag.dtype.itemsize
  outs = (jax.ShapeDtypeStruct(x.shape, x.dtype),)
  out_specs = (x_spec,)
  if backward:  # ddiag sums over the batch: the batch axis runs in order, into one tile.
    outs += (jax.ShapeDtypeStruct(diag.shape, jnp.float32),)
    out_specs += (d_spec,)
    moved += x.size * item + diag.size * 4
  kw = {'interpret': True} if interpret else {'compiler_params': _tpu_params(backward)}
  res = pl.pallas_call(
      functools.partial(kernel, n // 2, rows), out_shape=outs, grid=grid,
      in_specs=[x_spec, d_spec] + ([x_spec] if backward else []), out_specs=out_specs,
      name='pe_rotate_' + ('backward' if backward else 'forward'),
      cost_estimate=pl.CostEstimate(flops=2 * n * x.size * (2 if backward else 1),
                                    transcendentals=0, bytes_accessed=moved),
      **kw)(*((x, diag) + ((g,) if backward else ())))
  return res if backward else res[0]


def _tpu_params(backward):
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  return pltpu.CompilerParams(
      dimension_semantics=('parallel', 'arbitrary' if backward else 'parallel'))


def _shift(x, s):
  """y[..., w, :] = x[..., w + s, :] (cyclic along the head dims, the sublanes; the band is 0
  where it wraps)."""
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  d = x.shape[-2]
  return x if s % d == 0 else pltpu.roll(x, (-s) % d, x.ndim - 2)


def _forward_kernel(half, rows, x_ref, d_ref, o_ref):
  band = lambda s: d_ref[s + half].astype(jnp.float32)  # [d, T], read from VMEM as needed

  def row(r, carry):
    x = x_ref[r].astype(jnp.float32)  # [d, T]
    out = band(0) * x
    for s in range(1, half + 1):
      out += band(s) * _shift(x, s) + band(-s) * _shift(x, -s)
    o_ref[r] = out.astype(o_ref.dtype)
    return carry
  jax.lax.fori_loop(0, rows, row, 0)


def _backward_kernel(half, rows, x_ref, d_ref, g_ref, dx_ref, dd_ref):
  @pl.when(pl.program_id(1) == 0)
  def _():
    dd_ref[...] = jnp.zeros_like(dd_ref)

  band = lambda s: d_ref[s + half].astype(jnp.float32)

  def row(r, carry):
    x, g = x_ref[r].astype(jnp.float32), g_ref[r].astype(jnp.float32)
    dx = band(0) * g
    for s in range(1, half + 1):  # The transpose of y = D x[. + s] is dx = shift(D y, -s).
      dx += _shift(band(s) * g, -s) + _shift(band(-s) * g, s)
    dx_ref[r] = dx.astype(dx_ref.dtype)
    for s in range(-half, half + 1):
      dd_ref[s + half] += g * _shift(x, s)
    return carry
  jax.lax.fori_loop(0, rows, row, 0)
