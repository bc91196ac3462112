"""Small configs and utilities shared by the tests: tiny models, the tiny arrows run (trained
and evaluated in this process by the library, or by its command line), and running the programs
as a user does (`python -m liere_jax.<program>`).

Layout: one test file per library module, named after it (rotations.py -> test_rotations.py,
expm.py -> test_expm.py, positions.py -> test_positions.py, checkpoint.py and
checkpoint_damage.py -> test_checkpoint.py, convert/ -> test_convert.py, encodings/ ->
test_encodings.py with ComRoPE in test_commuting.py), plus the end-to-end files (test_training.py,
test_user_paths.py, test_reproduce.py, ...). A test written for a mutation run goes into its
module's file; the numerics scope's tests carry the `numerics` marker (pytest.ini), the core
scope's are named in pyproject.toml's [tool.mutmut].

The tiny vocabulary, one builder per type: tiny_model_config (a model section) and tiny_spec
(its ModelSpec), tiny_model (its ViT); tiny_run_config (a run's config around that model);
tiny_config / TINY / TINY_RUN (the tiny arrows run, as a config, overrides or flags),
tiny_config_and_batch (it with a random batch) and tiny_run_spec (its RunSpec)."""
import ast
import functools
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time

from flax import nnx
import numpy as np
import pytest

import liere_jax.configs
from liere_jax.config import base_config, data_config, load, model_config
from liere_jax.config.model import resolve
from liere_jax.model import ViT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARROWS = liere_jax.configs.path('arrows')
# The tiny arrows run (grid 4: 48 px, 16 patches; one block of width 32): config overrides,
# and the same as train/eval flags.
TINY = {'model.width': 32, 'model.depth': 1, 'model.heads': 2, 'model.mlp_dim': 64,
        'batch_size': 16, 'eval_batch_size': 16, 'data.num_eval': 40, 'log_every': 1,
        'warmup_steps': 2, 'resolutions': (60,)}
TINY_RUN = tuple(f'--config.{key}={value}' for key, value in TINY.items())


def script(name: str):
  """scripts/NAME.py as a module (the scripts are not a package)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'scripts', name + '.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(path: str, arg: str = ''):
  return load(f'{path}:{arg}' if arg else path)


def tiny_model_config(pe='liere8', n_dims=2, patch=4, size=16, width=32, depth=2, heads=2,
                      pool='cls', **pe_overrides):
  cfg = model_config(pe=pe, variant='', patch=(patch,) * n_dims,
                     input_size=(size,) * n_dims, channels=3, num_classes=5,
                     width=width, depth=depth, heads=heads, pool=pool)
  cfg.pe.update(pe_overrides)
  return cfg


def tiny_spec(*args, **kw):
  """tiny_model_config's ModelSpec (what ViT and the converters take)."""
  return resolve(tiny_model_config(*args, **kw))


