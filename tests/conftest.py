"""Fixtures shared by the test modules."""
import pytest

from tests import helpers


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  """A workdir of the tiny arrows run (helpers.TINY_RUN) trained once per session by the real
  program, `python -m liere_jax.train`: 4 steps, checkpoints at steps 2 and 4.

  Read it only; a test that evaluates, resumes or damages the run works on
  `helpers.copy_run(tiny_run, tmp_path / 'run')`, and resuming it needs the same flags
  (helpers.run_tiny).
  """
  workdir = tmp_path_factory.mktemp('tiny_run') / 'run'
  rc, out = helpers.run_tiny('train', workdir, '--config.total_steps=4',
                             '--config.checkpoint_every=2')
  assert rc == 0, out
  return workdir
