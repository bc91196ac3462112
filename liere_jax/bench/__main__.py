"""python -m liere_jax.bench ACTION [flags], ACTION one of:"""
import json
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from liere_jax import command, tpu_slices
from liere_jax.config import parse_flags
from liere_jax.numerics import PRECISIONS
from liere_jax.bench.data import bench_data, data_table
from liere_jax.bench.expm import DEFAULT_CASES, IMPLS, bench_expm, expm_table, parse_case
from liere_jax.bench.lower import PLATFORMS, bench_lower
from liere_jax.bench.plan import plan_of, plan_table
from liere_jax.bench.presets import bench_presets, presets_table
from liere_jax.bench.profile import profile_step, profile_table
from liere_jax.bench.peer import OfficialError
from liere_jax.bench.rotations import bench_rotations, rotations_table
from liere_jax.bench.step import (bench_step, load_config, step_table, vs_overrides, vs_numerics,
                                  with_args)

_CONFIG = config_flags.DEFINE_config_file('config', None, 'step, data, lower, profile: '
                                          'config '
                                          'file[:args].',
                                          lock_config=False)
_VS = flags.DEFINE_string('vs', None, 'step, compile: arguments appended to the config '
                          'argument string for the baseline, e.g. pe=abs; items '
                          "config.KEY=VALUE override the baseline's config only, e.g. "
                          'config.model.scan_layers=False; items FIELD=VALUE replace a field of '
                          "the baseline's numerics plan (liere_jax.numerics), e.g. attention=xla, "
                          'pairs=swap_matmul.')
_STEPS = flags.DEFINE_integer('steps', 10, 'step: timed steps of each (after warm-up); '
                              'profile: traced steps.')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed calls of each before timing.')
_BREAKDOWN = flags.DEFINE_bool('breakdown', False, 'step: also time the train step with the '
                               'rotations cached, the encoding alone, and count XLA FLOPs.')
_OFFICIAL = flags.DEFINE_string('official', None, 'step: a checkout of '
                                'github.com/StanfordMIMI/LieRE; times its train step at the '
                                "shape of --config (imports DIR/models/rope_vit.py).")
_OFFICIAL_PYTHON = flags.DEFINE_string('official_python', None, 'step: interpreter with torch, '
                                       "einops and the official code's imports; default: this.")
_OFFICIAL_THREADS = flags.DEFINE_integer('official_threads', None,
                                         'step: torch threads; default: CPU count.')
_CASE = flags.DEFINE_multi_string('case', None, 'expm, rotations: cases (default: expm all '
                                   'but tiny, rotations all but tiny); expm also takes a shape: '
                                   'MxB (4096x32: 4096 matrices of 32x32) or LxHxGRID/B '
                                   '(12x12x14x14/8).')
_IMPL = flags.DEFINE_multi_string('impl', None, 'expm: implementations (default: scipy, fast '
                                   "(this backend's plan), torch; also XLA's forms loop, cond, "
                                   'select, and pallas).')