def tiny_run_config(num_classes=5, qkv_bias=True, **kw):
  """A run's config (arrows data on tiny_model_config's grid, 2 steps of 8) around
  tiny_model_config(**kw): what a workdir's config.json and the converters' --config hold."""
  model = tiny_model_config(**kw)
  model.num_classes, model.qkv_bias = num_classes, qkv_bias
  data = data_config(name='arrows', grid=model.input_size[0] // model.patch[0])
  return base_config(model=model, data=data, batch_size=8, total_steps=2, lr=1e-3)


def tiny_model(seed=0, numerics=None, **kw):
  """tiny_spec(**kw)'s ViT in eval mode; numerics: its plan (liere_jax.numerics; default this
  backend's)."""
  model = ViT(tiny_spec(**kw), rngs=nnx.Rngs(seed), numerics=numerics)
  model.eval()
  return model


def forward(model, x, **kwargs):
  """`model(x, **kwargs)` under one jit: a cold call compiles the whole forward once, ~2-3x
  faster than compiling it operation by operation eagerly, and models of one config share the
  compile. Array arguments (ctx) are traced, the others (positions, return_attention) static.
  Jitted and eager results may differ in the last bits: compare with a tolerance."""
  static = {k: v for k, v in kwargs.items() if v is None or isinstance(v, (str, bool, int))}
  traced = {k: v for k, v in kwargs.items() if k not in static}
  return _forward(model, x, traced, tuple(sorted(static.items())))


@functools.partial(nnx.jit, static_argnums=3)
def _forward(model, x, traced, static):
  return model(x, **traced, **dict(static))


def tiny_config_and_batch(batch_size):
  """The arrows config (grid 4) with the one-block model of TINY_RUN, and a random batch for it.

  The same config gives the same programs, which JAX's compilation cache (conftest.py) then
  compiles once for every test that builds a Trainer from it.
  """
  cfg = load_config(ARROWS, 'grid=4')
  cfg.model.update(width=32, depth=1, heads=2, mlp_dim=64)
  rng = np.random.default_rng(0)
  batch = {'image': rng.normal(size=(batch_size, 48, 48, 3)).astype(np.float32),
           'label': np.eye(4, dtype=np.float32)[rng.integers(0, 4, batch_size)]}
  return cfg, batch


def tiny_run_spec(pe, num_eval=24):
  """tiny_config_and_batch's run with encoding `pe`, evaluated also at 60 px, as its RunSpec
  (what steps.Trainer takes)."""
  from liere_jax.config import run as run_spec
  cfg, _ = tiny_config_and_batch(8)
  cfg.model.pe.name = pe
  cfg.data.num_eval, cfg.eval_batch_size, cfg.resolutions = num_eval, 8, (60,)
  return run_spec.resolve(cfg, 1)


def free_port() -> int:
  """A free TCP port on 127.0.0.1 (a jax.distributed coordinator for local processes)."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def xla_flags(devices: int) -> str:
  """This session's XLA_FLAGS (conftest.py) with `devices` fake CPU devices."""
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  return ' '.join([f'--xla_force_host_platform_device_count={devices}', *flags])


def python(args, devices=1, cwd=ROOT, env=None, wait=True, timeout=600, **popen):
  """`python ARGS` with `devices` fake CPU devices (and the session's other XLA flags) and
  this checkout on PYTHONPATH, output and errors together: (returncode, output), or the running
  Popen with wait=False. `popen`: more Popen arguments (process_group)."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS='cpu', PYTHONPATH=ROOT,
             **(env or {}))
  proc = subprocess.Popen([sys.executable, *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **popen)
  if not wait:
    return proc
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out


def run_tiny(program, workdir, *args, devices=1, wait=True, env=None, cwd=None, **popen):
  """`python -m liere_jax.<program>` (train or eval) on the tiny arrows run (TINY_RUN), from
  another directory than the checkout (as an installed library): `cwd`, default the workdir's
  parent (required for a gs:// workdir); `popen` as for `python`."""
  cmd = ['-m', f'liere_jax.{program}', '--config', ARROWS + ':grid=4', '--workdir', str(workdir),
         *TINY_RUN, *args]
  if program == 'train':
    cmd.append('--noprogress')
  return python(cmd, devices=devices, cwd=cwd or os.path.dirname(str(workdir)), env=env,
                wait=wait, **popen)


def two_processes(program, workdir, *args, cwd):
  """`program` (train or eval) of the tiny run as two local processes (jax.distributed on
  127.0.0.1, one device each), running, in one process group of their own: as a VM's, which
  `os.killpg(procs[0].pid, signal.SIGTERM)` stops, their data workers too, not pytest."""
  addr = f'127.0.0.1:{free_port()}'
  procs = []
  for i in range(2):
    procs.append(run_tiny(program, workdir, *args, f'--coordinator_address={addr}',
                          '--num_processes=2', f'--process_id={i}', cwd=cwd, wait=False,
                          process_group=procs[0].pid if procs else 0))
  return procs


def wait_for(condition, *procs, timeout=300):
  """Polls `condition` while every one of `procs` runs; a process that ends first, or the
  timeout, fails the test (and ends the others)."""
  deadline = time.time() + timeout
  while not condition():
    if any(p.poll() is not None for p in procs) or time.time() > deadline:
      for p in procs:
        p.kill()
      pytest.fail(f'no longer waiting: {[p.communicate()[0][-3000:] for p in procs]}')
    time.sleep(0.05)


def preempted_at(out: str) -> int:
  """The step of the one line a preempted run prints."""
  lines = [l for l in out.splitlines() if l.startswith('Preempted (SIGTERM')]
  assert len(lines) == 1, out
  return int(lines[0].split(' at step ')[1].split()[0])


def override(config, overrides: dict):
  """`config` with overrides as keyword arguments, dots as '__' ({'model__width': 64}), as
  --config.model.width=64 sets it."""
  for key, value in overrides.items():
    *sections, field = key.replace('__', '.').split('.')
    functools.reduce(lambda c, name: c[name], sections, config)[field] = value
  return config


def flag_overrides(args) -> dict:
  """The `--config.x=y` flags of a command line as overrides for `override` (values as Python
  literals, else strings, as config_flags reads them)."""
  out = {}
  for arg in args:
    key, value = arg[len('--config.'):].split('=', 1)
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def tiny_config(arg='grid=4', **overrides):
  """The tiny arrows run's config (configs/arrows.py:ARG, then TINY, then `overrides`)."""
  return override(load_config(ARROWS, arg), {**TINY, **overrides})


def trainer(config, devices=None, model_parallel=1):
  """steps.Trainer of `config` resolved for `devices` (default: all), as the programs build
  it: the test's edge, where a config becomes a RunSpec."""
  import jax
  from liere_jax import steps
  from liere_jax.config import run as run_spec
  devices = jax.devices() if devices is None else devices
  return steps.Trainer(run_spec.resolve(config, len(devices)),
                           steps.make_mesh(devices, model_parallel))


def pe_params_around_two_steps(**model):
  """(the encoding's parameters before, after two train steps, the last loss) of a one-device
  tiny run (tiny_run_config(width=32, heads=2, depth=1, **model)) on a random batch of 8: the
  first step's learning rate is warmup's 0."""
  import jax
  t = trainer(tiny_run_config(width=32, heads=2, depth=1, **model), jax.devices()[:1])
  rng = np.random.default_rng(0)
  batch = {'image': rng.normal(size=(8, 16, 16, 3)).astype(np.float32),
           'label': np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]}
  state = t.init_state(0)
  before = jax.device_get(state['params']['pe'])
  for _ in range(2):
    state, metrics = t.train_step(state, t.global_batch(batch))
  return before, jax.device_get(state['params']['pe']), float(metrics['loss'])


def train(config, workdir, devices=1):
  """training.train_and_evaluate in this process on the first `devices` devices, as `python -m
  liere_jax.train` with that many devices trains (the same steps, bit for bit); returns the
  step SIGTERM stopped it at, or None, and prints what the program prints."""
  import jax
  from liere_jax import training
  from liere_jax.config import run as run_spec
  return training.train_and_evaluate(run_spec.resolve(config, devices), str(workdir),
                                     progress=False, devices=jax.devices()[:devices])


def train_tiny(workdir, **overrides):
  """The tiny run (tiny_config(**overrides)) trained in this process on one device, as
  run_tiny('train', ...) trains it."""
  return train(tiny_config(**overrides), workdir)


def evaluate(workdir, config=None, devices=1, out='eval', **overrides):
  """`python -m liere_jax.eval --workdir WORKDIR --out OUT` in this process on the first
  `devices` devices: the run's own config (or `config`) with `overrides`; returns the
  results."""
  import jax
  from liere_jax import checkpoint, evaluation
  from liere_jax.config import run as run_spec
  run = run_spec.resolve(override(config or checkpoint.read_config(str(workdir)), overrides),
                         devices)
  checkpoint.check_same_model(str(workdir), run.model)
  return evaluation.evaluate_workdir(run, str(workdir), out=out, devices=jax.devices()[:devices])


def copy_run(workdir, to):
  """A copy of a run's workdir (config, checkpoints, metrics) to change or resume."""
  shutil.copytree(str(workdir), str(to))
  return to


def train_rng_grad_norms(cfg, batch, cases, fresh=()):
  """The gradient norm of one training step from the same parameters (init seed 0) and batch,
  for each (seed, step) of `cases`, by one Trainer per seed (a new one for the cases whose
  index is in `fresh`, as a resumed run builds).

  Only the training RNG (dropout masks, position jitter) depends on (seed, step) here, so
  equal norms mean equal randomness: a test compares them across seeds and steps.
  """
  import jax
  import jax.numpy as jnp
  trainers, norms = {}, []
  for i, (seed, step) in enumerate(cases):
    if seed not in trainers or i in fresh:
      cfg.seed = seed
      trainers[seed] = trainer(cfg, jax.devices()[:1])
    t = trainers[seed]
    state = t.init_state(0)
    state['step'] = jnp.asarray(step, jnp.int32)
    _, metrics = t.train_step(state, t.global_batch(batch))
    norms.append(float(metrics['grad_norm']))
  return norms


def assert_training_randomness_is_a_function_of_seed_and_step(switch, resumed=False):
  """On the tiny arrows run with `switch(cfg, on)` turning a random option on (dropout, position
  jitter): turning it on changes the step, and its randomness is the same for the same
  (seed, step) (from a new Trainer, as after a resume, if `resumed`) and differs from step to
  step and from seed to seed."""
  cfg, batch = tiny_config_and_batch(8)
  switch(cfg, False)
  off = train_rng_grad_norms(cfg, batch, [(0, 3)])
  switch(cfg, True)
  same, again, later, other_seed = train_rng_grad_norms(cfg, batch,
                                                        [(0, 3), (0, 3), (0, 4), (1, 3)],
                                                        fresh={1} if resumed else ())
  assert [same] != off, 'the option does not change the step'
  assert same == again, 'the training RNG is not the same for the same (seed, step)'
  assert later != same, 'the training RNG ignores the step'
  assert other_seed != same, 'the training RNG ignores the seed'


def skew_of_radii(seed, block, radii, per=1):
  """Random skew-symmetric matrices [len(radii) * per, b, b] float32, `per` of each spectral
  radius in `radii` (in order), and cotangents of their shape (standard normal, float32)."""
  rng = np.random.default_rng(seed)
  u = rng.standard_normal((len(radii) * per, block, block))
  a = u - np.swapaxes(u, -1, -2)
  radius = np.repeat(np.asarray(radii, np.float64), per)
  a *= (radius / np.abs(np.linalg.eigvals(a)).max(-1))[:, None, None]
  return a.astype(np.float32), rng.standard_normal(a.shape).astype(np.float32)


def expm_vjp64(a, g):
  """The skew part (what a skew-symmetric parametrisation sees) of jax.vjp of
  jax.scipy.linalg.expm at a for the cotangent g, in float64 (a, g: [m, b, b])."""
  import jax
  with jax.enable_x64(True):
    _, vjp = jax.vjp(jax.vmap(jax.scipy.linalg.expm), jax.numpy.asarray(a, np.float64))
    out = np.asarray(vjp(jax.numpy.asarray(g, np.float64))[0])
  return 0.5 * (out - np.swapaxes(out, -1, -2))


# Spectral radii of the exponential's gradient tests (test_expm, test_kernels_expm: blocks of 3
# to 64, each XLA form and the kernel), and the tolerance at each, relative to the largest entry
# of the float64 gradient of the radius's matrices: float32's rounding, which grows with the
# radius. Measured under conftest's XLA flags: at most 5.4e-7 up to 3, 2.4e-6 at 30 and 1.1e-5
# at 250 (loop, blocks of 4; 7.2e-6 elsewhere); the backward before taylor.py's adjoint
# 5.6e-7, 2.3e-6 and 9.9e-6 on the same matrices. LieRE64's own at 250 keep 1e-5
# (test_expm.test_loop_form_and_its_gradient_within_1e_5_of_float64_at_training).
ADJOINT_RADII = {1e-3: 1e-6, 0.3: 1e-6, 3.0: 1e-6, 30.0: 3e-6, 250.0: 1.5e-5}


def adjoint_errors(grad, ref, per):
  """Max |skew(grad) - ref| / max |ref| over each group of `per` matrices."""
  grad = np.asarray(grad, np.float64)
  diff = np.abs(0.5 * (grad - np.swapaxes(grad, -1, -2)) - ref).reshape(-1, per, *ref.shape[1:])
  return diff.max(axis=(1, 2, 3)) / np.abs(ref).reshape(diff.shape).max(axis=(1, 2, 3))
