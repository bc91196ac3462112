"""Self-attention with the rotations of q and k inside, one Pallas TPU kernel a pass: a TPU's
attention (liere_jax.numerics), for every encoding whose attention has no logit bias.

XLA's attention on a TPU writes the logits [B, H, T, T] to HBM and reads them back, forward and
backward, and a rotary encoding adds its own passes over q and k (reads, shifts, writes: a
ViT-B/16 step moved 1.6x as much for abs: docs/decisions/002). Here a grid step holds a few
batch elements' q, k, v of 128 lanes (128 // d heads) for all T tokens in VMEM: q and k rotate
in registers, the logits and softmax never leave the chip. The backward recomputes the logits
and keeps nothing but q, k, v and the output (which the projection after it keeps anyway). For
a ViT's token counts (`supported`, by MAX_TOKENS) a whole row of logits fits: no online
softmax.

q, k, v are read in place, as the qkv projection writes them: [B, T, 3 H d] (`attention_qkv`)
or three [B, T, H d] (`attention`), or q and k rotated by liere_jax.kernels.rotation and v from
the projection's array; a grid step reads lanes [128 j, 128 (j + 1)) of each. Each
head's products run on all 128 lanes, the other heads' lanes masked to zero (d = 64: the MXU
does twice the logits' useful work, which a 128-deep MXU would spend on 64-deep products
anyway; the CostEstimate counts it). The backward writes the gradient of q, k and v like them:
one array in three grid steps from one computation, or three arrays in one step.

q and k may be wider than v: lifted (PaPE's, liere_jax.encodings.base.Lift), each head's
channels padded with zeros to whole lane tiles (`lifted`: PaPE's 168 to 256), v of d channels, the
softmax scale given (d**-0.5, not from q's width). A grid step then reads v's 128 lanes and the
same 128 // d heads' lanes of q and k; each head's logits, dq and dk are products of its own
tiles (slices, not masks), and the backward writes three arrays like its inputs.

The rotation comes as its blocks' entries (blocks of b in BLOCKS; RoPE's pairs are b = 2):
E_m[i] = R[r, m], r = i mod b the dim's row in its block (`entries`: b values a dim). At a lane
tile's first batch step the kernel makes them the band of 2b - 1 diagonals along the head
dims in VMEM (D_s[i] = E_{r + s}[i], by selects), then q'[i] = sum_s D_s[i] q[i + s], applied
by lane shifts (`pltpu.roll`) to q and k as they are read; its gradient, the batch's sum of
dq' q[. + s] + dk' k[. + s], accumulates on chip across the batch (the batch axis runs in
order) and leaves as the entries' at the last step. HBM holds b values a dim, not 2b - 1 (LieRE8:
8, not 15), and their gradient in their own dtype (docs/decisions/030). On CPU the same kernels
run in interpret mode (tests).
"""
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from liere_jax.kernels.common import LANES, call_kw, in_hbm, nt as _nt, pltpu, vmem
from liere_jax.kernels.common import Cost, estimate, padded

# The blocks it rotates by (a lane's row in its block is its lane mod b); others rotate before
# the kernel (liere_jax.kernels.rotation or an einsum).
BLOCKS = (2, 4, 8)
MAX_BLOCK = max(BLOCKS)
# The most tokens a grid step's rows of logits fit in VMEM, by the scope the kernel runs in and the
# band's diagonals n (0: no band; a band of n not listed takes the next listed above it): deviceless
# compiles of the forward and backward at 12 heads of 64 in bf16, batch 8 (scripts/kernel_limits.py;
# docs/decisions/029 and 030; tests/test_kernels_attention.py compiles each). The compiler's default
# scope (16 MiB: v4's whole VMEM) on v4; past it, the kernel asks for WIDE_SCOPE, which a chip with
# that much (numerics.TPU_VMEM: v5e, v5p, v6e) grants. Longer rows keep XLA's attention, or (a band
# past its rows) rotate by XLA before the kernel.
SCOPE, WIDE_SCOPE = 16 * 2**20, 64 * 2**20
MAX_TOKENS = {SCOPE: {0: 1024, 3: 832, 7: 624, 15: 368},
              WIDE_SCOPE: {0: 2048, 3: 2016, 7: 1728, 15: 1344}}
