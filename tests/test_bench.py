"""Smoke tests of the benchmark CLI (python -m liere_jax.bench): output keys, no timings; the
official-code timing (liere_jax/bench/peer.py) against a fake checkout, and against a real one
when LIERE_OFFICIAL_CHECKOUT names it."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from liere_jax import bench, expm
from tests import helpers

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
  with pytest.raises(ValueError, match="'nope' is neither a case .* nor a shape: MxB"):
    bench.bench_expm(['nope'], ['fast'])
  with pytest.raises(ValueError, match='neither a case'):  # 48 does not divide 64
    bench.bench_expm(['1x1x4x4/48'], ['fast'])
  with pytest.raises(ValueError, match='Unknown impl'):
    bench.bench_expm(['tiny'], ['pade'])


def test_expm_bench_takes_a_shape_the_user_names():
  """'MxB' is M matrices of B x B, 'LxHxGRID/B' a model's stack: the rows say so, with each
  implementation's counted FLOPs (select: SELECT_CAP squarings for every matrix)."""
  assert bench.parse_case('12x3x4x5/8') == bench.Case(12, 3, (4, 5), 8)
  assert bench.parse_case('2x3x2x4x5/16').n_matrices == 2 * 3 * 40 * 4
  rows = bench.bench_expm(['10x16'], ['select', 'cond'], repeats=1,
                          precision='highest', log=lambda s: None)
  assert [(r['n_matrices'], r['size'], r['precision']) for r in rows] == [(10, 16, 'highest')] * 2
  select, cond = rows
  assert select['fwd_gflop'] * 1e9 == (5 + 2 + expm.SELECT_CAP) * 10 * 2 * 16**3
  assert cond['fwd_gflop'] < select['fwd_gflop'] and max(r['max_abs_err'] for r in rows) < 1e-5


def test_fast_flops_counts_squarings_from_the_spectral_radius():
  b = 8
  # A rotation generator by angle 5 in the (0, 1) plane: rho = 5 (its 1-norm is also 5), and
  # ||a^k||_1^(1/k) = 5 exactly. 'cond' (this CPU's plan; degree 12 at theta 1): ceil(log2 5) =
  # 3 squarings, 7 + 3 products of 2 b^3 FLOPs; 'loop' (degree 12 at 1.46, 4 products): 2, 6 + 2;
  # 'select': 7 + SELECT_CAP.
  a = np.zeros((3, b, b), np.float32)
  a[:, 0, 1], a[:, 1, 0] = 5.0, -5.0
  assert bench.fast_flops(a, form='cond') == bench.fast_flops(a) == 3 * 10 * 2 * b**3
  assert bench.fast_flops(a, form='loop') == 3 * 8 * 2 * b**3
  assert bench.fast_flops(a, form='select') == 3 * (7 + expm.SELECT_CAP) * 2 * b**3
  # The all-ones skew matrix (upper +1, lower -1): ||a||_1 = 7, rho 5.03, bound 5.32.
  u = np.triu(np.ones((b, b), np.float32), 1)
  a = np.stack([u - u.T] * 2)
  rho = np.abs(np.linalg.eigvals(a[0].astype(np.float64))).max()
  bound = np.abs(np.linalg.matrix_power(a[0].astype(np.float64), 4)).sum(0).max() ** 0.25
  assert rho <= bound < 7
  assert bench.fast_flops(a, form='cond') == 2 * (7 + int(np.ceil(np.log2(bound)))) * 2 * b**3
  assert bench.fast_flops(np.zeros((4, 2, 2), np.float32)) == 0  # closed form


