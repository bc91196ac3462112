"""Self-attention with a position encoding's context, dispatched in one place (`attend`).

An encoding hands attention a neutral context (liere_jax.encodings.base: block rotations, RoPE
angles, a logit bias, a projection); the plan (liere_jax.numerics) says how it runs, and `path`
names it:
  'xla'                 the context applied by XLA (rotations.rotate), then
                        jax.nn.dot_product_attention;
  'cudnn'               the same with cuDNN's attention where it takes the shapes (bf16 / fp16
                        heads of at most 256 dims from Hopper on, 128 before, a multiple of 8;
                        chosen while tracing on a GPU, XLA's otherwise);
  'kernel'              the Pallas attention kernel (liere_jax.kernels.attention), q, k and v read
                        in place from the qkv projection;
  'kernel, band'        the same rotating q and k inside (blocks of 2, 4, 8: every RoPE, LieRE8),
                        read as the blocks' entries, the band of diagonals built on chip;
  'rotation kernel'     larger blocks (LieRE64) rotated by liere_jax.kernels.rotation first, which
                        runs the attention kernel after it;
  'kernel after xla'    the context applied by XLA, then the attention kernel;
  'kernel, lift'        a lifting context (PaPE's `Lift`: q and k gain channels from the
                        attention's input): attend and lift by XLA, each head's q' and k' padded
                        with zeros to whole lane tiles (PaPE's 168 channels to 256), then the
                        attention kernel at the unlifted head size's scale d**-0.5, v of d;
  'cudnn, lift'         attend and lift, then cuDNN's attention at that scale with v padded with
                        zeros to q' and k' (jax.nn.dot_product_attention wants them alike), its
                        output sliced back (where cuDNN refuses: as 'xla').
A lifting context runs 'xla' where neither takes its lifted heads (or on the cpu plan): attend,
then an explicit softmax of q k^T plus the lift's product (`Lift.features`: q' and k' are not
built) at the scale d**-0.5, v of d.
`weights` is the explicit softmax that returns the attention maps. On a mesh the kernels run
under shard_map (a Mosaic kernel is not partitioned by XLA): each device its part of the batch,
and of the heads over 'model'.
"""
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from liere_jax.encodings.base import Angles, LayerContext, Rotate, RotateEntries
from liere_jax.kernels import attention as attention_kernel, rotation as rotation_kernel
from liere_jax.numerics import Numerics

CUDNN_HEAD_DIM = 256  # cuDNN's largest head from Hopper on (jax's check: 128 before, tracing).


def path(numerics: Numerics, ctx: LayerContext, shape) -> str:
  """How `attend` runs for q of `shape` [B, T, H, d] under ctx and the plan (module doc)."""
  if ctx.lifts:
    return _lift_path(numerics, ctx, shape)
  if numerics.attention != 'kernel':
    return numerics.attention
  if not _kernel_takes(numerics, ctx, shape):  # A logit bias, or shapes it does not take.
    return 'xla'
  diagonals = _diagonals(ctx)
  if diagonals and _kernel_takes(numerics, ctx, shape, band=diagonals):
    return 'kernel, band'
  if not diagonals and _rotation_kernel_takes(ctx, shape):
    return 'rotation kernel'
  return 'kernel after xla' if ctx.rotates else 'kernel'


def _diagonals(ctx) -> int:
  """The diagonals of the band that rotates q and k inside the attention kernel (RoPE's 3, 2b - 1
  for blocks of b in BLOCKS), 0 where the kernel does not rotate them itself."""
  if isinstance(ctx, Angles):
    return 3
  if isinstance(ctx, (Rotate, RotateEntries)) and ctx.block in attention_kernel.BLOCKS:
    return 2 * ctx.block - 1
  return 0


def lifted(ctx: LayerContext, shape) -> int:
  """d': the head size of q and k that ctx's lift gives q of `shape` [B, T, H, d] (its shapes
  alone, traced abstractly: whatever the lifting context)."""
  b, t, heads, d = shape
  x = jax.ShapeDtypeStruct((b, t, heads * d), jnp.float32)
  q = jax.ShapeDtypeStruct(shape, jnp.float32)
  return jax.eval_shape(lambda c, x, q: c.lift(x, q, q)[0], ctx, x, q).shape[-1]


