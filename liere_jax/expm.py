"""Matrix exponential of stacks of skew-symmetric matrices, the core of LieRE.

`expm(a, method, precision)` is the entry point (liere_jax.rotations calls it):
  scipy:       `jax.vmap(jax.scipy.linalg.expm)`, the reference. Under vmap its norm-dependent
               Pade order and squarings become selects, so every matrix pays for all of them,
               and its backward pass keeps every intermediate.
  scipy_remat: the same under `jax.checkpoint`, per chunk of 16 MiB of matrices inside
               `lax.map`: the backward pass holds one chunk's intermediates at a time.
  fast:        b = 2 in closed form (a rotation by the angle a[0, 1]); otherwise scaling and
               squaring from a spectral-radius bound, a Taylor polynomial and a final
               Newton-Schulz step, in a form chosen per platform when the program is lowered
               (`jax.lax.platform_dependent`, so a program lowered here for 'cuda' or 'tpu'
               takes that platform's form). What runs where (liere_jax.platforms, `per_platform`):

    platform  form         one scale per      squarings                      Taylor       'auto'
    cpu       fast_cond    64 KiB chunk       lax.cond branches, cap 2^24    PS 12, th 1  float32
    tpu       fast_loop    the whole stack    while loop on the device       BBC 12, 1.46 bf16 x6
    cuda      fast_select  the whole stack    SELECT_CAP squarings, select   PS 12, th 1  bf16 x6
                                              (fast_loop: its LieRE64 step 1.03x
                                              fast_select's on an H200)
    (Taylor: TAYLORS, PS Paterson-Stockmeyer, BBC Bader-Blanes-Casas, th its theta; 'auto':
    the products' precision, bf16 x6 = BF16_BF16_F32_X6 on a GPU, HIGHEST on a TPU.)

    fast_loop    ONE scale for a piece (its largest bound: on accelerators the stack's, one
                 reduction), its s squarings a `fori_loop` of dynamic trip count: no matrix pays
                 for a cap, and no cap (exact as far as float32 goes). Its VJP runs the polynomial
                 and squarings forward on a^T (`_squared_taylor`): it stores a and s alone. No
                 conditional. On a GPU a while loop copies its predicate to the host each trip:
                 2 (s + 1) round trips a step (s <= 9 for LieRE64 at the training range), against
                 1,224 for fast_cond there. On this CPU it loses to fast_cond (fwd+bwd 2.1x on
                 cifar LieRE64, 1.2x on LieRE8: docs/benchmarks.md), so the CPU keeps that.
    fast_cond    ONE scale per chunk, chunks under `jax.checkpoint` inside `lax.map`, the
                 squarings real branches (`lax.cond`; on a GPU each a host round trip).
    fast_select  a scale per matrix and SELECT_CAP squarings applied by select, no control flow:
                 every matrix pays for the cap, and past it the result is wrong. Kept for A/B
                 (what accelerators ran before fast_loop), as fast_cond on accelerators.
               Every form can be asked for by name on every platform (benchmarks, A/B).
  pallas:      (rotations.exponential; the kernel sits above this module) opt-in, not a default
               anywhere (on an H200: forward 2.4x fast's, forward + backward 1.24x, but the
               LieRE64 step 1.05x fast_select's; untimed on a TPU): fast_loop's program
               as ONE Pallas kernel (liere_jax.expm_kernel), each matrix on chip from a to R
               with its own squarings, and a Frechet-derivative VJP that stores a and R before
               Newton-Schulz (Mosaic on a TPU, Triton on a GPU, interpret mode on CPU: for
               tests).
               Blocks of 9 to 15, b = 2, past the kernel's largest, or under 16 on a GPU: the
               fast path.
Products run at `precision` (`per_platform`): 'highest' is float32 everywhere; 'auto' keeps it on
CPU and uses six bf16 passes on accelerators (tensor cores; a TPU's HIGHEST), which keep
float32's error (docs/benchmarks.md; `liere_jax.dots` emulates the presets on CPU). Products of
blocks up to ELEMENTWISE_UP_TO are float32 multiply-adds on a TPU (liere_jax.platforms'
elementwise_blocks; switch block_products for A/B).

`per_platform` runs a computation (the exponential, the lattice table's products) with its
products at each platform's precision. `fast_expm(a, taylor, form, precision)` is `fast` with
another Taylor scheme (a `Taylor`: TAYLOR18 for A/B) or a fixed form; `chunks` / `squarings`
say how `fast_cond` and `fast_loop` split a stack and scale each piece.
"""

