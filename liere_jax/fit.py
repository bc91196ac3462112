"""Does a run fit its chips' memory? Its train and eval steps compiled ahead of time, as
train.py builds them there (the Trainer's mesh, shardings and batch), for a Cloud TPU slice on
this machine (deviceless: liere_jax/tpu_slices.py) or for the devices a process runs on; the
compiler's memory analysis gives what a chip holds. A run that does not fit is refused in one
line naming its need and what would fit (`train.py --check_fit`, `bench compile`). MaxText's
train_compile.py is the same check.

  res = check_fit(config, 'v5litepod-256')  # ValueError (one line) where it does not fit.
"""
import math
import re

import jax
import numpy as np

from liere_jax import tpu_slices
from liere_jax.config import run as run_spec
from liere_jax.numerics import for_mesh
from liere_jax.steps import Trainer, make_mesh
from liere_jax.tpu_slices import GiB

# The TPU compiler's refusal of a program larger than a chip's memory.
_OOM = re.compile(r'required for (.+?) \(([\d.]+)([KMGT])\) exceeds available HBM '
                  r'\(([\d.]+)([KMGT])\)')
_UNIT = {'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}


class DoesNotFit(Exception):
  """The step needs more memory a chip than the chip has (the TPU compiler's refusal)."""

  def __init__(self, what, need, available):
    super().__init__(f'{what} need {need / GiB:.2f} GiB of the {available / GiB:.2f} GiB')
    self.what, self.need, self.available = what, need, available


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


def compile_steps(run, devices, steps=('train', 'eval'), numerics=None) -> dict:
  """The run's train and eval steps (`steps`) compiled for `devices` with the mesh, shardings,
  batch and numerics plan train.py uses there (`numerics`: fields it replaces, an A/B):
  {'train': Compiled, 'eval': Compiled}. DoesNotFit where the compiler finds a step larger than
  a chip's memory."""
  mesh = make_mesh(devices, run.loop.model_parallel)
  trainer = Trainer(run, mesh, for_mesh(mesh, **(numerics or {})))
  m = run.model
  image = (run.loop.batch_size,) + tuple(m.input_size) + (m.channels,)
  batch = {'image': jax.ShapeDtypeStruct(
               image, np.uint8 if trainer.pixels is not None else np.float32),
           'label': jax.ShapeDtypeStruct((run.loop.batch_size, m.num_classes), np.float32)}
  batch = _abstract(batch, {k: trainer.batch_sharding for k in batch})
  out = {}
  try:
    with jax.set_mesh(trainer.mesh):
      if 'train' in steps:
        out['train'] = trainer.train_step.jitted.trace(trainer.abstract_state,
                                                       batch).lower().compile()
      if 'eval' in steps:
        params = _abstract(trainer.param_shapes, trainer.param_sharding)
        ctx = jax.eval_shape(lambda p: trainer.pe_context_fn(p, m.train_grid, None), params)
        ctx = _abstract(ctx, jax.tree.map(lambda _: trainer.replicated, ctx))
        b = run.evaluation.batch_size
        ebatch = {'image': jax.ShapeDtypeStruct((b,) + image[1:], np.float32),
                  'label': jax.ShapeDtypeStruct((b,), np.int32),
                  'mask': jax.ShapeDtypeStruct((b,), np.bool_)}
        ebatch = _abstract(ebatch, {k: trainer.batch_sharding for k in ebatch})
        out['eval'] = trainer.eval_step.jitted.trace(params, ebatch, ctx).lower().compile()
  except Exception as e:  # pylint: disable=broad-except
    oom = _OOM.search(str(e))
    if oom is None:
      raise
    raise DoesNotFit(oom.group(1), float(oom.group(2)) * _UNIT[oom.group(3)],
                     float(oom.group(4)) * _UNIT[oom.group(5)]) from None
  return out


def memory(compiled) -> dict:
  """Bytes a chip of a compiled step: its memory analysis, and the need (what it holds at
  once: arguments and outputs less those aliased, temporaries and the code)."""
  ma = compiled.memory_analysis()
  mem = {'arguments': ma.argument_size_in_bytes, 'temporaries': ma.temp_size_in_bytes,
         'outputs': ma.output_size_in_bytes, 'aliased': ma.alias_size_in_bytes,
         'code': ma.generated_code_size_in_bytes}
  mem['need'] = (mem['arguments'] + mem['outputs'] - mem['aliased'] + mem['temporaries']
                 + mem['code'])
  return mem


def state_bytes(run, devices) -> int:
  """Bytes a chip of the train state (parameters and Adam's moments) in its sharding."""
  t = Trainer(run, make_mesh(devices, run.loop.model_parallel))
  leaves = jax.tree.leaves(t.abstract_state)
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in leaves)


