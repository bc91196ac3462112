"""The exponential of a stack of skew-symmetric blocks as one Pallas kernel (liere_jax.expm's
'kernel' form: a TPU's, and model.pe.expm='pallas' elsewhere).

XLA's 'loop' form runs each of its ~20 products a matrix as its own op: every product reads two
stacks from memory and writes one. Here one kernel reads each matrix once and writes its
rotation once: per matrix, in on-chip memory (VMEM on a TPU, registers on a GPU),
  1. a, a^2, a^3 and the spectral-radius bound rho(a) <= ||a^3||_1^(1/3) (as taylor.squarings,
     in logarithms: the vector units have no scalar pow);
  2. the matrix's OWN number of squarings s (no cap: a loop of dynamic trip count, each
     matrix's square kept by select up to its own);
  3. the degree-12 Bader-Blanes-Casas polynomial at a 2^-s (taylor.TAYLOR12, over the kernel's
     `Algebra`), the s squarings and the Newton-Schulz step.
The VJP stores a and R. A second kernel computes the cotangent of a as the XLA forms do, by
taylor.py's adjoint for skew-symmetric a (docs/decisions/027-expm-adjoint.md): W = skew(R^T G),
L(x, W) at x = a 2^-s (the polynomial's derivative, `jax.jvp` inside the kernel), then each
matrix's own s levels L(2x, W) = (E L + L E) / 2 beside the squarings E -> E^2 recomputed, and
abar = skew(L(a, W) (2R - R0)^T): 13 + 3s products a matrix (the Frechet kernel before it, the
polynomial and squarings at a^T differentiated forward after the Newton-Schulz adjoint: 17 + 3s);
the XLA 'loop' form's gradient (tests/test_kernels_expm.py).

By `Numerics.platform`: 'tpu' Mosaic, a grid over tiles of `tile_matrices(b)` matrices, blocks of
3 to ENTRIES_UP_TO (LieRE8's) in an entries layout [b, b, m / 128, 128] (each entry of 1,024
matrices whole vector registers, a product b^3 float32 multiply-adds, a transpose a renaming);
'cuda' Triton, one matrix a program; 'cpu' interpret mode with a TPU's tiling (tests). Which
blocks each takes: `supported`. Why: docs/decisions/.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from liere_jax import taylor as taylor_lib
from liere_jax.kernels.common import LANES, Cost, call_kw, estimate, padded

TAYLOR = taylor_lib.TAYLOR12  # The polynomial: degree 12 in 4 products (x^2, x^3 and 2).
MIN_BLOCK = 16  # The smallest block a matrix at a time; from 3 to ENTRIES_UP_TO: entries layout.
ENTRIES_UP_TO = 8
ENTRY_ROWS = 8  # Entries layout: rows of 128 matrices a grid step (1,024: 256 KiB of 8 x 8).
MAX_BLOCK = 256  # TPU / interpret: a 256 x 256 matrix's ~20 intermediates are ~5 MiB of VMEM.
GPU_MAX_BLOCK = 128  # Triton: one matrix a program, held in registers.
GPU_WARPS = 8  # Untuned (no GPU timing yet).
TILE_BYTES = 2**17  # TPU / interpret: the matrices a grid step, about this many bytes.
MAX_TILE = 32
COUNTED_SQUARINGS = 8  # The cost estimate's (ImageNet LieRE64's training range: 6.92 on average).


def supported(block: int, platform: str = 'tpu') -> bool:
  """Whether the kernel runs blocks of `block` on `platform` ('cpu': interpret mode, a TPU's)."""
  if platform == 'cuda':
    return MIN_BLOCK <= block <= GPU_MAX_BLOCK and block & (block - 1) == 0
  return 3 <= block <= ENTRIES_UP_TO or MIN_BLOCK <= block <= MAX_BLOCK


def tile_matrices(block: int) -> int:
  """Matrices a grid step on TPU (and in interpret mode)."""
  return int(np.clip(TILE_BYTES // (4 * block * block), 1, MAX_TILE))


def expm_pallas(a: jax.Array, numerics) -> jax.Array:
  """exp(a) for a [..., b, b] skew-symmetric (float32; `supported` blocks) as one Pallas kernel
  on `numerics.platform`, its products at `numerics.products` (Triton; a TPU's tiles at theirs,
  the entries layout in float32 multiply-adds)."""
  if not supported(a.shape[-1], numerics.platform):
    raise ValueError(f'The Pallas exponential takes no blocks of {a.shape[-1]} on '
                     f'{numerics.platform}; liere_jax.expm.expm chooses where it runs.')
  flat = jnp.asarray(a, jnp.float32).reshape((-1,) + a.shape[-2:])
  if a.shape[-1] <= ENTRIES_UP_TO:  # Stacks [m, b, b] <-> entries [b, b, m].
    return jnp.moveaxis(_kernel(numerics, True, jnp.moveaxis(flat, 0, -1)), -1, 0).reshape(
        a.shape)
  return _kernel(numerics, False, flat).reshape(a.shape)


def expm_entries(a: jax.Array, numerics) -> jax.Array:
  """exp of the matrices of a [b, b, M] laid out entries first (a[i, j] the (i, j) entries of all
  M matrices; blocks of 3 to ENTRIES_UP_TO, TPU or interpret mode), in that layout: no
  transposes to and from stacks, whose [.., b, b] minor dimensions a TPU pads to 128 lanes
  (LieRE8's every-token exponentials: rotations.liere_entries)."""
  b = a.shape[0]
  if not (a.ndim == 3 and a.shape[1] == b and 3 <= b <= ENTRIES_UP_TO
          and numerics.platform != 'cuda'):
    raise ValueError(f'expm_entries takes [b, b, M] with 3 <= b <= {ENTRIES_UP_TO} on a TPU '
                     f'(or interpret mode), not {a.shape} on {numerics.platform}.')
  with jax.named_scope('liere_expm'):
    return _kernel(numerics, True, jnp.asarray(a, jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _kernel(numerics, entries, a):
  """Stacks [m, b, b] (or entries [b, b, m]) -> exp, with taylor.py's adjoint as the VJP;
  residuals a and R."""
  return _pallas('forward', numerics, entries, a)


def _kernel_fwd(numerics, entries, a):
  r = _pallas('forward', numerics, entries, a)
  return r, (a, r)


def _kernel_bwd(numerics, entries, res, g):
  return _pallas('backward', numerics, entries, *res, g),


_kernel.defvjp(_kernel_fwd, _kernel_bwd)


def _pallas(kind, numerics, entries, *args):
  platform = numerics.platform
  if entries:
    return _pallas_entries(kind, platform, *args)
  m, b, _ = args[0].shape
  d = numerics.products
  body, n_out = _body(kind, taylor_lib.stacked(d.forward), taylor_lib.stacked(d.backward))
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
  declared = estimate(name, cost(kind, b, n * tile, n, False, len(args) + n_out))
  res = pl.pallas_call(
      functools.partial(_apply, body, len(args)), out_shape=(out,) * n_out, grid=(n,),
      in_specs=[spec] * len(args), out_specs=(spec,) * n_out, name=name, cost_estimate=declared,
      **_tpu_kw(platform))(*args)
  res = tuple(x[:m] for x in res) if n * tile != m else tuple(res)
  return res if n_out > 1 else res[0]


def _pallas_entries(kind, platform, *args):
  """_pallas for blocks of up to ENTRIES_UP_TO (TPU, interpret mode) on matrices laid out
  entries first, [b, b, m], as [b, b, m / 128, 128] (zero matrices pad m), so that each entry of
  a tile's 1,024 matrices is whole vector registers [8, 128], not an 8 x 8 block on an 8 x 128
  tile; a product is b^3 multiply-adds of them (float32, exact), a transpose a renaming."""
  b, _, m = args[0].shape
  rows = min(ENTRY_ROWS, -(-m // LANES))  # A multiple of 8, or the whole array.
  size = -(-m // (rows * LANES)) * rows * LANES
  body, n_out = _body(kind, ENTRIES, ENTRIES)
  to_entries = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, size - m))).reshape(
      b, b, size // LANES, LANES)
  spec = pl.BlockSpec((b, b, rows, LANES), lambda i: (0, 0, i, 0))
  out = jax.ShapeDtypeStruct((b, b, size // LANES, LANES), jnp.float32)
  declared = estimate(f'liere_expm_{kind}', cost(kind, b, size, size // (rows * LANES), True,
                                              len(args) + n_out))
  res = pl.pallas_call(
      functools.partial(_apply, body, len(args)), out_shape=(out,) * n_out,
      grid=(size // (rows * LANES),), in_specs=[spec] * len(args), out_specs=(spec,) * n_out,
      name=f'liere_expm_{kind}', cost_estimate=declared, **_tpu_kw(platform))(
          *map(to_entries, args))
  res = tuple(x.reshape(b, b, size)[..., :m] for x in res)
  return res if n_out > 1 else res[0]


def _body(kind, forward, backward):
  """The kernel body of pass `kind` in these algebras (forward, backward), and its outputs."""
  body = {'forward': functools.partial(_exp_one, forward),
          'backward': functools.partial(_grad_one, backward)}[kind]
  return body, 1


def _tpu_kw(platform):
  """pallas_call's arguments on a TPU (Mosaic, tiles in parallel), or interpret mode (cpu)."""
  return call_kw(platform == 'cpu', ('parallel',))


def _counted_products(kind):
  """Products a matrix at COUNTED_SQUARINGS: forward a^2, a^3, the polynomial's 2, Newton-Schulz's
  2 and one a squaring; backward (taylor.py's adjoint) R^T G, a^2, a^3, the powers' skew
  tangents 3, the polynomial's 2 and its tangent's 4 (a tangent product two products), the end's
  1, and 3 a level (E^2, E M, M E)."""
  return {'forward': 6, 'backward': 13}[kind] + (
      3 if kind == 'backward' else 1) * COUNTED_SQUARINGS


def cost(kind, b, matrices, steps, entries, arrays) -> Cost:
  """What pass `kind` does (common.Cost) on `matrices` b x b (the padding matrices included)
  in `steps` grid steps, laid out as entries (`_pallas_entries`) or as stacks (`_pallas`),
  `arrays` of them read or written, each matrix at COUNTED_SQUARINGS = S squarings (its own
  count is data: the estimate's). Per matrix, E = b^2 elements:
    a product (`_counted_products`): stacks 2 b^3 MXU flops (HIGHEST's six bf16 passes counted
      once, as XLA counts its own); entries b^3 multiplies and (b - 1) b^2 adds on the vector
      unit; a tangent product (jax.jvp inside the backward) is two;
    forward: the bound on rho: |a^3|, |a| (2 E), their column sums (2 E) and maxima (2 b), two
      log2 (a log and a divide each) over 3, and s from them: 14 ops, 2 logs; the scaling
      2^-s (a conversion, a negation, an exp2, its square and cube: 5 ops) applied to a, a^2,
      a^3 (3 E); the polynomial: four sums of three scaled powers (6 E each: 3 multiplies and 3
      adds, the first onto 0), X6 and Y (2 E), T's two scalings and three adds (5 E); the
      squarings' count (a max) and each squaring's test (1) and select (E); Newton-Schulz's
      1.5 r - 0.5 (.) (3 E): (41 + S) E + 2 b + 20 + S, and 3 transcendentals;
    backward: W = skew(R^T G) (4 E: R - I's negation, G minus the product, the skew part's
      difference and halving), the bound and the scaling as forward (4 E + 2 b, 20 ops, 3
      transcendentals), the scaled powers (3 E) and their skew tangents' sums (2 E), the
      polynomial (31 E) and its tangent (29 E: the sums' 3 multiplies and 2 adds each, X6's
      2 E, Y's E, T's 6 E), the levels' count (a max) and each level's selects of E and M and
      (E M + M E) / 2 (4 E) and its two tests (2), the end's 2R - R0 or R (3 E) and its test
      s > 0 (1), its deviation from I (E), M minus the product and the skew part (3 E):
      (80 + 4 S) E + 2 b + 21 + 2 S, and 3 transcendentals;
    I added once forward, three times backward (W, the polynomial, the end): entries b each;
      stacks E each, and 3 b^2 a step for its jnp.eye.
  HBM: each matrix read and written once, as laid out (stacks: rows of whole 128 lanes;
  entries: whole tiles of 8 rows of 128 matrices)."""
  backward = kind == 'backward'
  e, s = b * b, COUNTED_SQUARINGS
  products = _counted_products(kind)
  identities = 3 if backward else 1
  vpu = (e * (80 + 4 * s) + 2 * b + 21 + 2 * s if backward else
         e * (41 + s) + 2 * b + 20 + s)
  if entries:
    mxu, vpu, eye = 0, vpu + identities * b + products * (2 * b**3 - e), 0
    moved = 4 * e * padded(matrices // LANES, jnp.float32) * LANES
  else:
    mxu, vpu, eye = products * 2 * b**3, vpu + identities * e, identities * 3 * e * steps
    moved = 4 * padded(b, jnp.float32) * padded(b) * matrices
  return Cost(mxu * matrices, vpu * matrices + eye, 3 * matrices, moved * arrays)


def _entries_product(x, y):
  """x @ y of each matrix in the entries layout [b, b, ...]: b multiply-adds an entry."""
  out = x[:, 0][:, None] * y[0][None]
  for k in range(1, x.shape[1]):
    out = out + x[:, k][:, None] * y[k][None]
  return out


def _entries_plus_identity(x):
  """I + x entry by entry: a kernel holds no array constants."""
  return jnp.stack([jnp.stack([x[i, j] + 1 if i == j else x[i, j] for j in range(x.shape[1])])
                    for i in range(x.shape[0])])


# The entries layout [b, b, ...]: a transpose is a renaming of the entries.
ENTRIES = taylor_lib.Algebra(_entries_product,
                             lambda x: jnp.stack([x[:, i] for i in range(x.shape[0])]),
                             _entries_plus_identity)


def _apply(body, n_in, *refs):
  """The input refs' blocks in, body's results to the output refs: one matrix [b, b] (Triton) or
  a tile [tile, b, b] at once (TPU: each product one batched product of the tile, which the MXU
  streams; each matrix with its own squarings)."""
  for ref, x in zip(refs[n_in:], body(*(r[...] for r in refs[:n_in]))):
    ref[...] = x


def squarings(powers, theta, entries=False):
  """taylor.squarings for each matrix of a stack [..., b, b] inside a kernel, int32 [..., 1, 1]
  ([...] in the entries layout): the squarings that take the spectral-radius bound
  ||a^k||_1^(1/k) (||a||_1 where that is not finite) to at most theta, no cap; 0 for a
  non-finite matrix. Reductions keep their dims and the power is taken in logarithms (Mosaic
  has no scalar pow)."""
  k = max(powers)
  norm = functools.partial(_norm1, entries=entries)
  log_k = jnp.log2(norm(powers[k])) / k  # -inf for a = 0: no squarings.
  log_bound = jnp.where(jnp.isfinite(log_k) | (log_k < 0), log_k, jnp.log2(norm(powers[1])))
  s = jnp.ceil(jnp.maximum(log_bound - np.float32(np.log2(theta)), -1.0))
  return jnp.where(jnp.isfinite(s), jnp.maximum(s, 0.0), 0.0).astype(jnp.int32)


def _norm1(p, entries):
  """Each matrix's 1-norm (largest column sum): [..., 1, 1], or [...] in the entries layout."""
  if entries:
    return jnp.max(jnp.sum(jnp.abs(p), axis=0), axis=0)
  return jnp.max(jnp.sum(jnp.abs(p), axis=-2, keepdims=True), axis=-1, keepdims=True)


def _squared(alg, powers, s):
  """p(a 2^-s)^(2^s) for a stack's powers, s [..., 1, 1] its own per matrix: the loop runs to
  the stack's largest s, each matrix's square kept by select up to its own."""
  scale = jnp.exp2(-s.astype(jnp.float32))
  y = TAYLOR.polynomial(alg, {k: p * scale**k for k, p in powers.items()})
  return jax.lax.fori_loop(0, jnp.max(s), lambda i, y: jnp.where(
      i < s, alg.matmul(y, y), y), y)


def _exp_one(alg, a):
  """(exp(a),) of a stack in `alg`'s layout: 'loop''s program with each matrix's own
  squarings."""
  powers = TAYLOR.powers(alg, a)
  r0 = _squared(alg, powers, squarings(powers, TAYLOR.theta, alg is ENTRIES))
  return taylor_lib.newton_schulz(alg, r0),


def _grad_one(alg, a, r, g):
  """(the cotangent of a,) for the cotangent g of R = exp(a) (stacks as _exp_one's):
  taylor.py's adjoint, each matrix's squarings recomputed as _exp_one runs them (the same
  R0 = p(x)^(2^s), so R0^{-1} = (2R - R0)^T holds), its levels beside them, each matrix's own
  count kept by select up to the stack's largest."""
  powers = TAYLOR.powers(alg, a)
  s = squarings(powers, TAYLOR.theta, alg is ENTRIES)
  w = taylor_lib.skew_cotangent(alg, r, g)
  e, m = taylor_lib.adjoint_base(alg, TAYLOR, powers, jnp.exp2(-s.astype(jnp.float32)), w)
  step = lambda i, c: tuple(jnp.where(i < s, new, old)
                            for new, old in zip(taylor_lib.adjoint_level(alg, *c), c))
  e, m = jax.lax.fori_loop(0, jnp.max(s), step, (e, m))
  return taylor_lib.adjoint_end(alg, m, r, e, s > 0),
