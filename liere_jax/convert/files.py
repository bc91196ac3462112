"""The converters' files: a run's checkpoint -> an export file (+ its JSON), an export file ->
a params-only checkpoint that eval.py and checkpoint.load_params read.

Every check runs before anything is written, and each file is written under a temporary name
and renamed, so a failed conversion leaves no partial file. The model is resolved once, where
its stored description is read (a workdir's config.json, a model JSON); the layouts take the
ModelSpec.
"""
import io
import json
import os

import numpy as np

from liere_jax import checkpoint, paths
from liere_jax.config.model import resolve_stored
from liere_jax.convert import config_json
from liere_jax.convert.official_layout import from_official_layout, official_layout
from liere_jax.convert.torch_layout import fold_string_cayley, from_torch_layout, torch_layout


def json_path(path: str) -> str:
  """The JSON beside an export file: FILE.safetensors -> FILE.json (a URL too)."""
  return os.path.splitext(path)[0] + '.json'


def _check_out(path, suffix, flag='--out'):
  if not path.endswith(suffix):
    raise ValueError(f'{flag} {path} should end with {suffix}.')
  parent = paths.path(path).parent
  if not paths.is_url(path) and not parent.is_dir():  # A bucket has no folders to create.
    raise FileNotFoundError(f'{flag} {path}: the folder {parent} does not exist; create it.')


def _load_run(workdir, step, best):
  if not paths.path(workdir).is_dir():
    raise FileNotFoundError(f'--workdir {workdir} does not exist.')
  if best and step is not None:
    raise ValueError(f'--step {step} and --best both given; give one (or neither: the latest).')
  config, params, _ = checkpoint.load_params(workdir, step, best=best)
  return config, resolve_stored(config.model), params


def export_torch(workdir, out, step=None, best=False, fold=False):
  """A run's checkpoint (latest, `step` or the best) -> `out` (.safetensors, torch_vit layout)
  and its model JSON beside it; `fold` exports a string_cayley run as rope_mixed. Returns the
  two paths."""
  _check_out(out, '.safetensors')
  config, spec, params = _load_run(workdir, step, best)
  if fold:
    params, spec = fold_string_cayley(params, spec)
    config = config.copy_and_resolve_references()
    config.model.pe.name = spec.pe.name
  state = torch_layout(params, spec)
  meta = config_json.export_json(spec, config)
  from safetensors.numpy import save
  header = json.dumps({k: v for k, v in meta.items() if k != 'source_config'})
  paths.write(out, save(state, metadata={'format': 'pt', 'liere_jax': header}))
  config_json.write_json(json_path(out), meta)
  return out, json_path(out)


def export_official(workdir, out, step=None, best=False):
  """A run's checkpoint -> `out` (.pt, a state_dict the official RoPEViT loads with
  strict=True) and a JSON beside it with the RoPEViT keyword arguments. Returns the paths."""
  _check_out(out, '.pt')
  config, spec, params = _load_run(workdir, step, best)
  state, kw = official_layout(params, spec)
  import torch
  tensors = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}
  data = io.BytesIO()
  torch.save(tensors, data)
  paths.write(out, data.getvalue())
  config_json.write_json(json_path(out), {'rope_vit_kwargs': kw,
                                          'liere_model': config_json.export_json(spec, config)})
  return out, json_path(out)


def _check_out_workdir(out_workdir, spec):
  kept = paths.path(out_workdir) / 'checkpoints'
  if kept.is_dir() and any(kept.iterdir()):
    raise ValueError(f'--out_workdir {out_workdir} already holds checkpoints; use a new one.')
  checkpoint.check_same_model(out_workdir, spec)


def read_config_arg(value: str, flag: str = '--config'):
  """A model JSON given as a file path or inline (starting with '{') -> (a liere_jax config,
  its ModelSpec)."""
  if value.lstrip().startswith('{'):
    try:
      obj = json.loads(value)
    except json.JSONDecodeError as e:
      raise ValueError(f'{flag} is not valid JSON ({e}); give a JSON file or a JSON '
                       'object.') from None
    return config_json.config_from_json(obj, flag)
  return config_json.config_from_json(config_json.read_json(value, flag), f'{flag} {value}')


def import_torch(safetensors_path, out_workdir, config_path=None, step=0):
  """FILE.safetensors (torch_vit layout) -> a params-only checkpoint in `out_workdir`; the model
  from `config_path` (a path or inline JSON; default FILE.json). Returns (config, params)."""
  if not paths.path(safetensors_path).exists():
    raise FileNotFoundError(f'--safetensors {safetensors_path} does not exist.')
  config, spec = read_config_arg(config_path or json_path(safetensors_path))
  from safetensors.numpy import load
  params = from_torch_layout(load(paths.path(safetensors_path).read_bytes()), spec)
  _check_out_workdir(out_workdir, spec)
  checkpoint.save_params(out_workdir, config, params, step=step)
  return config, params


def load_official_state_dict(path) -> dict:
  """{name: np.ndarray} from an official FILE.pt or Lightning FILE.ckpt (its 'state_dict', the
  'model.' prefix dropped); read with torch.load(weights_only=True) only: no arbitrary
  unpickling."""
  import torch
  if not paths.path(path).exists():
    raise FileNotFoundError(f'--state_dict {path} does not exist.')
  try:
    obj = torch.load(io.BytesIO(paths.path(path).read_bytes()), map_location='cpu',
                     weights_only=True)
  except Exception as e:  # pickle.UnpicklingError and friends: refuse, never unpickle.
    raise ValueError(f'--state_dict {path} cannot be read with torch.load(weights_only=True) '
                     f'({type(e).__name__}): it is no plain state_dict of tensors, and this tool '
                     'never unpickles arbitrary objects.') from None
  if isinstance(obj, dict) and isinstance(obj.get('state_dict'), dict):
    obj = obj['state_dict']
  if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
    raise ValueError(f'--state_dict {path} is not a dict of tensors.')
  if obj and all(k.startswith('model.') for k in obj):
    obj = {k[len('model.'):]: v for k, v in obj.items()}
  return {k: v.detach().float().numpy() for k, v in obj.items()}


def import_official(state_dict_path, config, out_workdir, step=0):
  """An official state_dict -> a params-only checkpoint in `out_workdir`; the model from
  `config` (a path or inline JSON: any model JSON config_from_json reads). Returns (config,
  params)."""
  config, spec = read_config_arg(config)
  state = load_official_state_dict(state_dict_path)
  params = from_official_layout(state, spec)
  _check_out_workdir(out_workdir, spec)
  checkpoint.save_params(out_workdir, config, params, step=step)
  return config, params
