"""Cloud TPU slices by accelerator type (v4-8, v5litepod-256, v5p-128, v6e-16): each
generation's published per-chip figures (CHIPS), a slice's chips, torus and hosts
(`parse_slice`), and its devices as jax lists them on the pod, built on this machine without
a TPU (`slice_devices`: libtpu's `get_topology_desc`, requirements-tpu.txt), for compiling
ahead of time (liere_jax/fit.py, `bench compile`). MaxText's accelerator_to_spec_map.py is the
same catalogue.
"""
import dataclasses
import math
import os

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU generation as Cloud TPU sells it: `family-N` accelerator types."""
  family: str  # The accelerator type's prefix: v4-8, v5litepod-8, v5p-8, v6e-8.
  topology: str  # get_topology_desc's name for it.
  device_kind: str  # jax's device_kind.
  hbm: int  # Bytes a chip.
  peak_flops: float  # bf16 FLOP/s a chip.
  hbm_bw: float  # Bytes/s a chip.
  cores_in_name: bool  # N counts TensorCores (2 a chip, one megacore device), else chips.
  dims: int  # Of the chip torus.
  sizes: tuple  # The chip counts sold.
  source: str


# Each generation's published per-chip figures (Cloud TPU system architecture pages).
CHIPS = {c.family: c for c in [
    Chip('v4', 'v4', 'TPU v4', 32 * GiB, 275e12, 1200e9, True, 3,
         tuple(2**i for i in range(2, 13)), 'https://cloud.google.com/tpu/docs/v4'),
    Chip('v5litepod', 'v5e', 'TPU v5 lite', 16 * GiB, 197e12, 819e9, False, 2,
         (1, 4, 8, 16, 32, 64, 128, 256), 'https://cloud.google.com/tpu/docs/v5e'),
    Chip('v5p', 'v5p', 'TPU v5', 95 * GiB, 459e12, 2765e9, True, 3,
         tuple(2**i for i in range(2, 13)), 'https://cloud.google.com/tpu/docs/v5p'),
    Chip('v6e', 'v6e', 'TPU v6 lite', 32 * GiB, 918e12, 1640e9, False, 2,
         (1, 4, 8, 16, 32, 64, 128, 256), 'https://cloud.google.com/tpu/docs/v6e'),
]}
CHIPS_PER_HOST = 4  # A VM of a multi-host slice; one-host slices: v5e / v6e up to 8 chips.


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str  # v5litepod-8
  chip: Chip
  chips: int
  shape: tuple  # Chips along each torus axis.
  hosts: int

  @property
  def host_shape(self):
    if self.hosts == 1:
      return self.shape + (1,) * (3 - len(self.shape))
    return (2, 2, 1)

  def devices(self):
    """The slice's devices, as jax.devices() lists them on the pod (deviceless)."""
    os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')  # No metadata server off a TPU VM.
    os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # Its lock file: several processes.
    try:
      from jax.experimental import topologies
      topology = topologies.get_topology_desc(
          f"{self.chip.topology}:{'x'.join(map(str, self.shape))}", 'tpu',
          chips_per_host_bounds=self.host_shape,
          chip_config_name='megacore' if self.chip.cores_in_name else 'default')
    except Exception as e:  # pylint: disable=broad-except
      if 'tpu' in str(e).lower():  # libtpu missing, or another platform's jax.
        raise RuntimeError(f'--topology {self.name} needs the TPU compiler: pip install -r '
                           f'requirements-tpu.txt ({type(e).__name__}: {str(e)[:200]})') from e
      raise
    return topology.devices


def _torus(chips: int, dims: int) -> tuple:
  """Chips -> the torus shape Cloud TPU gives that many (2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...;
  1x1, 2x2, 2x4, 4x4, 4x8, 8x8, ...): double the smallest axis, the last of equals."""
  if chips == 1:
    return (1,) * dims
  shape = [2, 2] + [1] * (dims - 2)
  while math.prod(shape) < chips:
    small = min(shape)
    i = max(j for j, s in enumerate(shape) if s == small)
    shape[i] *= 2
  return tuple(shape)


def parse_slice(name: str) -> Slice:
  """'v5litepod-256', 'v4-32', 'v5p-128', 'v6e-8' -> its Slice; a one-line error otherwise."""
  family, _, n = name.partition('-')
  chip = CHIPS.get(family)
  known = ', '.join(f'{c.family}-N (N in {c.sizes[0] * (2 if c.cores_in_name else 1)}..'
                    f'{c.sizes[-1] * (2 if c.cores_in_name else 1)})' for c in CHIPS.values())
  if chip is None or not n.isdigit():
    raise ValueError(f'--topology={name!r} is not a Cloud TPU accelerator type; use {known}.')
  chips = int(n) // 2 if chip.cores_in_name else int(n)
  if chips not in chip.sizes or (chip.cores_in_name and int(n) % 2):
    sold = [s * (2 if chip.cores_in_name else 1) for s in chip.sizes]
    raise ValueError(f'--topology={name!r}: {family} slices are {family}-N for N in {sold}.')
  one_host = CHIPS_PER_HOST if chip.cores_in_name else 8
  hosts = 1 if chips <= one_host else chips // CHIPS_PER_HOST
  return Slice(name, chip, chips, _torus(chips, chip.dims), hosts)


def slice_devices(slice_: Slice):
  """`slice_.devices()` with the environment libtpu reads while it loads off a TPU VM set for
  that moment only, so that nothing after (jax.distributed's cluster detection) mistakes this
  machine for a pod host."""
  quiet = {'TPU_ACCELERATOR_TYPE': 'v5litepod-8', 'TPU_WORKER_HOSTNAMES': 'localhost'}
  saved = {k: os.environ.get(k) for k in quiet}
  os.environ.update({k: v for k, v in quiet.items() if saved[k] is None})
  try:
    return slice_.devices()
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
