"""bench compile (liere_jax/bench/compile.py): tiny configs compiled deviceless by the TPU
compiler for a one-host and a multi-host slice, the Pallas kernels' declared work split out,
and against a baseline (--vs). Slices by name:
test_tpu_slices.py; the traffic read from a compiled module: test_bench_hlo.py; a run that
cannot fit: test_fit.py."""
import json
import subprocess
import sys

import pytest

from liere_jax import tpu_slices
from liere_jax.bench import compile as tpu
from liere_jax.config import run as run_spec
from tests import helpers

pytest.importorskip('libtpu', reason='requirements-tpu.txt')


def _tiny(pe, batch):
  cfg, _ = helpers.tiny_config_and_batch(batch)
  cfg.model.pe.name = pe
  cfg.batch_size = cfg.eval_batch_size = batch
  return cfg


@pytest.mark.parametrize('topology, model', [('v5litepod-4', 1), ('v4-16', 1), ('v5litepod-4', 2)])
def test_a_tiny_run_compiles_for_a_one_host_and_a_multi_host_slice(topology, model):
  """LieRE8 (a TPU's Pallas kernels for its rotations) on one host, two, and a model axis."""
  s = tpu_slices.parse_slice(topology)
  cfg = _tiny('liere8', 32)
  cfg.model_parallel = model
  res = tpu.compile_report(run_spec.resolve(cfg, s.chips), s)
  assert res['fits'] and res['hosts'] == (1 if topology == 'v5litepod-4' else 2)
  assert res['mesh'] == {'data': s.chips // model, 'model': model}
  assert res['batch_per_host'] == 32 // s.hosts
  train, evals = res['train'], res['eval']
  assert 0 < train['need'] <= res['need'] < s.chip.hbm and 0 < evals['need']
  assert train['arguments'] > 0 and train['temporaries'] > 0 and train['aliased'] > 0
  assert 0.5 < train['flops'] / train['model_flops'] < 5 and train['bytes'] > 0
  assert train['step_s'] == max(train['flops'] / s.chip.peak_flops,
                                train['bytes'] / s.chip.hbm_bw)
  assert train['conditionals'] == 0  # No branch decided on the device.
  assert train['parts']['exponential'] > 0 and train['parts']['rotation application'] > 0
  assert len(train['largest']) == 5
  # The exponential kernel's work as it declares it: vector ops (8 x 8 blocks as entries), split
  # from the compiler's FLOPs, which count it.
  kernels = train['kernels']
  assert {'liere_expm_forward', 'liere_expm_backward'} <= set(kernels), kernels
  assert all(k['calls'] and k['vpu_ops'] > 0 and not k['unsplit_flops'] for k in kernels.values())
  totals = tpu.kernel_totals(train)
  assert 0 < totals['vpu_ops'] < train['flops'] and 0 < totals['bytes'] < train['bytes']
  assert totals['xla_flops'] == train['flops'] - totals['mxu_flops'] - totals['vpu_ops']
  table = tpu.compile_table([res], ['tiny'])
  assert 'Pallas kernels: VPU Tops' in table and 'liere_expm_backward' in table


def test_vs_compiles_the_baseline_with_its_numerics_field():
  """bench compile --vs FIELD=VALUE: the baseline's numerics plan has that field replaced
  (RoPE's pair swap as a product instead of the TPU's lane shifts: the tiny model's heads are
  too narrow for the attention kernel), so the two programs differ."""
  flags = [f'--config.{k}={v}' for k, v in helpers.TINY.items()]
  cmd = [sys.executable, '-m', 'liere_jax.bench', 'compile', '--config',
         f'{helpers.ARROWS}:grid=4,pe=rope_mixed', '--topology', 'v5litepod-1', '--train_only',
         '--vs', 'pairs=swap_matmul', '--json'] + flags
  p = subprocess.run(cmd, capture_output=True, text=True, cwd=helpers.ROOT)
  assert p.returncode == 0, p.stderr[-2000:]
  roll, matmul = json.loads(p.stdout.strip().splitlines()[-1])
  assert roll['train']['flops'] < matmul['train']['flops'], (roll['train'], matmul['train'])
