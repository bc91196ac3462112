"""Formats we do not own, read from files we did not write (issue 31): a .safetensors file
written from the published specification (tests/foreign_formats.py) loads in JAX
(`model_init`, `convert from_torch`) and in the PyTorch port; our own export decodes under that
specification. The official Lightning `.ckpt` in Lightning's full layout:
test_official_fixtures.py and test_model_init.py. TFDS array_record datasets written by TFDS
and grain's readers, and the raw downloads (CIFAR-100's binary tarball from its published row
layout, ImageNet's tars, UCF101's .avi from ffmpeg): test_prepare.py and test_data.py."""
import json

import jax
import numpy as np
import pytest

from liere_jax import checkpoint, convert, model_init
from liere_jax.config import run as run_spec
from liere_jax.config.model import resolve
from liere_jax.convert import __main__ as convert_cli
from tests import foreign_formats
from tests.helpers import tiny_run_config


def _random_params(config, seed=0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32),
                      convert.abstract_params(resolve(config.model)))


def test_a_safetensors_file_written_from_the_specification_loads_in_jax_and_in_torch(tmp_path):
  torch_vit = pytest.importorskip('liere_jax.torch_vit')
  config = tiny_run_config(pe='liere8', width=32, heads=2)
  params = _random_params(config)
  spec = resolve(config.model)
  state = convert.torch_layout(params, spec)
  path = str(tmp_path / 'model.safetensors')
  foreign_formats.write_safetensors(path, state, metadata={'format': 'pt'})
  convert.write_json(str(tmp_path / 'model.json'), convert.export_json(spec, config))
  want = convert.flatten(params)
  # --config.model_init=FILE.safetensors
  loaded = model_init.load(run_spec.resolve(config, 1), path)
  assert loaded.keys() == want.keys()
  for key, value in want.items():
    np.testing.assert_array_equal(loaded[key], value, err_msg=str(key))
  assert convert_cli.call(['from_torch', '--safetensors', path,
                           '--out_workdir', str(tmp_path / 'run')]) == 0
  imported = convert.flatten(checkpoint.load_params(str(tmp_path / 'run'))[1])
  for key, value in want.items():
    np.testing.assert_array_equal(imported[key], value, err_msg=str(key))
  ported = torch_vit.load_liere_safetensors(path).state_dict()
  for name, value in state.items():
    np.testing.assert_array_equal(ported[name].numpy(), value, err_msg=name)


def test_our_safetensors_export_decodes_under_the_specification_with_the_run_s_json(tmp_path):
  config = tiny_run_config(pe='rope_mixed', width=32, heads=2)
  params = _random_params(config, 1)
  run = str(tmp_path / 'run')
  checkpoint.save_params(run, config, params)
  out = str(tmp_path / 'model.safetensors')
  convert.export_torch(run, out)
  tensors, metadata = foreign_formats.read_safetensors(out)
  state = convert.torch_layout(params, resolve(config.model))
  assert tensors.keys() == state.keys()
  for name, value in state.items():
    np.testing.assert_array_equal(tensors[name], value, err_msg=name)
  assert metadata['format'] == 'pt'  # What safetensors.torch.load_file expects of a torch file.
  with open(str(tmp_path / 'model.json')) as f:
    beside = json.load(f)
  assert json.loads(metadata['liere_jax']) == {k: v for k, v in beside.items()
                                               if k != 'source_config'}
  again, _ = convert.config_from_json(beside, 'model.json')  # The whole run, not just its model.
  fields = lambda c: (c.data.name, c.data.grid, c.batch_size, c.total_steps, c.lr)
  assert fields(again) == fields(config)
