"""Checkpoints with Orbax: atomic, asynchronous, latest N plus the best by eval accuracy.

Layout of a workdir:
  config.json                      the full config of the run (a resumed run must match it)
  checkpoints/<step>/state         params, opt_state, step   (StandardSave)
  checkpoints/<step>/meta          {"step", "data_position", "seed", ...} (JSON)
  best/<step>/...                  the same items for the best eval accuracy so far
Orbax writes each step to a temporary directory and renames it when complete, so a run killed
at any moment leaves only whole checkpoints. The RNG is a pure function of (seed, step) and the
data position is the step (batches are `train_ds[step]`), so (state, meta) is all of a run.
"""
import json
import os
from typing import Optional

import jax
import ml_collections
import orbax.checkpoint as ocp

from liere_jax import spec as spec_lib

CONFIG_FILE = 'config.json'


def config_to_json(config: ml_collections.ConfigDict) -> str:
  return config.to_json(sort_keys=True, indent=1)


def read_config(workdir: str) -> Optional[ml_collections.ConfigDict]:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    config = _tuples(json.load(f))
  if 'pe' in config.get('model', {}):  # Fields added since the run was written.
    config['model'] = {**spec_lib.MODEL_ADDED, **config['model']}
    config['model']['pe'] = {**spec_lib.PE_ADDED, **config['model']['pe']}
  if 'data' in config:
    from liere_jax.data import pipeline  # Late: reading a config needs no TFDS otherwise.
    config['data'] = {**pipeline.DATA_ADDED, **config['data']}
  return ml_collections.ConfigDict(config)


def _tuples(x):
  return {k: _tuples(v) for k, v in x.items()} if isinstance(x, dict) else (
      tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x)


def _leaves(tree, prefix=''):
  """{'model.pe.name': value, ...} of a nested dict."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  return {k: v for key, sub in tree.items() for k, v in _leaves(sub, f'{prefix}.{key}'
                                                              if prefix else key).items()}


def has_checkpoint(workdir: str) -> bool:
  path = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(path) and any(d.isdigit() for d in os.listdir(path))


def check_same_model(workdir: str, config: ml_collections.ConfigDict):
  """Raises if `workdir` holds a checkpoint of a different model (before anything is written).

  A workdir without a checkpoint (a run that failed before its first save) takes any config.
  """
  old = read_config(workdir)
  if old is None or not has_checkpoint(workdir):
    return
  new = _leaves(_tuples(json.loads(config_to_json(config)))['model'], 'model')
  old = _leaves(_tuples(old.to_dict())['model'], 'model')
  diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
  if diff:
    raise ValueError(
        f'--workdir {workdir} holds a run of a different model ({diff[0]}: '
        f'{old.get(diff[0])!r} there, {new.get(diff[0])!r} now). Use a new --workdir, or the '
        f'config of that run (--config.{diff[0]}={old.get(diff[0])!r}) to resume it.')


def write_config(workdir: str, config: ml_collections.ConfigDict):
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    tmp = os.path.join(workdir, CONFIG_FILE + '.tmp')
    with open(tmp, 'w') as f:
      f.write(config_to_json(config))
    os.replace(tmp, os.path.join(workdir, CONFIG_FILE))


def manager(workdir: str, name: str = 'checkpoints', keep: int = 2,
            best: bool = False) -> ocp.CheckpointManager:
  """`checkpoints/` keeps the latest `keep` steps; `best/` keeps the best one by accuracy."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=1 if best else keep, create=True, enable_async_checkpointing=True,
      best_fn=(lambda m: m['accuracy']) if best else None, best_mode='max')
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, name)), options=options,
      item_handlers={'state': ocp.StandardCheckpointHandler(),
                     'meta': ocp.JsonCheckpointHandler()})


def save(mngr: ocp.CheckpointManager, step: int, state, meta: dict, metrics=None):
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          meta=ocp.args.JsonSave(meta)), metrics=metrics)


def restore(mngr: ocp.CheckpointManager, abstract_state, step: Optional[int] = None):
  """(state, meta) at `step` (default: latest), placed like `abstract_state` (shardings)."""
  step = mngr.latest_step() if step is None else step
  out = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
  return out.state, out.meta


def load_params(workdir: str, step: Optional[int] = None, best: bool = False):
  """(config, params, step) from a run's latest / given / best checkpoint.

  Works for training checkpoints and params-only (imported) ones alike.
  """
  config = read_config(workdir)
  if config is None:
    raise FileNotFoundError(f'{workdir} has no {CONFIG_FILE}: not a liere_jax workdir.')
  mngr = manager(workdir, 'best' if best else 'checkpoints', best=best)
  steps = mngr.all_steps()
  if not steps:
    raise FileNotFoundError(f'{workdir} has no checkpoint yet; train first (train.py).')
  if step is None:
    step = mngr.best_step() if best else mngr.latest_step()
  if step not in steps:
    raise ValueError(f'--step {step} is not in {workdir}; available: {sorted(steps)}.')
  # Restore onto this process's first device whatever topology wrote the checkpoint.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        mngr.item_metadata(step)['state'])
  item = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
  mngr.close()
  return config, _int_keys(item.state['params']), step


def _int_keys(tree):
  """Orbax returns the layer indices of `blocks` as strings; the model's tree uses ints."""
  if not isinstance(tree, dict):
    return tree
  return {int(k) if isinstance(k, str) and k.isdigit() else k: _int_keys(v)
          for k, v in tree.items()}


def save_params(workdir: str, config: ml_collections.ConfigDict, params, step: int = 0):
  """A params-only checkpoint (e.g. imported weights) that eval.py and load_params read."""
  check_same_model(workdir, config)
  write_config(workdir, config)
  mngr = manager(workdir)
  save(mngr, step, {'params': params}, {'step': step, 'data_position': step, 'imported': True})
  mngr.wait_until_finished()
  mngr.close()
