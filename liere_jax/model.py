"""Vision Transformer with pluggable position encodings (Flax NNX), for 1D, 2D and 3D inputs.

Inputs are channels-last: [B, T, C] (1D), [B, H, W, C] (2D), [B, T, H, W, C] (3D); one
convolution with kernel = stride = `patch` makes the tokens (patches, tubelets). Pre-norm
blocks, exact GELU, CLS or mean pooling; `model.remat='block'` recomputes each block's
activations in the backward pass.

Dropout (rate model.dropout) at the sites named in model.dropout_sites, the official LieRE
code's four (models/vit.py, rope_vit.py): 'embed' the tokens after the CLS concat and the
position embedding, 'attn' the attention output projection, 'mlp_hidden' the MLP hidden units
after GELU, 'mlp' the MLP output. One dropout RNG stream per block serves its three sites.

Initialisation (model.init): 'jax' Xavier-uniform kernels, zero biases, a zero head, a
LeCun-normal patch embedding, CLS token and absolute embedding 0.02 N(0, 1); 'official' the
PyTorch defaults the official code keeps: every Linear (the patch embedding is one, fan_in =
prod(patch) * C) has weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), CLS and absolute
embedding N(0, 1). LayerNorms start at ones / zeros either way. Parameters are float32 whatever
model.dtype (bfloat16 is the compute dtype).

Parameter tree (stable names; the PyTorch port maps them one to one):
  patch_embed/kernel [*patch, C, D], patch_embed/bias [D]
  cls_token [1, 1, D]                          (pool='cls' only)
  pe/...                                       (see liere_jax/encodings/__init__.py)
  norm_pre/{scale, bias} [D]                   (model.norm_pre only: the official PaPE's)
  blocks/<i>/norm1/{scale, bias} [D]
  blocks/<i>/attn/qkv/{kernel [D, 3D], bias [3D]}   output laid out (q|k|v, head, head_dim);
                                                    no bias with qkv_bias=False (official LieRE)
  blocks/<i>/attn/proj/{kernel [D, D], bias [D]}
  blocks/<i>/norm2/{scale, bias} [D]
  blocks/<i>/mlp/fc1/{kernel [D, M], bias [M]}, blocks/<i>/mlp/fc2/{kernel [M, D], bias [D]}
  norm/{scale, bias} [D]
  head/{kernel [D, classes], bias [classes]}
With model.scan_layers the model holds the blocks stacked, blocks/... [depth, ...] (one Block
whose parameters have a leading layer axis, run under one lax.scan); checkpoints, exports and
the port see blocks/<i>/... either way (liere_jax.param_tree.to_loop_params / to_scan_params
convert at those boundaries).
"""
import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from liere_jax import attention, encodings, numerics as numerics_lib, param_tree
from liere_jax import positions as positions_lib
from liere_jax.config import model_config
from liere_jax.config.model import LN_EPS, ModelSpec, resolve

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
_XAVIER = nnx.initializers.xavier_uniform()
_ZEROS = nnx.initializers.zeros_init()


def sharded(init, *axes):
  """`init` with the logical axes of its parameter as metadata ('embed' = width, 'heads' = the
  q|k|v / head outputs, 'mlp' = MLP hidden, None = never split); steps.py maps them to mesh
  axes (data parallel, fsdp, a model axis)."""
  return nnx.with_partitioning(init, axes, eager_sharding=False)


def torch_uniform(fan_in: int):
  """PyTorch's default init of a Linear's weight and bias alike (kaiming_uniform with
  a = sqrt(5) for the weight): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), std 1/sqrt(3 fan_in)."""
  bound = 1. / math.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound,
                                                                  bound)


def linear_inits(init: str, fan_in: int, kernel, kernel_axes, bias_axes=None) -> dict:
  """kernel_init / bias_init of a Linear or the patch conv under model.init: 'jax' `kernel`
  and zeros, 'official' torch_uniform(fan_in) for both. The logical axes (sharded) are the
  same under either init; bias_axes=None leaves the bias without them (replicated)."""
  kernel, bias = (kernel, _ZEROS) if init == 'jax' else (torch_uniform(fan_in),) * 2
  return dict(kernel_init=sharded(kernel, *kernel_axes),
              bias_init=bias if bias_axes is None else sharded(bias, *bias_axes))


