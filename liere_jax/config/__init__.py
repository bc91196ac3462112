"""Configuration: every field declared once, with its default and doc, beside its section's
checks and the frozen type the section resolves into. A config file (liere_jax/configs/*.py)
builds its config from the names this package exports:

  from liere_jax.config import base_config, data_config, model_config, parse_arg

  fields.py       Field and Section: the builders, field lists, upgrade and docs table read them
  model.py        config.model and config.model.pe: model_config, resolve -> ModelSpec
  data.py         config.data: data_config, resolve_data -> DataSpec
  datasets.py     the datasets data.name may name, with their constants
  timm_policy.py  timm's RandAugment policy strings (data.randaug_policy)
  run.py          the top-level fields and the whole config: base_config, upgrade, resolve -> RunSpec
  files.py        config files: load, parse_arg, and the command line's overrides (parse_flags)
"""
import importlib

# The names a config file uses, each from its module, imported on first use: a data worker that
# reads config.data or config.datasets imports neither jax nor the model section.
_EXPORTS = {'OFFICIAL_MODEL': 'model', 'model_config': 'model', 'data_config': 'data',
            'base_config': 'run', 'load': 'files', 'parse_arg': 'files', 'parse_flags': 'files',
            'unknown_override': 'files'}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f'liere_jax.config.{_EXPORTS[name]}'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(list(globals()) + list(_EXPORTS))
