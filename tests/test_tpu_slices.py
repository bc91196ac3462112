"""liere_jax/tpu_slices.py: Cloud TPU slices by accelerator type (chips, torus, hosts), refused
in one line where Cloud TPU does not sell them; a slice's devices built without a TPU."""
import os

import pytest

from liere_jax import tpu_slices


@pytest.mark.parametrize('name, chips, shape, hosts', [
    ('v4-8', 4, (2, 2, 1), 1), ('v4-32', 16, (2, 2, 4), 4), ('v4-4096', 2048, (8, 16, 16), 512),
    ('v5p-128', 64, (4, 4, 4), 16), ('v5litepod-1', 1, (1, 1), 1),
    ('v5litepod-8', 8, (2, 4), 1), ('v5litepod-32', 32, (4, 8), 8),
    ('v5litepod-256', 256, (16, 16), 64), ('v6e-4', 4, (2, 2), 1), ('v6e-16', 16, (4, 4), 4)])
def test_accelerator_types_name_their_chips_hosts_and_torus(name, chips, shape, hosts):
  s = tpu_slices.parse_slice(name)
  assert (s.chips, s.shape, s.hosts) == (chips, shape, hosts)


@pytest.mark.parametrize('name, says', [('v5e-8', 'v5litepod-N'), ('v4-6', 'v4-N for N in'),
                                        ('v5litepod-2', '[1, 4, 8'), ('tpu', 'v6e-N')])
def test_a_slice_that_cloud_tpu_does_not_sell_is_refused_naming_those_it_does(name, says):
  with pytest.raises(ValueError, match='--topology') as e:
    tpu_slices.parse_slice(name)
  assert says in str(e.value) and '\n' not in str(e.value)


def test_a_slice_s_devices_are_built_here_leaving_no_pod_host_environment_behind():
  """Deviceless (libtpu): as many devices as the slice has chips, of its chip's kind; the
  variables libtpu reads while it loads are gone after, so jax.distributed finds no pod."""
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
  s = tpu_slices.parse_slice('v5litepod-4')
  before = {k: os.environ.get(k) for k in ('TPU_ACCELERATOR_TYPE', 'TPU_WORKER_HOSTNAMES')}
  devices = tpu_slices.slice_devices(s)
  assert len(devices) == s.chips
  assert {d.device_kind for d in devices} == {s.chip.device_kind}
  assert {k: os.environ.get(k) for k in before} == before
