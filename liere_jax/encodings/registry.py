"""The encodings by name: what each family declared at its registration (`base.register`), read
without importing jax (config checks, docs and data tools need the names, not the classes).

A `model.pe.name` is a family ('rope_mixed'), a family with a block size ('liere8' for the
family 'liere' with 8 x 8 blocks) or an alias ('paper_rope_mixed' = liere2, declared by LieRE).
The facts are the literal arguments of each `@register('family', ...)` in MODULES, read from
their source; `register` checks, when a class is imported, that they are the facts it gives.
An encoding declares its model.pe options there too, each once (`Option`: name, default, doc,
the value of runs stored before it existed): liere_jax.config.model makes them model.pe's
fields and the resolved PESpec's, and the encoding gets their values (PESpec.options).

  parse('comrope_ap4') == ('comrope_ap', 4); facts('liere8').positions == 'normalized'
"""
import ast
import dataclasses
import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

# The modules that define the encodings, in registration order (a new one is added here).
MODULES = ('absolute', 'rope', 'liere', 'commuting', 'pape')


NEW = '<in every stored config>'  # Option.added of an option runs were always stored with.


@dataclasses.dataclass(frozen=True)
class Option:
  """A model.pe option of an encoding, declared once in its `@register(..., options=...)`."""
  name: str  # model.pe.<name>; the encoding's __init__ takes it as a keyword of that name.
  default: Any  # What a config a user writes gets (and a stored one, where not `added`).
  doc: str  # One line: what it is, its values (config.model prefixes the readers: 'LieRE: ').
  added: Any = NEW  # The value of runs stored before the option existed (config.fields.Field).


@dataclasses.dataclass(frozen=True)
class Facts:
  """What the rest of the library needs to know about an encoding family."""
  family: str  # 'liere', 'comrope_ap', 'rope_mixed', ...
  label: str  # Report label; '{b}' stands for the block size.
  blocks: bool = False  # Names are family<b> (liere8, comrope_ld4, ...).
  min_block: int = 2  # The smallest block size b.
  positions: str = 'integer'  # Default position mode (liere_jax.positions.MODES).
  reads_positions: bool = True  # False: the encoding ignores token positions (and jitter).
  options: Tuple[Option, ...] = ()  # model.pe options it reads besides name, positions, jitter.
  official: bool = False  # Converts to / from the official LieRE code's checkpoint layout.
  # 'rotary': rotates q and k (it can come first in a composition 'a+b'); 'lift': adds channels
  # to q and k (PaPE; second in 'a+b': rotate, then lift).
  composes: str = ''
  # Names that are this family at a fixed block size: alias -> (block, report label).
  aliases: Mapping[str, Tuple[int, str]] = dataclasses.field(default_factory=dict)

  @property
  def option_names(self) -> Tuple[str, ...]:
    return tuple(o.name for o in self.options)


def _literal(node):
  """The value of a literal, where an `Option(...)` of literals may stand for a value."""
  if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'Option':
    return Option(*map(_literal, node.args), **{k.arg: _literal(k.value) for k in node.keywords})
  if isinstance(node, ast.Tuple):
    return tuple(map(_literal, node.elts))
  return ast.literal_eval(node)


def _declared(module: str):
  """The Facts of every `@register(...)` on a class of encodings/<module>.py, in source order."""
  path = os.path.join(os.path.dirname(__file__), module + '.py')
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in tree.body:
    for deco in getattr(node, 'decorator_list', ()):
      if isinstance(deco, ast.Call) and getattr(deco.func, 'id', None) == 'register':
        yield Facts(*map(_literal, deco.args),
                    **{k.arg: _literal(k.value) for k in deco.keywords})


FAMILIES: Dict[str, Facts] = {f.family: f for module in MODULES for f in _declared(module)}
# alias -> (family, block): the names that are another family at a fixed block size.
ALIASES: Dict[str, Tuple[str, int]] = {
    alias: (f.family, block) for f in FAMILIES.values() for alias, (block, _) in f.aliases.items()}
