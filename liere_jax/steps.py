"""Training and evaluation steps over a device mesh: one code path for 1 CPU, many devices and
multi-host pods. The mesh is ('data', 'model'); the batch is split over 'data'. Parameters
carry their logical axes as metadata (model.sharded): heads and MLP split over 'model', the
width over 'data' with `sharding='fsdp'`, else replicated. `jax.jit` with explicit shardings
places everything; the step donates its inputs.
"""
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from liere_jax import numerics as numerics_lib, param_tree
from liere_jax.config import run as run_spec
from liere_jax import model as model_lib
from liere_jax.data.transform import normalisation
from liere_jax.model import ViT
from liere_jax.numerics import Numerics


def make_mesh(devices=None, model_parallel: int = 1) -> jax.sharding.Mesh:
  """A ('data', 'model') mesh over all devices of all processes (or the given ones); the
  'model' axis (model_parallel devices) splits heads and MLP, the batch goes over 'data'."""
  devices = jax.devices() if devices is None else devices
  if model_parallel < 1 or len(devices) % model_parallel:
    raise ValueError(f'--config.model_parallel={model_parallel} must divide the '
                     f'{len(devices)} devices.')
  return jax.make_mesh((len(devices) // model_parallel, model_parallel), ('data', 'model'),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)


def param_specs(mesh, mode: str, logical, shapes):
  """Logical axes (the parameters' sharding metadata, model.sharded) -> PartitionSpecs:
  'heads' and 'mlp' go over 'model', 'embed' over 'data' with `mode='fsdp'`; an axis that the
  mesh axis does not divide stays whole. `mode`: a resolved loop.sharding (config/run.py checks
  it once)."""
  rules = {'heads': 'model', 'mlp': 'model', 'embed': 'data' if mode == 'fsdp' else None}

  def spec(axes, x):
    mesh_axes = [rules.get(a) if a else None for a in axes]
    return P(*[m if m and dim % mesh.shape[m] == 0 and mesh.shape[m] > 1 else None
               for m, dim in zip(mesh_axes, x.shape)])
  return jax.tree.map(spec, logical, shapes, is_leaf=lambda x: isinstance(x, P))


def _path_keys(path):
  return tuple(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))) for k in path)


def state_specs(param_spec_tree, state_shapes):
  """Specs of a whole train state: a leaf whose path ends with a parameter's path (the
  parameters, Adam's mu and nu) shares its spec; the rest (step, counts) is replicated."""
  by_path = {_path_keys(path): spec for path, spec in jax.tree_util.tree_flatten_with_path(
      param_spec_tree, is_leaf=lambda x: isinstance(x, P))[0]}

  def spec(path, x):
    keys = _path_keys(path)
    return next((by_path[keys[i:]] for i in range(len(keys)) if keys[i:] in by_path), P())
  return jax.tree_util.tree_map_with_path(spec, state_shapes)


def make_optimizer(optimizer):
  """(tx, schedule) of a run_spec.OptimizerSpec (or a RunSpec's): Adam(W) with linear warmup
  and cosine decay, optional global-norm clipping."""
  opt = optimizer.optimizer if isinstance(optimizer, run_spec.RunSpec) else optimizer
  run_spec.spec_of(opt, 'make_optimizer', run_spec.OptimizerSpec)
  if opt.warmup_steps:
    schedule = optax.warmup_cosine_decay_schedule(0.0, opt.lr, opt.warmup_steps, opt.decay_steps)
  else:  # The same values, without optax's log line about a zero-step warmup.
    schedule = optax.cosine_decay_schedule(opt.lr, opt.decay_steps)
  adam = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
  tx = optax.chain(optax.clip_by_global_norm(opt.grad_clip), adam) if opt.grad_clip else adam
  return tx, schedule


