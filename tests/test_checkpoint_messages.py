"""What a damaged checkpoint tells the user, checked without training a run: one line, without
TensorStore's spec, naming the step and the file (mutation survivors: docs/mutation.md)."""
from liere_jax import checkpoint_damage


def test_an_error_s_first_line_drops_tensorstore_s_spec_and_orbax_s_advice():
  error = ValueError('Unable to read "/w/4/state/x": NOT_FOUND [tensorstore_spec={"driver": '
                     '"zarr"}]\nIf this mismatch is intentional, pass partial_restore=True.')
  assert checkpoint_damage._first_line(error) == 'Unable to read "/w/4/state/x": NOT_FOUND'


def test_a_step_whose_metrics_are_not_json_is_set_aside_with_a_one_line_warning(tmp_path,
                                                                                 caplog):
  for step, text in ((3, '{"loss": 1.0}'), (5, '{"loss": ')):
    (tmp_path / str(step) / 'metrics').mkdir(parents=True)
    (tmp_path / str(step) / 'metrics' / 'metrics').write_text(text)
  assert checkpoint_damage.set_aside_unreadable_metrics(str(tmp_path))
  assert checkpoint_damage.steps_in(tmp_path) == [3]
  lines = [r.getMessage() for r in caplog.records if 'cannot be read' in r.getMessage()]
  path = tmp_path / '5' / 'metrics' / 'metrics'
  assert len(lines) == 1 and '\n' not in lines[0], lines
  assert lines[0].startswith(f'Checkpoint step 5 cannot be read: {path}: invalid JSON ('), lines
  assert lines[0].endswith('.') and f'Moved it to {tmp_path / "5"}' in lines[0], lines