def _lift_path(numerics, ctx, shape) -> str:
  """A lifting context's path: the kernel ('kernel, lift') or cuDNN ('cudnn, lift') where they
  take the lifted head size, else XLA's explicit softmax."""
  if ctx.biased:
    return 'xla'
  d2 = lifted(ctx, shape)
  if numerics.attention == 'kernel' and _kernel_takes(
      numerics, ctx, shape, attention_kernel.lifted(d2)):
    return 'kernel, lift'
  if numerics.attention == 'cudnn' and d2 <= CUDNN_HEAD_DIM and d2 % 8 == 0:
    return 'cudnn, lift'
  return 'xla'


def split_qkv(numerics: Numerics, ctx: LayerContext, shape) -> bool:
  """Whether q, k and v come from three products, not one: where the plan asks for it and XLA
  rotates q and k first, blocks above 8 or before the attention kernel ('kernel after xla'; the
  kernels take the rest in place)."""
  if not (numerics.split_qkv and isinstance(ctx, (Rotate, RotateEntries)) and ctx.block > 2):
    return False
  how = path(numerics, ctx, shape)
  return how == 'kernel after xla' or (
      how not in ('kernel, band', 'rotation kernel') and ctx.block > attention_kernel.MAX_BLOCK)


def attend(x, kernel, bias, heads: int, ctx: LayerContext, numerics: Numerics):
  """Self-attention of x [B, T, D] -> [B, T, H, d] from the qkv projection (kernel [D, 3D], bias
  [3D] or None) with the encoding's context, by `path`."""
  b, t, width = x.shape
  shape = (b, t, heads, width // heads)
  how, three = path(numerics, ctx, shape), split_qkv(numerics, ctx, shape)
  if how == 'rotation kernel':  # Rotated by the rotation kernel, which reads the one product.
    return _kernel_attention((project(x, kernel, bias, heads, False, stacked=True),), None,
                             numerics, _rows(ctx, shape))
  if how in ('kernel after xla', 'kernel, lift'):
    q, k, v = project(x, kernel, bias, heads, three)
    q, k, _ = ctx.attend(q, k, numerics)
    if ctx.lifts:  # Zero channels to whole lane tiles a head: they change no logit.
      q, k = (_pad(a, attention_kernel.lifted(a.shape[-1])) for a in ctx.lift(x, q, k))
    return _kernel_attention((q, k, v), None, numerics, scale=1 / math.sqrt(shape[-1]))
  if how in ('kernel', 'kernel, band'):
    qkv = project(x, kernel, bias, heads, three, stacked=True)
    return _kernel_attention(qkv if three else (qkv,), _band(ctx, shape, x.dtype), numerics)
  q, k, v = project(x, kernel, bias, heads, three)
  q, k, bias = ctx.attend(q, k, numerics)
  if how == 'cudnn, lift':
    out = _cudnn(*ctx.lift(x, q, k), v, None)
    if out is not None:
      return out
  if ctx.lifts:
    return _softmax_attention(q, k, v, bias, shape[-1], ctx.features(x))[0]
  bias = None if bias is None else bias[None].astype(q.dtype)
  out = _cudnn(q, k, v, bias) if how == 'cudnn' else None
  return jax.nn.dot_product_attention(q, k, v, bias=bias) if out is None else out


def weights(x, kernel, bias, heads: int, ctx: LayerContext, numerics: Numerics):
  """(attention [B, T, H, d], its weights [B, H, T, T]) by an explicit softmax in float32 (the
  attention maps), the context applied by XLA."""
  b, t, width = x.shape
  three = split_qkv(numerics, ctx, (b, t, heads, width // heads))
  q, k, v = project(x, kernel, bias, heads, three)
  q, k, bias = ctx.attend(q, k, numerics)
  return _softmax_attention(q, k, v, bias, width // heads, ctx.features(x))


def _softmax_attention(q, k, v, bias, head_dim, lift=None):
  """(attention [B, T, H, d], weights [B, H, T, T]): softmax((q' k'^T) / sqrt(head_dim) + bias)
  v, logits and softmax in float32; lift: a lift's `features` (q's [B, T, H, c], k's [T, H, c]),
  whose product joins q k^T (q' k'^T, without building q' and k'); head_dim is v's."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  if lift is not None:
    qs, ks = (f.astype(q.dtype) for f in lift)
    logits = logits + jnp.einsum('bqhc,khc->bhqk', qs, ks, preferred_element_type=jnp.float32)
  logits = logits / math.sqrt(head_dim)
  if bias is not None:
    logits = logits + bias
  w = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum('bhqk,bkhd->bqhd', w.astype(v.dtype), v), w


def project(x, kernel, bias, heads, three, stacked=False):
  """The qkv projection: q, k, v [B, T, H, d], from one product or from three (each its own
  array: XLA then rotates q and k as they come, without copies to slice them out of one);
  `stacked`: the one product's [B, T, 3, H, d]."""
  b, t, width = x.shape
  if not three:
    qkv = jnp.dot(x, kernel) if bias is None else jnp.dot(x, kernel) + bias
    qkv = qkv.reshape(b, t, 3, heads, -1)
    return qkv if stacked else tuple(jnp.moveaxis(qkv, 2, 0))
  w = kernel.reshape(width, 3, -1)
  out = [jnp.dot(x, w[:, i]) for i in range(3)]
  if bias is not None:
    out = [y + c for y, c in zip(out, bias.reshape(3, -1))]
  return tuple(y.reshape(b, t, heads, -1) for y in out)


def _cudnn(q, k, v, bias):
  """cuDNN's attention at the scale 1 / sqrt(d) of v's head size d, or None where it does not
  take q (it is chosen while tracing, and cannot be lowered without a GPU). q and k may be wider
  than v (a lift): it takes v padded with zeros to their width, its output sliced back."""
  d = v.shape[-1]
  if not (q.dtype in (jnp.bfloat16, jnp.float16) and q.shape[-1] <= CUDNN_HEAD_DIM
          and q.shape[-1] % 8 == 0):
    return None
  try:
    out = jax.nn.dot_product_attention(q, k, _pad(v, q.shape[-1]), bias=bias,
                                       scale=1 / math.sqrt(d), implementation='cudnn')
  except (NotImplementedError, ValueError, RuntimeError):
    return None
  return out if q.shape[-1] == d else out[..., :d]


def _pad(x, channels):
  """x [..., c] with zeros after its c channels to `channels` (x itself where c is that)."""
  if x.shape[-1] == channels:
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, channels - x.shape[-1])])


def _model_axis():
  """The context mesh's 'model' axis where it splits the heads, else None."""
  mesh = jax.sharding.get_abstract_mesh()
  return 'model' if not mesh.empty and mesh.shape.get('model', 1) > 1 else None


def _kernel_takes(numerics, ctx, shape, lift=None, band=0) -> bool:
  """Whether the attention kernel takes q [B, T, H, d] (each device's heads) under ctx on the
  plan's chip: no logit bias; lift: q's and k's lifted head size, band: the diagonals it rotates
  them by (attention_kernel.supported)."""
  _, t, heads, d = shape
  model = jax.sharding.get_abstract_mesh().shape['model'] if _model_axis() else 1
  return (not ctx.biased and not heads % model
          and attention_kernel.supported(heads // model, d, t, lift, band, numerics.vmem))


class Shares(NamedTuple):
  """The kernel's entries [b, T', H d] split over a mesh's 'data' axis by tokens (T' a multiple
  of its devices: rotations.liere_entries), gathered where the kernel reads them."""
  entries: jax.Array


def _band(ctx, shape, dtype):
  """The rotation of q and k that the attention kernel applies itself (path 'kernel, band'):
  its entries [b, T' >= T, H d] (attention_kernel.entries), RoPE's from its angles and other
  blocks from `rot`, built whole, or `RotateEntries`' as they come, split by tokens (`Shares`).
  None where the kernel does not rotate (path 'kernel')."""
  heads, d = shape[2:]
  if isinstance(ctx, Angles):
    return attention_kernel.pair_entries(jnp.swapaxes(ctx.angles, 0, 1), heads, d, dtype)
  if isinstance(ctx, RotateEntries):  # Heads shared: [b, T', d] for every head.
    e = ctx.entries.astype(dtype)
    return Shares(jnp.tile(e, (1, 1, heads * d // e.shape[-1])))
  if not ctx.rotates:
    return None
  rot = jnp.swapaxes(ctx.rot, 0, 1).astype(dtype)  # [T' >= T, H or 1, k, b, b]
  return attention_kernel.entries(jnp.broadcast_to(rot, rot.shape[:1] + (heads,) + rot.shape[2:]),
                                  d)


def _rotation_kernel_takes(ctx, shape) -> bool:
  """Whether ctx's blocks fill q's heads as the rotation kernel takes them."""
  if not isinstance(ctx, Rotate):
    return False
  _, _, heads, d = shape
  k, b = ctx.rot.shape[-3], ctx.block
  return k * b == d and rotation_kernel.supported(b, d, heads)


def _rows(ctx, shape):
  heads = shape[2]  # Every token (padding too: the kernel reads them split over data).
  return rotation_kernel.rows(jnp.broadcast_to(ctx.rot, (heads,) + ctx.rot.shape[1:]))


def _kernel_attention(xs, band, numerics, rot=None, scale=None):
  """The attention kernel of xs at `scale` (None: 1 / sqrt(d)): (q, k, v) [B, T, H, d] (q and k may
  be lifted: [B, T, H, d'], d' whole lane tiles) or ([B, T, 3, H, d],), q and k rotated by `band`
  (blocks' entries [b, T' >= T, H d], their first T tokens read: attention_kernel.entries; or
  `Shares` of them; or None), or the latter's first rotated by the rotation kernel's rows `rot`
  [H / n, T' >= T, d, n b] where given. On a mesh each device attends its part of the batch (and
  of the heads, over 'model'); `Shares` come in split by tokens, all-gathered for the kernel,
  their gradient reduce-scattered: no device holds every token's before the kernel or sums the
  whole of their gradient with the others (docs/decisions/030). rot's tokens come split over
  'data' where they divide (rotations.liere_rotations' split_tokens): the rotation kernel
  gathers them."""
  interpret = numerics.interpret
  mesh = jax.sharding.get_abstract_mesh()
  model, data = _model_axis(), 'data' if 'data' in mesh.axis_names else None
  n = mesh.shape[data] if data and not mesh.empty else 1
  share = data if isinstance(band, Shares) and n > 1 else None
  if isinstance(band, Shares):
    band = band.entries
  if mesh.empty or mesh.size == 1:
    return _kernel_call(xs, band, rot, interpret, None, None, scale)
  gather = data if rot is not None and n > 1 and rot.shape[1] % n == 0 else None
  spec = {4: P(data, None, model, None), 5: P(data, None, None, model, None)}
  fn = functools.partial(_kernel_call, interpret=interpret, gather=gather, share=share,
                         scale=scale)
  return jax.shard_map(fn, in_specs=(tuple(spec[a.ndim] for a in xs), P(None, share, model),
                                     P(model, gather)),
                       out_specs=spec[4], check_vma=False)(xs, band, rot)


def _kernel_call(xs, band, rot, interpret, gather, share, scale):
  if rot is not None:
    (qkv,) = xs
    b, t, _, h, d = qkv.shape
    out = rotation_kernel.attention(qkv.reshape(b, t, 3 * h * d), rot, interpret, gather)
    return out.reshape(b, t, h, d)
  if share:  # The devices' shares of the tokens; the transpose reduce-scatters the gradient.
    band = jax.lax.all_gather(band, share, axis=1, tiled=True)
  if len(xs) == 1:
    return attention_kernel.attention_qkv(xs[0], band, interpret=interpret)
  return attention_kernel.attention(*xs, band, interpret=interpret, scale=scale)