_PRECISION = flags.DEFINE_string('precision', 'auto', 'expm: products of the JAX '
                                 'implementations, auto or highest (model.pe.expm_precision).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'expm, rotations: timed calls of each (after '
                                'warm-up); data: rounds over the worker counts.')
_WORKERS = flags.DEFINE_list('workers', ['0', '1', '2'], 'data: Grain worker process counts '
                              'to time (0 = threads of the main process only).')
_BATCHES = flags.DEFINE_integer('batches', 10, 'data: timed batches of each (after warm-up); '
                                'the batch is --config.batch_size.')
_PLATFORM = flags.DEFINE_enum('platform', None, PLATFORMS, 'lower: the platform to lower the '
                              'train step for (default cuda); plan: the platform whose plan to '
                              'print (default: this backend).')
_TOPOLOGY = flags.DEFINE_string('topology', 'v5litepod-8', 'compile: the Cloud TPU slice, as '
                                'its accelerator type: v4-8 .. v4-4096, v5litepod-1 .. '
                                'v5litepod-256, v5p-8 .., v6e-1 .. v6e-256; plan: its chip '
                                "(its VMEM; default: v4's, the least).")
_NO_EVAL = flags.DEFINE_bool('train_only', False, 'compile: the train step only.')
_JSON = flags.DEFINE_bool('json', False, 'Print the result as JSON on the last line.')



def _platform():
  d = jax.devices()[0]
  return f'platform: {d.platform} ({d.device_kind}), jax {jax.__version__}'


def _expm(log):
  cases = _CASE.value or DEFAULT_CASES
  with command.refusing():
    [parse_case(c) for c in cases]
    if _PRECISION.value not in PRECISIONS:
      raise ValueError(f'--precision={_PRECISION.value!r} is unknown; use one of {PRECISIONS}.')
  rows = bench_expm(cases, _IMPL.value or IMPLS, _REPEATS.value,
                    max(_WARMUP.value, 1) if _WARMUP.present else 1,
                    precision=_PRECISION.value, log=log)
  return _platform(), expm_table(rows), rows


def _rotations(log):
  rows = bench_rotations(*[_CASE.value] if _CASE.value else [], repeats=_REPEATS.value, log=log)
  return _platform(), rotations_table(rows), rows


def _data(log):
  if _CONFIG.value is None:
    raise app.UsageError('data needs --config CONFIG[:args].')
  workers = [int(n) for n in _WORKERS.value if n.isdigit()]
  if (not workers or len(workers) != len(_WORKERS.value) or _BATCHES.value < 1
      or _REPEATS.value < 1):
    raise app.UsageError(f'--workers={",".join(_WORKERS.value)} must be counts >= 0, '
                         f'--batches={_BATCHES.value} and --repeats={_REPEATS.value} >= 1.')
  res = bench_data(_CONFIG.value, workers=workers, batches=_BATCHES.value,
                   warmup=_WARMUP.value, repeats=_REPEATS.value, log=log)
  res['config'] = config_flags.get_config_filename(flags.FLAGS['config'])
  res['overrides'] = config_flags.get_override_values(flags.FLAGS['config'])
  head = (f'{res["config"]}: {res["dataset"]} {res["input_shape"]}, augment {res["augment"]}, '
          f'batch {res["batch_size"]}, {res["batches"]} timed batches, {res["cores"]} cores, '
          f'prefetch {res["prefetch"]}; {res["data"]}')
  return head, data_table(res), res


def _lower(log):
  if _CONFIG.value is None:
    raise app.UsageError('lower needs --config CONFIG[:args].')
  platform = _PLATFORM.value or 'cuda'
  log(f'lowering the train step for {platform}')
  res, = bench_lower(_CONFIG.value, [platform])
  res['config'] = config_flags.get_config_filename(flags.FLAGS['config'])
  table = '\n'.join(f'{k}: {res[k]}' for k in ('conditionals', 'platform_cases', 'while_loops',
                                                'expm_dot_algorithms', 'expm_dots'))
  return f"{res['config']} lowered for {res['platform']} on {_platform()}", table, res


def _plan(log):
  if _CONFIG.value is None:
    raise app.UsageError('plan needs --config CONFIG[:args].')
  with command.refusing():
    chip = (tpu_slices.parse_slice(_TOPOLOGY.value).chip.device_kind
            if flags.FLAGS['topology'].present else None)
    res = plan_of(_CONFIG.value, _PLATFORM.value, chip)
  res['config'] = config_flags.get_config_filename(flags.FLAGS['config'])
  return f"{res['config']} on {res['platform']} (liere_jax.numerics)", plan_table(res), res


def _presets(log):
  case = (_CASE.value or ['imagenet_vitb16_liere64'])[0]
  with command.refusing():
    parse_case(case)
  rows = bench_presets(case, log=log)
  return (f'{case}: the exponential (XLA\'s loop form) at emulated presets against float64 SciPy, '
          f"{rows[0]['n_matrices']} largest matrices", presets_table(rows), rows)


def _profile(log):
  if _CONFIG.value is None:
    raise app.UsageError('profile needs --config CONFIG[:args].')
  res = profile_step(_CONFIG.value, steps=_STEPS.value, warmup=_WARMUP.value, log=log)
  res['config'] = config_flags.get_config_filename(flags.FLAGS['config'])
  return f"{res['config']} train step on {_platform()}", profile_table(res), res


def _step(log):
  if _CONFIG.value is None or _VS.value is None:
    raise app.UsageError('step needs --config CONFIG[:args] and --vs ARGS.')
  spec = config_flags.get_config_filename(flags.FLAGS['config'])
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  spec_b = with_args(spec, _VS.value)
  try:
    baseline = load_config(spec_b, {**overrides, **vs_overrides(_VS.value)})
    baseline_numerics = vs_numerics(_VS.value)
    names = (spec, spec_b + ''.join(f',{k}={v}' for k, v in baseline_numerics.items()))
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    raise app.UsageError(f'--vs {_VS.value!r}: {e}')
  official = None
  if _OFFICIAL.value:
    official = dict(checkout=_OFFICIAL.value, python=_OFFICIAL_PYTHON.value,
                    threads=_OFFICIAL_THREADS.value)
  try:
    res = bench_step(_CONFIG.value, baseline, names=names, steps=_STEPS.value,
                     warmup=_WARMUP.value, breakdown=_BREAKDOWN.value, official=official,
                     baseline_numerics=baseline_numerics, log=log)
  except OfficialError as e:  # Found before anything is compiled.
    raise app.UsageError(f'bench step --official: {e}') from None
  res['overrides'] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in overrides.items()}
  head = (f'platform: {res["platform"]} x{res["devices"]}, jax {jax.__version__}, '
          f'batch {res["batch_size"]}, {res["steps"]} timed steps (medians)')
  return head, step_table(res), res


