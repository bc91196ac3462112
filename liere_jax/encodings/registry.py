"""The facts of every position encoding, by name (standard library only: tools read it too).

A `model.pe.name` is a family ('rope_mixed'), a family with a block size ('liere8' for the
family 'liere' with 8 x 8 blocks) or an alias ('paper_rope_mixed' = liere2). The classes that
implement the families live beside this module and register under these family names.

  parse('comrope_ap4') == ('comrope_ap', 4); facts('liere8').positions == 'normalized'
"""
import dataclasses
import re
from typing import Dict, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Facts:
  """What the rest of the library needs to know about an encoding family."""
  family: str  # 'liere', 'comrope_ap', 'rope_mixed', ...
  blocks: bool  # Names are family<b> (liere8, comrope_ld4, ...).
  min_block: int  # The smallest block size b.
  positions: str  # Default position mode (liere_jax.positions.MODES) at the training grid.
  reads_positions: bool  # False: the encoding ignores token positions (and jitter).
  options: Tuple[str, ...]  # model.pe options that apply besides name, positions and jitter.
  official: bool  # Converts to / from the official LieRE code's checkpoint layout.
  label: str  # Report label; '{b}' stands for the block size.


def _facts(family, *, blocks=False, min_block=2, positions='integer', reads_positions=True,
           options=(), official=False, label):
  return family, Facts(family, blocks, min_block, positions, reads_positions, options,
                       official, label)


# The position modes follow each family's initialisation: LieRE's U[0, 2 pi) generators and
# ComRoPE's centred patch coordinates on [0, 1] positions, RoPE's frequencies on patch indices;
# the paper's VisionLlama ran on the official code's [0, 1] positions.
FAMILIES: Dict[str, Facts] = dict([
    _facts('none', reads_positions=False, official=True, label='None'),
    _facts('abs', reads_positions=False, official=True, label='Absolute'),
    _facts('sincos', reads_positions=False, label='Sin-cos'),
    _facts('rope_axial', label='Axial RoPE (rope-vit)'),
    _facts('rope_mixed', official=True, label='RoPE-Mixed (naver-ai)'),
    _facts('alibi', label='2D ALiBi'),
    _facts('liere', blocks=True, positions='normalized', official=True, label='LieRE{b}',
           options=('share', 'init_scale', 'expm', 'expm_precision')),
    _facts('comrope_ap', blocks=True, positions='normalized', label='ComRoPE-AP{b}'),
    _facts('comrope_ld', blocks=True, positions='normalized', label='ComRoPE-LD{b}'),
    _facts('string_cayley', label='STRING (Cayley)'),
    # A 2 x 2 circulant is symmetric: C - C^T = 0.
    _facts('string_circulant', blocks=True, min_block=3, label='STRING (circulant {b})'),
    _facts('paper_visionllama', positions='normalized', official=True,
           label='VisionLlama RoPE (paper)'),
])
# Names that are another family at a fixed block size: the paper's RoPE-Mixed column ran the
# official code's LieRE with 2 x 2 blocks (its Table 10's b = 2 row equals it).
ALIASES: Dict[str, Tuple[str, int]] = {'paper_rope_mixed': ('liere', 2)}
ALIAS_LABELS = {'paper_rope_mixed': 'RoPE-Mixed (paper: LieRE2)'}
NAMES: Tuple[str, ...] = tuple(
    f.family + ('<b>' if f.blocks else '') for f in FAMILIES.values()) + tuple(ALIASES)
BLOCK_FAMILIES = tuple(f.family for f in FAMILIES.values() if f.blocks)


def parse(name: str) -> Tuple[str, Optional[int]]:
  """(family, block) of a model.pe.name: 'liere8' -> ('liere', 8), 'paper_rope_mixed' ->
  ('liere', 2); any other name is its own family with block None."""
  if name in ALIASES:
    return ALIASES[name]
  m = re.fullmatch(r'(%s)(\d+)' % '|'.join(BLOCK_FAMILIES), name)
  return (m.group(1), int(m.group(2))) if m else (name, None)


def facts(name: str) -> Facts:
  """The Facts of a model.pe.name (or of a family name)."""
  family, _ = parse(name)
  if family not in FAMILIES:
    raise ValueError(f'model.pe.name={name!r} is unknown; use one of {NAMES} '
                     '(e.g. pe=liere8 or pe=rope_mixed).')
  return FAMILIES[family]


def label(name: str) -> str:
  """The report label of a model.pe.name: 'LieRE8', 'RoPE-Mixed (paper: LieRE2)'."""
  if name in ALIAS_LABELS:
    return ALIAS_LABELS[name]
  _, block = parse(name)
  return facts(name).label.format(b='' if block is None else block)
