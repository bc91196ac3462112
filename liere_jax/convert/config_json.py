"""The model JSON of the converters: the one we write beside an export, and every shape of
model description we read back into a liere_jax config.

`config_from_json` reads (and resolves: a program's edge, where a stored model comes in)
  - ours: the JSON beside a torch export (`format: liere_jax.torch_vit`: the resolved model plus
    the run's `source_config`), or beside an official export (the same under `liere_model`);
  - a workdir's config.json, or a plain model section;
  - the official model's description: its RoPEViT keyword arguments, or a
    LiereImageClassification's init_args (the `model` section of its lightning_conf YAML).
A model a run wrote before a field existed gets the value that reproduces it (the fields'
`added` values, liere_jax/config/); a model section a user wrote gets today's defaults.
"""
import json
from typing import Tuple

import ml_collections

from liere_jax import paths
from liere_jax.config import model as model_spec
from liere_jax.config.model import MODEL
from liere_jax.config.run import RUN, upgrade
from liere_jax.convert import official_args

FORMAT = 'liere_jax.torch_vit'


def export_json(spec: model_spec.ModelSpec, config: ml_collections.ConfigDict) -> dict:
  """The JSON beside a torch export: the model's fields (what torch_vit.ViT needs, ModelSpec
  `spec`) and the run's whole config (`spec` resolved from its model section)."""
  return {'format': FORMAT, 'version': 1, **spec.to_json(),
          'source_config': json.loads(config.to_json())}


def _model_section(obj: dict, stored: bool) -> ml_collections.ConfigDict:
  """A plain model section (JSON) over model_config's defaults; if a run `stored` it, the fields
  added since it was written at their old values."""
  from liere_jax.config import model_config
  try:
    m = model_config(pe=obj['pe']['name'], variant=obj.get('variant') or '',
                     patch=tuple(obj['patch']), input_size=tuple(obj['input_size']),
                     channels=obj['channels'], num_classes=obj['num_classes'])
  except (KeyError, TypeError) as e:
    raise ValueError(f'The model section lacks the field {e}; write it with '
                     'liere_jax.config.model.resolve(config.model).to_json().') from None
  # Derived fields (head_dim, ...) are skipped.
  for key, value in MODEL.upgrade(obj, stored).items():
    if key == 'pe':
      for k, v in value.items():
        if k in m.pe:
          m.pe[k] = v
    elif key in m:
      m[key] = tuple(value) if isinstance(value, list) else value
  return m


def _is_official(obj: dict) -> bool:
  model = obj.get('model')
  return ('model_architecture' in obj or 'rope_vit_kwargs' in obj or
          'positional_encoding_type' in obj or
          (isinstance(model, dict) and isinstance(model.get('init_args'), dict)))


def _from_official(obj: dict) -> ml_collections.ConfigDict:
  model = obj.get('model')
  if isinstance(model, dict) and isinstance(model.get('init_args'), dict):
    kw = official_args.rope_vit_kwargs(model['init_args'])
  elif 'model_architecture' in obj:
    kw = official_args.rope_vit_kwargs(obj)
  else:
    kw = obj.get('rope_vit_kwargs', obj)
  return ml_collections.ConfigDict({'model': official_args.model_from_official(kw)})


def _from_ours(obj: dict, what: str) -> ml_collections.ConfigDict:
  if not obj.get('source_config'):
    return ml_collections.ConfigDict({'model': _model_section(obj, stored=True)})
  source = dict(obj['source_config'])
  if not isinstance(source.get('model'), dict) or 'pe' not in source['model']:
    raise ValueError(f'{what}: source_config has no model section; remove source_config.')
  return ml_collections.ConfigDict(upgrade(source))


def _check_source(obj: dict, spec: model_spec.ModelSpec, what: str):
  """The model fields of our export JSON `obj` agree with `spec`, its source_config's."""
  found = json.loads(json.dumps(spec.to_json()))
  ours = json.loads(json.dumps(MODEL.upgrade(obj)))
  wanted = {k: ours[k] for k in found if k in ours}
  diff = [k for k in wanted if found[k] != wanted[k]]
  if diff:
    raise ValueError(f'{what}: field {diff[0]!r} = {wanted[diff[0]]!r} disagrees with its '
                     f'source_config ({found[diff[0]]!r}); fix or remove source_config.')


def config_from_json(obj: dict, what: str
                     ) -> Tuple[ml_collections.ConfigDict, model_spec.ModelSpec]:
  """(a liere_jax config, at least its `model` section, and that section's ModelSpec) from any
  model JSON this module reads; `what` names the source in errors."""
  if not isinstance(obj, dict):
    raise ValueError(f'{what} is not a JSON object.')
  if 'liere_model' in obj:  # The JSON beside an official export.
    obj = obj['liere_model']
  if _is_official(obj):
    config = _from_official(obj)
  elif obj.get('format') == FORMAT:
    config = _from_ours(obj, what)
  elif isinstance(obj.get('model'), dict) and 'pe' in obj['model']:
    config = ml_collections.ConfigDict(upgrade(obj, RUN.stored(obj)))
  elif 'patch' in obj and 'pe' in obj:
    config = ml_collections.ConfigDict({'model': _model_section(obj, MODEL.stored(obj))})
  else:
    raise ValueError(f'{what} is neither an exported model JSON, a liere_jax config.json, a '
                     'model section nor an official model description (no "model", "patch", '
                     '"pe" or "positional_encoding_type" field).')
  spec = model_spec.resolve(config.model)
  if obj.get('format') == FORMAT and obj.get('source_config'):
    _check_source(obj, spec, what)
  return config, spec


def read_json(path: str, what: str) -> dict:
  """The JSON object in file `path`; FileNotFoundError / ValueError naming `what` and path."""
  if not paths.path(path).exists():
    raise FileNotFoundError(f'{what} {path} does not exist.')
  try:
    return paths.read_json(path)
  except json.JSONDecodeError as e:
    raise ValueError(f'{what} {path} is not valid JSON: {e}') from None


def write_json(path: str, obj):
  """`obj` as indented JSON at `path`, whole (paths.write)."""
  paths.write(path, json.dumps(obj, indent=1, sort_keys=True))
