"""What a run that was never interrupted ends with, computed in the test process, and what a
run's checkpoint holds: the references of the tests that stop a run (SIGTERM, SIGKILL) and
resume it, with one process or several.

The reference is the Trainer's steps from the run's own config.json, on one device per process
of the run, fed the 1-process data: batch k (step k + 1) is `train_dataset(...)[k]` with its
examples in the order a P-process run holds them (process p takes positions p, p + P, ...,
liere_jax/data/pipeline.py, and its devices come p-th on the 'data' axis). In the test process
this is bit-identical to `python -m liere_jax.train` on the same devices, so a stopped and
resumed run must equal it exactly; it also shows that the P per-process batches together are
the 1-process batch.
"""
import jax
import numpy as np
import orbax.checkpoint as ocp

from liere_jax import checkpoint, data, model_init, param_tree
from liere_jax.steps import Trainer, make_mesh
from liere_jax.checkpoint_damage import stored_target
from liere_jax.config import run as run_spec


def uninterrupted_state(workdir, steps: int, processes: int = 1, init=None) -> dict:
  """The train state (params in the checkpoints' layout, opt_state, step) after `steps` steps
  of the run in `workdir` on `processes` devices, from fresh parameters or from `init` (a
  --config.model_init source, as that run started)."""
  run = run_spec.resolve(checkpoint.read_config(str(workdir)), processes)
  trainer = Trainer(run, make_mesh(jax.devices()[:processes]))
  loop = trainer.run.loop
  if init is None:
    state = trainer.init_state(loop.seed)
  else:
    state = model_init.init_state(trainer, loop.seed, model_init.load(run, init))
  ds = data.train_dataset(trainer.run.data, global_batch_size=loop.batch_size, seed=loop.seed)
  order = np.concatenate([np.arange(p, loop.batch_size, processes) for p in range(processes)])
  for k in range(steps):
    batch = {key: np.asarray(value)[order] for key, value in ds[k].items()}
    state, _ = trainer.train_step(state, trainer.global_batch(batch))
  return jax.device_get(param_tree.to_loop_params(state))


def stored_state(workdir, step=None) -> dict:
  """The whole train state a run saved at `step` (default: its latest), as numpy arrays."""
  mngr = checkpoint.manager(str(workdir))
  try:
    step = mngr.latest_step() if step is None else step
    target = stored_target(mngr, step)
    state = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target))).state
  finally:
    mngr.close()
  return jax.device_get(state)


def _leaves(state) -> dict:
  """{('opt_state', '0', 'mu', 'blocks', '0', ...): array}: the paths of a state restored by
  Orbax (dicts, string indices) and of one computed here (namedtuples) alike."""
  def name(k):
    return str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))))
  return {tuple(map(name, path)): value
          for path, value in jax.tree_util.tree_leaves_with_path(state)}


def assert_same_state(expected: dict, got: dict):
  """Every leaf of two train states (parameters, Adam's moments and count, step) bit-equal."""
  want, have = _leaves(expected), _leaves(got)
  assert sorted(want) == sorted(have), sorted(set(want) ^ set(have))
  assert {k[0] for k in want} == {'params', 'opt_state', 'step'}, sorted({k[0] for k in want})
  for key, value in want.items():
    assert np.array_equal(np.asarray(value), np.asarray(have[key])), f"{'/'.join(key)} differs"
