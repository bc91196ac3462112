"""liere_jax/fit.py: whether a run's steps fit its chips' memory. The advice and the one-line
refusal, from the figures; a tiny run compiled for this process's devices, fitting and not; and
train.py --check_fit refusing, deviceless, a run that cannot fit a Cloud TPU slice before
anything is written."""
import os
import subprocess
import sys
import types

import jax
import pytest

from liere_jax import fit
from liere_jax.config import run as run_spec
from liere_jax.tpu_slices import GiB
from tests import helpers


def _run(remat='none', sharding='data'):
  return types.SimpleNamespace(model=types.SimpleNamespace(remat=remat),
                               loop=types.SimpleNamespace(sharding=sharding))


def test_the_advice_is_the_batch_that_leaves_the_temporaries_room_and_the_settings_that_shrink():
  """Temporaries grow with the batch: 64 images a chip need 30 GiB of them, and 95% of the
  16 GiB chip less the 1 GiB state leaves room for 14.2 / 30 of them: 24 a chip (of 8)."""
  res = {'hbm': 16 * GiB, 'state': 1 * GiB, 'batch_per_chip': 64, 'mesh': {'data': 4}}
  assert fit.advice(_run(), res, temp=30 * GiB) == (
      '--config.batch_size=96 (24 a chip) or --config.model.remat=block')
  # remat already on, a state worth sharding (over a tenth of the chip), no room for 8 a chip.
  res['state'] = 15 * GiB
  assert fit.advice(_run('block'), res, temp=30 * GiB) == '--config.sharding=fsdp'
  assert fit.advice(_run('block', 'fsdp'), res, temp=30 * GiB) == 'a slice with more chips'


def test_the_refusal_is_one_line_with_the_need_the_chip_and_the_advice():
  res = {'topology': 'v5litepod-1', 'need': 20 * GiB, 'batch_per_chip': 64., 'hbm': 16 * GiB,
         'available': 15.75 * GiB, 'device_kind': 'TPU v5 lite', 'advice': 'X or Y'}
  assert fit.refusal('The run', res) == (
      'The run does not fit v5litepod-1: the train step needs 20.00 GiB a chip (64 images a '
      'chip) and a TPU v5 lite chip has 15.75 GiB; would fit (estimate): X or Y.')


def test_a_tiny_run_compiled_for_these_devices_fits_them_and_not_a_chip_one_byte_short():
  """check_fit('devices'): the train step compiled for this process's devices (8 CPU devices,
  whose memory the backend does not state: it fits); the same figures against a chip one byte
  short of the need do not fit, with advice."""
  cfg, _ = helpers.tiny_config_and_batch(16)
  cfg.batch_size = cfg.eval_batch_size = 16
  res = fit.check_fit(cfg, 'devices')
  assert res['fits'] and res['mesh'] == {'data': jax.device_count(), 'model': 1}
  train = res['train']
  assert res['need'] == train['need'] == (train['arguments'] + train['outputs']
                                          - train['aliased'] + train['temporaries']
                                          + train['code']) > 0
  assert res['state'] == train['arguments'] and 'eval' not in res
  run = run_spec.resolve(cfg, jax.device_count())
  short, compiled = fit.fit(run, jax.devices(), hbm=res['need'] - 1, steps=('train',))
  assert not short['fits'] and short['advice'] and set(compiled) == {'train'}


def test_a_run_that_cannot_fit_is_refused_in_one_line_before_anything_is_written(tmp_path):
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
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