import contextlib
import contextvars
import functools
import math
import os
from typing import Callable, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp

from liere_jax import dots as dots_lib, switches
from liere_jax.platforms import PLATFORMS, current

METHODS = ('fast', 'fast_loop', 'fast_cond', 'fast_select', 'scipy', 'scipy_remat')
FORMS = ('auto', 'loop', 'cond', 'select')
PRECISIONS = ('auto', 'highest')
_MAX_SQUARINGS = 24  # fast_cond: scaled norms up to 2**24, far beyond any position range in use.
# fast_select: every matrix pays for SELECT_CAP squarings. 16 covers spectral radii up to 2**16:
# the init's largest is 2**11 for LieRE64 at 4x the position range of our configs, and 2**9 at
# it. Beyond the cap the squarings stop there and the error grows (tests/test_expm.py).
SELECT_CAP = 16
# fast_select without remat while its residuals (about SELECT_CAP + 15 stacks of the input's
# size) fit this: ImageNet LieRE64's lattice exponentials (16,848 of 64x64: 276 MB a stack) keep
# 8.6 GB, which an 80 GB accelerator holds beside ViT-B/16's batch of 128 (37 GB). Lower it to
# trade recomputation for memory.
REMAT_ABOVE_BYTES = 16 * 2**30
ELEMENTWISE_UP_TO = 8
BLOCK_PRODUCTS = switches.Switch(
    'block_products', ('auto', 'dot', 'elementwise'), "the exponential's and the lattice "
    "table's products of small blocks: 'auto' (liere_jax.platforms' elementwise_blocks), 'dot' "
    f"everywhere, or 'elementwise' (float32 multiply-adds up to {ELEMENTWISE_UP_TO}) everywhere.")


class Taylor(NamedTuple):
  """A polynomial for `fast`'s scaling and squaring.

  powers: a [c, b, b] -> {k: a^k}, k = 1 included; the highest power bounds the spectral
    radius (rho(a) <= ||a^k||_1^(1/k)).
  polynomial: the scaled powers {k: x^k} -> the Taylor polynomial of exp at x.
  theta: the largest scaled spectral radius the polynomial is used at.
  products: matrix products per matrix in powers and polynomial together.
  """
  powers: Callable[[jax.Array], Dict[int, jax.Array]]
  polynomial: Callable[[Dict[int, jax.Array]], jax.Array]
  theta: float
  products: int


def expm(a: jax.Array, method: str = 'fast', precision='auto') -> jax.Array:
  """exp(a) for a: [..., b, b] skew-symmetric; returns float32 [..., b, b] rotations."""
  if method not in METHODS:
    raise ValueError(f"expm method={method!r} is unknown; use one of {METHODS} "
                     "(e.g. --config.model.pe.expm=fast).")
  if method.startswith('fast'):
    return fast_expm(a, form=method.partition('_')[2] or 'auto', precision=precision)
  flat, shape = _stack(a)
  fn = jax.vmap(jax.scipy.linalg.expm)
  with jax.default_matmul_precision('highest'):
    out = (_map_chunks(jax.checkpoint(fn), flat, PLATFORMS[current()].chunk_bytes)
           if method == 'scipy_remat'
           else fn(flat))
  return out.reshape(shape)


