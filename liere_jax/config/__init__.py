"""Configuration: every field declared once, with its default and doc, by section.

  fields.py  Field and Section: the builders, field lists, upgrade and docs table read them
  model.py   config.model and config.model.pe (model_config)
  data.py    config.data (data_config)
  run.py     the top-level fields and the whole config (base_config, upgrade)
The checks live with the resolved types: liere_jax/spec.py (ModelSpec), liere_jax/data/spec.py
(DataSpec), liere_jax/run_spec.py (RunSpec).
"""
