"""Config files that cannot be used stop in one line naming the file (and, for a workdir's
config.json, the two ways out): mutation survivors of checkpoint.read_config and
convert.files.read_config_arg (docs/mutation.md)."""
import re

import pytest

from liere_jax import checkpoint
from liere_jax.convert import files


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