def _compile(log):
  from liere_jax import fit, tpu_slices
  from liere_jax.bench import compile as tpu
  from liere_jax.config import run as run_spec
  if _CONFIG.value is None:
    raise app.UsageError('compile needs --config CONFIG[:args].')
  if not jax.config.jax_platforms:  # Deviceless: this machine's own accelerators stay unused.
    jax.config.update('jax_platforms', 'cpu')
  spec = config_flags.get_config_filename(flags.FLAGS['config'])
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  configs, names, settings = [_CONFIG.value], [spec], [{}]
  with command.refusing():
    slice_ = tpu_slices.parse_slice(_TOPOLOGY.value)
    if _VS.value is not None:  # The baseline: other arguments, overrides or numerics fields.
      settings.append(vs_numerics(_VS.value))
      names.append(with_args(spec, _VS.value) + ''.join(
          f',{k}={v}' for k, v in settings[-1].items()))
      configs.append(load_config(with_args(spec, _VS.value),
                                 {**overrides, **vs_overrides(_VS.value)}))
    runs = [run_spec.resolve(c, slice_.chips) for c in configs]
  results = []
  for name, run, fields in zip(names, runs, settings):
    log(f'compiling {name} for {slice_.name} ({slice_.chips} chips, {slice_.hosts} hosts)')
    results.append(tpu.compile_report(run, slice_, eval_step=not _NO_EVAL.value,
                                      numerics=fields))
  misfit = next((fit.refusal(n, r) for n, r in zip(names, results) if not r['fits']), None)
  if misfit:  # One line, exit 2: what a pod launch would have found out on the pod.
    if _JSON.value:
      print(json.dumps(results, default=str))
    raise app.UsageError(misfit)
  return f'{names[0]} compiled for {slice_.name} (TPU compiler, jax {jax.__version__})', \
      tpu.compile_table(results, names), results


# The actions, each once: its function above and one line of help; its module
# (liere_jax/bench/ACTION.py) says in full what it measures.
ACTIONS = {
    'expm': (_expm, 'the matrix exponential\'s methods on LieRE cases: time, memory, errors'),
    'rotations': (_rotations, "a model's LieRE rotations, general against lattice path"),
    'step': (_step, 'train and eval steps of --config against --vs (and the official code)'),
    'data': (_data, "the config's train batches per second against Grain worker count"),
    'lower': (_lower, 'the train step lowered for --platform: conditionals, loops, precisions'),
    'plan': (_plan, 'what --platform computes for --config: exponential, rotations, attention'),
    'profile': (_profile, "a profiler trace of the train step: where the device's time goes"),
    'presets': (_presets, "the exponential's error at each dot-algorithm preset (emulated)"),
    'compile': (_compile, 'the train and eval steps compiled for a Cloud TPU slice (--topology)'),
}
__doc__ += '\n\n' + '\n'.join(f'  {name:10s} {help_}' for name, (_, help_) in ACTIONS.items())


def main(argv):
  action = command.subcommand(argv, ACTIONS, 'bench')
  log = lambda s: print(s, file=sys.stderr, flush=True)
  head, table, result = ACTIONS[action][0](log)
  print(head)
  print(table)
  if _JSON.value:
    print(json.dumps(result, default=str))


if __name__ == '__main__':
  command.run(main, 'bench', flags_parser=parse_flags)
