"""A new run from the parameters of another (`--config.model_init`): fine-tuning.

  python train.py --config configs/arrows.py:grid=14,finetune=runs/base --workdir runs/ft
  python train.py --config configs/imagenet.py --workdir DIR --config.model_init=OLD:best

Sources (`--config.model_init=...`):
  DIR                 a train.py workdir: its latest checkpoint
  DIR:best            its best checkpoint by eval accuracy (DIR/best/)
  DIR:STEP            its checkpoint of step STEP (DIR/checkpoints/ keeps the latest `keep`)
  FILE.safetensors    an export of ours (`python -m liere_jax.convert to_torch`), FILE.json
                      beside it
  FILE.ckpt, FILE.pt  an official StanfordMIMI/LieRE checkpoint: a Lightning checkpoint (its
                      'state_dict') or a plain state_dict, mapped like `convert from_official`.
                      Reading it needs torch (imported only for this source). Its grid comes
                      from its pos_embedding and its classes from its head; every other field is
                      this config's (the official model is CLS-pooled).
Only the parameters carry over: the optimizer state is fresh and the step is 0 (the schedule
starts again). Encodings whose parameters do not depend on the grid carry over unchanged and
keep this config's position mode (normalized positions span [0, 1] on the new training grid);
the absolute embedding `pe/embedding` [1, T, D] is resized to the new grid exactly as evaluation
at another resolution resizes it (encodings.Absolute.embed). `--config.model_init_head=reinit`
starts a new (zero) head, e.g. for another number of classes; the default 'load' keeps the
checkpoint's. Any other difference (another encoding or position mode, a missing or extra
parameter, another shape) stops before anything is compiled or written, in one line naming the
parameter, both shapes and the fix. A workdir that already holds a checkpoint resumes it and
ignores model_init (train.py says so), so resuming stays exact.
"""
import dataclasses
import math
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from liere_jax import param_tree, paths
from liere_jax.model import abstract_params
from liere_jax.config.model import ModelSpec, resolve_stored

HEAD = (('head', 'kernel'), ('head', 'bias'))
EMBEDDING = ('pe', 'embedding')
OFFICIAL_SUFFIXES = ('.ckpt', '.pt')
# The fields that shape the tree and must agree: the encoding is compared first (its own
# message), the head and the absolute embedding follow the rules above.
MUST_AGREE = tuple(f for f in param_tree.SHAPING if f not in ('pe.name', 'input_size',
                                                              'num_classes'))

Params = Dict[Tuple[str, ...], Optional[np.ndarray]]  # Flat, param_tree.flatten's keys.


def parse(source: str) -> Tuple[str, Optional[int], bool]:
  """'DIR' / 'DIR:best' / 'DIR:STEP' / 'FILE' -> (path, step or None, best)."""
  path, sep, tail = source.rpartition(':')
  if sep and path and (tail == 'best' or tail.isdigit()) and not paths.path(source).exists():
    return path, None if tail == 'best' else int(tail), tail == 'best'
  return source, None, False


def read_source(source: str, model: ModelSpec) -> Tuple[ModelSpec, Params]:
  """(the source's model, its parameters {path: np.ndarray}); `model` (this run's) completes an
  official checkpoint's."""
  path, step, best = parse(source)
  paths.check_store(path, 'the source')
  if not paths.path(path).exists():
    raise FileNotFoundError(f'{path} does not exist.')
  if path.endswith('.safetensors') or path.endswith(OFFICIAL_SUFFIXES):
    # The converters read the foreign layouts; a workdir needs none of them.
    from liere_jax import convert
  if path.endswith('.safetensors'):
    from safetensors.numpy import load
    json_path = convert.json_path(path)
    _, src = convert.config_from_json(convert.read_json(json_path, "the export's model JSON"),
                                      json_path)
    params = convert.from_torch_layout(load(paths.path(path).read_bytes()), src)
  elif path.endswith(OFFICIAL_SUFFIXES):
    try:
      state = convert.load_official_state_dict(path)
    except ImportError:
      raise ImportError(f'reading the official checkpoint {path} needs torch (pip install '
                        'torch); the other sources do not.') from None
    src = _official_model(state, model)
    try:
      convert.official_spec(src)
    except ValueError as e:
      raise ValueError(f'this model cannot take an official LieRE checkpoint ({e})') from None
    try:
      params = convert.from_official_layout(state, src)
    except ValueError as e:  # This run's model section describes the official model.
      raise ValueError(f"{e} Set --config.model's width, depth, heads, mlp_dim and patch to "
                       "the official model's (its grid and classes are read from the file).") \
          from None
  else:
    from liere_jax import checkpoint
    if not paths.path(path).is_dir():
      raise FileNotFoundError(f'{path} is neither a workdir, a .safetensors export nor an '
                              f'official {"/".join(OFFICIAL_SUFFIXES)} checkpoint.')
    kept = paths.path(path) / ('best' if best else 'checkpoints')
    steps = checkpoint.steps_in(kept)
    if not steps or step not in steps + [None]:
      raise FileNotFoundError(
          f'{kept} holds no checkpoint' + (f' of step {step} (it holds {steps})' if steps else '')
          + (' (best/ is written when the run evaluates); use the latest (no :best) or a :STEP'
             if best else '') + '.')
    stored, params, _ = checkpoint.load_params(path, step, best=best)
    src = resolve_stored(stored.model)
  return src, {k: np.asarray(v) for k, v in param_tree.flatten(params).items()}


