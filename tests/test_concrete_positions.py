"""rotations.concrete_positions: positions known at trace time are read (the lattice path needs
them), positions that grad or vmap traces are not, and that is not an error (a mutation
survivor: docs/mutation.md)."""
import jax
import jax.numpy as jnp
import numpy as np

from liere_jax import rotations


def test_positions_traced_by_grad_or_vmap_are_unknown_and_constants_under_jit_are_read():
  seen = []
  record = lambda p: seen.append(rotations.concrete_positions(p)) or jnp.sum(p)
  jax.grad(record)(jnp.ones((4, 2)))
  jax.vmap(record)(jnp.ones((3, 4, 2)))
  assert seen == [None, None]
  grid = np.arange(8.).reshape(4, 2)
  jax.jit(lambda: record(jnp.asarray(grid)))()  # A constant under jit: its value is known.
  np.testing.assert_array_equal(seen[-1], grid)