class Attention(nnx.Module):

  def __init__(self, width, heads, *, qkv_bias, init, dtype, rngs, numerics=None):
    self.heads = heads
    # Static: how attention runs (liere_jax.attention.path); default this backend's plan.
    self.numerics = numerics or numerics_lib.plan()
    self.qkv = nnx.Linear(width, 3 * width, use_bias=qkv_bias, dtype=dtype, rngs=rngs,
                          **linear_inits(init, width, _XAVIER, ('embed', 'heads'), ('heads',)))
    self.proj = nnx.Linear(width, width, dtype=dtype, rngs=rngs,
                           **linear_inits(init, width, _XAVIER, ('heads', 'embed')))

  def __call__(self, x, ctx: encodings.LayerContext, return_weights=False):
    """Self-attention [B, T, D] -> ([B, T, D], weights [B, H, T, T] or None); `ctx` is this
    layer's position-encoding context (encodings.Encoding.layer). Logits and softmax in
    float32 (liere_jax.attention)."""
    b, t, width = x.shape
    kernel, bias = self.qkv.kernel[...], self.qkv.bias[...] if self.qkv.bias is not None else None
    if ctx.projects:  # A linear map of q and k folded into the projection, once per step.
      kernel, bias = ctx.project(kernel, bias)
    dtype = self.qkv.dtype or jnp.result_type(x, kernel)
    args = (x.astype(dtype), kernel.astype(dtype), None if bias is None else bias.astype(dtype),
            self.heads, ctx, self.numerics)
    if not return_weights:
      return self.proj(attention.attend(*args).reshape(b, t, width)), None
    out, weights = attention.weights(*args)
    return self.proj(out.reshape(b, t, width)), weights


class Mlp(nnx.Module):

  def __init__(self, width, mlp_dim, *, hidden_dropout, init, dtype, rngs):
    self.fc1 = nnx.Linear(width, mlp_dim, dtype=dtype, rngs=rngs,
                          **linear_inits(init, width, _XAVIER, ('embed', 'mlp'), ('mlp',)))
    self.fc2 = nnx.Linear(mlp_dim, width, dtype=dtype, rngs=rngs,
                          **linear_inits(init, mlp_dim, _XAVIER, ('mlp', 'embed')))
    self.dropout = nnx.Dropout(hidden_dropout)  # Keys from the caller's stream (`rngs`).

  def __call__(self, x, rngs=None):
    """[..., D] -> [..., D]; `rngs` (an RngStream or key) drives the hidden-unit dropout."""
    return self.fc2(self.dropout(jax.nn.gelu(self.fc1(x), approximate=False), rngs=rngs))


class Block(nnx.Module):

  def __init__(self, width, heads, mlp_dim, *, qkv_bias, dropout, dropout_sites, init, dtype,
               rngs, layer_norm_eps=LN_EPS, numerics=None):
    norm = dict(epsilon=layer_norm_eps, dtype=dtype, rngs=rngs)
    self.norm1 = nnx.LayerNorm(width, **norm)
    self.attn = Attention(width, heads, qkv_bias=qkv_bias, init=init, dtype=dtype,
                          numerics=numerics, rngs=rngs)
    self.norm2 = nnx.LayerNorm(width, **norm)
    self.mlp = Mlp(width, mlp_dim, init=init, dtype=dtype, rngs=rngs,
                   hidden_dropout=dropout if 'mlp_hidden' in dropout_sites else 0.)
    # The block's one RNG stream (and the only one it forks from `rngs`, after the parameters:
    # the init and the stream layout do not depend on the sites).
    self.dropout = nnx.Dropout(dropout, rngs=rngs)
    self.sites = tuple(site for site in ('attn', 'mlp') if site in dropout_sites)

  def _drop(self, site, y):
    return self.dropout(y) if site in self.sites else y

  def __call__(self, x, ctx: encodings.LayerContext, return_weights=False):
    y, weights = self.attn(self.norm1(x), ctx, return_weights)
    x = x + self._drop('attn', y)
    x = x + self._drop('mlp', self.mlp(self.norm2(x), rngs=self.dropout.rngs))
    return x, weights