def _official_model(state, ms: ModelSpec) -> ModelSpec:
  """This run's model with the official checkpoint's grid, classes and CLS pooling (and what
  follows from them: the CLS token, the training grid)."""
  classes = (int(state['mlp_head.1.weight'].shape[0]) if 'mlp_head.1.weight' in state
             else ms.num_classes)
  grid = ms.train_grid
  tokens = state['pos_embedding'].shape[1] - 1 if 'pos_embedding' in state else None
  if tokens is not None and tokens != math.prod(ms.train_grid):
    side = math.isqrt(tokens)
    if ms.n_dims != 2 or side * side != tokens:
      raise ValueError(f'its pos_embedding has {tokens} patch tokens, which fits no square '
                       f'grid of patch={ms.patch}; import it with its config first (python -m '
                       'liere_jax.convert from_official ... --out_workdir DIR) and start from '
                       'DIR.')
    grid = (side, side)
  return dataclasses.replace(ms, pool='cls', num_prefix=1, num_classes=classes, train_grid=grid,
                             input_size=tuple(g * p for g, p in zip(grid, ms.patch)))


def _flag(value):
  return f"({','.join(map(str, value))})" if isinstance(value, tuple) else str(value)


def load(run, source: Optional[str] = None) -> Params:
  """The initial parameters of `run` (a liere_jax.config.run.RunSpec) from `source` (default
  its loop.model_init), checked against its model: {path: np.ndarray, or None for a head to
  initialise afresh}. Raises one line (ValueError / FileNotFoundError / ImportError) before
  anything is compiled or written."""
  source = source or run.loop.model_init
  flag = f'--config.model_init={source}'
  here = run.model
  try:
    there, src = read_source(source, here)
  except (ValueError, FileNotFoundError, ImportError) as e:
    raise type(e)(f'{flag}: {e}') from None
  value = param_tree.field_value
  for field in ('pe.name', 'pe.positions'):  # Aliases (paper_rope_mixed = liere2) agree.
    if value(there, field) != value(here, field) and (field != 'pe.name' or (
        there.pe.family, there.pe.block) != (here.pe.family, here.pe.block)):
      raise ValueError(
          f'{flag}: the checkpoint was trained with model.{field}={value(there, field)!r}, '
          f'this run has {value(here, field)!r}; set --config.model.{field}='
          f'{value(there, field)} (the parameters of one encoding mean nothing to another).')
  dst = param_tree.flatten(abstract_params(here))
  shapes = {k: tuple(v.shape) for k, v in src.items()}
  reinit = run.loop.model_init_head == 'reinit'
  resize = here.pe.name == 'abs' and there.train_grid != here.train_grid

  def stop(key, fix):
    here_shape = tuple(dst[key].shape) if key in dst else 'none'
    raise ValueError(f"{flag}: parameter {'/'.join(key)} has shape {shapes.get(key, 'none')} in "
                     f'the checkpoint and {here_shape} in this model; {fix}.')

  field = param_tree.first_difference(there, here, MUST_AGREE)
  fix = (f'the checkpoint has model.{field}={_flag(value(there, field))}, this run '
         f'{_flag(value(here, field))}: set --config.model.{field}='
         f'{_flag(value(there, field))}' if field else
         "make --config.model match the checkpoint's model")
  for key in list(dst) + [k for k in shapes if k not in dst]:
    same = key in dst and shapes.get(key) == tuple(dst[key].shape)
    if key in HEAD and (reinit or same):
      continue
    if key in HEAD and key in shapes and key in dst and field is None:
      stop(key, f'set --config.model_init_head=reinit to start a new head (num_classes '
                f'{there.num_classes} there, {here.num_classes} here)')
    if key == EMBEDDING and resize and key in shapes and shapes[key][-1] == dst[key].shape[-1]:
      continue
    if not same:
      stop(key, fix)
  if field:  # Same shapes, another model (e.g. other heads and no per-head parameter).
    raise ValueError(f'{flag}: {fix}.')
  params = {k: src[k].astype(dst[k].dtype, copy=False) for k in dst}
  if reinit:
    params.update({k: None for k in HEAD})
  if resize:
    params[EMBEDDING] = resize_embedding(params[EMBEDDING], there.train_grid, here.train_grid,
                                         here.num_prefix)
  return params


def resize_embedding(embedding: np.ndarray, train_grid, grid, num_prefix: int) -> np.ndarray:
  """[1, num_prefix + prod(train_grid), D] -> [1, num_prefix + prod(grid), D]: what the model
  adds at `grid` (encodings.Absolute.embed, the resize evaluation uses)."""
  from flax import nnx
  from liere_jax import encodings
  dim = embedding.shape[-1]
  pe = nnx.eval_shape(lambda: encodings.Absolute(dim=dim, train_grid=train_grid,
                                                  num_prefix=num_prefix, rngs=nnx.Rngs(0)))
  pe.embedding.value = jnp.asarray(embedding)
  zeros = jnp.zeros((1, num_prefix + math.prod(grid), dim), jnp.float32)
  return np.asarray(pe.embed(zeros, tuple(grid)))


def init_state(trainer, seed: int, params: Params):
  """The train state of a new run: `params` (load()) placed like the trainer's, a fresh
  optimizer state and step 0; None entries (a new head) take the init of `seed`."""
  fresh = param_tree.to_loop_params(trainer.init_state(seed)['params'])  # blocks/<i>, as loaded.
  flat = {k: v if params[k] is None else params[k]
          for k, v in param_tree.flatten(fresh).items()}
  tree = trainer.place_params(param_tree.unflatten_like(fresh, flat))  # Stacked if scanned.
  return jax.jit(lambda p: {'params': p, 'opt_state': trainer.tx.init(p),
                            'step': jnp.zeros((), jnp.int32)},
                 out_shardings=trainer.state_sharding)(tree)