NAMES: Tuple[str, ...] = tuple(
    f.family + ('<b>' if f.blocks else '') for f in FAMILIES.values()) + tuple(ALIASES)
BLOCK_FAMILIES = tuple(f.family for f in FAMILIES.values() if f.blocks)


def options() -> Dict[str, Tuple[Option, Tuple[str, ...]]]:
  """name -> (its Option, the families that read it) over every family, in declaration order;
  two families that read one option declare it alike."""
  out = {}
  for f in FAMILIES.values():
    for o in f.options:
      if o.name in out and out[o.name][0] != o:
        raise ValueError(f'model.pe.{o.name} is declared otherwise by {f.family} than by '
                         f'{out[o.name][1][0]} ({o} != {out[o.name][0]}); declare it alike.')
      out[o.name] = (o, out.get(o.name, (o, ()))[1] + (f.family,))
  return out


def split(name: str) -> Tuple[str, ...]:
  """The parts of a composed name ('liere8+pape' -> ('liere8', 'pape')), or (name,)."""
  return tuple(name.split('+'))


def parse(name: str) -> Tuple[str, Optional[int]]:
  """(family, block) of a model.pe.name: 'liere8' -> ('liere', 8), 'paper_rope_mixed' ->
  ('liere', 2), 'liere8+pape' -> ('liere+pape', 8) (the block is the rotary part's); any other
  name is its own family with block None."""
  if '+' in name:
    composed(name)  # Refuses what is not a rotary encoding and a lift.
    (rotary, block), (lift, _) = map(parse, split(name))
    return f'{rotary}+{lift}', block
  if name in ALIASES:
    return ALIASES[name]
  m = re.fullmatch(r'(%s)(\d+)' % '|'.join(BLOCK_FAMILIES), name)
  return (m.group(1), int(m.group(2))) if m else (name, None)


def facts(name: str) -> Facts:
  """The Facts of a model.pe.name (or of a family name); a composed name's are its parts'
  (`composed`)."""
  if '+' in name:
    return composed(name)
  family, _ = parse(name)
  if family not in FAMILIES:
    raise ValueError(f'model.pe.name={name!r} is unknown; use one of {NAMES} '
                     '(e.g. pe=liere8 or pe=rope_mixed).')
  return FAMILIES[family]


def composed(name: str) -> Facts:
  """The Facts of 'a+b', a rotary encoding a then a lift b ('liere8+pape'): a's blocks and
  positions, both parts' options; refused in one line unless a rotates and b lifts."""
  parts = split(name)
  ok = len(parts) == 2 and all(parts)
  rotary, lift = (facts(p) for p in parts) if ok else (None, None)
  if not ok or rotary.composes != 'rotary' or lift.composes != 'lift':
    rotaries = ', '.join(f.family + '<b>' * f.blocks for f in FAMILIES.values()
                         if f.composes == 'rotary')
    lifts = ', '.join(f.family for f in FAMILIES.values() if f.composes == 'lift')
    raise ValueError(f'model.pe.name={name!r}: a composition is a rotary encoding, then a lift '
                     f'(rotary: {rotaries}; lift: {lifts}), e.g. liere8+pape.')
  options = {o.name: o for o in rotary.options + lift.options}
  return Facts(f'{rotary.family}+{lift.family}', f'{rotary.label}+{lift.label}',
               blocks=rotary.blocks, min_block=rotary.min_block, positions=rotary.positions,
               options=tuple(options.values()))


def label(name: str) -> str:
  """The report label of a model.pe.name: 'LieRE8', 'RoPE-Mixed (paper: LieRE2)',
  'LieRE8+PaPE'."""
  if '+' in name:
    return '+'.join(map(label, split(name)))
  f = facts(name)
  if name in f.aliases:
    return f.aliases[name][1]
  _, block = parse(name)
  return f.label.format(b='' if block is None else block)
