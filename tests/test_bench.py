"""Smoke tests of the benchmark CLI (python -m liere_jax.bench): output keys, no timings."""
import json
import os
import subprocess
import sys

import pytest

from liere_jax import bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_expm_bench_tiny_case_rows_and_fast_accuracy():
  rows = bench.bench_expm(['tiny', 'tiny2'], ['fast', 'scipy'], repeats=1, log=lambda s: None)
  assert [(r['case'], r['impl']) for r in rows] == [
      ('tiny', 'fast'), ('tiny', 'scipy'), ('tiny2', 'fast'), ('tiny2', 'scipy')]
  for r in rows:
    assert set(bench.ROW_KEYS) <= set(r), r
    assert r['status'] == 'ok', r
    assert r['n_matrices'] == bench.CASES[r['case']].n_matrices
    assert r['fwd_s'] > 0 and r['fwd_bwd_s'] > 0 and r['compile_s'] > 0
    assert r['temp_bytes'] is not None
  for r in rows:
    if r['impl'] == 'fast':
      assert r['max_abs_err'] <= 1e-5 and r['orth_err'] <= 1e-5, r
      assert r['grad_rel_err'] <= 1e-4, r
  assert 'tiny' in bench.expm_table(rows)


def test_expm_bench_unknown_names_fail_clearly():
  with pytest.raises(ValueError, match='Unknown case'):
    bench.bench_expm(['nope'], ['fast'])
  with pytest.raises(ValueError, match='Unknown impl'):
    bench.bench_expm(['tiny'], ['pade'])


def test_with_args_appends_and_replaces():
  assert bench.with_args('c.py:variant=Ti', 'pe=abs') == 'c.py:variant=Ti,pe=abs'
  assert bench.with_args('c.py:pe=liere8,variant=Ti', 'pe=abs') == 'c.py:variant=Ti,pe=abs'
  assert bench.with_args('c.py', 'pe=abs') == 'c.py:pe=abs'


def _run(*args):
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=2',
             JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-m', 'liere_jax.bench', *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def test_expm_bench_cli_json():
  out = _run('expm', '--case', 'tiny', '--impl', 'fast', '--repeats', '1', '--json')
  rows = json.loads(out.strip().splitlines()[-1])
  assert len(rows) == 1 and set(bench.ROW_KEYS) <= set(rows[0])
  assert rows[0]['status'] == 'ok' and rows[0]['max_abs_err'] <= 1e-5
  assert 'grad rel' in out  # the table came first


def test_step_bench_cli_json():
  out = _run('step', '--config', 'configs/arrows.py:grid=3', '--vs', 'pe=abs',
             '--config.model.depth=1', '--config.model.width=32', '--config.model.heads=2',
             '--config.model.mlp_dim=64', '--config.batch_size=8', '--steps', '2',
             '--warmup', '1', '--json')
  res = json.loads(out.strip().splitlines()[-1])
  for key in ('config', 'baseline', 'train_s', 'baseline_train_s', 'train_ratio', 'eval_s',
              'baseline_eval_s', 'eval_ratio', 'compile_s'):
    assert key in res, key
  assert res['config'] == 'configs/arrows.py:grid=3'
  assert res['baseline'] == 'configs/arrows.py:grid=3,pe=abs'
  assert res['overrides']['batch_size'] == 8
  assert res['train_s'] > 0 and res['baseline_eval_s'] > 0
  assert 'A / B' in out
