"""Vision Transformer with pluggable position encodings (Flax NNX), for 1D, 2D and 3D inputs.

Inputs are channels-last: [B, T, C] (1D), [B, H, W, C] (2D), [B, T, H, W, C] (3D); one
convolution with kernel = stride = `patch` makes the tokens (patches, tubelets). Pre-norm
blocks, exact GELU, CLS or mean pooling.

Parameter tree (stable names; the PyTorch port maps them one to one):
  patch_embed/kernel [*patch, C, D], patch_embed/bias [D]
  cls_token [1, 1, D]                          (pool='cls' only)
  pe/...                                       (see encodings.py)
  blocks/<i>/norm1/{scale, bias} [D]
  blocks/<i>/attn/qkv/{kernel [D, 3D], bias [3D]}   output laid out (q|k|v, head, head_dim);
                                                    no bias with qkv_bias=False (official LieRE)
  blocks/<i>/attn/proj/{kernel [D, D], bias [D]}
  blocks/<i>/norm2/{scale, bias} [D]
  blocks/<i>/mlp/fc1/{kernel [D, M], bias [M]}, blocks/<i>/mlp/fc2/{kernel [M, D], bias [D]}
  norm/{scale, bias} [D]
  head/{kernel [D, classes], bias [classes]}
"""
import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from liere_jax import encodings
from liere_jax.positions import grid_positions, with_prefix

VARIANTS = {'Ti': (192, 12, 3), 'S': (384, 12, 6), 'B': (768, 12, 12), 'L': (1024, 24, 16)}
LN_EPS = 1e-5  # PyTorch's default, as in the official LieRE code.
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def dims(cfg: ml_collections.ConfigDict):
  """(width, depth, heads, mlp_dim): the variant's, each overridable in the config."""
  if cfg.get('variant') and cfg.variant not in VARIANTS:
    raise ValueError(f'model.variant={cfg.variant!r} is unknown; use one of {list(VARIANTS)} '
                     'or set variant=None with width, depth and heads.')
  width, depth, heads = VARIANTS[cfg.variant] if cfg.get('variant') else (None,) * 3
  width, depth, heads = (cfg.get('width') or width, cfg.get('depth') or depth,
                         cfg.get('heads') or heads)
  if None in (width, depth, heads):
    raise ValueError('Set model.variant (Ti, S, B, L) or all of model.width/depth/heads.')
  if width % heads:
    raise ValueError(f'model.width={width} is not divisible by model.heads={heads}.')
  return width, depth, heads, cfg.get('mlp_dim') or 4 * width


