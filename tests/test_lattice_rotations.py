"""LieRE's rotations on a small patch grid (seconds: the mutation run's selection for
rotations.liere_rotations, docs/mutation.md): the lattice path, one exponential per primitive
lattice point and powers for the rest, gives every token exp(sum_i p_i A_i) in float64; which
path runs, and how a mesh's data devices share the exponentials."""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from liere_jax import rotations
from liere_jax.expm import expm
from liere_jax.positions import grid_positions


def test_by_default_a_small_grid_takes_the_lattice_path_and_each_token_gets_its_exponential():
  layers, heads, block, n_blocks = 2, 1, 4, 2
  gens = np.random.default_rng(0).uniform(
      -1, 1, (layers, heads, 2, n_blocks, rotations.num_free(block))).astype(np.float32)
  pos = grid_positions((3, 4), (3, 4), 'integer')  # (2, 0) = 2 (1, 0): powers to share
  plan = rotations.lattice_plan(pos)
  assert plan is not None and len(plan.primitives) < len(pos) - 1
  matrices = []  # exponentiated, by the function given as the method (the lattice path: the
  #               primitive points' only)
  exp = lambda a: matrices.append(np.prod(a.shape[:-2])) or expm(a)
  got = np.asarray(rotations.liere_rotations(jnp.asarray(gens), pos, block, method=exp))
  assert matrices == [layers * heads * len(plan.primitives) * n_blocks], matrices
  assert got.shape == (layers, heads, len(pos), n_blocks, block, block)
  a = np.asarray(rotations.skew(jnp.asarray(np.einsum('tn,lhnkf->lhtkf', pos, gens)), block))
  want = np.vectorize(scipy.linalg.expm, signature='(b,b)->(b,b)')(a.astype(np.float64))
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_lattice_false_and_2x2_blocks_exponentiate_every_token_and_3x3_the_primitives_only():
  # 2 x 2 blocks have a closed form: cheap enough that the lattice's products would cost more.
  pos = grid_positions((3, 4), (3, 4), 'integer')
  n_primitive = len(rotations.lattice_plan(pos).primitives)
  for block, lattice, want in ((4, False, len(pos)), (2, True, len(pos)), (3, True, n_primitive)):
    matrices = []
    exp = lambda a: matrices.append(np.prod(a.shape[:-2])) or jnp.broadcast_to(
        jnp.eye(block), a.shape)
    gens = jnp.zeros((1, 1, 2, 1, rotations.num_free(block)))
    rotations.liere_rotations(gens, pos, block, method=exp, lattice=lattice)
    assert matrices == [want], (block, lattice, matrices)


def test_positions_traced_under_jit_take_the_general_path_and_1d_positions_no_lattice():
  pos = grid_positions((3, 4), (3, 4), 'integer')
  matrices = []
  exp = lambda a: matrices.append(np.prod(a.shape[:-2])) or jnp.broadcast_to(jnp.eye(4), a.shape)
  gens = jnp.zeros((1, 1, 2, 1, rotations.num_free(4)))
  jax.jit(lambda p: rotations.liere_rotations(gens, p, 4, method=exp))(pos)
  assert matrices == [len(pos)] and rotations.lattice_plan(pos[:, 0]) is None


def test_on_a_mesh_each_data_device_exponentiates_its_share_of_the_matrices():
  mesh = jax.make_mesh((2,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])
  for context, share in ((jax.set_mesh(mesh), 3), (contextlib.nullcontext(), 5)):
    seen = []
    with context:
      out = rotations.split_over_data(lambda x: seen.append(x.shape[0]) or 2 * x,
                                      jnp.arange(20.).reshape(5, 2, 2))
    assert seen == [share], seen  # 5 matrices over 2 devices: 3 each, one padding
    np.testing.assert_array_equal(out, 2 * np.arange(20.).reshape(5, 2, 2))