class MeshJit:
  """jax.jit traced and run under `jax.set_mesh(mesh)`, so that model code sees the mesh (the
  rotations split their exponentials over its 'data' axis: rotations.split_over_data)."""

  def __init__(self, mesh, fn, **jit_kwargs):
    self.mesh, self.jitted = mesh, jax.jit(fn, **jit_kwargs)

  def __call__(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args)

  def lower(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted.lower(*args)


@dataclasses.dataclass
class EvalSteps:
  """What evaluating a run (a run_spec.RunSpec) needs: the model in eval mode over pure-dict
  parameters, their shardings, the jitted eval steps and the batch placement. No optimizer:
  evaluation.evaluate_workdir builds only this; a Trainer is one."""
  run: run_spec.RunSpec
  mesh: jax.sharding.Mesh
  # How the mesh's platform computes (liere_jax.numerics; default: its plan). An A/B replaces a
  # field (bench step --vs).
  numerics: Optional[Numerics] = None

  def __post_init__(self):
    self.numerics = self.numerics or numerics_lib.for_mesh(self.mesh)
    run_spec.spec_of(self.run, type(self).__name__)
    n = self.mesh.devices.size
    if self.run.num_devices not in (None, n):  # Its batch checks were for another count.
      raise ValueError(f'The run was resolved for {self.run.num_devices} devices and the mesh has '
                       f'{n}; resolve it for the mesh: liere_jax.config.run.resolve(config, {n}).')
    self.spec = self.run.model
    model = nnx.eval_shape(lambda: ViT(self.spec, numerics=self.numerics, rngs=nnx.Rngs(0)))
    model.train()
    self.train_def, params, rest = nnx.split(model, nnx.Param, ...)
    logical = nnx.to_pure_dict(nnx.get_partition_spec(params))
    model.eval()
    self.eval_def = nnx.graphdef(model)
    # The only non-parameter state is the dropout RNG (key and count), reseeded from (seed,
    # step) every step. It is kept as shapes and made anew inside each trace: NNX variables
    # created outside a trace cannot be updated inside one (dropout > 0 would fail).
    self.rng_shapes = nnx.to_pure_dict(rest)
    self.param_shapes = nnx.to_pure_dict(params)
    self.param_specs = param_specs(self.mesh, self.run.loop.sharding, logical, self.param_shapes)
    self.param_sharding = jax.tree.map(lambda p: NamedSharding(self.mesh, p), self.param_specs,
                                       is_leaf=lambda x: isinstance(x, P))
    self.batch_sharding = NamedSharding(self.mesh, P('data'))
    self.replicated = NamedSharding(self.mesh, P())
    self._pe_context = MeshJit(self.mesh, self.pe_context_fn, static_argnums=(1, 2),
                               out_shardings=self.replicated)
    # The eval steps take the encoding's context (pe_context), computed once per grid.
    eval_shardings = (self.param_sharding, self.batch_sharding, None)
    self.eval_step = MeshJit(self.mesh, self._eval_step, in_shardings=eval_shardings)
    self.predict_step = MeshJit(self.mesh, self._predict, in_shardings=eval_shardings)

  def model(self, params, train: bool = False, rng=None) -> ViT:
    """An NNX model over pure-dict params (inside or outside jit)."""
    rest = jax.tree.map(
        lambda x: (jnp.broadcast_to(jax.random.key(0), x.shape)
                   if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                   else jnp.zeros(x.shape, x.dtype)), self.rng_shapes)
    model = nnx.merge(self.train_def if train else self.eval_def, params, rest)
    if rng is not None:  # The same keys with the blocks stacked (scan_layers) or not.
      model_lib.reseed(model, dropout=rng)
    return model

  def place_params(self, params):
    """Parameters in either layout (blocks/<i>/... as checkpoints hold them, or stacked) in
    these steps' layout (stacked under model.scan_layers) and shardings."""
    convert = param_tree.to_scan_params if self.spec.scan_layers else param_tree.to_loop_params
    # Arrays this process holds whole (a checkpoint read onto one device, numpy) go in as host
    # values, so the jit may place them on any devices; global arrays stay as they are.
    params = jax.tree.map(lambda x: np.asarray(x) if getattr(x, 'is_fully_addressable', True)
                          else x, params)
    return jax.jit(convert, out_shardings=self.param_sharding)(params)

  def _eval_step(self, params, batch, ctx):
    """Per-example correctness [b] (masked examples count as incorrect) and the mask."""
    logits = self.model(params)(batch['image'], ctx=ctx)
    correct = (jnp.argmax(logits, -1) == batch['label']) & batch['mask']
    return correct, batch['mask']

  def _predict(self, params, batch, ctx):
    """Softmax probabilities float32 [b, classes] (video views are averaged from these)."""
    logits = self.model(params)(batch['image'], ctx=ctx)
    return jax.nn.softmax(logits.astype(jnp.float32))

  def pe_context(self, params, grid, positions=None):
    """Rotations (or biases) for a grid, computed once and reused by every eval batch; one
    compile per (grid, positions)."""
    return self._pe_context(params, tuple(grid), positions)

  def pe_context_fn(self, params, grid, positions):
    """pe_context's function before jit (what ahead-of-time compiles trace: liere_jax/fit.py)."""
    return self.model(params).pe_context(grid, positions)

  def global_batch(self, local: dict) -> dict:
    """Per-process numpy batch -> global arrays sharded over 'data' (any process count)."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v))
            for k, v in local.items()}


@dataclasses.dataclass
class Trainer(EvalSteps):
  """A run's EvalSteps plus its optimizer, the train state's shardings and the jitted train and
  loss steps."""

  def __post_init__(self):
    super().__post_init__()
    self.tx, self.schedule = make_optimizer(self.run.optimizer)
    # data.normalise='device': train batches are uint8 pixels, normalised in the step (4x less
    # to copy between host processes and to the device, no host time).
    self.pixels = (normalisation(self.run.data) if self.run.data.normalise == 'device'
                   else None)
    params = self.param_shapes
    shapes = {'params': params, 'opt_state': jax.eval_shape(self.tx.init, params),
              'step': jax.ShapeDtypeStruct((), jnp.int32)}
    specs = state_specs(self.param_specs, shapes)
    self.state_sharding = jax.tree.map(lambda p: NamedSharding(self.mesh, p), specs,
                                       is_leaf=lambda x: isinstance(x, P))
    self.abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
        self.state_sharding)
    self.train_step = MeshJit(self.mesh, self._train_step, donate_argnums=(0,),
                              in_shardings=(self.state_sharding, self.batch_sharding),
                              out_shardings=(self.state_sharding, self.replicated))
    self.loss_step = MeshJit(self.mesh, self._loss, in_shardings=(
        self.param_sharding, self.batch_sharding))

  def init_state(self, seed: int):
    """Fresh parameters and optimizer state, created directly in their shardings."""
    def init():
      params = nnx.to_pure_dict(nnx.state(ViT(self.spec, rngs=nnx.Rngs(seed)),
                                          nnx.Param))
      return {'params': params, 'opt_state': self.tx.init(params),
              'step': jnp.zeros((), jnp.int32)}
    return jax.jit(init, out_shardings=self.state_sharding)()

  def _train_step(self, state, batch):
    rng = jax.random.fold_in(jax.random.key(self.run.loop.seed), state['step'])

    def loss_fn(params):
      logits = self.model(params, train=True, rng=rng)(self.images(batch))
      loss = optax.softmax_cross_entropy(logits, batch['label']).mean()
      return loss, logits

    # Under model.scan_layers the parameters, gradients and Adam's moments are stacked
    # (blocks/... [depth, ...]): the update's code does not grow with depth either.
    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
    updates, opt_state = self.tx.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = {
        'loss': loss,
        'accuracy': jnp.mean(jnp.argmax(logits, -1) == jnp.argmax(batch['label'], -1)),
        'grad_norm': optax.global_norm(grads),
        'param_norm': optax.global_norm(params),
        'lr': self.schedule(state['step']),
    }
    return {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1}, metrics

  def _loss(self, params, batch):
    """Mean cross-entropy of `params` on a training batch, without dropout."""
    return optax.softmax_cross_entropy(self.model(params)(self.images(batch)),
                                       batch['label']).mean()

  def images(self, batch):
    """The batch's model inputs: uint8 pixels (data.normalise='device') normalised here."""
    x = batch['image']
    if x.dtype != jnp.uint8:
      return x
    if self.pixels is None:
      raise ValueError("The batch has uint8 pixels but data.normalise='host'; the pipeline and "
                       'the trainer must be built from the same run.')
    scale, offset = self.pixels
    return x.astype(jnp.float32) * scale + offset