def fast_expm(a: jax.Array, taylor: Optional[Taylor] = None, form: str = 'auto',
              precision='auto') -> jax.Array:
  """expm(a, 'fast') with the Taylor scheme `taylor` (default: the form's, TAYLORS), in `form`
  (FORMS: 'auto' by platform, liere_jax.platforms), at `precision` (`per_platform`)."""
  if form not in FORMS:
    raise ValueError(f'fast_expm form={form!r} is unknown; use one of {FORMS}.')
  flat, shape = _stack(a)
  if shape[-1] == 2:
    return _rotation_2x2(flat).reshape(shape)
  if not flat.shape[0]:  # Nothing to exponentiate (e.g. every position at the origin).
    return flat.reshape(shape)
  def form_of(platform):
    row = PLATFORMS[platform]
    return _form(taylor, row.expm_form if form == 'auto' else form, row.chunk_bytes,
                 platform == 'cpu')
  with jax.named_scope('liere_expm'):
    return per_platform(form_of, precision, flat).reshape(shape)


@functools.lru_cache(maxsize=None)
def _form(taylor, form, budget, cpu):
  """One form of fast on [m, b, b], in pieces of `budget` bytes (a cached function: equal
  branches are traced once)."""
  taylor = taylor or TAYLORS[form]
  if form == 'select':
    return functools.partial(_select_stack, taylor, budget)
  if form == 'loop':
    fn = functools.partial(_loop_expm, taylor)
    return (lambda x: _map_chunks(fn, x, budget)) if cpu else fn
  return lambda x: _map_chunks(jax.checkpoint(functools.partial(_cond_expm, taylor)), x, budget)


def _stack(a):
  """a [..., b, b] as float32 [m, b, b], and a's shape."""
  a = jnp.asarray(a, jnp.float32)
  b, b2 = a.shape[-2:]
  if b != b2:
    raise ValueError(f'expm needs square matrices, got shape {a.shape}.')
  return a.reshape(-1, b, b), a.shape


def _rotation_2x2(a):
  """exp([[0, t], [-t, 0]]) = [[cos t, sin t], [-sin t, cos t]]; a: [m, 2, 2]."""
  t = a[:, 0, 1]
  c, s = jnp.cos(t), jnp.sin(t)
  return jnp.stack([jnp.stack([c, s], -1), jnp.stack([-s, c], -1)], -2)


def chunks(a: jax.Array, form: str = 'cond') -> jax.Array:
  """a [m, b, b] as `form` ('cond' or 'loop') splits it on this backend into pieces of one scale
  each: [n_chunks, chunk, b, b], the last chunk zero-padded."""
  platform = current()
  if form == 'loop' and platform != 'cpu':
    return a[None]
  return _chunked(a, PLATFORMS[platform].chunk_bytes)


