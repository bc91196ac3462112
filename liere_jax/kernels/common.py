"""What the Pallas kernels share: the lane width, memory spaces and compiler parameters."""
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


def call_kw(interpret: bool, semantics) -> dict:
  """pallas_call's arguments: interpret mode (CPU), or Mosaic with these dimension semantics
  ('parallel' grid axes split over a chip's cores; 'arbitrary' ones run in order)."""
  if interpret:
    return {'interpret': True}
  return {'compiler_params': pltpu().CompilerParams(dimension_semantics=tuple(semantics))}


def nt(a, b):
  """a b^T: [T, n] x [S, n] -> [T, S] float32."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
