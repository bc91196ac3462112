"""A whole config: its top-level fields (optimizer, loop, evaluations) declared once with their
defaults and docs, the builder, `upgrade` (the one place a stored config gets the fields added
since it was written) and `resolve`, which checks every section before anything is compiled or
written and returns a frozen `RunSpec`: the model (config.model.ModelSpec), the data
(config.data.DataSpec), the optimizer, the loop and the evaluations. Nothing downstream reads a
training field from the config.

  run = resolve(config, jax.device_count())
  run.model.width, run.data.size, run.optimizer.lr, run.loop.batch_size, run.evaluation.resolutions
  run.to_config()   # The config it came from, as a run directory stores it (config.json).

Resolving is for a program's edges (the CLIs, bench, reproduce, a test helper): the library
(steps.Trainer, data.train_dataset, ...) takes the spec, and refuses a config.
"""
import copy
import dataclasses
import math
from typing import Optional, Tuple

import ml_collections

from liere_jax.config import data as data_spec
from liere_jax.config import model as model_spec
from liere_jax.config.data import DATA
from liere_jax.config.fields import REQUIRED, Field, Section
from liere_jax.config.model import MODEL
from liere_jax.encodings import registry

RUN = Section('', [
    Field('seed', 0, 'Parameters, dropout and the data order: a pure function of (seed, step).',
          plain='loop'),
    Field('model', MODEL, 'The model (model.* above).'),
    Field('data', DATA, 'The data (data.* above).'),
    Field('batch_size', REQUIRED, 'Global batch, over all devices and processes.', kind=int,
          plain='loop'),
    Field('total_steps', REQUIRED, 'Training steps.', kind=int, plain='loop'),
    Field('lr', REQUIRED, 'Peak learning rate (Adam(W), linear warmup, cosine to 0).',
          kind=float, plain='optimizer'),
    Field('warmup_steps', 0, 'Linear warmup steps; 0 = none.', plain='optimizer'),
    Field('b1', 0.9, "Adam's beta1.", plain='optimizer'),
    Field('b2', 0.999, "Adam's beta2.", plain='optimizer'),
    Field('eps', 1e-8, "Adam's epsilon.", plain='optimizer'),
    Field('weight_decay', 0.0, 'Decoupled weight decay (AdamW); 0 = Adam.', plain='optimizer'),
    Field('grad_clip', 0.0, 'Global-norm clipping threshold; 0 = off.', plain='optimizer'),
    Field('sharding', 'data', "'data' (replicated parameters) or 'fsdp' (parameters sharded "
          'too).', plain='loop'),
    Field('model_parallel', 1, "Devices on the mesh's 'model' axis: heads and MLP split over "
          'them.', added=1, plain='loop'),
    Field('log_every', 50, 'Steps between logged metrics.', plain='loop'),
    Field('eval_every', 0, 'Steps between evaluations; 0 = at the end only.', plain='loop'),
    Field('checkpoint_every', 500, 'Steps between checkpoints.', plain='loop'),
    Field('keep', 2, 'Latest checkpoints kept (the best by eval accuracy is kept too).',
          plain='loop'),
    Field('eval_batch_size', REQUIRED, 'Global eval batch (base_config: batch_size).'),
    Field('resolutions', (), 'eval.py: also evaluate at these input sizes (paper Fig. 7), e.g. '
          '(384,).', added=()),
    Field('model_init', '', 'Start from these parameters: DIR[:best|:STEP], FILE.safetensors, '
          "FILE.ckpt (model_init.py); '' = fresh.", added=''),
    Field('model_init_head', 'load', "'load' the source's head or 'reinit' a new one (e.g. "
          'other classes).', added='load', plain='loop'),
])


def base_config(*, model, data, batch_size, **values) -> ml_collections.ConfigDict:
  """A whole experiment: RUN's defaults, `values` over them (eval_batch_size: batch_size)."""
  return RUN.build(model=model, data=data, batch_size=batch_size,
                   **{'eval_batch_size': batch_size, **values})