def _chunked(a, budget):
  """[m, b, b] -> [n_chunks, chunk, b, b] of about `budget` bytes each, zero-padded (exp(0) =
  I; the padding is sliced off after)."""
  m, b, _ = a.shape
  n_chunks = -(-m // max(1, min(m, budget // (4 * b * b))))
  chunk = -(-m // n_chunks)  # Balanced: fewer than n_chunks padding matrices.
  return jnp.pad(a, ((0, n_chunks * chunk - m), (0, 0), (0, 0))).reshape(n_chunks, chunk, b, b)


def _map_chunks(fn, a, budget):
  """fn over chunks of about `budget` bytes of a [m, b, b], one after another (lax.map)."""
  if not a.shape[0]:
    return a
  parts = _chunked(a, budget)
  if parts.shape[0] == 1:
    return fn(a)
  out = jax.lax.map(fn, parts)
  return out.reshape(-1, *a.shape[1:])[:a.shape[0]]


def squarings(chunk: jax.Array, taylor: Optional[Taylor] = None, form: str = 'cond') -> jax.Array:
  """The squarings `form` ('cond' or 'loop'; with `taylor`, default the form's) applies to a
  chunk [c, b, b] (`chunks`)."""
  taylor = taylor or TAYLORS[form]
  cap = _MAX_SQUARINGS if form == 'cond' else None
  return jnp.max(_squarings(taylor.powers(chunk), taylor.theta, cap))


def _squarings(powers, theta, cap=None):
  """Squarings per matrix [c], from the highest power a^k of the unscaled matrices: the scaled
  spectral radius ends at most theta (up to 2**cap; no cap: as far as float32 goes). A matrix
  with a non-finite entry gets none (its result is NaN either way: no endless loop)."""
  # A skew-symmetric matrix is normal: the Taylor remainder at x is bounded through rho(x) in
  # the 2-norm, and rho(a) <= ||a^k||_1^(1/k) <= ||a||_1 (tighter than the 1-norm, and free:
  # the powers are needed anyway). ||a||_1 where a^k overflows.
  k = max(powers)
  norm = lambda p: jnp.max(jnp.sum(jnp.abs(p), axis=-2), axis=-1)
  bound = norm(powers[k]) ** (1 / k)
  bound = jax.lax.stop_gradient(jnp.where(jnp.isfinite(bound), bound, norm(powers[1])))
  s = jnp.ceil(jnp.log2(jnp.maximum(bound / theta, 1e-30)))
  return jnp.where(jnp.isfinite(s), jnp.clip(s, 0, cap), 0).astype(jnp.int32)


def _scaled_polynomial(taylor, powers, s):
  """The Taylor polynomial at a * 2^-s (s per matrix [c] or one scalar)."""
  scale = jnp.exp2(-s.astype(jnp.float32)).reshape(s.shape + (1, 1))
  return taylor.polynomial({k: p * scale**k for k, p in powers.items()})


def _newton_schulz(r):
  """One Newton-Schulz step to the nearest orthogonal matrix: squaring doubles the rounding
  error each time; this removes the part of it that breaks orthogonality."""
  return 1.5 * r - 0.5 * matmul(r, matmul(transpose(r), r))


def _loop_expm(taylor, a):
  """fast_loop on a [c, b, b]: one scale for the stack, from its largest bound, and that many
  squarings in a while loop."""
  return _newton_schulz(_squared_taylor(taylor, _DOTS.get(), _ELEMENTWISE.get())(a))


def _taylor_squared(taylor, powers, s):
  """p(a 2^-s)^(2^s) from a's powers, s a scalar: the squarings a while loop (on a TPU it runs
  on the device; on a GPU each trip's predicate goes to the host)."""
  return jax.lax.fori_loop(0, s, lambda _, y: matmul(y, y), _scaled_polynomial(taylor, powers, s))


@functools.lru_cache(maxsize=None)
def _squared_taylor(taylor, d, elementwise_blocks):
  """a [c, b, b] -> p(a 2^-s)^(2^s) with s the stack's squarings, products at d (multiply-adds
  up to elementwise_blocks), as a function whose VJP keeps a and s alone.

  p and the squarings make a polynomial q in a, and the adjoint of a polynomial's derivative at
  a is its derivative at a^T: the VJP of cotangent g is jvp(q, a^T, g), the same program run
  forward on a^T with g as tangent (3 products a product, nothing stored; reverse mode would
  keep every intermediate, and cannot go through a loop of unknown trip count).
  """
  def fwd(a):  # Both may be traced after per_platform's branch returned (under cond's JVP).
    with _products(d.forward, elementwise_blocks):
      powers = taylor.powers(a)
      s = jnp.max(_squarings(powers, taylor.theta))
      return _taylor_squared(taylor, powers, s), (a, s)

  def bwd(res, g):
    a, s = res
    q = lambda x: _taylor_squared(taylor, taylor.powers(x), s)
    with _products(d.backward, elementwise_blocks):
      return jax.jvp(q, (jnp.swapaxes(a, -1, -2),), (g,))[1],

  run = jax.custom_vjp(lambda a: fwd(a)[0])
  run.defvjp(fwd, bwd)
  return run


def _cond_expm(taylor, a):
  """fast_cond on one chunk a [c, b, b]: one scale for the whole chunk."""
  powers = taylor.powers(a)
  s = jnp.max(_squarings(powers, taylor.theta, _MAX_SQUARINGS))
  r = _scaled_polynomial(taylor, powers, s)
  for i in range(_MAX_SQUARINGS):  # s is a scalar: each cond runs one branch.
    r = jax.lax.cond(i < s, lambda y: matmul(y, y), lambda y: y, r)
  return _newton_schulz(r)


def _select_expm(taylor, a):
  """fast_select on a [c, b, b]: a scale per matrix, SELECT_CAP squarings kept by select."""
  powers = taylor.powers(a)
  s = _squarings(powers, taylor.theta, SELECT_CAP)
  r = _scaled_polynomial(taylor, powers, s)
  for i in range(SELECT_CAP):
    r = jnp.where((i < s)[:, None, None], matmul(r, r), r)
  return _newton_schulz(r)


def select_remat(taylor: Taylor, n_matrices: int, block: int) -> bool:
  """Whether fast_select chunks and recomputes a stack: its residuals past REMAT_ABOVE_BYTES."""
  return (taylor.products + SELECT_CAP + 10) * n_matrices * block**2 * 4 > REMAT_ABOVE_BYTES


def _select_stack(taylor, budget, a):
  fn = functools.partial(_select_expm, taylor)
  if select_remat(taylor, *a.shape[:2]):
    return _map_chunks(jax.checkpoint(fn), a, budget)
  return fn(a)


# The products of the branch being traced (per_platform), or None outside one; and the largest
# block whose products are multiply-adds there.
_DOTS = contextvars.ContextVar('liere_expm_dots', default=None)
_ELEMENTWISE = contextvars.ContextVar('liere_expm_elementwise', default=0)
_ENTRIES = contextvars.ContextVar('liere_expm_entries', default=False)


def per_platform(fn_of: Callable[[str], Callable], precision, *args):
  """fn_of(platform)(*args) with every `matmul` inside at that platform's products for
  `precision` ('auto', 'highest' or a `dots.Dots` everywhere), chosen when the program is
  lowered: one `platform_dependent` for the whole computation, each distinct branch traced once
  (fn_of must return equal functions for platforms that run the same code)."""
  if isinstance(precision, str) and precision not in PRECISIONS:
    raise ValueError(f'model.pe.expm_precision={precision!r} is unknown; use one of '
                     f'{PRECISIONS} (e.g. --config.model.pe.expm_precision=auto).')
  branches = {p: _with_dots(fn_of(p), _dots(precision, p), _elementwise_blocks(p))
              for p in ('cpu', 'tpu', 'cuda')}
  if len(set(branches.values())) == 1:
    return branches['cpu'](*args)
  return jax.lax.platform_dependent(*args, cpu=branches['cpu'], tpu=branches['tpu'],
                                    default=branches['cuda'])  # cuda, rocm


def _dots(precision, platform: str) -> dots_lib.Dots:
  if not isinstance(precision, str):
    return precision
  if platform == 'cpu':
    return dots_lib.CPU if precision == 'highest' else _cpu_auto()
  return dots_lib.HIGHEST if precision == 'highest' else PLATFORMS[platform].products


def _elementwise_blocks(platform: str) -> int:
  form = BLOCK_PRODUCTS.get()
  if form == 'auto':
    return PLATFORMS[platform].elementwise_blocks
  return ELEMENTWISE_UP_TO if form == 'elementwise' else 0


@functools.lru_cache(maxsize=256)  # Equal arguments give one function: platform_dependent's dedup.
def _with_dots(fn, d: dots_lib.Dots, elementwise_blocks: int = 0):
  def run(*args):
    with _products(d, elementwise_blocks):
      return fn(*args)
  return run


@contextlib.contextmanager
def _products(d, elementwise_blocks: int = 0, entries: bool = False):
  """`matmul` inside is d: a Dots (its forward, with a VJP at its backward), or a plain product
  (x, y) -> x @ y, which forward-mode differentiation goes through (fast_loop); multiply-adds
  for blocks up to elementwise_blocks. `entries`: the matrices are laid out entries first,
  [b, b, ...] (liere_jax.expm_kernel's small blocks), for `transpose` and `plus_identity`."""
  tokens = _DOTS.set(d), _ELEMENTWISE.set(elementwise_blocks), _ENTRIES.set(entries)
  try:
    yield
  finally:
    _DOTS.reset(tokens[0])
    _ELEMENTWISE.reset(tokens[1])
    _ENTRIES.reset(tokens[2])


def transpose(x: jax.Array) -> jax.Array:
  """Each matrix's transpose: [..., b, b], or [b, b, ...] in the entries layout (`_products`)."""
  if _ENTRIES.get():
    return jnp.stack([x[:, i] for i in range(x.shape[0])])
  return jnp.swapaxes(x, -1, -2)


def plus_identity(x: jax.Array) -> jax.Array:
  """I + x, each matrix (the layouts as `transpose`'s)."""
  if _ENTRIES.get():  # Entry by entry: a kernel holds no array constants.
    return jnp.stack([jnp.stack([x[i, j] + 1 if i == j else x[i, j] for j in range(x.shape[1])])
                      for i in range(x.shape[0])])
  return jnp.eye(x.shape[-1], dtype=x.dtype) + x


def matmul(x: jax.Array, y: jax.Array) -> jax.Array:
  """Batched x @ y at the products of the per_platform branch being traced (outside one: as
  precision 'auto', a platform_dependent of its own)."""
  d = _DOTS.get()
  if d is None:
    return per_platform(lambda _: matmul, 'auto', x, y)
  if x.shape[-1] <= _ELEMENTWISE.get():
    return _multiply_adds(x, y)
  return _matmul(d)(x, y) if isinstance(d, dots_lib.Dots) else d(x, y)


def _multiply_adds(x, y):
  """x @ y for small blocks in float32 on the vector units: b multiply-adds an entry, no dot (a
  dot of 8 x 8 tiles fills a fraction of a tensor core or an MXU). Exact float32 products."""
  x, y = x.astype(jnp.float32), y.astype(jnp.float32)
  return jnp.sum(x[..., :, :, None] * y[..., None, :, :], axis=-2)


def _cpu_auto() -> dots_lib.Dots:
  """'auto' on CPU: float32, or with LIERE_EXPM_EMULATE=cuda (or tpu) that platform's presets,
  emulated (slow: to train on CPU as the accelerator computes, e.g. to compare accuracies)."""
  platform = os.environ.get('LIERE_EXPM_EMULATE')
  return dots_lib.emulated_dots(*dots_lib.preset_names(platform)) if platform else dots_lib.CPU


@functools.lru_cache(maxsize=None)
def _matmul(d: dots_lib.Dots):
  """x @ y with d.forward, and a VJP whose products use d.backward.

  The VJP needs x^T g; XLA folds the transpose into the dot as a contraction over the lhs's
  row axis, which on CPU runs several times slower than x @ y for small batched matrices.
  Materialising x^T first (d.barrier: the barrier keeps XLA from folding it back) restores the
  fast form there.
  """
  @jax.custom_vjp
  def mm(x, y):
    return d.forward(x, y)

  def bwd(res, g):
    x, y = res
    xt = jnp.swapaxes(x, -1, -2)
    if d.barrier:
      xt = jax.lax.optimization_barrier(xt)
    return d.backward(g, jnp.swapaxes(y, -1, -2)), d.backward(xt, g)

  mm.defvjp(lambda x, y: (mm(x, y), (x, y)), bwd)
  return mm


def _powers4(a):
  a2 = matmul(a, a)
  return {1: a, 2: a2, 4: matmul(a2, a2)}


def _taylor12_ps(x):
  """Degree 12 by Paterson-Stockmeyer from x, x^2, x^4 (one more product: x^3)."""
  x1, x2, x4 = x[1], x[2], x[4]
  x = {1: x1, 2: x2, 3: matmul(x2, x1)}
  eye = jnp.eye(x1.shape[-1], dtype=x1.dtype)
  c = [1.0 / math.factorial(k) for k in range(13)]
  block = lambda j: c[j] * eye + _combine(c[j + 1:j + 4], x)
  r = block(8) + c[12] * x4
  r = block(4) + matmul(x4, r)
  return block(0) + matmul(x4, r)


def _powers3(a):
  a2 = matmul(a, a)
  return {1: a, 2: a2, 3: matmul(a2, a)}


def _combine(c, x):
  """c[0] x + c[1] x^2 + c[2] x^3 (+ c[3] x^6) from the powers x (no identity term)."""
  return sum(ci * x[k] for ci, k in zip(c[1:], (2, 3, 6))) + c[0] * x[1]


# Bader, Blanes and Casas (2019), "Computing the matrix exponential with an optimized Taylor
# polynomial approximation": Taylor's degree 12 in 4 products (x^2, x^3 and 2) and 18 in 5 (x^6
# and 2 more), coefficients as published there (rows: B_i's of I, x, x^2, x^3[, x^6]); both are
# exp's Taylor sum to 2e-16 relative (tests/test_expm.py). theta: the float32 thresholds the paper
# gives for unit roundoff 2^-24 (also torch.linalg.matrix_exp's), here on the spectral-radius
# bound.
_B12 = ((9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
        (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
         0.01108844528519167989),
        (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
         0.00610700528898058230),
        (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
         -0.00675951846863086359))
_B18 = ((0., -1.00365581030144618291e-01, -8.02924648241156932449e-03,
         -8.92138498045729985177e-04, 0.),
        (0., 3.97849749499645077844e-01, 1.36783778460411720168e+00,
         4.98289622525382669416e-01, -6.37898194594723280150e-04),
        (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
         -6.98210122488052056106e-03, 3.34975017086070470649e-05),
        (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
         2.95552570429315521194e-02, -1.39180257516060693404e-05),
        (0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02,
         -1.40086798182036094347e-05))


def _taylor12(x):
  """T = B1 + (B2 + X6) X6 with X6 = B3 + B4^2. Apart from I: X6 = a I + x6, B2 + X6 = c I + y,
  T = (b1_0 + c a) I + B1' + c x6 + a y + y x6 with b1_0 + c a = 1 (b1_0 and b4_0, below 1e-12,
  left out). Formed as published, the I of T came out of the product c a in float32, an error
  of ~4e-7 that the squarings amplify (gradient 1.2e-5 off, against 2e-6): here I enters once,
  exactly, and every other term is O(x)."""
  b1, b2, b3, b4 = (_combine(c[1:], x) for c in _B12)
  a = _B12[2][0]
  c = _B12[1][0] + a
  x6 = b3 + matmul(b4, b4)
  y = b2 + x6
  return plus_identity(b1) + c * x6 + a * y + matmul(y, x6)


def _powers18(a):
  """a, a^2, a^3 and a^6 (the bound: rho(a) <= ||a^6||_1^(1/6))."""
  x = _powers3(a)
  return {**x, 6: matmul(x[3], x[3])}


def _taylor18(x):
  """T = B2 + (B3 + X9) X9 with X9 = B1 B5 + B4, I split off as in _taylor12: X9 = d I + x9,
  B3 + X9 = e I + y, T = e d I + B2' + e x9 + d y + y x9 with e d = 1."""
  b1, b2, b3, b4, b5 = (_combine(c[1:], x) for c in _B18)
  d = _B18[3][0]
  e = _B18[2][0] + d
  x9 = matmul(b1, b5) + b4
  y = b3 + x9
  return plus_identity(b2) + e * x9 + d * y + matmul(y, x9)


# The forms fast_cond and fast_select as they were: degree 12 up to a scaled spectral radius of
# 1 (remainder < 1/13! ~ 2e-10) in 5 products: a^2, a^4, x^3 and 2 in the polynomial.
TAYLOR12_PS = Taylor(powers=_powers4, polynomial=_taylor12_ps, theta=1.0, products=5)
TAYLOR12 = Taylor(powers=_powers3, polynomial=_taylor12, theta=1.461661507209034, products=4)
TAYLOR18 = Taylor(powers=_powers18, polynomial=_taylor18, theta=3.010066362817634, products=5)
TAYLORS = {'loop': TAYLOR12, 'cond': TAYLOR12_PS, 'select': TAYLOR12_PS}  # By form.
