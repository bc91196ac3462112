"""A config field declared once: its name, default, one-line doc and, for a field added after
runs were written, the value that reproduces those runs. The ConfigDict builders, the field
lists, the filling of a read section's missing fields and the docs table all read these
declarations.

What a missing field means is decided here only (`Section.upgrade`): in a section that a run
stored, the field was added since and takes the value that reproduces the run (`added`, where it
applies); in a section a user wrote, it takes its default.

  MODEL = Section('model', [Field('width', 0, 'Token width; 0 = the variant's.'), ...])
  MODEL.build(width=32) -> ConfigDict; MODEL.names; MODEL.upgrade(obj, MODEL.stored(obj)) -> dict
  Field('qkv_bias', True, '...', plain=True): ModelSpec.qkv_bias, resolved from the declaration.
"""
import dataclasses
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import ml_collections

REQUIRED = object()  # A field every builder call must give (no default).
NEW = object()  # `added` of a field every stored config has.


@dataclasses.dataclass(frozen=True)
class Field:
  name: str
  default: Any  # REQUIRED, a value, or a Section (a nested section).
  doc: str  # One line: what it is, its values, what 0 / None means.
  added: Any = NEW  # Stored configs written before the field existed get it (Section.upgrade).
  kind: Optional[type] = None  # The type of a None or REQUIRED default.
  # A plain field: the resolved spec has it as it is (as its type, one of `choices` if given),
  # derived from this declaration (Section.spec_fields / resolve_plain): declaring it is all it
  # takes to reach the spec. True, or the name of the spec it goes to where a section resolves
  # into several (the run's 'loop' and 'optimizer'). Fields resolve computes are not plain.
  plain: Any = False
  choices: Tuple[Any, ...] = ()

  @property
  def type(self) -> type:
    return self.kind or type(self.default)

  def resolve(self, value, where: str):
    """A plain field's value as its type, refused (naming the value and the choices) if it is
    not one of them."""
    if self.type in (bool, int, float):
      value = self.type(value)
    if self.choices and value not in self.choices:
      raise ValueError(f'{where}.{self.name}={value!r} is unknown; use one of {self.choices}.')
    return value


@dataclasses.dataclass(frozen=True)
class Section:
  """The fields of one config section (`where`: 'model', 'model.pe', 'data', '' = the top).
  `applies(name, stored_section)`: whether field `name`'s `added` value means something to that
  section (an encoding option does only to the encodings that read it); where not, the default
  reproduces the run."""
  where: str
  fields: Tuple[Field, ...]
  applies: Callable[[str, Dict[str, Any]], bool]

  def __init__(self, where: str, fields: Sequence[Field], applies=lambda name, section: True):
    object.__setattr__(self, 'where', where)
    object.__setattr__(self, 'fields', tuple(fields))
    object.__setattr__(self, 'applies', applies)

  @property
  def names(self) -> Tuple[str, ...]:
    return tuple(f.name for f in self.fields)

  def __getitem__(self, name: str) -> Field:
    return next(f for f in self.fields if f.name == name)

  def build(self, **values) -> ml_collections.ConfigDict:
    """The section with every field at its default, `values` over them; nested sections are
    built from their own defaults unless given."""
    unknown = sorted(set(values) - set(self.names))
    if unknown:
      raise ValueError(f'{self.where or "config"} has no field {unknown[0]!r}; its fields are '
                      f'{list(self.names)}.')
    c = ml_collections.ConfigDict()
    for f in self.fields:
      if f.name in values:
        c[f.name] = values[f.name]
      elif isinstance(f.default, Section):
        c[f.name] = f.default.build()
      elif f.default is REQUIRED:
        raise TypeError(f'{self.where or "config"}.{f.name} has no default; give it.')
      elif f.default is None:
        c[f.name] = ml_collections.config_dict.placeholder(f.kind)
      else:
        c[f.name] = f.default
    return c

  def stored(self, section: Dict[str, Any]) -> bool:
    """Whether plain dict `section` reads as one a run stored: it holds every field that every
    stored section holds (those without `added`). A section a user writes names fewer."""
    return all(f.name in section for f in self.fields if f.added is NEW)

  def upgrade(self, section: Dict[str, Any], stored: bool = True) -> Dict[str, Any]:
    """`section` (plain dict) with its missing fields filled, nested sections likewise: if a run
    `stored` it, those added since it was written get the values that reproduce it (`added`;
    the default where that does not apply); if a user wrote it, every field with a default gets
    that default. Fields it has are left as they are; required ones (and, in a stored section,
    those every stored one has) stay missing for the checks to name."""
    out = dict(section)
    for f in self.fields:
      if isinstance(f.default, Section):
        if isinstance(out.get(f.name), dict):
          out[f.name] = f.default.upgrade(out[f.name], stored)
      elif f.name in out or f.default is REQUIRED or (stored and f.added is NEW):
        continue
      elif stored and self.applies(f.name, section):
        out[f.name] = f.added
      else:
        out[f.name] = f.default
    return out

  def spec_fields(self, spec: Any = True):
    """[(name, type)] of the plain fields (of `spec`): a resolved spec's attributes
    (dataclasses.make_dataclass)."""
    return [(f.name, f.type) for f in self.fields if f.plain == spec]

  def resolve_plain(self, section: Dict[str, Any], spec: Any = True) -> Dict[str, Any]:
    """{name: resolved value} of the plain fields (of `spec`) of `section`."""
    return {f.name: f.resolve(section[f.name], self.where) for f in self.fields
            if f.plain == spec}

  def added(self) -> Dict[str, Any]:
    """{name: value for stored configs} of the fields added since runs were written."""
    return {f.name: f.added for f in self.fields if f.added is not NEW}

  def defaults(self) -> Dict[str, Any]:
    """{name: default} of the fields that have one (no nested sections)."""
    return {f.name: f.default for f in self.fields
            if f.default is not REQUIRED and not isinstance(f.default, Section)}

  def table(self) -> str:
    """The fields as Markdown table rows: | `where.name` | default | doc |."""
    rows = []
    for f in self.fields:
      if isinstance(f.default, Section):
        rows.append(f.default.table())
        continue
      key = f'{self.where}.{f.name}' if self.where else f.name
      default = 'required' if f.default is REQUIRED else f'`{f.default!r}`'
      rows.append(f'| `{key}` | {default} | {f.doc} |')
    return '\n'.join(rows)