def _lattice_case(block, layers, heads, grid):
  from liere_jax import rotations
  from liere_jax.positions import grid_positions, with_prefix
  rng = np.random.default_rng(0)
  gens = rng.uniform(0, 2 * np.pi, (layers, heads, 2, 64 // block, rotations.num_free(block)))
  pos = np.asarray(with_prefix(grid_positions(grid, (9, 9), 'normalized'), 1))
  return gens.astype(np.float32), pos


def test_liere_flops_counts_exponentials_and_powers():
  from liere_jax import lattice, rotations
  gens, pos = _lattice_case(8, 2, 3, grid=(6, 6))
  plan = lattice.lattice_plan(pos)
  a = np.asarray(rotations.liere_generators(gens, plan.primitives, 8)).reshape(-1, 8, 8)
  per_device, total = bench.liere_flops(gens, pos, 8)
  assert per_device == total == bench.fast_flops(a) + plan.n_products * 2 * 3 * 8 * 2 * 8**3
  assert total < bench.liere_flops(gens, pos, 8, lattice_ok=False)[1]
  per_device, one_device = bench.liere_flops(gens, pos, 8, n_devices=3)
  assert per_device < total and one_device == total
  # 'loop': one product fewer a matrix, and no more squarings (theta 1.46 against 1).
  assert bench.liere_flops(gens, pos, 8, form='loop')[1] == (
      bench.fast_flops(a, 'loop') + plan.n_products * 2 * 3 * 8 * 2 * 8**3) < total


def test_step_mfu_counts_the_model_from_shapes_as_the_tpu_compiler_does():
  """bench step's MFU numerator (model_flops, from the ViT's shapes) against the TPU compiler's
  count of an abs train step compiled deviceless (every product XLA's, no loop); XLA's count is
  withheld where a library does the products (a GPU's cuBLAS GEMMs) or a loop hides work."""
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
  from liere_jax import fit, tpu_slices
  from liere_jax.bench import step
  from liere_jax.bench.flops import model_flops
  from liere_jax.config import run as run_spec
  cfg, _ = helpers.tiny_config_and_batch(16)
  # Wide enough for the products to dominate (as in ViT-B), small enough to compile in seconds:
  # the TPU compiler's time grows with the batch and the width.
  cfg.model.update(width=256, mlp_dim=1024, heads=2, depth=1)
  cfg.model.pe.name, cfg.batch_size = 'abs', 16
  run = run_spec.resolve(cfg, 1)
  devices = tpu_slices.slice_devices(tpu_slices.parse_slice('v5litepod-1'))
  compiled = fit.compile_steps(run, devices, steps=('train',))['train']
  ratio = step._flops(compiled) / model_flops(run.model, 16)
  assert 1.0 <= ratio < 1.1, ratio  # XLA adds norms, softmax, GELU and Adam.
  assert step.peak_flops(devices[0].device_kind) == 197e12  # v5e

  class Compiled:  # What a GPU compiles: its GEMMs as cuBLAS custom calls; or a loop.
    def __init__(self, text):
      self.as_text = lambda: text
    cost_analysis = compiled.cost_analysis
  gemm = '%d = f32[8,8]{1,0} custom-call(%a, %b), custom_call_target="__cublas$gemm"'
  assert step._flops(Compiled(compiled.as_text() + gemm)) is None
  assert step._flops(Compiled('%w = (s32[]) while(%t), condition=%c, body=%b')) is None


def test_with_args_appends_and_replaces():
  assert bench.with_args('c.py:variant=Ti', 'pe=abs') == 'c.py:variant=Ti,pe=abs'
  assert bench.with_args('c.py:pe=liere8,variant=Ti', 'pe=abs') == 'c.py:variant=Ti,pe=abs'
  assert bench.with_args('c.py', 'pe=abs') == 'c.py:pe=abs'
  # config.KEY=VALUE items are the baseline's overrides, not config arguments.
  vs = 'pe=abs,config.model.scan_layers=False,config.model.pe.expm=scipy'
  assert bench.with_args('c.py:variant=Ti', vs) == 'c.py:variant=Ti,pe=abs'
  assert bench.vs_overrides(vs) == {'model.scan_layers': False, 'model.pe.expm': 'scipy'}
  with pytest.raises(ValueError, match='config.KEY=VALUE'):
    bench.vs_overrides('config.model.scan_layers')


def _run(*args):
  env = dict(os.environ, XLA_FLAGS=helpers.xla_flags(2),
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


def test_rotations_bench_cli_json():
  out = _run('rotations', '--case', 'tiny', '--repeats', '1', '--json')
  rows = json.loads(out.strip().splitlines()[-1])
  assert [r['path'] for r in rows] == ['general', 'lattice']
  general, lattice = rows[0], rows[1]
  assert lattice['n_exp'] < general['n_exp'] and lattice['gflop'] < general['gflop']
  assert lattice['diff'] <= 1e-5 and min(r['fwd_bwd'] for r in rows) > 0
  assert 'x f+b' in out  # the table came first


def test_step_bench_cli_json(fake_official):
  # Head dim 64, as the official attention requires; the fake official code is timed too.
  out = _run('step', '--config', 'configs/arrows.py:grid=3', '--vs', 'pe=abs',
             '--config.model.depth=1', '--config.model.width=128', '--config.model.heads=2',
             '--config.model.mlp_dim=64', '--config.model.pool=cls', '--config.batch_size=8',
             '--steps', '2', '--warmup', '1', '--official', str(fake_official),
             '--official_threads', '1', '--breakdown', '--json')
  res = json.loads(out.strip().splitlines()[-1])
  for key in ('config', 'baseline', 'train_s', 'baseline_train_s', 'train_ratio', 'eval_s',
              'baseline_eval_s', 'eval_ratio', 'compile_s'):
    assert key in res, key
  assert res['config'] == 'configs/arrows.py:grid=3'
  assert res['baseline'] == 'configs/arrows.py:grid=3,pe=abs'
  assert res['overrides']['batch_size'] == 8
  assert res['train_s'] > 0 and res['baseline_eval_s'] > 0
  # The breakdown against abs, whose context has no float leaf (only integer positions).
  assert res['cached_rot_ratio'] > 0 and res['baseline_pe_fwd_bwd_s'] > 0
  assert 'A / B' in out
  assert res['official_train_s'] > 0 and res['official_over_train'] > 0
  assert res['official']['kwargs']['dim'] == 128 and res['official']['threads'] == 1
  assert 'official / A' in out


# ----------------------------------------------------------------------------------------------
# The official PyTorch LieRE step (liere_jax/bench/peer.py), against a fake checkout.

FAKE_ROPE_VIT = '''
import json, os
import torch
from .vit import Head  # A relative import, as the official rope_vit.py does.


class RoPEViT(torch.nn.Module):
  """Stands in for the official class: the same keyword arguments, a tiny model."""

  def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
               positional_encoding_type, input_dimensionality=2, phase_type=None,
               position_sequencing_type="sequential", generator_dim=None, pool="cls",
               channels=3, dim_head=64, dropout=0.1, emb_dropout=0.1,
               force_absolute_encodings=False, rotary_embedding_per_layer=False,
               rotary_embedding_per_head=False, checkpoint_attn=False, shuffle_patches=False,
               enable_ape=True):
    super().__init__()
    print("the official code prints while it builds")  # Must not break the worker protocol.
    kw = {k: v for k, v in locals().items() if k not in ('self', '__class__')}
    with open(os.path.join(os.path.dirname(__file__), 'kwargs.json'), 'w') as f:
      json.dump(kw, f)
    self.patch = torch.nn.Conv2d(channels, dim, patch_size, patch_size)
    self.head = Head(dim, num_classes)

  def forward(self, x):
    return self.head(self.patch(x).mean((2, 3)))
'''

FAKE_VIT = '''
import torch


class Head(torch.nn.Linear):
  pass
'''


@pytest.fixture(scope='module')
def fake_official(tmp_path_factory):
  root = tmp_path_factory.mktemp('fake_LieRE')
  (root / 'models').mkdir()
  (root / 'models' / 'rope_vit.py').write_text(FAKE_ROPE_VIT)
  (root / 'models' / 'vit.py').write_text(FAKE_VIT)
  return root


def _cifar(pe='liere64', **overrides):
  return bench.load_config(f'configs/cifar100.py:variant=Ti,pe={pe}',
                           dict(dict(batch_size=4), **overrides))


def test_official_kwargs_map_our_shape():
  kw = bench.official_kwargs(_cifar().model)
  assert kw == dict(
      image_size=32, patch_size=4, num_classes=100, dim=192, depth=12, heads=3, mlp_dim=768,
      input_dimensionality=2, pool='cls', channels=3, dim_head=64, dropout=0.1,
      emb_dropout=0.1, positional_encoding_type='liere', phase_type='naver', generator_dim=64,
      enable_ape=False, rotary_embedding_per_layer=True, rotary_embedding_per_head=True)
  kw = bench.official_kwargs(_cifar('liere8', **{'model.pe.share': 'layers'}).model)
  assert (kw['generator_dim'], kw['rotary_embedding_per_layer'],
          kw['rotary_embedding_per_head']) == (8, False, True)
  kw = bench.official_kwargs(_cifar('rope_mixed').model)
  assert (kw['positional_encoding_type'], kw['generator_dim']) == ('liere', 2)
  assert bench.official_kwargs(_cifar('abs').model)['positional_encoding_type'] == 'absolute'
  with pytest.raises(ValueError, match='pe=sincos'):
    bench.official_kwargs(_cifar('sincos').model)
  with pytest.raises(ValueError, match='head_dim=32'):
    bench.official_kwargs(_cifar(**{'model.heads': 6}).model)


def test_official_step_on_a_fake_checkout(fake_official):
  config = _cifar()
  res = bench.time_official(config, str(fake_official), steps=2, warmup=1, threads=1,
                            device='cpu')
  assert res['train_s'] > 0 and len(res['times']) == 2 and all(t > 0 for t in res['times'])
  assert res['device'] == 'cpu' and res['threads'] == 1 and res['params'] > 0
  built = json.loads((fake_official / 'models' / 'kwargs.json').read_text())
  expected = bench.official_kwargs(config.model)
  assert {k: built[k] for k in expected} == expected


def test_official_checkout_errors(tmp_path):
  config = _cifar()
  with pytest.raises(bench.OfficialError, match=r'has no models/rope_vit\.py: point --official'):
    bench.Official(config, str(tmp_path), device='cpu')
  (tmp_path / 'models').mkdir()
  (tmp_path / 'models' / 'rope_vit.py').write_text('import not_a_module_liere\n')
  with pytest.raises(bench.OfficialError, match="No module named 'not_a_module_liere'.*pip"):
    bench.Official(config, str(tmp_path), device='cpu')
  (tmp_path / 'models' / 'rope_vit.py').write_text('X = 1\n')
  with pytest.raises(bench.OfficialError, match='defines no RoPEViT'):
    bench.Official(config, str(tmp_path), device='cpu')


OFFICIAL_CHECKOUT = os.environ.get('LIERE_OFFICIAL_CHECKOUT')


@pytest.mark.skipif(not OFFICIAL_CHECKOUT, reason='set LIERE_OFFICIAL_CHECKOUT to a checkout '
                    'of github.com/StanfordMIMI/LieRE')
@pytest.mark.parametrize('pe', ['liere8', 'abs'])
def test_official_step_on_the_real_checkout(pe):
  config = _cifar(pe, **{'model.depth': 2})
  res = bench.time_official(config, OFFICIAL_CHECKOUT, steps=1, warmup=1, device='cpu')
  assert res['train_s'] > 0 and res['params'] > 0
