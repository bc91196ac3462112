"""A workdir's config.json that cannot be read stops the run in one line that names the file
and the two ways out (a mutation survivor of checkpoint.read_config: docs/mutation.md)."""
import pytest

from liere_jax import checkpoint


def test_a_config_json_that_is_not_json_names_the_file_and_the_ways_out(tmp_path):
  path = tmp_path / checkpoint.CONFIG_FILE
  path.write_text('{"model": ')  # Cut short, as by a full disk.
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.read_config(str(tmp_path))
  message = str(e.value)
  assert '\n' not in message and message.startswith(f'{path} cannot be read (invalid JSON: ')
  assert message.endswith('Move it away to resume with the --config of the same model (a new '
                          'one is written), or use a new --workdir.'), message
