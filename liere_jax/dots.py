"""Matrix products at a named precision: the exponential's presets per platform, and their
emulation on CPU.

A multi-pass preset splits each float32 operand into narrower parts and sums some of the
parts' products in float32: BF16_BF16_F32_X6 three bf16 parts and six products (what TPUs do at
HIGHEST), X3 two parts and three, TF32_TF32_F32_X3 two TF32 parts and three. The CPU backend
accepts the BF16 presets but computes them in float32 and rejects the TF32 ones, so their
errors are measured with `emulated`, which splits the operands as XLA does.
"""
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST
_PRESET = jax.lax.DotAlgorithmPreset


class Dots(NamedTuple):
  """The product of a forward pass and the products of its VJP: (x, y) -> x @ y, batched."""
  forward: Callable
  backward: Callable
  barrier: bool = False  # Materialise x^T in the VJP (fast on XLA CPU; expm.xla_algebra).
  name: str = ''  # What `bench plan` prints.


def at(precision) -> Callable:
  """x @ y at a jax Precision or DotAlgorithmPreset, accumulating in float32."""
  return functools.partial(_dot, precision=precision)


def _dot(x, y, precision):
  return jnp.matmul(x, y, precision=precision, preferred_element_type=jnp.float32)


HIGHEST = Dots(at(_HI), at(_HI), name='HIGHEST')
CPU = Dots(at(_HI), at(_HI), barrier=True, name='float32')
# Tensor cores: six bf16 passes keep the exponential at float32's error. Three would halve the
# backward's cost but miss a 1e-5 relative gradient (1.2e-5 on LieRE64's largest matrices,
# emulated: python -m liere_jax.bench presets).
GPU = Dots(at(_PRESET.BF16_BF16_F32_X6), at(_PRESET.BF16_BF16_F32_X6), name='BF16_BF16_F32_X6')
TPU = Dots(at(_HI), at(_HI), name='HIGHEST (six bf16 passes)')
EMULATED = ('F32', 'BF16_BF16_F32_X6', 'BF16_BF16_F32_X3', 'TF32_TF32_F32_X3', 'TF32_TF32_F32',
            'BF16_BF16_F32')
# Parts per operand and which (lhs part, rhs part) products each preset sums.
_SCHEMES = {'BF16_BF16_F32_X6': ('bf16', 3, ((0, 0), (0, 1), (1, 0), (0, 2), (2, 0), (1, 1))),
            'BF16_BF16_F32_X3': ('bf16', 2, ((0, 0), (0, 1), (1, 0))),
            'BF16_BF16_F32': ('bf16', 1, ((0, 0),)),
            'TF32_TF32_F32_X3': ('tf32', 2, ((0, 0), (0, 1), (1, 0))),
            'TF32_TF32_F32': ('tf32', 1, ((0, 0),))}


def _round_tf32(x):
  """float32 -> the nearest TF32 (10 explicit mantissa bits; ties to even), as float32."""
  bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
  bits = (bits + 0xFFF + ((bits >> 13) & 1)) & jnp.uint32(0xFFFFE000)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _round_bf16(x):
  return x.astype(jnp.bfloat16).astype(jnp.float32)


def split(x: jax.Array, kind: str, parts: int):
  """x (float32) as `parts` narrower numbers (kind 'bf16' or 'tf32') that sum to about x."""
  rnd = _round_bf16 if kind == 'bf16' else _round_tf32
  out, rest = [], x
  for _ in range(parts):
    out.append(rnd(rest))
    rest = rest - out[-1]
  return out


def emulated(name: str) -> Callable:
  """x @ y as the preset `name` (EMULATED) computes it: the parts' products are exact in
  float32 (their mantissas are short) and summed smallest first in float32."""
  if name == 'F32':
    return at(_HI)
  if name not in _SCHEMES:
    raise ValueError(f'Unknown preset {name!r}; emulated: {EMULATED}.')
  kind, parts, pairs = _SCHEMES[name]

  def mm(x, y):
    xs, ys = split(x, kind, parts), split(y, kind, parts)
    terms = [_dot(xs[i], ys[j], _HI) for i, j in sorted(pairs, key=lambda p: -sum(p))]
    return functools.reduce(jnp.add, terms)
  return mm


def emulated_dots(forward: str, backward: str) -> Dots:
  """The presets `forward` and `backward` (EMULATED names) emulated in float32 on any backend
  (`Numerics.products`: to compute on CPU as an accelerator does)."""
  return Dots(emulated(forward), emulated(backward), name=f'emulated {forward} / {backward}')


def preset_names(platform: str) -> tuple:
  """The (forward, backward) presets `auto` uses on a platform, as EMULATED names."""
  multi = platform in ('cuda', 'rocm', 'tpu')
  return ('BF16_BF16_F32_X6',) * 2 if multi else ('F32', 'F32')
