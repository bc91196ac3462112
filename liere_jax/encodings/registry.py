"""The encodings by name: what each family declared at its registration (`base.register`).

A `model.pe.name` is a family ('rope_mixed'), a family with a block size ('liere8' for the
family 'liere' with 8 x 8 blocks) or an alias ('paper_rope_mixed' = liere2, declared by LieRE).
Importing this module imports every implementation (and so jax): their facts live with them.

  parse('comrope_ap4') == ('comrope_ap', 4); facts('liere8').positions == 'normalized'
"""
import re
from typing import Dict, Optional, Tuple

from liere_jax.encodings import absolute, commuting, liere, rope  # noqa: F401  They register.
from liere_jax.encodings.base import Facts, families

FAMILIES: Dict[str, Facts] = {family: cls.facts for family, cls in families().items()}
# alias -> (family, block): the names that are another family at a fixed block size.
ALIASES: Dict[str, Tuple[str, int]] = {
    alias: (f.family, block) for f in FAMILIES.values() for alias, (block, _) in f.aliases.items()}
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
  f = facts(name)
  if name in f.aliases:
    return f.aliases[name][1]
  _, block = parse(name)
  return f.label.format(b='' if block is None else block)
