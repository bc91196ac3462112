"""bench compile (liere_jax/bench/compile.py): Cloud TPU slices by name, the traffic read from a
compiled module, and tiny configs compiled deviceless by the TPU compiler for a one-host and a
multi-host slice; a run that cannot fit refused in one line by bench compile and train.py."""
import json
import os
import subprocess
import sys

import pytest

from liere_jax.bench import compile as tpu
from liere_jax.config import run as run_spec
from tests import helpers

pytest.importorskip('libtpu', reason='requirements-tpu.txt')


@pytest.mark.parametrize('name, chips, shape, hosts', [
    ('v4-8', 4, (2, 2, 1), 1), ('v4-32', 16, (2, 2, 4), 4), ('v4-4096', 2048, (8, 16, 16), 512),
    ('v5p-128', 64, (4, 4, 4), 16), ('v5litepod-1', 1, (1, 1), 1),
    ('v5litepod-8', 8, (2, 4), 1), ('v5litepod-32', 32, (4, 8), 8),
    ('v5litepod-256', 256, (16, 16), 64), ('v6e-4', 4, (2, 2), 1), ('v6e-16', 16, (4, 4), 4)])
def test_accelerator_types_name_their_chips_hosts_and_torus(name, chips, shape, hosts):
  s = tpu.parse_slice(name)
  assert (s.chips, s.shape, s.hosts) == (chips, shape, hosts)


@pytest.mark.parametrize('name, says', [('v5e-8', 'v5litepod-N'), ('v4-6', 'v4-N for N in'),
                                        ('v5litepod-2', '[1, 4, 8'), ('tpu', 'v6e-N')])
def test_a_slice_that_cloud_tpu_does_not_sell_is_refused_naming_those_it_does(name, says):
  with pytest.raises(ValueError, match='--topology') as e:
    tpu.parse_slice(name)
  assert says in str(e.value) and '\n' not in str(e.value)


HLO = """HloModule m

%fused (p: f32[8,8]) -> f32[8,8] {
  %p = f32[8,8]{1,0} parameter(0)
  ROOT %n = f32[8,8]{1,0} negate(%p)
}

%body (t: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %t = (s32[], f32[8,8]{1,0:T(8,128)}) parameter(0)
  %x = f32[8,8]{1,0:T(8,128)} get-tuple-element(%t), index=1
  %f = f32[8,8]{1,0:T(8,128)} fusion(%x), kind=kLoop, calls=%fused, metadata={op_name="jit(f)/liere_expm/neg"}
  %cp = f32[8,8]{0,1:T(8,128)} copy(%f)
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %r = (s32[], f32[8,8]{1,0:T(8,128)}) tuple(%i, %cp)
}

%cond (c: (s32[], f32[8,8])) -> pred[] {
  %c = (s32[], f32[8,8]{1,0}) parameter(0)
  ROOT %k = pred[] constant(true)
}

ENTRY %main (a: f32[8,8], b: bf16[4,256]) -> f32[8,8] {
  %a = f32[8,8]{1,0:T(8,128)} parameter(0)
  %b = bf16[4,256]{1,0} parameter(1)
  %z = s32[] constant(0)
  %c0 = bf16[4,256]{1,0} copy(%b), metadata={op_name="jit(f)/pe_rotate/copy"}
  %t0 = (s32[], f32[8,8]{1,0:T(8,128)}) tuple(%z, %a)
  %w = (s32[], f32[8,8]{1,0:T(8,128)}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %o = f32[8,8]{1,0:T(8,128)} get-tuple-element(%w), index=1
}
"""


def test_traffic_counts_top_level_instructions_times_their_loops_and_tiles_as_laid_out():
  """hlo_traffic on a handwritten module: what it counts, how often, in which scope."""
  rows = {r['name']: r for r in tpu.hlo_traffic(HLO)}
  assert set(rows) == {'f', 'cp', 'c0'}  # Not the fused negate, parameters, tuples, the loop.
  f, c0 = rows['f'], rows['c0']
  # A copy the compiler added (no op name) counts as the op it copies.
  assert rows['cp']['op_name'] == '(copy of) jit(f)/liere_expm/neg'
  assert (rows['cp']['scope'], rows['cp']['count']) == ('exponential', 5)
  assert (f['scope'], f['count'], c0['scope'], c0['count']) == (
      'exponential', 5, 'rotation application', 1)
  assert f['bytes'] == 5 * 2 * 8 * 8 * 4  # Read and written, 5 trips.
  assert f['padded_bytes'] == 5 * 2 * 8 * 128 * 4  # An 8 x 8 block in an 8 x 128 tile.
  assert c0['bytes'] == c0['padded_bytes'] == 2 * 4 * 256 * 2


def _tiny(pe, batch):
  cfg, _ = helpers.tiny_config_and_batch(batch)
  cfg.model.pe.name = pe
  cfg.batch_size = cfg.eval_batch_size = batch
  return cfg


@pytest.mark.parametrize('topology, model', [('v5litepod-4', 1), ('v4-16', 1), ('v5litepod-4', 2)])
def test_a_tiny_run_compiles_for_a_one_host_and_a_multi_host_slice(topology, model):
  """LieRE8 (a TPU's Pallas kernels for its rotations) on one host, two, and a model axis."""
  s = tpu.parse_slice(topology)
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


def test_a_run_that_cannot_fit_is_refused_in_one_line_before_anything_is_written(tmp_path):
  flags = [f'--config.{k}={v}' for k, v in helpers.TINY.items() if k != 'batch_size']
  cmd = [sys.executable, '-m', 'liere_jax.train', '--config', f'{helpers.ARROWS}:grid=4',
         '--workdir', str(tmp_path / 'run'), '--config.batch_size=262144', '--check_fit',
         'v5litepod-1', '--progress=false'] + flags
  p = subprocess.run(cmd, capture_output=True, text=True, cwd=helpers.ROOT)
  assert p.returncode == 2, p.stderr[-2000:]
  line = p.stderr.strip().splitlines()[-1]
  assert line.startswith('python -m liere_jax.train: error: The run does not fit v5litepod-1')
  assert 'GiB a chip' in line and '--config.batch_size=' in line, line
  assert not os.path.exists(tmp_path / 'run')


def test_vs_compiles_the_baseline_under_its_switches():
  """bench compile --vs NAME=FORM: the baseline is traced with that switch set (RoPE's pair swap
  as a product instead of the TPU's lane shifts), so the two programs differ."""
  flags = [f'--config.{k}={v}' for k, v in helpers.TINY.items()]
  cmd = [sys.executable, '-m', 'liere_jax.bench', 'compile', '--config',
         f'{helpers.ARROWS}:grid=4,pe=rope_mixed', '--topology', 'v5litepod-1', '--train_only',
         '--vs', 'swap=matmul', '--json'] + flags
  p = subprocess.run(cmd, capture_output=True, text=True, cwd=helpers.ROOT)
  assert p.returncode == 0, p.stderr[-2000:]
  roll, matmul = json.loads(p.stdout.strip().splitlines()[-1])
  assert roll['train']['flops'] < matmul['train']['flops'], (roll['train'], matmul['train'])