def fit(run, devices, hbm, steps=('train', 'eval'), numerics=None):
  """The run's steps compiled for `devices` with `hbm` bytes a chip (None: not known, fits):
  (the report, {step: Compiled}). The report: the mesh and batch a chip, each step's `memory`,
  'need' (the largest step's), 'state', 'fits'; where it does not fit, 'advice' (and no
  compiled steps where the compiler refused: 'available', its figure of a chip's memory)."""
  data = len(devices) // run.loop.model_parallel
  res = {'mesh': {'data': data, 'model': run.loop.model_parallel},
         'sharding': run.loop.sharding, 'batch': run.loop.batch_size,
         'batch_per_chip': run.loop.batch_size / data, 'hbm': hbm, 'remat': run.model.remat}
  try:
    compiled = compile_steps(run, devices, steps, numerics)
  except DoesNotFit as e:
    state = state_bytes(run, devices)
    res.update(fits=False, need=e.need + state, available=e.available, state=state)
    res['advice'] = advice(run, res, temp=e.need)
    return res, {}
  res.update({name: memory(c) for name, c in compiled.items()})
  res['need'] = max(res[k]['need'] for k in compiled)
  res['fits'] = hbm is None or res['need'] <= hbm
  res['state'] = res['train']['arguments']
  if not res['fits']:
    res['advice'] = advice(run, res, temp=res['train']['temporaries'])
  return res, compiled


def advice(run, res, temp) -> str:
  """What would fit, estimated: the batch a chip that leaves the temporaries room (they grow
  with the batch), and the settings that shrink them (remat) or the state (fsdp)."""
  room = 0.95 * res.get('available', res['hbm']) - res['state']
  per_chip = res['batch_per_chip']
  fits = int(per_chip * room / temp) // 8 * 8 if room > 0 else 0
  options = []
  if fits >= 8:
    options.append(f"--config.batch_size={fits * res['mesh']['data']} ({fits} a chip)")
  if run.model.remat == 'none':
    options.append('--config.model.remat=block')
  if run.loop.sharding != 'fsdp' and res['state'] > 0.1 * res.get('available', res['hbm']):
    options.append('--config.sharding=fsdp')  # The state is worth sharding.
  return ' or '.join(options) or 'a slice with more chips'


def refusal(name: str, res: dict) -> str:
  """The one line of a run that does not fit its slice."""
  return (f"{name} does not fit {res['topology']}: the train step needs "
          f"{res['need'] / GiB:.2f} GiB a chip ({res['batch_per_chip']:g} images a chip) and a "
          f"{res['device_kind']} chip has {res.get('available', res['hbm']) / GiB:.2f} GiB; "
          f"would fit (estimate): {res['advice']}.")


def check_fit(config, target: str, name: str = 'The run'):
  """train.py --check_fit: raises ValueError (one line: the need and what would fit) where the
  run does not fit `target`, a Cloud TPU slice compiled for here (deviceless: its train and eval
  steps) or 'devices' (the devices this process runs on, after jax.distributed starts: its train
  step). Returns the report."""
  if target != 'devices':
    slice_ = tpu_slices.parse_slice(target)
    run = run_spec.resolve(config, slice_.chips)
    devices, steps = tpu_slices.slice_devices(slice_), ('train', 'eval')
    hbm, topology, kind = slice_.chip.hbm, slice_.name, slice_.chip.device_kind
  else:
    devices = jax.devices()
    run = run_spec.resolve(config, len(devices))
    hbm = (devices[0].memory_stats() or {}).get('bytes_limit')  # None: the backend does not say.
    kind, steps = devices[0].device_kind, ('train',)
    topology = f'{len(devices)} x {kind}'
  res, _ = fit(run, devices, hbm, steps)
  res.update(topology=topology, device_kind=kind)
  if not res['fits']:
    raise ValueError(refusal(name, res))
  return res