def validate(cfg: ml_collections.ConfigDict):
  """Checks a model config; raises ValueError naming the value and the fix."""
  width, depth, heads, _ = dims(cfg)
  patch, size = tuple(cfg.patch), tuple(cfg.input_size)
  if len(patch) != len(size):
    raise ValueError(f'model.patch={patch} has {len(patch)} axes but model.input_size={size} '
                     f'has {len(size)}; give one patch size per spatial axis.')
  if any(s % p for s, p in zip(size, patch)):
    raise ValueError(f'model.input_size={size} is not divisible by model.patch={patch}.')
  if cfg.pool not in ('cls', 'mean'):
    raise ValueError(f"model.pool={cfg.pool!r} is unknown; use 'cls' or 'mean'.")
  if cfg.dtype not in DTYPES:
    raise ValueError(f'model.dtype={cfg.dtype!r} is unknown; use one of {list(DTYPES)}.')
  encodings.validate(cfg.pe, head_dim=width // heads, width=width, n_dims=len(patch))


class Attention(nnx.Module):

  def __init__(self, width, heads, *, qkv_bias, dtype, rngs):
    self.heads = heads
    dense = dict(dtype=dtype, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
    self.qkv = nnx.Linear(width, 3 * width, use_bias=qkv_bias, **dense)
    self.proj = nnx.Linear(width, width, **dense)

  def __call__(self, x, pe, ctx, layer):
    b, t, width = x.shape
    q, k, v = jnp.moveaxis(self.qkv(x).reshape(b, t, 3, self.heads, -1), 2, 0)
    q, k, bias = pe.attend(ctx, layer, q, k)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(q.shape[-1])
    logits = logits.astype(jnp.float32)
    if bias is not None:
      logits = logits + bias
    weights = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(v.dtype), v).reshape(b, t, width)
    return self.proj(out), weights


class Mlp(nnx.Module):

  def __init__(self, width, mlp_dim, *, dtype, rngs):
    dense = dict(dtype=dtype, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
    self.fc1 = nnx.Linear(width, mlp_dim, **dense)
    self.fc2 = nnx.Linear(mlp_dim, width, **dense)

  def __call__(self, x):
    return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class Block(nnx.Module):

  def __init__(self, width, heads, mlp_dim, *, qkv_bias, dropout, dtype, rngs):
    norm = dict(epsilon=LN_EPS, dtype=dtype, rngs=rngs)
    self.norm1 = nnx.LayerNorm(width, **norm)
    self.attn = Attention(width, heads, qkv_bias=qkv_bias, dtype=dtype, rngs=rngs)
    self.norm2 = nnx.LayerNorm(width, **norm)
    self.mlp = Mlp(width, mlp_dim, dtype=dtype, rngs=rngs)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, x, pe, ctx, layer):
    y, weights = self.attn(self.norm1(x), pe, ctx, layer)
    x = x + self.dropout(y)
    x = x + self.dropout(self.mlp(self.norm2(x)))
    return x, weights


class ViT(nnx.Module):
  """ViT classifier. `model(x)` computes the encoding's context (rotations) once per call;
  pass `ctx=model.pe_context(grid)` to reuse it (cached rotations for evaluation)."""

  def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    validate(cfg)
    width, depth, heads, mlp_dim = dims(cfg)
    dtype = DTYPES[cfg.dtype]
    self.patch = tuple(cfg.patch)
    self.train_grid = tuple(s // p for s, p in zip(cfg.input_size, cfg.patch))
    self.channels = cfg.channels
    self.pool = cfg.pool
    self.num_prefix = 1 if cfg.pool == 'cls' else 0
    self.positions = cfg.pe.get('positions')
    self.patch_embed = nnx.Conv(cfg.channels, width, self.patch, strides=self.patch,
                                padding='VALID', dtype=dtype, rngs=rngs)
    if self.num_prefix:
      self.cls_token = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, 1, width)))
    self.pe = encodings.build(cfg.pe, width=width, depth=depth, heads=heads,
                              train_grid=self.train_grid, num_prefix=self.num_prefix, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
    self.blocks = nnx.List([
        Block(width, heads, mlp_dim, qkv_bias=cfg.qkv_bias, dropout=cfg.dropout, dtype=dtype,
              rngs=rngs)
        for _ in range(depth)])
    self.norm = nnx.LayerNorm(width, epsilon=LN_EPS, dtype=dtype, rngs=rngs)
    self.head = nnx.Linear(width, cfg.num_classes, dtype=dtype,
                           kernel_init=nnx.initializers.zeros_init(), rngs=rngs)

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

  def pe_context(self, grid: Sequence[int], positions: Optional[str] = None):
    """The encoding's per-forward-pass state for a patch grid (e.g. LieRE rotations)."""
    mode = positions or self.positions or self.pe.positions
    pos = with_prefix(grid_positions(grid, self.train_grid, mode), self.num_prefix)
    return self.pe.context(pos, self.num_prefix)

  def __call__(self, x, *, ctx=None, positions: Optional[str] = None,
               return_attention: bool = False):
    grid = self.grid(x.shape)
    if ctx is None:
      ctx = self.pe_context(grid, positions)
    x = self.patch_embed(x)
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    if self.num_prefix:
      cls = jnp.broadcast_to(self.cls_token[...], (x.shape[0], 1, x.shape[-1]))
      x = jnp.concatenate([cls.astype(x.dtype), x], axis=1)
    x = self.dropout(self.pe.embed(x, grid, self.num_prefix))
    attention = []
    for layer, block in enumerate(self.blocks):
      x, weights = block(x, self.pe, ctx, layer)
      attention.append(weights)
    x = self.norm(x)
    x = x[:, 0] if self.pool == 'cls' else x.mean(axis=1)
    logits = self.head(x).astype(jnp.float32)
    return (logits, attention) if return_attention else logits