def docs_table() -> str:
  """Every field of a config as the Markdown table of docs/configs.md ("Every field")."""
  return '| field | default | what |\n|---|---|---|\n' + RUN.table()


def upgrade(config: dict, stored: bool = True) -> dict:
  """A config read back (plain dict, from a config.json or a model JSON) with its missing fields
  filled (fields.Section.upgrade): if a run `stored` it, those added since it was written at the
  values that reproduce it; if a user wrote it, at their defaults. Sections it lacks stay
  absent."""
  return RUN.upgrade(config, stored)


SHARDINGS = ('data', 'fsdp')
INIT_HEADS = ('load', 'reinit')  # model_init_head (liere_jax/model_init.py).


def _spec(name: str, plain: str, doc: str, computed=()):
  """A frozen dataclass of the `computed` fields [(name, type)], then RUN's fields that are
  `plain` in it (their declarations above say what they are)."""
  cls = dataclasses.make_dataclass(name, list(computed) + RUN.spec_fields(plain), frozen=True)
  cls.__module__, cls.__doc__ = __name__, doc
  return cls


OptimizerSpec = _spec(
    'OptimizerSpec', 'optimizer', 'Adam(W) on a learning rate that rises linearly from 0 over '
    'warmup_steps, then follows a cosine to 0 at decay_steps (total_steps, at least '
    'warmup_steps + 1); optional global-norm clipping.', [('decay_steps', int)])
