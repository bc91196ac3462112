"""A run's inputs that cannot be used (config files, checkpoints, an encoding's name) stop in
one line naming what is wrong (for a workdir's config.json, the file and the two ways out):
mutation survivors of checkpoint.read_config, convert.files.read_config_arg,
convert.tree.check_params and encodings.registry.facts (docs/mutation.md)."""
import re

import jax
import numpy as np
import pytest

from liere_jax import checkpoint, convert, encodings
from liere_jax.convert import files, tree
from tests.helpers import tiny_spec


def test_a_config_json_that_is_not_json_names_the_file_and_the_ways_out(tmp_path):
  path = tmp_path / checkpoint.CONFIG_FILE
  path.write_text('{"model": ')  # Cut short, as by a full disk.
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.read_config(str(tmp_path))
  message = str(e.value)
  assert '\n' not in message and message.startswith(f'{path} cannot be read (invalid JSON: ')
  assert message.endswith('Move it away to resume with the --config of the same model (a new '
                          'one is written), or use a new --workdir.'), message


def test_a_model_json_that_is_no_object_is_named_by_its_flag_and_path(tmp_path):
  path = tmp_path / 'model.json'
  path.write_text('[1, 2]')
  with pytest.raises(ValueError, match=re.escape(f'--config {path} is not a JSON object.')):
    files.read_config_arg(str(path))


def test_a_checkpoint_missing_a_parameter_is_named_as_the_checkpoint():
  model = tiny_spec('liere8')
  params = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), convert.abstract_params(model))
  del params['head']['bias']
  with pytest.raises(ValueError, match=re.escape(
      "The checkpoint does not match the model config: missing key 'head/bias'.")):
    tree.check_params(params, model)


def test_a_checkpoint_with_one_unexpected_parameter_is_refused_naming_it_alone():
  model = tiny_spec('liere8')
  params = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), convert.abstract_params(model))
  params['head']['extra'] = np.zeros(3, np.float32)
  with pytest.raises(ValueError, match=re.escape(
      "The checkpoint does not match the model config: unexpected key 'head/extra'.")):
    tree.check_params(params, model)


def test_an_unknown_encoding_name_lists_the_known_ones_with_two_examples():
  with pytest.raises(ValueError) as e:
    encodings.facts('liere_typo8')
  message = str(e.value)
  assert message.startswith("model.pe.name='liere_typo8' is unknown; use one of ")
  assert message.endswith(' (e.g. pe=liere8 or pe=rope_mixed).'), message
  assert all(name in message for name in encodings.NAMES)
