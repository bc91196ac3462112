"""Every position encoding of the paper behind one interface, chosen by name (`model.pe.name`).

  base.py       the interface (Encoding), the per-layer contexts, `register` (a family's
                facts, declared on its class), build / validate
  registry.py   the names: parse / facts / label of every registered family and alias, read
                from the @register declarations without importing jax
  absolute.py   none, abs, sincos
  rope.py       rope_axial, paper_visionllama, rope_mixed, alibi
  liere.py      liere<b> (and its alias paper_rope_mixed = liere2)
  commuting.py  comrope_ap<b>, comrope_ld<b>, string_cayley, string_circulant<b>
  pape.py       pape, pape_ri (a lift of q and k: base.Lift)

Parameters (names are an API: checkpoints and the PyTorch port depend on them):
  abs         embedding   [1, T_train, D]  (CLS slot first when there is a CLS token)
  rope_mixed  freqs       [n, depth, heads * d/2]   (naver-ai/rope-vit layout)
  liere<b>    generators  [L, H, n, d//b, b(b-1)/2]  L = depth or 1, H = heads or 1 (sharing)
  paper_rope_mixed     generators [L, H, n, d//2, 1]: liere2 itself (an alias LieRE declares),
                       is the paper's RoPE-Mixed column; not naver-ai's RoPE-Mixed (rope_mixed).
  paper_visionllama    no parameters: is the paper's VisionLlama column; not rope-vit's axial
                       RoPE (rope_axial).
  comrope_ap<b>        skew_params  [depth, heads, d//b, b, b]   block j: B_j = P_j - P_j^T
  comrope_ld<b>        skew_params  [depth, heads, d//b, b, b],  axis_scales [depth, n, d//b]
  string_cayley        freqs [n, depth, heads * d/2] (rope_mixed's),  cayley [depth, heads,
                       d(d-1)/2] (strict upper triangle of S, np.triu_indices order)
  string_circulant<b>  circulant    [depth, heads, n, d//b, b]   first columns c of C_{a,j}
  pape                 position [depth, n, heads * M],  ab [depth, D, 2 * heads * M]  (a | b)
  pape_ri              position_scales [depth, heads] (fixed),  a [depth, D, heads]
  <rotary>+<lift>      rotary/<the rotary part's>,  lift/<the lift's>  (liere8+pape: rotary/
                       generators, lift/position, lift/ab; base.Composition)
  none, sincos, rope_axial, alibi: no parameters.
"""
import importlib

from liere_jax.encodings import registry
from liere_jax.encodings.registry import (ALIASES, FAMILIES, NAMES, Facts, Option, facts, label,
                                          parse)

# name -> its module, for the names imported on first use (PEP 562): the names and facts above
# need no jax; the first of these imports every encoding (they register).
_LAZY = {
    # The interface and the builder.
    'base': ('Angles', 'Bias', 'Composed', 'Composition', 'Encoding', 'LayerContext', 'Lift',
             'Rotate', 'RotateEntries', 'build', 'encoding_class', 'families', 'layer',
             'register', 'validate'),
    # The encodings, and their math for tests and the port's parity checks.
    'absolute': ('NoPE', 'Absolute', 'SinCos', 'sincos_table'),
    'rope': ('RopeAxial', 'PaperVisionLlama', 'RopeMixed', 'ALiBi'),
    'liere': ('LieRE',),
    'commuting': ('ComRoPEAP', 'ComRoPELD', 'StringCayley', 'StringCirculant',
                  'cayley_orthogonal', 'expm_skew_lines'),
    'pape': ('PaPE', 'PaPERI'),
}
__all__ = ['ALIASES', 'FAMILIES', 'NAMES', 'Facts', 'Option', 'facts', 'label', 'parse',
           'registry',
           *(name for names in _LAZY.values() for name in names)]


def __getattr__(name):
  home = next((module for module, names in _LAZY.items() if name in names), None)
  if home is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  for module in registry.MODULES:  # All of them: build / families need every family.
    importlib.import_module(f'{__name__}.{module}')
  value = getattr(importlib.import_module(f'{__name__}.{home}'), name)
  globals()[name] = value
  return value