LoopSpec = _spec('LoopSpec', 'loop', 'The training loop: steps, batches, cadences, placement '
                 "and the starting parameters (model_init: '' = fresh).", [('model_init', str)])


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """The evaluations: batch size, and the input sizes with their position modes (Fig. 7)."""
  batch_size: int  # Global.
  resolutions: Tuple[int, ...]  # Input sizes evaluated besides the training one.
  # The position modes at those sizes: the encoding's own, and 'rescaled' if it reads positions.
  positions_modes: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A whole run, resolved: every field a consumer needs, no defaults left to apply."""
  model: model_spec.ModelSpec
  data: data_spec.DataSpec
  optimizer: OptimizerSpec
  loop: LoopSpec
  evaluation: EvalSpec
  # The config it was resolved from (plain dict), which a run directory stores (config.json) and
  # its checks read back; not part of what the run is (two configs may resolve alike).
  source: Optional[dict] = dataclasses.field(default=None, compare=False, repr=False)
  # The devices its batches were checked against: the mesh it runs on must have as many.
  num_devices: Optional[int] = dataclasses.field(default=None, compare=False, repr=False)

  def to_config(self) -> ml_collections.ConfigDict:
    """The config this spec was resolved from (a copy), as config.json stores it."""
    if self.source is None:
      raise ValueError('This RunSpec was not made by liere_jax.config.run.resolve(config, '
                       'num_devices), so it has no config to store; resolve a config instead.')
    return ml_collections.ConfigDict(copy.deepcopy(self.source))


def spec_of(run, what: str, takes=RunSpec):
  """`run` if it is a `takes` (a RunSpec), else a TypeError saying how to make one (`what` takes
  it): the library takes resolved specs only."""
  if not isinstance(run, takes):
    an = 'an' if takes.__name__[0] in 'AEIOU' else 'a'
    raise TypeError(f'{what} takes {an} {takes.__name__}, not a {type(run).__name__}; resolve '
                    'the config first: liere_jax.config.run.resolve(config, jax.device_count()).')
  return run


def _need(ok: bool, key: str, value, what: str):
  if not ok:
    raise ValueError(f'--config.{key}={value!r} {what}.')


def _int(c: dict, key: str, low: int, what: str):
  value = c[key]
  _need(isinstance(value, int) and not isinstance(value, bool) and value >= low, key, value,
        what)


def resolve(config, num_devices: int) -> RunSpec:
  """A config (ConfigDict or dict) on `num_devices` devices -> RunSpec, at a program's edge
  (what the library takes); raises one ValueError naming the field and the fix."""
  c = config.to_dict() if hasattr(config, 'to_dict') else copy.deepcopy(dict(config))
  unknown = sorted(set(c) - set(RUN.names))
  if unknown:
    raise ValueError(f'--config.{unknown[0]} is not a field of a run; remove it (the fields are '
                     f'{list(RUN.names)}).')
  missing = [k for k in RUN.names if k not in c]
  if missing:
    raise ValueError(f'config.{missing[0]} is missing; build the config with '
                     'liere_jax.config.base_config (it sets every field).')
  model, loop = model_spec.resolve(c['model']), _loop(c, num_devices)
  return RunSpec(model=model, data=data_spec.resolve_data(c['data']), optimizer=_optimizer(c),
                 loop=loop, evaluation=_evaluation(c, model, num_devices // loop.model_parallel),
                 source=c, num_devices=num_devices)


def _optimizer(c: dict) -> OptimizerSpec:
  _int(c, 'total_steps', 1, 'must be a positive integer')
  _int(c, 'warmup_steps', 0, 'must be an integer >= 0 (0 = off)')
  _need(math.isfinite(c['lr']) and c['lr'] > 0, 'lr', c['lr'],
        'must be a positive finite number')
  for key in ('b1', 'b2'):
    _need(0 <= c[key] < 1, key, c[key], 'must be in [0, 1)')
  _need(c['eps'] > 0, 'eps', c['eps'], 'must be positive')
  for key in ('weight_decay', 'grad_clip'):
    _need(c[key] >= 0, key, c[key], 'must be >= 0 (0 = off)')
  return OptimizerSpec(decay_steps=max(c['total_steps'], c['warmup_steps'] + 1),
                       **RUN.resolve_plain(c, 'optimizer'))


def _loop(c: dict, num_devices: int) -> LoopSpec:
  for key in ('total_steps', 'checkpoint_every', 'log_every', 'keep'):
    _int(c, key, 1, 'must be a positive integer')
  _int(c, 'eval_every', 0, 'must be an integer >= 0 (0 = at the end only)')
  _need(isinstance(c['seed'], int), 'seed', c['seed'], 'must be an integer')
  _need(c['sharding'] in SHARDINGS, 'sharding', c['sharding'],
        f'is unknown; use one of {SHARDINGS}')
  mp = c['model_parallel']
  _need(isinstance(mp, int) and mp >= 1 and num_devices % mp == 0, 'model_parallel', mp,
        f'must divide the {num_devices} devices')
  _batch(c, 'batch_size', num_devices // mp)
  _need(c['model_init_head'] in INIT_HEADS, 'model_init_head', c['model_init_head'],
        f'is unknown; use one of {INIT_HEADS}')
  return LoopSpec(model_init=c['model_init'] or '', **RUN.resolve_plain(c, 'loop'))


def _batch(c: dict, key: str, data_devices: int):
  _need(isinstance(c[key], int) and c[key] > 0 and c[key] % data_devices == 0, key, c[key],
        f"must be a positive multiple of the mesh's {data_devices} data devices")


def _evaluation(c: dict, model: model_spec.ModelSpec, data_devices: int) -> EvalSpec:
  _batch(c, 'eval_batch_size', data_devices)
  for size in c['resolutions']:
    _need(isinstance(size, int) and size > 0 and all(size % p == 0 for p in model.patch[-2:]),
          'resolutions', tuple(c['resolutions']), 'must be input sizes divisible by the patch '
          f'{model.patch[-2:]}, e.g. ({2 * model.input_size[-1]},)')
  own = model.pe.positions
  modes = (own, 'rescaled') if registry.facts(model.pe.name).reads_positions else (own,)
  return EvalSpec(batch_size=c['eval_batch_size'], resolutions=tuple(c['resolutions']),
                  positions_modes=tuple(dict.fromkeys(modes)))