def stack_blocks(blocks: Sequence[nnx.Module]) -> nnx.Module:
  """One module holding `blocks` (alike) stacked: every variable with a leading layer axis
  (unsplit: its logical axis is None)."""
  state = jax.tree.map(lambda *v: jnp.stack(v), *[nnx.state(b) for b in blocks])
  state = nnx.spmd.add_axis(state, 0, {nnx.PARTITION_NAME: None})
  return nnx.merge(nnx.graphdef(blocks[0]), state)


def reseed(model: nnx.Module, **stream_keys):
  """nnx.reseed (RNG streams named by `stream_keys`: key or int) for either layout: the
  streams take keys fold_in(key, 0), fold_in(key, 1), ... in graph order, a stacked stream one
  per layer, so a scanned model gets the loop model's keys (and dropout masks).

  A model built with `nnx.Rngs(seed)` (one 'default' stream) has its dropout and jitter
  streams tagged 'default' (`rngs['dropout']` falls back to it; the parameters are drawn at
  init, so these are the model's only streams): `dropout=` reseeds them too."""
  counts = dict.fromkeys(stream_keys, 0)
  keys = {tag: jax.random.key(k) if isinstance(k, int) else k for tag, k in stream_keys.items()}
  for _, stream in nnx.iter_graph(model):
    if not isinstance(stream, nnx.RngStream):
      continue
    tag = 'dropout' if stream.key.tag == 'default' and 'default' not in keys else stream.key.tag
    if tag in keys:
      shape = stream.key.shape
      n = math.prod(shape)
      index = jnp.arange(counts[tag], counts[tag] + n, dtype=jnp.uint32)
      new = jax.vmap(jax.random.fold_in, (None, 0))(keys[tag], index).reshape(shape)
      stream.key.set_value(new)
      stream.count.set_value(jnp.zeros(shape, jnp.uint32))
      counts[tag] += n


@nnx.remat
def _remat_block(block, x, ctx):
  """A block whose activations the backward pass recomputes (model.remat='block')."""
  return block(x, ctx)


class PositionJitter(nnx.Module):
  """Noise on the patch positions while training (model.pe.jitter; ComRoPE's perturbation):
  one draw per step from the dropout RNG stream, none in eval mode."""

  def __init__(self, intensity: float, *, rngs: nnx.Rngs):
    self.intensity, self.deterministic = intensity, False
    self.rngs = rngs['dropout'].fork() if intensity else nnx.data(None)

  def __call__(self, grid) -> Optional[jax.Array]:
    """Offsets in patch units [prod(grid), n], or None."""
    if not self.intensity or self.deterministic:
      return None
    return positions_lib.jitter(self.rngs(), grid, self.intensity)


def create_encoding(name: str, *, grid: Sequence[int], heads: int, head_dim: int,
                    depth: int = 1, num_prefix: int = 0, rngs: nnx.Rngs,
                    **options) -> encodings.Encoding:
  """An encoding for attention outside our ViT: `depth` layers of `heads` heads of `head_dim`
  dims, tokens on `grid` (the training grid; one axis per position coordinate), `num_prefix`
  (0 or 1) prefix tokens first. options: model.pe fields (positions, share, init_scale, expm),
  checked as a model config's: an entry point, it builds its model section and resolves it."""
  m = model_config(pe=name, variant='', patch=(1,) * len(grid), input_size=grid,
                   channels=1, num_classes=1, pool='cls' if num_prefix else 'mean',
                   width=heads * head_dim, depth=depth, heads=heads)
  m.pe.update(options)
  return encodings.build(resolve(m), rngs=rngs)


