"""LieRE: rotations R(p) = expm(sum_i p_i A_i) with learned skew-symmetric generators A_i.

The names liere<b> (b x b blocks) and paper_rope_mixed (= liere2: the paper's RoPE-Mixed
column ran the official code's LieRE with 2 x 2 blocks; its Table 10's b = 2 row equals it).
"""
import jax
import jax.numpy as jnp
from flax import nnx

from liere_jax import numerics as numerics_lib, rotations
from liere_jax.encodings.base import Encoding, Rotate, RotateEntries, register
from liere_jax.encodings.registry import Option
from liere_jax.numerics import PRECISIONS

# model.pe.expm: the platform's exponential ('fast': liere_jax.numerics), the SciPy reference, or
# the Pallas kernel where the platform's plan runs XLA's (a GPU: opt-in; its forward is faster,
# its backward not yet). Names of earlier versions, still in stored runs, are the platform's.
METHODS = ('fast', 'scipy', 'pallas')
LEGACY_METHODS = {'fast_loop': 'fast', 'fast_cond': 'fast', 'fast_select': 'fast',
                  'scipy_remat': 'scipy'}

SHARE = ('none', 'layers', 'heads', 'all')  # model.pe.share: generators shared over these.


# Normalized positions: the U[0, 2 pi) generators are sized for positions in [0, 1].
@register('liere', blocks=True, positions='normalized', official=True, label='LieRE{b}',
          composes='rotary',
          options=(
              Option('share', 'none', "generators shared over 'none', 'layers', 'heads' or "
                     "'all'."),
              Option('init_scale', 6.283185307179586,  # 2 pi.
                     'generators ~ U[0, 1) * init_scale.'),
              Option('expm', 'fast', "the exponential: 'fast' (the platform's), 'scipy' (the "
                     "reference) or 'pallas' (the Pallas kernel; liere_jax.encodings.liere)."),
              Option('expm_precision', 'auto', "the exponential's products, 'auto' (float32 on "
                     "CPU, tensor-core presets on GPU / TPU) or 'highest' (float32 everywhere).",
                     added='highest'),
          ),
          aliases={'paper_rope_mixed': (2, 'RoPE-Mixed (paper: LieRE2)')})
class LieRE(Encoding):
  """LieRE: R(p) = expm(sum_i p_i A_i) with learned block-diagonal skew-symmetric A_i.

  Raw parameters are the strict upper triangles, init U[0, 1) * init_scale; rotations once per
  forward pass, by `expm` with products at `expm_precision` (its options, declared above; no
  defaults below the declaration). `layers` / `heads`: the generator stacks (1 when shared;
  liere_jax.config.model resolves model.pe.share into them).
  """

  def __init__(self, *, block, layers, heads, head_dim, n_dims, rngs, share, init_scale, expm,
               expm_precision, dtype):
    del share  # Resolved into layers / heads.
    self.block, self.expm, self.expm_precision = block, expm, expm_precision
    self.head_dim, self.dtype = head_dim, dtype  # The attention kernel's entries (`context`).
    shape = (layers, heads, n_dims, head_dim // block, rotations.num_free(block))
    self.generators = nnx.Param(init_scale * jax.random.uniform(rngs.params(), shape))

  @classmethod
  def check_options(cls, pe, *, name):
    if pe['share'] not in SHARE:
      raise ValueError(f"model.pe.share={pe['share']!r} is unknown; use one of {SHARE}.")
    if pe['expm'] not in METHODS and pe['expm'] not in LEGACY_METHODS:
      raise ValueError(f"model.pe.expm={pe['expm']!r} is unknown; use one of {METHODS} "
                       '(e.g. --config.model.pe.expm=fast).')
    if pe['expm_precision'] not in PRECISIONS:
      raise ValueError(f"model.pe.expm_precision={pe['expm_precision']!r} is unknown; use one "
                       f'of {PRECISIONS} (e.g. --config.model.pe.expm_precision=auto).')
    if not float(pe['init_scale']) > 0:
      raise ValueError(f"model.pe.init_scale={float(pe['init_scale'])} must be positive "
                       '(LieRE: 2 pi).')

  @classmethod
  def from_spec(cls, spec, *, rngs):
    pe = spec.pe
    return cls(block=pe.block, layers=pe.layers, heads=pe.heads, head_dim=spec.head_dim,
               n_dims=spec.n_dims, rngs=rngs, dtype=spec.dtype, **pe.options)

  def numerics(self, numerics=None) -> numerics_lib.Numerics:
    """The plan (default: this backend's) with this encoding's exponential and precision."""
    numerics = (numerics or numerics_lib.plan()).at_precision(self.expm_precision)
    method = LEGACY_METHODS.get(self.expm, self.expm)
    if method == 'scipy':
      return numerics.replace(expm='scipy', expm_kernel=False)
    return numerics.replace(expm_kernel=True) if method == 'pallas' else numerics

  def context(self, pos, numerics=None):
    """Rotations [layers, heads, T, head_dim // b, b, b] (layers / heads 1 when shared; T split
    over a mesh's data axis where the rotation kernel reads them: rotations.liere_rotations), or
    where the attention kernel rotates by every token's blocks, their entries [layers, b, T,
    heads * head_dim] in the model's dtype (rotations.liere_entries)."""
    numerics = self.numerics(numerics)
    if rotations.entries_path(numerics, self.block, len(pos)):
      return RotateEntries(rotations.liere_entries(
          self.generators[...], pos, self.block, self.head_dim, numerics,
          jnp.dtype(self.dtype)), self.head_dim)
    return Rotate(rotations.liere_rotations(self.generators[...], pos, self.block, numerics,
                                            split_tokens=True))
