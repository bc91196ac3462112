"""The exponential of a stack of skew-symmetric blocks as one Pallas kernel (`expm(a, 'pallas')`).

fast_loop (liere_jax.expm) runs each of its ~20 products a matrix as its own XLA op: every
product reads two stacks from memory and writes one. Here one kernel reads each matrix once and
writes its rotation once: per matrix, in on-chip memory (VMEM on a TPU, registers / shared
memory on a GPU),
  1. a, a^2, a^3 and the spectral-radius bound rho(a) <= ||a^3||_1^(1/3) (as expm._squarings,
     in logarithms: the vector units have no scalar pow);
  2. the matrix's OWN number of squarings s (no cap: a loop of dynamic trip count, so a small
     matrix is not squared for a large one (on a TPU: within its tile, a select) and a large one
     stays exact);
  3. the degree-12 Bader-Blanes-Casas polynomial at a 2^-s (expm.TAYLOR12: its coefficients,
     theta and evaluation are imported, not copied), the s squarings and expm's Newton-Schulz
     step.
The VJP stores a and R0 (R before the Newton-Schulz step: the forward under differentiation
writes both, the forward alone R only). The gradient of exp at a for a cotangent G is the
Frechet derivative L(a^T, G) (the upper-right block of exp([[a^T, G], [0, a^T]])); a second
kernel computes it in the structured form: the same polynomial and squarings differentiated
forward (`jax.jvp` inside the kernel), the pairs (x^2, x e + e x), ..., (y^2, y e + e y) carried
on chip, 3 products a product, after the Newton-Schulz step's adjoint at R0. That is the XLA
path's gradient (fast_loop: autodiff through Newton-Schulz, then its VJP runs the program forward
on a^T, `expm._squared_taylor`), the whole matrix, not only its skew part
(tests/test_expm_kernel.py; to 3e-5 of it, its skew part to 1e-5).

Per platform (`expm.per_platform`: `jax.lax.platform_dependent`, decided when lowered):
  cpu   Pallas interpret mode (for tests), the TPU's tiling.
  tpu   Mosaic: a grid over tiles of `tile_matrices(b)` matrices (about 128 KiB a tile), each
        product one batched product of the tile, each matrix with its own s (the tile's loop
        runs to its largest, a matrix's square kept by select up to its own); products at
        HIGHEST (six bf16 passes). A TPU's model.pe.expm='fast' (liere_jax.platforms).
        Blocks of 3 to ENTRIES_UP_TO (LieRE8's 8 x 8) in the entries layout (`_pallas_entries`):
        the stack as [b, b, m / 128, 128], each entry of 1,024 matrices whole vector registers,
        a product b^3 float32 multiply-adds of them (as XLA's `elementwise_blocks`), a
        transpose a renaming; the same program otherwise (v5e-8 ImageNet LieRE8 cell: 72.52 ->
        71.97 GB a step, 1.049x abs's; docs/benchmarks.md).
  cuda  Triton: one matrix a program (b a power of 2, at most GPU_MAX_BLOCK), GPU_WARPS warps;
        products at the platform's preset (bf16 x6 for 'auto', float32 for 'highest').
b = 2 (RoPE's), b < MIN_BLOCK on a GPU, or b > MAX_BLOCK: expm.fast_expm, as 'fast'. A block
one platform's kernel does not take (a GPU's 48 or 256): fast_loop's program on that platform.
On a TPU a 64-wide matrix fills half of the 128 lanes of its tiles (HBM and VMEM); packing two
a row would need a reshape [32, 128] -> [64, 64] in the kernel, which Mosaic refuses.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from liere_jax import expm as expm_lib

TAYLOR = expm_lib.TAYLOR12  # The polynomial: degree 12 in 4 products (x^2, x^3 and 2).
MIN_BLOCK = 16  # The smallest block a matrix at a time; from 3 to ENTRIES_UP_TO: entries layout.
ENTRIES_UP_TO = expm_lib.ELEMENTWISE_UP_TO
ENTRY_ROWS = 8  # Entries layout: rows of 128 matrices a grid step (1,024: 256 KiB of 8 x 8).
LANES = 128
MAX_BLOCK = 256  # TPU / interpret: a 256 x 256 matrix's ~20 intermediates are ~5 MiB of VMEM.
GPU_MAX_BLOCK = 128  # Triton: one matrix a program, held in registers.
GPU_WARPS = 8  # Untuned (no GPU timing yet).
TILE_BYTES = 2**17  # TPU / interpret: the matrices a grid step, about this many bytes.
MAX_TILE = 32
COUNTED_SQUARINGS = 8  # The cost estimate's (ImageNet LieRE64's training range: 6.92 on average).


def supported(block: int, platform: str = 'tpu') -> bool:
  """Whether the kernel runs blocks of `block` on `platform` (else expm falls back to XLA)."""
  if platform == 'cuda':
    return MIN_BLOCK <= block <= GPU_MAX_BLOCK and block & (block - 1) == 0
  return 3 <= block <= ENTRIES_UP_TO or MIN_BLOCK <= block <= MAX_BLOCK


def tile_matrices(block: int) -> int:
  """Matrices a grid step on TPU (and in interpret mode)."""
  return int(np.clip(TILE_BYTES // (4 * block * block), 1, MAX_TILE))


def expm_pallas(a: jax.Array, precision='auto') -> jax.Array:
  """exp(a) for a [..., b, b] skew-symmetric, float32, as one Pallas kernel (module doc);
  precision as expm.per_platform ('auto', 'highest' or a dots.Dots). Blocks the kernel does not
  take (`supported`) go to expm.fast_expm."""
  flat, shape = expm_lib._stack(a)  # pylint: disable=protected-access
  b = shape[-1]
  if not supported(b, 'tpu') or not flat.shape[0]:
    return expm_lib.fast_expm(a, precision=precision)
  if isinstance(precision, str) and precision not in expm_lib.PRECISIONS:
    expm_lib.per_platform(lambda _: None, precision)  # Raises its error.
  with jax.named_scope('liere_expm'):
    return _kernel_expm(precision)(flat).reshape(shape)


@functools.lru_cache(maxsize=None)
def _kernel_expm(precision):
  """[m, b, b] -> exp, with the Frechet VJP; residuals a and R0 (R before Newton-Schulz)."""
  def fwd(a):
    r, r0 = expm_lib.per_platform(functools.partial(_stack_fn, 'forward_res'), precision, a)
    return r, (a, r0)

  def bwd(res, g):
    return expm_lib.per_platform(functools.partial(_stack_fn, 'backward'), precision, *res, g),

  run = jax.custom_vjp(
      lambda a: expm_lib.per_platform(functools.partial(_stack_fn, 'forward'), precision, a))
  run.defvjp(fwd, bwd)
  return run


@functools.lru_cache(maxsize=None)
def _stack_fn(kind, platform):
  """The pass `kind` on `platform` over stacks [m, b, b] ('forward': a -> R; 'forward_res':
  a -> (R, R0); 'backward': a, R0, G -> dA): a Pallas kernel, or on blocks the platform's
  kernel does not take, XLA."""
  def run(*args):
    d = expm_lib._DOTS.get()  # pylint: disable=protected-access
    b = args[0].shape[-1]
    if not supported(b, platform):
      return _xla(kind, d, *args)
    return _pallas(kind, platform, d, *args)
  return run


def _xla(kind, d, a, r0=None, g=None):
  """The XLA path (fast_loop's program) for a block this platform's kernel does not take."""
  fn = lambda x: expm_lib._loop_expm(TAYLOR, x)  # pylint: disable=protected-access
  if kind == 'forward':
    return fn(a)
  if kind == 'forward_res':
    return fn(a), a  # The backward recomputes what it needs from a.
  return jax.vjp(fn, a)[1](g)[0]


def _pallas(kind, platform, d, *args):
  m, b, _ = args[0].shape
  if b <= ENTRIES_UP_TO:
    return _pallas_entries(kind, platform, *args)
  forward, backward = _products(d)
  body, n_out = _body(kind, forward, backward)
  name = f'liere_expm_{kind}'
  if platform == 'cuda':
    from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
    spec = pl.BlockSpec((None, b, b), lambda i: (i, 0, 0))
    out = jax.ShapeDtypeStruct((m, b, b), jnp.float32)
    res = pl.pallas_call(
        functools.partial(_apply, body, len(args)), out_shape=(out,) * n_out, grid=(m,),
        in_specs=[spec] * len(args), out_specs=(spec,) * n_out, name=name,
        compiler_params=plgpu.CompilerParams(num_warps=GPU_WARPS))(*args)
    return res if n_out > 1 else res[0]
  tile = tile_matrices(b)
  n = -(-m // tile)
  if n * tile != m:  # Zero matrices (exp(0) = I, no squarings), sliced off after.
    args = [jnp.pad(x, ((0, n * tile - m), (0, 0), (0, 0))) for x in args]
  spec = pl.BlockSpec((tile, b, b), lambda i: (i, 0, 0))
  out = jax.ShapeDtypeStruct((n * tile, b, b), jnp.float32)
  # Each matrix read and written once, its rows padded to whole 128-lane tiles as a TPU lays it.
  cost = pl.CostEstimate(flops=2 * b**3 * _counted_products(kind) * n * tile, transcendentals=0,
                         bytes_accessed=4 * b * -(-b // 128) * 128 * n * tile * (len(args) + n_out))
  res = pl.pallas_call(
      functools.partial(_apply, body, len(args)), out_shape=(out,) * n_out, grid=(n,),
      in_specs=[spec] * len(args), out_specs=(spec,) * n_out, name=name, cost_estimate=cost,
      **_tpu_kw(platform))(*args)
  res = tuple(x[:m] for x in res) if n * tile != m else tuple(res)
  return res if n_out > 1 else res[0]


def _pallas_entries(kind, platform, *args):
  """_pallas for blocks of up to ENTRIES_UP_TO (TPU, interpret mode): the stacks [m, b, b] laid
  out entries first, [b, b, m / 128, 128] (zero matrices pad m), so that each entry of a tile's
  1,024 matrices is whole vector registers [8, 128], not an 8 x 8 block on an 8 x 128 tile; a
  product is b^3 multiply-adds of them (float32, exact), a transpose a renaming."""
  m, b, _ = args[0].shape
  rows = min(ENTRY_ROWS, -(-m // LANES))  # A multiple of 8, or the whole array.
  size = -(-m // (rows * LANES)) * rows * LANES
  body, n_out = _body(kind, _entries_product, _entries_product, entries=True)
  to_entries = lambda x: jnp.pad(jnp.moveaxis(x, 0, -1), ((0, 0), (0, 0), (0, size - m))).reshape(
      b, b, size // LANES, LANES)
  spec = pl.BlockSpec((b, b, rows, LANES), lambda i: (0, 0, i, 0))
  out = jax.ShapeDtypeStruct((b, b, size // LANES, LANES), jnp.float32)
  cost = pl.CostEstimate(flops=2 * b**3 * _counted_products(kind) * size, transcendentals=0,
                         bytes_accessed=4 * b * b * size * (len(args) + n_out))
  res = pl.pallas_call(
      functools.partial(_apply, body, len(args)), out_shape=(out,) * n_out,
      grid=(size // (rows * LANES),), in_specs=[spec] * len(args), out_specs=(spec,) * n_out,
      name=f'liere_expm_{kind}', cost_estimate=cost, **_tpu_kw(platform))(
          *map(to_entries, args))
  res = tuple(jnp.moveaxis(x.reshape(b, b, size)[..., :m], -1, 0) for x in res)
  return res if n_out > 1 else res[0]


def _body(kind, forward, backward, entries=False):
  """The kernel body of pass `kind` with these products, and its number of outputs."""
  body = {'forward': functools.partial(_exp_one, forward, False, entries=entries),
          'forward_res': functools.partial(_exp_one, forward, True, entries=entries),
          'backward': functools.partial(_grad_one, backward, entries=entries)}[kind]
  return body, 2 if kind == 'forward_res' else 1


def _tpu_kw(platform):
  """pallas_call's arguments on a TPU (Mosaic, tiles in parallel), or interpret mode (cpu)."""
  if platform == 'cpu':
    return {'interpret': True}
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  return {'compiler_params': pltpu.CompilerParams(dimension_semantics=('parallel',))}


def _counted_products(kind):
  """For XLA's counts: products a matrix at COUNTED_SQUARINGS (HIGHEST's six passes not
  counted)."""
  return {'forward': 6, 'forward_res': 6, 'backward': 5 + 3 * 4}[kind] + (
      3 if kind == 'backward' else 1) * COUNTED_SQUARINGS


def _entries_product(x, y):
  """x @ y of each matrix in the entries layout [b, b, ...]: b multiply-adds an entry."""
  out = x[:, 0][:, None] * y[0][None]
  for k in range(1, x.shape[1]):
    out = out + x[:, k][:, None] * y[k][None]
  return out


def _products(d):
  """(forward, backward) products for the kernel body: plain (x, y) -> x @ y of 2-D blocks."""
  if d is None:
    d = expm_lib._dots('auto', 'cpu')  # pylint: disable=protected-access
  if isinstance(d, expm_lib.dots_lib.Dots):
    return d.forward, d.backward
  return d, d


def _apply(body, n_in, *refs):
  """The input refs' blocks in, body's results to the output refs: one matrix [b, b] (Triton) or
  a tile [tile, b, b] at once (TPU: each product one batched product of the tile, which the MXU
  streams; each matrix with its own squarings)."""
  for ref, x in zip(refs[n_in:], body(*(r[...] for r in refs[:n_in]))):
    ref[...] = x


def squarings(powers, theta):
  """expm._squarings for each matrix of a stack [..., b, b] inside a kernel, int32 [..., 1, 1]:
  the squarings that take the spectral-radius bound ||a^k||_1^(1/k) (||a||_1 where that is not
  finite) to at most theta, no cap; 0 for a non-finite matrix. Reductions keep their dims and
  the power is taken in logarithms (Mosaic has no scalar pow)."""
  k = max(powers)
  norm = _norm1
  log_k = jnp.log2(norm(powers[k])) / k  # -inf for a = 0: no squarings.
  log_bound = jnp.where(jnp.isfinite(log_k) | (log_k < 0), log_k, jnp.log2(norm(powers[1])))
  s = jnp.ceil(jnp.maximum(log_bound - np.float32(np.log2(theta)), -1.0))
  return jnp.where(jnp.isfinite(s), jnp.maximum(s, 0.0), 0.0).astype(jnp.int32)


def _norm1(p):
  """Each matrix's 1-norm (largest column sum): [..., 1, 1], or [...] in the entries layout."""
  if expm_lib._ENTRIES.get():  # pylint: disable=protected-access
    return jnp.max(jnp.sum(jnp.abs(p), axis=0), axis=0)
  return jnp.max(jnp.sum(jnp.abs(p), axis=-2, keepdims=True), axis=-1, keepdims=True)


def _squared(powers, s):
  """p(a 2^-s)^(2^s) for a stack's powers, s [..., 1, 1] its own per matrix: the loop runs to
  the stack's largest s, each matrix's square kept by select up to its own."""
  scale = jnp.exp2(-s.astype(jnp.float32))
  y = TAYLOR.polynomial({k: p * scale**k for k, p in powers.items()})
  return jax.lax.fori_loop(0, jnp.max(s), lambda i, y: jnp.where(
      i < s, expm_lib.matmul(y, y), y), y)


def _exp_one(mm, residual, a, entries=False):
  """(exp(a),) of a stack [m, b, b] (`entries`: [b, b, ...]), fast_loop's program with each
  matrix's own squarings; with `residual` also R0, the rotation before the Newton-Schulz step
  (the backward's residual)."""
  with expm_lib._products(mm, entries=entries):  # pylint: disable=protected-access
    powers = TAYLOR.powers(a)
    r0 = _squared(powers, squarings(powers, TAYLOR.theta))
    r = expm_lib._newton_schulz(r0)  # pylint: disable=protected-access
  return (r, r0) if residual else (r,)


def _grad_one(mm, a, r0, g, entries=False):
  """(the cotangent of a,) for the cotangent g of R = NS(R0(a)) (stacks as _exp_one's): through
  the Newton-Schulz step's adjoint at R0 (at R0, not at an orthogonal R: that keeps the
  gradient's error at the XLA path's, 2.5e-6 against 6e-6 on LieRE64's largest matrices), then
  L(a^T, g) as the polynomial and squarings at a^T differentiated forward in direction g."""
  t = expm_lib.transpose
  with expm_lib._products(mm, entries=entries):  # pylint: disable=protected-access
    # NS(r) = 1.5 r - 0.5 r r^T r; its adjoint: 1.5 g - 0.5 (g r^T r + r g^T r + r r^T g).
    p = mm(t(r0), g)
    g = 1.5 * g - 0.5 * (mm(g, mm(t(r0), r0)) + mm(r0, t(p)) + mm(r0, p))
    powers, tangents = jax.jvp(TAYLOR.powers, (t(a),), (g,))
    s = squarings(powers, TAYLOR.theta)
    return jax.jvp(lambda x: _squared(x, s), (powers,), (tangents,))[1],
