"""Configuration: every field declared once, with its default and doc, beside its section's
checks and the frozen type the section resolves into.

  fields.py  Field and Section: the builders, field lists, upgrade and docs table read them
  model.py   config.model and config.model.pe: model_config, resolve -> ModelSpec
  data.py    config.data: data_config, resolve_data -> DataSpec
  run.py     the top-level fields and the whole config: base_config, upgrade, resolve -> RunSpec
"""
