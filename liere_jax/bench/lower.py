"""bench lower: the train step of a config lowered for a platform (cuda, tpu, cpu) on this
machine, exactly as that platform would run it, and what it holds.

  python -m liere_jax.bench lower --config configs/imagenet.py:pe=liere64 --platform cuda [--json]

The step is traced with that platform's numerics plan (liere_jax.numerics: the model a Trainer
builds on its devices) and lowered for it, so no accelerator is needed. `conditionals` counts
the data-dependent `case` and `if` ops, each a host round trip on a GPU (XLA copies the
predicate to the host); `platform_cases` the `case` ops with a constant selector (XLA folds
them; none are expected).
"""
import jax
import numpy as np

from liere_jax.bench.step import random_batches

PLATFORMS = ('cuda', 'tpu', 'cpu', 'rocm')
# Named scopes of LieRE's products (liere_jax.expm, liere_jax.rotations).
PRODUCT_SCOPES = ('liere_expm', 'liere_lattice')


def lower_train_step(config, platforms):
  """The config's train step lowered for each of `platforms` (MLIR modules), from abstract
  inputs on a one-device mesh of this machine, traced with each platform's numerics plan."""
  from liere_jax import numerics, steps
  from liere_jax.config import run as run_spec
  for platform in platforms:
    if platform not in PLATFORMS:
      raise ValueError(f'--platform={platform!r} is unknown; use one of {PLATFORMS}.')
  run = run_spec.resolve(config, 1)
  mesh = steps.make_mesh(jax.devices()[:1])
  train, _ = random_batches(config)
  out = []
  for p in platforms:
    t = steps.Trainer(run, mesh, numerics.plan(p))
    if t.pixels is not None:  # data.normalise='device': the step takes uint8 pixels.
      train['image'] = train['image'].astype(np.uint8)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=t.batch_sharding)
             for k, v in train.items()}
    with jax.set_mesh(t.mesh):
      traced = t.train_step.jitted.trace(t.abstract_state, batch)
      out.append(traced.lower(lowering_platforms=(p,)).compiler_ir('stablehlo'))
  return out


def _ops(module):
  from jax._src.lib import mlir
  out = []

  def visit(op):
    out.append(op.operation if hasattr(op, 'operation') else op)
    return mlir.ir.WalkResult.ADVANCE
  module.operation.walk(visit)
  return out


def _static(value) -> bool:
  """Whether a case selector is known when the module is compiled: a constant, or a result of
  a case with such a selector whose branches all return such values there."""
  from jax._src.lib import mlir
  owner = value.owner
  name = getattr(owner, 'name', None)  # None: a block argument.
  if name == 'stablehlo.constant':
    return True
  if name != 'stablehlo.case' or not _static(owner.operands[0]):
    return False
  i = mlir.ir.OpResult(value).result_number
  returns = [list(block.operations)[-1] for region in owner.regions for block in region.blocks]
  return all(_static(ret.operands[i]) for ret in returns)


def _dot_name(op) -> str:
  """A dot's precision: its algorithm as a preset name (BF16_BF16_F32_X6) or its precision."""
  attrs = {op.attributes[i].name: str(op.attributes[i].attr)
           for i in range(len(op.attributes))}
  if 'algorithm' in attrs:
    alg = attrs['algorithm']
    field = lambda key: alg.split(key + ' = ')[1].split(',')[0].split('>')[0].strip()
    n = int(field('num_primitive_operations'))
    return '_'.join([field('lhs_precision_type'), field('rhs_precision_type'),
                     field('accumulation_type')]).upper() + (f'_X{n}' if n > 1 else '')
  prec = attrs.get('precision_config', '')
  return 'HIGHEST' if 'HIGHEST' in prec else 'HIGH' if 'HIGH' in prec else 'DEFAULT'


def summarize(module, platform: str) -> dict:
  """{'platform', 'conditionals', 'platform_cases', 'while_loops', 'expm_dot_algorithms',
  'expm_dots'} of a lowered module."""
  conditionals = platform_cases = whiles = 0
  algorithms, dots = set(), 0
  for op in _ops(module):
    if op.name == 'stablehlo.case' and _static(op.operands[0]):
      platform_cases += 1
    elif op.name in ('stablehlo.case', 'stablehlo.if'):
      conditionals += 1
    elif op.name == 'stablehlo.while':
      whiles += 1
    elif op.name == 'stablehlo.dot_general' and any(
        s in str(op.location) for s in PRODUCT_SCOPES):
      algorithms.add(_dot_name(op))
      dots += 1
  return {'platform': platform, 'conditionals': conditionals, 'expm_dot_algorithms':
          sorted(algorithms), 'while_loops': whiles, 'platform_cases': platform_cases,
          'expm_dots': dots}


def bench_lower(config, platforms) -> list:
  """summarize() of the config's train step lowered for each of `platforms`."""
  return [summarize(m, p) for m, p in zip(lower_train_step(config, platforms), platforms)]
