"""LieRE's rotations on a small patch grid (seconds: the mutation run's selection for
rotations.liere_rotations, docs/mutation.md): the lattice path, one exponential per primitive
lattice point and powers for the rest, gives every token exp(sum_i p_i A_i) in float64."""
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
