"""Fixtures shared by the test modules."""
import pytest

from tests import helpers


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  """A workdir of the tiny arrows run (helpers.TINY) trained once per session in this process
  (helpers.train_tiny, one device, as `python -m liere_jax.train` on one device trains it): 4
  steps, checkpoints at steps 2 and 4.

  Read it only; a test that evaluates, resumes or damages the run works on
  `helpers.copy_run(tiny_run, tmp_path / 'run')`, and resuming it needs the same config
  (helpers.train_tiny, or helpers.run_tiny's flags).
  """
  workdir = tmp_path_factory.mktemp('tiny_run') / 'run'
  assert helpers.train_tiny(workdir, total_steps=4, checkpoint_every=2) is None
  return workdir