class ViT(nnx.Module):
  """ViT classifier. `model(x)` computes the encoding's context (rotations) once per call;
  pass `ctx=model.pe_context(grid)` to reuse it (cached rotations for evaluation).

  numerics: how the platform computes the exponential, the rotations and attention
  (liere_jax.numerics; default: this backend's plan; a Trainer passes its mesh's)."""

  def __init__(self, spec: ModelSpec, *, rngs: nnx.Rngs,
               numerics: Optional[numerics_lib.Numerics] = None):
    if not isinstance(spec, ModelSpec):  # Resolved once, where the config comes in.
      raise TypeError(f'ViT takes a ModelSpec, not a {type(spec).__name__}; build it with '
                      'ViT(liere_jax.config.model.resolve(config.model), ...).')
    self.spec = spec  # Static: the graphdef carries it.
    self.numerics = numerics = numerics or numerics_lib.plan()  # Static too.
    width, dtype = spec.width, DTYPES[spec.dtype]
    self.patch, self.train_grid = spec.patch, spec.train_grid
    self.channels, self.pool, self.num_prefix = spec.channels, spec.pool, spec.num_prefix
    # The official patch embedding is a Linear on the flattened patch: fan_in = prod(patch) C.
    conv_axes = (None,) * (spec.n_dims + 1) + ('embed',)
    conv_init = linear_inits(spec.init, math.prod(self.patch) * spec.channels,
                             nnx.initializers.lecun_normal(), conv_axes)
    self.patch_embed = nnx.Conv(spec.channels, width, self.patch, strides=self.patch,
                                padding='VALID', dtype=dtype, rngs=rngs, **conv_init)
    if self.num_prefix:
      cls = jax.random.normal(rngs.params(), (1, 1, width))
      self.cls_token = nnx.Param(spec.embed_std * cls)
    self.pe = encodings.build(spec, rngs=rngs)
    if spec.norm_pre:  # The official PaPE classifiers' encoder.norm_pre (no draws).
      self.norm_pre = nnx.LayerNorm(width, epsilon=spec.layer_norm_eps, dtype=dtype, rngs=rngs)
    self.dropout = nnx.Dropout(spec.dropout, rngs=rngs)
    # The same draws either way: scan_layers stacks the loop's blocks (a run starts alike).
    blocks = [Block(width, spec.heads, spec.mlp_dim, qkv_bias=spec.qkv_bias,
                    dropout=spec.dropout, dropout_sites=spec.dropout_sites, init=spec.init,
                    dtype=dtype, numerics=numerics, rngs=rngs,
                    layer_norm_eps=spec.layer_norm_eps)
              for _ in range(spec.depth)]
    self.blocks = stack_blocks(blocks) if spec.scan_layers else nnx.List(blocks)
    self.norm = nnx.LayerNorm(width, epsilon=spec.layer_norm_eps, dtype=dtype, rngs=rngs)
    self.head = nnx.Linear(width, spec.num_classes, dtype=dtype, rngs=rngs,
                           **linear_inits(spec.init, width, _ZEROS, ('embed', None)))
    # Last: its RNG fork must not shift the initialisation of the parameters above.
    self.jitter = PositionJitter(spec.pe.jitter, rngs=rngs)

  def grid(self, shape: Sequence[int]):
    """The patch grid of an input shape; raises a clear error on a shape that does not fit."""
    n = len(self.patch)
    spatial = tuple(shape[1:-1])
    if len(shape) != n + 2 or shape[-1] != self.channels:
      raise ValueError(
          f'Input shape {tuple(shape)} does not fit the model: it expects [batch, '
          f'{n} spatial axes, {self.channels} channels] for patch={self.patch}. Check '
          'model.patch / model.channels or the data pipeline.')
    if any(s % p for s, p in zip(spatial, self.patch)):
      raise ValueError(f'Input size {spatial} is not divisible by patch={self.patch}; resize '
                       'the input to a multiple of the patch size.')
    return tuple(s // p for s, p in zip(spatial, self.patch))

  def pe_positions(self, grid: Sequence[int], positions: Optional[str] = None, offsets=None):
    """The token positions [T, n] of a patch grid (prefix tokens first, at the origin);
    `offsets` [prod(grid), n] move the patches, in patch units (PositionJitter)."""
    mode, base = positions or self.spec.pe.positions, self.spec.pe.positions
    pos = positions_lib.grid_positions(grid, self.train_grid, mode, base)
    if offsets is not None:
      pos = pos + offsets * positions_lib.patch_step(grid, self.train_grid, mode, base)
    return positions_lib.with_prefix(pos, self.num_prefix)

  def pe_context(self, grid: Sequence[int], positions: Optional[str] = None, offsets=None):
    """The encoding's per-forward-pass context for a patch grid (e.g. LieRE rotations), every
    layer's, computed as the model's numerics plan says."""
    return self.pe.context(self.pe_positions(grid, positions, offsets), self.numerics)

  def _scan_blocks(self, x, ctx):
    """The stacked blocks (model.scan_layers) under one jax.lax.scan: the body is traced once,
    whatever the depth, and takes its layer's parameters and encoding context (by the traced
    layer index); the dropout RNG counts move on, as in the loop."""
    graphdef, state = nnx.split(self.blocks)

    def body(x, inputs):
      state, layer = inputs
      block = nnx.merge(graphdef, state)
      x, _ = block(x, self.pe.layer(ctx, layer))
      return x, nnx.state(block, nnx.RngState)

    if self.spec.remat == 'block':
      body = jax.checkpoint(body)
    x, rng_state = jax.lax.scan(body, x, (state, jnp.arange(self.spec.depth)))
    nnx.update(self.blocks, rng_state)
    return x

  def _unstacked(self):
    """Per-layer views of the stacked blocks (the attention maps' path under scan_layers)."""
    graphdef, state = nnx.split(self.blocks)
    return [nnx.merge(graphdef, jax.tree.map(lambda v, i=i: v[i], state))
            for i in range(self.spec.depth)]

  def __call__(self, x, *, ctx=None, positions: Optional[str] = None,
               return_attention: bool = False):
    grid = self.grid(x.shape)
    if ctx is None:
      ctx = self.pe_context(grid, positions, offsets=self.jitter(grid))
    x = self.patch_embed(x)
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    if self.num_prefix:
      cls = jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, x.shape[-1]))
      x = jnp.concatenate([cls.astype(x.dtype), x], axis=1)
    x = self.pe.embed(x, grid)
    if 'embed' in self.spec.dropout_sites:
      x = self.dropout(x)
    if self.spec.norm_pre:
      x = self.norm_pre(x)
    # The blocks run one of three ways: stacked under one lax.scan (model.scan_layers, the
    # train and eval steps); one by one over per-layer views of the stacked blocks (scan_layers
    # with return_attention: the maps of every layer); or as a Python loop over nnx.List blocks
    # (scan_layers off), each rematerialised under model.remat='block' unless the maps are asked
    # for (remat under scan is in _scan_blocks).
    attention = []
    if self.spec.scan_layers and not return_attention:
      x = self._scan_blocks(x, ctx)
    else:
      blocks = self._unstacked() if self.spec.scan_layers else self.blocks
      for layer, block in enumerate(blocks):
        layer_ctx = self.pe.layer(ctx, layer)
        if self.spec.remat == 'block' and not return_attention:
          x, weights = _remat_block(block, x, layer_ctx)
        else:
          x, weights = block(x, layer_ctx, return_attention)
        attention.append(weights)
      if self.spec.scan_layers:  # The views' dropout counts moved on.
        nnx.update(self.blocks, jax.tree.map(
            lambda *v: jnp.stack(v), *[nnx.state(b, nnx.RngState) for b in blocks]))
    x = self.norm(x)
    x = x[:, 0] if self.pool == 'cls' else x.mean(axis=1)
    logits = self.head(x).astype(jnp.float32)
    return (logits, attention) if return_attention else logits


def abstract_params(spec) -> dict:
  """The parameter tree of ModelSpec `spec` as checkpoints and exports hold it (blocks/<i>/...,
  whatever scan_layers), with ShapeDtypeStruct leaves (nothing allocated; any platform's)."""
  abstract = nnx.eval_shape(lambda: ViT(spec, rngs=nnx.Rngs(0)))
  return param_tree.to_loop_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
