"""Converters between liere_jax runs and PyTorch: our port (liere_jax/torch_vit.py) and the
official StanfordMIMI/LieRE layout, both ways. The command line is `python -m
liere_jax.convert ACTION` (see __main__.py); the same in Python:

  export_torch(workdir, 'model.safetensors')       # + model.json, for torch_vit.ViT
  export_official(workdir, 'model.pt')              # + model.json with the RoPEViT kwargs
  import_torch('model.safetensors', out_workdir)    # a params-only checkpoint
  import_official('model.pt', 'model.json', out_workdir)

The layouts take a ModelSpec (liere_jax.config.model.resolve(config.model)); the files resolve
the model once, where they read its description.

Modules: config_json (the model JSON, read and written), tree (key checks over
liere_jax.param_tree), torch_layout (the port's layout, STRING folding), official_args and
official_layout (the official model's arguments and state_dict), pape_layout (the official
PaPE classifiers' description and state_dict, imported), files (the export and import files).
"""
from liere_jax.convert.config_json import (FORMAT, config_from_json, export_json, read_json,
                                           write_json)
from liere_jax.convert.files import (export_official, export_torch, import_official,
                                     import_torch, json_path, load_official_state_dict)
from liere_jax.convert.official_layout import (Layer0BugWarning, from_official_layout,
                                               official_layout)
from liere_jax.convert.official_args import (model_from_official, official_spec,
                                             rope_vit_kwargs)
from liere_jax.convert.pape_layout import from_pape_layout, pape_model
from liere_jax.convert.torch_layout import fold_string_cayley, from_torch_layout, torch_layout
from liere_jax.convert.tree import abstract_params, check_keys
from liere_jax.param_tree import flatten, unflatten_like