# A lift's q (or k) a grid step, tokens x lanes: one batch row of them in float32 fits VMEM's
# default scope (16 MiB) with the rest; twice this does not (deviceless v5e compiles).
MAX_LIFT = 512 * 4 * LANES
LIFT_TOKENS = 512  # The lifted heads' longest rows compiled (ViT-B's PaPE and PaPE-RI).
ROW_BYTES = 2**18  # q's bytes a grid step, about: a few batch elements a step.


def supported(heads: int, head_dim: int, tokens: int, lift: Optional[int] = None,
              band: int = 0, vmem: int = SCOPE) -> bool:
  """Whether the kernel takes these shapes on a chip of `vmem` bytes of VMEM: heads of d
  dividing 128 lanes, H d a multiple of 128, and rows of logits that fit (MAX_TOKENS for a band
  of `band` diagonals, 0: none). lift: each head's channels of q and k where wider than v's d
  (`lifted`: a multiple of 128), whose 128 / d heads a grid step hold at most MAX_LIFT tokens x
  lanes (ViT-B/16's 197 tokens: PaPE's 256 lanes a head of 64 or of 32), in the default scope."""
  scope = _chip_scope(vmem) if lift is None else SCOPE
  return (LANES % head_dim == 0 and (heads * head_dim) % LANES == 0 and head_dim >= 8
          and band <= max(MAX_TOKENS[scope]) and tokens <= _limit(scope, band)
          and (lift is None or (lift % LANES == 0 and tokens <= LIFT_TOKENS
                                and tokens * LANES // head_dim * lift <= MAX_LIFT)))


def takes_band(block: int, tokens: int, vmem: int = SCOPE) -> bool:
  """Whether the kernel rotates by blocks of `block` itself at `tokens` on a chip of `vmem`
  bytes of VMEM (their band's rows fit: `supported`'s rule for 2b - 1 diagonals)."""
  return block in BLOCKS and tokens <= _limit(_chip_scope(vmem), 2 * block - 1)


def _chip_scope(vmem: int) -> int:
  """The widest scope a chip of `vmem` bytes of VMEM grants the kernel."""
  return WIDE_SCOPE if vmem >= WIDE_SCOPE else SCOPE


def _limit(scope: int, band: int) -> int:
  limits = MAX_TOKENS[scope]
  return limits[min(n for n in limits if n >= band)]


def _scope(tokens: int, band: int) -> Optional[int]:
  """The VMEM scope the kernel asks for: None (the default) where its rows fit it, else WIDE."""
  return None if band <= max(MAX_TOKENS[SCOPE]) and tokens <= _limit(SCOPE, band) else WIDE_SCOPE


def lifted(channels: int) -> int:
  """A lift's channels a head (d' > d) -> the kernel's: whole lane tiles, zeros after d' (they
  change no logit)."""
  return -(-channels // LANES) * LANES


@jax.named_scope('pe_rotate')  # The rotation's part of a step (bench.compile.SCOPES).
def entries(rot: jax.Array, head_dim: int) -> jax.Array:
  """[T, H, k, b, b] block rotations -> the kernel's entries [b, T, H * d]: E_m[i] = R[r, m]
  for dim i, row r = i mod b of its block R, in rot's dtype; dims past k * b pass through (the
  identity's entries). b a power of 2 up to 8 (a lane's row is its lane mod b); the kernel
  turns them into the band of 2b - 1 diagonals on chip (`_build_band`)."""
  t, h, k, b, _ = rot.shape
  out = jnp.moveaxis(rot, -1, 0).reshape(b, t, h, k * b)
  if k * b < head_dim:
    rest = np.arange(k * b, head_dim) % b == np.arange(b)[:, None]  # [b, d - k b]
    out = jnp.concatenate([out, jnp.broadcast_to(jnp.asarray(rest[:, None, None], out.dtype),
                                                 (b, t, h, head_dim - k * b))], -1)
  return out.reshape(b, t, h * head_dim)


@jax.named_scope('pe_rotate')
def pair_entries(angles: jax.Array, heads: int, head_dim: int, dtype) -> jax.Array:
  """RoPE's entries [2, T, H d] from its angles [T, H or 1, k] (pair j rotated by angle j; dims
  past 2k pass through): `entries` of angle_rotations' blocks, cos and sin rounded to dtype
  alike, without them."""
  t, _, k = angles.shape
  a = jnp.repeat(jnp.broadcast_to(angles, (t, heads, k)), 2, axis=-1)  # [T, H, 2k]: per dim
  c, s = jnp.cos(a).astype(dtype), jnp.sin(a).astype(dtype)
  even = np.arange(2 * k) % 2 == 0
  rest = np.arange(head_dim - 2 * k) % 2  # Pass-through dims: the identity's rows 0, 1, 0, ..

  def row(rotated, m):  # -> [T, H d]
    tail = jnp.broadcast_to(jnp.asarray(rest == m, dtype), (t, heads, len(rest)))
    return jnp.concatenate([rotated, tail], -1).reshape(t, heads * head_dim)
  # [[c, -s], [s, c]]: E_0 = c on the even dims, s on the odd; E_1 = -s, c.
  return jnp.stack([row(jnp.where(even, c, s), 0), row(jnp.where(even, -s, c), 1)])


def attention(q, k, v, diag=None, interpret: bool = False, scale: Optional[float] = None):
  """softmax(q' k'^T scale) v per head, q' and k' q and k rotated by blocks of b given as their
  `entries` diag [b, T' >= T, H d] (their first T tokens read; None: not rotated). q, k, v [B,
  T, H, d] -> [B, T, H, d] in q's dtype; logits and softmax in float32, products of q's dtype.
  Differentiable in q, k, v and diag. q and k may be wider than v (a lift, e.g. PaPE's: [B, T,
  H, d'], d' `lifted`, no band): each head's q and k span whole lane tiles of their own, v its d
  lanes. scale: default 1 / sqrt(d), v's head size (not q's)."""
  b, t, h, d = v.shape
  flat = lambda a: a.reshape(b, t, -1)
  return _attention(interpret, d, scale, (flat(q), flat(k), flat(v)), diag).reshape(b, t, h, d)


def attention_qkv(qkv, diag=None, interpret: bool = False):
  """`attention` of q, k, v in one array [B, T, 3, H, d] (the qkv projection's output), read in
  place: no copies of the three, and their gradient one array like qkv."""
  b, t, _, h, d = qkv.shape
  return _attention(interpret, d, None, (qkv.reshape(b, t, 3 * h * d),), diag).reshape(
      b, t, h, d)


def forward(xs, diag, head_dim: int, interpret: bool = False, scale: Optional[float] = None):
  """The forward pass alone (for a composition's own VJP: liere_jax.kernels.rotation): xs as
  `_call` reads them -> out [B, T, H d]."""
  return _pass(_forward_kernel, interpret, head_dim, scale)(xs, diag)


def backward(xs, diag, out, g, head_dim: int, interpret: bool = False,
             scale: Optional[float] = None):
  """The backward pass alone: (the gradient of q, k, v as `_call` writes it, the band's)."""
  return _pass(_backward_kernel, interpret, head_dim, scale)(xs, diag, out, g)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attention(interpret, d, scale, xs, diag):
  return forward(xs, diag, d, interpret, scale)


def _attention_fwd(interpret, d, scale, xs, diag):
  out = _attention(interpret, d, scale, xs, diag)
  return out, (xs, diag, out)


def _attention_bwd(interpret, d, scale, res, g):
  xs, diag, out = res
  grads = backward(xs, diag, out, g, d, interpret, scale)
  dxs = (grads[0],) if len(xs) == 1 else tuple(grads[0])
  return dxs, None if diag is None else grads[1].astype(diag.dtype)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _pass(kernel, interpret, d, scale):
  """The pass as one jitted function: its kernel is traced once a shape, not once a call."""
  return functools.partial(_call_jit, kernel, interpret, d, scale)


def _sources(n, blocks):
  """Where q, k and v lie in the n arrays xs: (array, first lane tile) each."""
  return {1: ((0, 0), (0, blocks), (0, 2 * blocks)),  # one [B, T, 3 W]
          2: ((0, 0), (0, blocks), (1, 2 * blocks)),  # q', k' [B, T, 2 W]; v in [B, T, 3 W]
          3: ((0, 0), (1, 0), (2, 0))}[n]  # three [B, T, W]


def _call(kernel, interpret, d, scale, xs, diag, out=None, g=None):
  """The forward (-> out [B, T, H d]) or the backward (out, g -> dq|dk|dv: one array
  [B, T, 3 H d] from one or two arrays xs, three like xs from three; ddiag float32) pass at the
  softmax scale `scale` (None: 1 / sqrt(d)). xs: q, k, v [B, T, H d] each, or q and k lifted
  [B, T, H d'] (d' a multiple of 128: `lifted`); one array [B, T, 3 H d] that a grid step reads
  at three lane offsets; or rotated q and k [B, T, 2 H d] and v in place in the projection's
  [B, T, 3 H d] (liere_jax.kernels.rotation)."""
  one_grad = len(xs) < 3
  batch, t, _ = xs[0].shape
  width = xs[-1].shape[-1] // (3 if one_grad else 1)
  blocks, dtype = width // LANES, xs[0].dtype
  # q's and k's lanes a grid step: v's 128, or (lifted) its 128 / d heads' d' each.
  lanes = xs[0].shape[-1] // blocks if len(xs) == 3 else LANES
  lift = lanes * d // LANES if lanes > LANES else None
  rows = int(np.clip(ROW_BYTES // (t * lanes * dtype.itemsize), 1, batch))
  while batch % rows:
    rows -= 1
  backward = g is not None
  # Lane blocks outer (a block's band stays in VMEM), batch tiles; the backward into one array
  # writes q's, k's and v's gradient in three steps (a third axis), from one computation.
  grid = (blocks, batch // rows) + ((3,) if backward and one_grad else ())
  spec = lambda offset, n=LANES: pl.BlockSpec((rows, t, n), lambda j, i, *_: (i, 0, offset + j))
  rotated = diag is not None
  b = diag.shape[0] if rotated else None  # The blocks' size: their entries' rows.
  n = 2 * b - 1 if rotated else 0  # The band's diagonals.
  # The entries may hold more tokens than q (a mesh's shares, padded): their first t are read.
  t_band = diag.shape[1] if rotated else t
  d_spec = pl.BlockSpec((b or 1, t_band, LANES), lambda j, *_: (0, 0, j))
  sources = _sources(len(xs), blocks)
  if len(xs) == 2 and not interpret:
    # Rotated q' and k' (liere_jax.kernels.rotation, in HBM) read from HBM as they are: the
    # compiler would prefetch them into VMEM in slices first (docs/decisions/005).
    xs = (in_hbm(xs[0]),) + tuple(xs[1:])
  ins = [xs[a] for a, _ in sources] + ([diag] if rotated else [])
  in_specs = [spec(o, n) for (_, o), n in zip(sources, (lanes, lanes, LANES))] + [
      d_spec] * rotated
  outs, out_specs, scratch = [], [], []
  if not backward:
    outs.append(jax.ShapeDtypeStruct((batch, t, width), dtype))
    out_specs.append(spec(0))
  else:
    ins += [out, g]
    in_specs += [spec(0)] * 2
    if one_grad:
      outs.append(jax.ShapeDtypeStruct((batch, t, 3 * width), dtype))
      out_specs.append(pl.BlockSpec((rows, t, LANES), lambda j, i, p: (i, 0, p * blocks + j)))
      scratch = [vmem((2, rows, t, LANES), dtype)]  # dk and dv, until their steps
    else:  # Three arrays like xs, written in one step.
      outs += [jax.ShapeDtypeStruct(x.shape, dtype) for x in xs]
      out_specs += [spec(0, lanes)] * 2 + [spec(0)]
    if rotated:  # The entries' gradient, from the band's summed over the batch in order.
      outs.append(jax.ShapeDtypeStruct(diag.shape, diag.dtype))
      out_specs.append(d_spec)
  if rotated:  # The band, built at a lane tile's first batch step (and its gradient's sum).
    scratch += [vmem((n, t_band, LANES), diag.dtype)] + (
        [vmem((n, t_band, LANES), jnp.float32)] if backward else [])
  # The batch in order where the band is built at its first step.
  kw = call_kw(interpret, ('parallel', 'arbitrary' if rotated else 'parallel',
                           'arbitrary')[:len(grid)], _scope(t, n))
  res = pl.pallas_call(
      functools.partial(kernel, d, b, lift, rows,
                        1 / math.sqrt(d) if scale is None else scale,
                        **({'fused': one_grad} if backward else {})),
      out_shape=outs, grid=grid, in_specs=in_specs, out_specs=out_specs,
      scratch_shapes=scratch, name='attention_' + ('backward' if backward else 'forward'),
      cost_estimate=estimate('attention_' + ('backward' if backward else 'forward'),
                             cost(batch, t, width, d, dtype, diag, backward, lift)),
      **kw)(*ins)
  if not backward:
    return res[0]
  return (res[0] if one_grad else tuple(res[:3]),) + tuple(res[1 if one_grad else 3:])


_call_jit = jax.jit(_call, static_argnums=(0, 1, 2, 3))


def cost(batch, tokens, width, d, dtype, band=None, backward=False, lift=None) -> Cost:
  """What a pass does (`_call`; common.Cost): q, k, v [batch, tokens, width] of dtype, heads of
  d, rotated by blocks of b given as their entries `band` [b, T' >= tokens, width] (the band of
  n = 2b - 1 diagonals built from them on chip; None: not), or q and k lifted to `lift`
  lanes a head (`lifted`; None: not). A grid step's batch rows each run `_forward_kernel`'s
  (`_backward_row`'s) body on a lane tile of v: with e = T x 128 elements of it, l = T x T
  logits, 128 / d heads a tile, each head's logits, dq and dk of depth 128 (q masked to the
  head's lanes, dq and dk kept on them) or, lifted, of depth `lift` on its own lanes (slices,
  no masks: e' = T x 128 lift / d elements of q), and c = 1 where q's dtype (cb: the band's)
  is not float32 (its conversions to and from it):
    heads' masks: 3 x 128 ops each (two compares and an and);
    forward, each head: q masked (e; lifted: none), its logits (2 l depth MXU flops) scaled
      (l), softmax (l exp; max, subtract, sum, divide: 4 l), P in v's dtype (c l), P v (2 l
      128), kept where the head's lanes are (e); the output in q's dtype (c e);
    backward, dO O (e, 2 c e), each head: q (not lifted), dO and dO O masked (3 e; 2 e), the
      logits again (2 l depth, l scaled, 4 l softmax, l exp), dO v^T (2 l 128), dS = P (dP -
      sum dO O) scale (the sum e, 3 l), P and dS in q's dtype (2 c l), dv (2 l 128), dq, dk
      (2 x 2 l depth) kept on the head's lanes (3 e; lifted: dv's e); dq, dk, dv in q's dtype
      (c (2 e' + e));
    the band's rotation of q and of k, each: n multiplies, n - 1 adds, n - 1 lane rolls, the n
      diagonals read in float32 (cb n) and x to float32 and back (2 c): (3 n - 2 + cb n + 2 c) e;
      backward also its transpose on dq and dk (the same without x's conversions) and the
      band's gradient, sum_s dq x_q[. + s] + dk x_k[. + s] into its tile: 2 (n - 1) rolls, 2 n
      multiplies, 2 n adds and x_q, x_k in float32: (6 n - 2 + 2 c) e.
  Once a lane tile (e_b = T' x 128): the band from the entries, b^2 selects (e_b each) and
  their lanes' compares (128 each), the lanes' rows (128); backward again, and the gradient's
  transpose to the entries (the same count) in the entries' dtype (cb b e_b).
  HBM: each grid step reads its rows of q, k, v (and out, dO) and writes theirs once; the
  entries' lane tile (and their gradient's, in their dtype) once a tile (the batch runs inside
  a tile): every array as laid out (tokens in whole tiles of rows)."""
  e, l, nh = tokens * LANES, tokens * tokens, LANES // d
  c = int(jnp.dtype(dtype) != jnp.float32)
  depth, masked = lift or LANES, int(lift is None)
  e_q = e * depth // (LANES if masked else d)
  row = 3 * LANES * nh  # the masks
  if backward:
    row += ((1 + 2 * c) * e + nh * ((4 + 3 * masked) * e + (8 + 2 * c) * l)
            + c * (2 * e_q + e))
  else:
    row += nh * ((1 + masked) * e + (5 + c) * l) + c * e
  array = batch * padded(tokens, dtype) * width * jnp.dtype(dtype).itemsize
  moved = (4 if backward else 2) * (array + array * e_q // e)  # v, out (dO, dv) and q, k
  tiles = 0
  if band is not None:
    b, t_band = band.shape[:2]  # The entries' tokens: q's or more (a mesh's shares, padded).
    n, cb, e_band = 2 * b - 1, int(band.dtype != jnp.float32), t_band * LANES
    rotate = (3 * n - 2 + cb * n) * e
    row += 2 * (rotate + 2 * c * e) + (2 * rotate + (6 * n - 2 + 2 * c) * e if backward else 0)
    build = b * b * (e_band + LANES) + LANES
    tiles = width // LANES * (build + (build + cb * b * e_band if backward else 0))
    moved += (2 if backward else 1) * b * width * padded(t_band, band.dtype) * band.dtype.itemsize
  rows = batch * width // LANES
  products = 3 * depth + 2 * LANES if backward else depth + LANES
  return Cost(mxu_flops=rows * nh * 2 * l * products, vpu_ops=rows * row + tiles,
              transcendentals=rows * nh * l, bytes=moved)


def _shift(x, s):
  """y[:, i] = x[:, i + s] (cyclic along the lanes; the band is 0 where it wraps)."""
  return x if s % LANES == 0 else pltpu().roll(x, (-s) % LANES, 1)


def _rotate(x, band, half):
  """x' = sum_s D_s x[. + s] in float32 (x [T, 128] float32, band(s) [T, 128])."""
  out = band(0) * x
  for s in range(1, half + 1):
    out += band(s) * _shift(x, s) + band(-s) * _shift(x, -s)
  return out


def _unrotate(g, band, half):
  """The transpose of _rotate: dx = sum_s shift(D_s g, -s)."""
  out = band(0) * g
  for s in range(1, half + 1):
    out += _shift(band(s) * g, -s) + _shift(band(-s) * g, s)
  return out


def _masks(d):
  lane = jax.lax.broadcasted_iota(jnp.int32, (1, LANES), 1)
  return [(lane >= h * d) & (lane < (h + 1) * d) for h in range(LANES // d)]


def _heads(d, lift, q, k):
  """A grid step's heads: (q_h, k_h, the head's lanes of v) each, q_h k_h^T its logits. lift
  None: q, k and v share the 128 lanes, d a head (q_h q masked to the head's lanes, k_h all of
  k); else each head's q and k span `lift` lanes of their own, whole tiles (slices: no products
  on the other heads' lanes)."""
  masks = _masks(d)
  if lift is None:
    return [(jnp.where(m, q, 0), k, m) for m in masks]
  part = lambda x, h: x[:, h * lift:(h + 1) * lift]
  return [(part(q, h), part(k, h), m) for h, m in enumerate(masks)]


def _join(masks, lift, parts):
  """The heads' parts of dq or dk (ds k_h, ds^T q_h: `_heads`) as one [T, lanes] float32: each
  head's lanes (`masks`) of its part (lift None), or the parts side by side."""
  if lift is not None:
    return jnp.concatenate(parts, axis=1)
  out = jnp.zeros(parts[0].shape, jnp.float32)
  for mask, part in zip(masks, parts):
    out = jnp.where(mask, part, out)
  return out


def _tn(a, b):
  """a^T b: [T, S] x [T, n] -> [S, n] float32."""
  return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _nn(a, b):
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _softmax(s):
  p = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))
  return p / jnp.sum(p, axis=1, keepdims=True)


def _rows(ref, s, t):
  """Diagonal s of a band ref [n, T' >= t, 128], its first t rows (a view)."""
  return ref.at[s] if ref.shape[1] == t else ref.at[s, pl.ds(0, t)]


def _lane_rows(b):
  """Each lane's row in its block of b (b a power of 2 dividing 128): [1, 128] int32."""
  return jax.lax.broadcasted_iota(jnp.int32, (1, LANES), 1) & (b - 1)


def _build_band(e_ref, band_ref, b):
  """The band's diagonals from the entries: D_s[i] = E_{r + s}[i] for lane i of row r, 0 where
  r + s leaves the block (a select a entry row a diagonal; rounding none)."""
  row = _lane_rows(b)
  for s in range(-(b - 1), b):
    out = None
    for m in range(max(0, s), min(b, b + s)):  # rows r = m - s of the block
      out = jnp.where(row == m - s, e_ref[m], 0 if out is None else out)
    band_ref[s + b - 1] = out.astype(band_ref.dtype)


def _entries_grad(dband_ref, de_ref, b):
  """The transpose of _build_band: dE_m[i] = dD_{m - r}[i]."""
  row = _lane_rows(b)
  for m in range(b):
    out = None
    for s in range(m - (b - 1), m + 1):
      out = jnp.where(row == m - s, dband_ref[s + b - 1], 0 if out is None else out)
    de_ref[m] = out.astype(de_ref.dtype)


def _inputs(band_ref, half, q_ref, k_ref, r):
  """q and k of batch row r, rotated (float32 rotation, then q's dtype), and the band reader."""
  q, k = q_ref[r], k_ref[r]
  if half is None:
    return q, k, None
  t = q.shape[0]
  band = lambda s: _rows(band_ref, s + half, t)[...].astype(jnp.float32)
  rot = lambda x: _rotate(x.astype(jnp.float32), band, half).astype(x.dtype)
  return rot(q), rot(k), band


def _forward_kernel(d, b, lift, rows, scale, q_ref, k_ref, v_ref, *refs):
  """b: the blocks' size where q and k rotate (refs: their entries, out, the band's scratch)."""
  e_ref, o_ref, band_ref = refs if b else (None,) + refs + (None,)
  half = b - 1 if b else None
  if b:
    pl.when(pl.program_id(1) == 0)(lambda: _build_band(e_ref, band_ref, b))

  def row(r, carry):
    q, k, _ = _inputs(band_ref, half, q_ref, k_ref, r)
    v = v_ref[r]
    out = jnp.zeros(v.shape, jnp.float32)
    for q_h, k_h, mask in _heads(d, lift, q, k):
      p = _softmax(_nt(q_h, k_h) * scale)
      out = jnp.where(mask, _nn(p.astype(v.dtype), v), out)
    o_ref[r] = out.astype(o_ref.dtype)
    return carry
  jax.lax.fori_loop(0, rows, row, 0)


def _backward_kernel(d, b, lift, rows, scale, q_ref, k_ref, v_ref, *refs, fused):
  """One array: grid step 0 computes, writes dq and keeps dk and dv (`stash`) for steps 1, 2;
  three arrays: one step writes all three. Rotated (blocks of b): the band built at a lane
  tile's first step, its gradient summed over the batch and written as the entries' at the
  last."""
  rotated = b is not None
  half = b - 1 if rotated else None
  e_ref = refs[0] if rotated else None
  o_ref, g_ref, *refs = refs[rotated:]
  outs, refs = refs[:1 if fused else 3], refs[1 if fused else 3:]
  de_ref = refs.pop(0) if rotated else None
  stash = refs.pop(0) if fused else None
  band_ref, dband_ref = refs if rotated else (None, None)
  write = (functools.partial(_write_fused, outs[0], stash) if fused else
           functools.partial(_write, outs))

  def compute():
    jax.lax.fori_loop(0, rows, functools.partial(_backward_row, d, half, lift, scale, q_ref,
                                                 k_ref, v_ref, band_ref, o_ref, g_ref,
                                                 dband_ref, write), 0)
  # (Read here: interpret mode has no program_id under a when.)
  first, last = pl.program_id(1) == 0, pl.program_id(1) == pl.num_programs(1) - 1
  part = pl.program_id(2) if fused else 0  # 0: compute, write dq, keep dk and dv; 1, 2: write.
  if rotated:
    @pl.when(first & (part == 0))
    def _():
      _build_band(e_ref, band_ref, b)
      dband_ref[...] = jnp.zeros_like(dband_ref)
  if fused:
    @pl.when(part > 0)
    def _():
      outs[0][...] = stash[part - 1]

    pl.when(part == 0)(compute)
  else:
    compute()
  if rotated:
    pl.when(last & (part == 0))(lambda: _entries_grad(dband_ref, de_ref, b))


def _write_fused(dx_ref, stash, r, dq, dk, dv):
  dx_ref[r] = dq.astype(dx_ref.dtype)
  stash[0, r], stash[1, r] = dk.astype(stash.dtype), dv.astype(stash.dtype)


def _write(refs, r, *grads):
  for ref, g in zip(refs, grads):
    ref[r] = g.astype(ref.dtype)


def _backward_row(d, half, lift, scale, q_ref, k_ref, v_ref, band_ref, o_ref, g_ref, dband_ref,
                  write, r, carry):
  q, k, band = _inputs(band_ref, half, q_ref, k_ref, r)
  v, g = v_ref[r], g_ref[r]
  dv = jnp.zeros(v.shape, jnp.float32)
  dqs, dks = [], []
  go = g.astype(jnp.float32) * o_ref[r].astype(jnp.float32)
  heads = _heads(d, lift, q, k)
  for q_h, k_h, mask in heads:
    p = _softmax(_nt(q_h, k_h) * scale)
    pc = p.astype(v.dtype)
    gm = jnp.where(mask, g, 0)
    # dS = P (dP - rowsum(dO O)), the sum over the head's lanes.
    dp = _nt(gm, v)
    ds = (p * (dp - jnp.sum(jnp.where(mask, go, 0), axis=1, keepdims=True)) * scale)
    ds = ds.astype(q.dtype)
    dv = jnp.where(mask, _tn(pc, g), dv)
    dqs.append(_nn(ds, k_h))
    dks.append(_tn(ds, q_h))
  masks = [mask for *_, mask in heads]
  dq, dk = _join(masks, lift, dqs), _join(masks, lift, dks)
  if half is not None:
    x_q, x_k = q_ref[r].astype(jnp.float32), k_ref[r].astype(jnp.float32)
    for s in range(-half, half + 1):
      rows = _rows(dband_ref, s + half, dq.shape[0])
      rows[...] += dq * _shift(x_q, s) + dk * _shift(x_k, s)
    dq, dk = _unrotate(dq, band, half), _unrotate(dk, band, half)
  write(r, dq, dk, dv)
  return carry
