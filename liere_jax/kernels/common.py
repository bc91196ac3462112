"""What the Pallas kernels share: the lane width, memory spaces and compiler parameters."""
from typing import NamedTuple

import jax
import jax.numpy as jnp

LANES = 128  # A TPU vector register's minor dimension: every tile is whole lanes.


def pltpu():
  """jax.experimental.pallas.tpu, loaded where a TPU kernel is built."""
  from jax.experimental.pallas import tpu  # pylint: disable=g-import-not-at-top
  return tpu


def vmem(shape, dtype):
  """A kernel's scratch array in VMEM."""
  return pltpu().VMEM(shape, dtype)


def hbm(shape, dtype):
  """A kernel's output that the compiler must place in HBM."""
  return pltpu().HBM(shape, dtype)


def in_hbm(x):
  """A kernel's input that the compiler must leave in HBM (no prefetch into VMEM)."""
  return pltpu().with_memory_space_constraint(x, pltpu().HBM)


def call_kw(interpret: bool, semantics, vmem=None) -> dict:
  """pallas_call's arguments: interpret mode (CPU), or Mosaic with these dimension semantics
  ('parallel' grid axes split over a chip's cores; 'arbitrary' ones run in order) and a VMEM
  scope of `vmem` bytes (None: the compiler's default)."""
  if interpret:
    return {'interpret': True}
  return {'compiler_params': pltpu().CompilerParams(dimension_semantics=tuple(semantics),
                                                    vmem_limit_bytes=vmem)}


def nt(a, b):
  """a b^T: [T, n] x [S, n] -> [T, S] float32."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


class Cost(NamedTuple):
  """What a Pallas kernel does over its whole grid, counted from its body: each kernel's `cost`
  function (tests/test_kernels_*.py hold it to an independent count of the traced kernel,
  tests/kernel_count.py).

  mxu_flops: 2 m n k a product (dot_general), the lanes it computes and masks away and the
    padding rows included; a float32 product at HIGHEST counted once, not as its six bf16
    passes (as XLA counts its own).
  vpu_ops: the vector unit's element operations: one per element of an elementwise result
    (arithmetic, compares, selects, conversions, lane rolls), one per element a reduction
    reads; loads, stores, broadcasts, reshapes and scalar work (ids, loop counters) none.
  transcendentals: exp, log, ... one per element (not in vpu_ops).
  bytes: HBM bytes read and written over the grid: each block every time the pipeline copies
    it (in when its index differs from the previous step's, out when the next step's
    differs), as the TPU lays the array out (`padded`).

  XLA's cost analysis counts its own elementwise ops one flop per element (a reduction one per
  element reduced, exp a transcendental and no flop), a product 2 m n k and bytes as laid out;
  `estimate` declares flops = mxu_flops + vpu_ops in the same units, so the compiler's totals
  add a kernel's work and XLA's alike, and `bench compile` splits the kernels' back out. (The
  roofline prices a vector op at the MXU's peak, as it does XLA's elementwise work.)
  """
  mxu_flops: int
  vpu_ops: int
  transcendentals: int
  bytes: int

  def __add__(self, other):
    return Cost(*(a + b for a, b in zip(self, other)))

  def __mul__(self, n):
    return Cost(*(a * n for a in self))


# The kernels' declared costs, (flops, transcendentals, bytes) -> (name, Cost): what `bench
# compile` splits a compiled custom call's CostEstimate by (liere_jax.bench.compile).
DECLARED = {}


def estimate(name: str, cost: Cost):
  """The pallas_call's CostEstimate of kernel `name` for `cost` (recorded in DECLARED)."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  cost = Cost(*(int(x) for x in cost))
  flops = cost.mxu_flops + cost.vpu_ops
  DECLARED[(flops, cost.transcendentals, cost.bytes)] = (name, cost)
  return pl.CostEstimate(flops=flops, transcendentals=cost.transcendentals,
                         bytes_accessed=cost.bytes)


def padded(n: int, dtype=None) -> int:
  """A dimension as a TPU lays it out in HBM: the minor one (dtype None) in whole 128 lanes,
  the second-minor in whole tiles of 8 32-bit rows (8 float32, 16 bf16)."""
  tile = LANES if dtype is None else 8 * max(1, 4 // jnp.dtype(dtype).itemsize)
  return -(-n // tile) * tile
