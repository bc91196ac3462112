"""Config files (liere_jax/configs/*.py, or a user's own): loading one with its argument string
(`load('configs/x.py:pe=liere8')`), parsing that string (`parse_arg`), and the command line's
`--config.KEY=VALUE` overrides of it (`parse_flags`, `unknown_override`).
"""
import importlib.util
import re
from typing import Optional

import ml_collections


def parse_arg(arg: str, **defaults):
  """'pe=liere8,variant=B' -> ConfigDict over `defaults` (values take the defaults' types)."""
  cfg = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    if not sep or key not in defaults:
      raise ValueError(f'Config argument {item!r} is not one of {sorted(defaults)} '
                       '(write key=value pairs separated by commas).')
    default = defaults[key]
    if isinstance(default, bool):
      value = value.lower() in ('1', 'true', 'yes')
    elif default is not None:
      value = type(default)(value)
    cfg[key] = value
  return cfg


def load(spec: str) -> ml_collections.ConfigDict:
  """'configs/x.py[:args]' -> the config that file's get_config(args) returns."""
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('liere_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def unknown_override(config: ml_collections.ConfigDict, key: str) -> Optional[str]:
  """For an override --config.KEY: None if KEY names a field, else one line naming the first
  unknown part of KEY and the valid fields of its section."""
  section, where = config, 'config'
  for part in key.split('.'):
    if not isinstance(section, ml_collections.ConfigDict) or part not in section:
      fields = sorted(section.keys()) if isinstance(section, ml_collections.ConfigDict) else []
      return (f'--config.{key}: {where} has no field {part!r}; its fields are {fields}.'
              if fields else f'--config.{key}: {where} is a value, not a section.')
    section, where = section[part], f'{where}.{part}'
  return None


def parse_flags(argv):
  """absl flags parser for the programs (command.run(main, tool, flags_parser=parse_flags)): an
  override of a key the config lacks raises a flags.Error of one line naming it and its
  section's fields, which command.run prints as the tool's refusal."""
  from absl import flags
  try:
    return flags.FLAGS(argv)
  except Exception:  # ml_collections raises AttributeError / KeyError from inside parsing.
    spec = next((a.split('=', 1)[1] if '=' in a else argv[i + 1]
                 for i, a in enumerate(argv) if re.fullmatch(r'--?config(=.*)?', a)
                 and ('=' in a or i + 1 < len(argv))), None)
    keys = [a.lstrip('-').split('=', 1)[0].split('.', 1)[1] for a in argv
            if re.match(r'--?config\.', a)]
    if spec:
      config = load(spec)
      problems = [p for p in map(lambda k: unknown_override(config, k), keys) if p]
      if problems:
        raise flags.Error(problems[0]) from None
    raise
