"""The exponential and the rotations: orthogonality, float64 agreement, gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import rotations
from liere_jax.expm import expm
from liere_jax.positions import grid_positions

BLOCKS = (2, 3, 4, 8, 16, 32, 48, 64)


def _coeffs(block, seed=0):
  """Generator combinations at positions up to 4x the training range ([0, 1] -> [0, 4]).

  Realistic LieRE: 2D, U[0, 2 pi) init, 64 head dims, a 33x33 grid evaluated on an 8x8
  training grid (normalized positions reach 4 per axis).
  """
  rng = np.random.default_rng(seed)
  gens = rng.uniform(0, 2 * np.pi, (1, 1, 2, 64 // block, rotations.num_free(block)))
  pos = grid_positions((33, 33), (9, 9), 'normalized')[::37]  # 30 positions incl. (4, 4)
  pos = np.concatenate([pos, [[4., 4.]]]).astype(np.float32)
  return np.einsum('tn,lhnkf->lhtkf', pos, gens).astype(np.float32)


@pytest.mark.parametrize('block', BLOCKS)
def test_rotations_orthogonal_and_match_float64(block):
  # jax.scipy.linalg.expm in float32 itself reaches 1.4e-5 at b=32 here: the bench reports it.
  a = np.asarray(rotations.skew(jnp.asarray(_coeffs(block)), block))
  r = np.asarray(expm(jnp.asarray(a)))
  eye = np.eye(block)
  orth = np.abs(np.einsum('...ji,...jk->...ik', r, r) - eye).max()
  ref = np.stack([scipy.linalg.expm(x) for x in a.reshape(-1, block, block).astype(np.float64)])
  err = np.abs(r.reshape(ref.shape) - ref).max()
  assert orth <= 1e-5, f'b={block}: ||R^T R - I|| = {orth:.2e}'
  assert err <= 1e-5, f'b={block}: max |R - R_float64| = {err:.2e}'


def test_skew_uses_strict_upper_triangle():
  p = jnp.arange(1., 7.)
  a = np.asarray(rotations.skew(p, 4))
  np.testing.assert_array_equal(a, -a.T)
  np.testing.assert_array_equal(a[np.triu_indices(4, 1)], np.arange(1., 7.))


@pytest.mark.parametrize('block', [2, 8, 64])
def test_fast_gradient_matches_float64(block):
  """d/dc sum(expm(skew(c)) * G) against SciPy's float64 Frechet derivative.

  The gradient of sum(exp(A) * G) in A is L(A^T, G); the raw parameters c feed the strict
  upper triangle with + and the lower with -. (jax.scipy.linalg.expm's own gradient is off by
  1.5% at angle 30 even in float64, so it is not the reference.)
  """
  rng = np.random.default_rng(1)
  c = _coeffs(block, seed=1)
  g = rng.normal(size=c.shape[:-1] + (block, block))
  fast = jax.grad(lambda c: jnp.sum(expm(rotations.skew(c, block)) * g))(jnp.asarray(c))
  a = np.asarray(rotations.skew(jnp.asarray(c, jnp.float32), block), np.float64)
  a, gf = a.reshape(-1, block, block), g.reshape(-1, block, block)
  grad_a = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                     for x, y in zip(a, gf)])
  rows, cols = np.triu_indices(block, 1)
  ref = (grad_a[:, rows, cols] - grad_a[:, cols, rows]).reshape(c.shape)
  rel = np.abs(np.asarray(fast) - ref).max() / np.abs(ref).max()
  assert rel <= 1e-4, f'b={block}: gradient relative error {rel:.2e}'


def test_identity_at_zero_and_many_chunks():
  a = jnp.zeros((70_000, 8, 8))  # several chunks of the fast path, padded at the end
  r = expm(a)
  assert r.shape == a.shape
  np.testing.assert_array_equal(np.asarray(r[-1]), np.eye(8))


def test_bad_method_names_the_fix():
  with pytest.raises(ValueError, match=r"method='pade'.*fast"):
    expm(jnp.zeros((1, 4, 4)), 'pade')


# ----------------------------------------------------------------------------------------------
# The lattice path: exponentials at primitive grid points, powers for the rest.


def test_lattice_plan_of_a_grid_counts_primitive_points():
  from liere_jax.positions import with_prefix
  pos = np.asarray(with_prefix(grid_positions((14, 14), (14, 14), 'normalized'), 1))
  plan = rotations.lattice_plan(pos)
  assert len(plan.primitives) == 117  # of 195 nonzero points (60%): gcd(i, j) = 1
  assert plan.n_products == 195 - 117  # one product per other point (no intermediates)
  assert len(plan.levels) == 4  # multiples up to 13: ceil(log2 13) levels
  assert plan.token_slot[0] == 0 and not plan.transpose.any()  # CLS: the identity slot
  for mode in ('integer', 'rescaled'):
    assert rotations.lattice_plan(grid_positions((5, 7), (3, 3), mode)) is not None
  assert rotations.lattice_plan(np.array([[0.1, 0.], [0.33, 0.]])) is None  # off a lattice


def _lattice_case(block, layers=1, heads=1, grid=(33, 33), seed=0):
  """Generators and positions at 4x the training range (33x33 normalized on a 9x9 grid)."""
  from liere_jax.positions import with_prefix
  rng = np.random.default_rng(seed)
  gens = rng.uniform(0, 2 * np.pi, (layers, heads, 2, 64 // block, rotations.num_free(block)))
  pos = np.asarray(with_prefix(grid_positions(grid, (9, 9), 'normalized'), 1))
  return gens.astype(np.float32), pos


# LieRE8 at 4x the training range (33 x 33 on 9 x 9); 4 x 4 and 64 x 64 blocks at 2x (17 x 17):
# the lattice's compile grows with its plan, 9 s for 64 x 64 blocks at 4x.
@pytest.mark.parametrize('block,grid', [(4, (17, 17)), (8, (33, 33)), (64, (17, 17))])
def test_lattice_path_matches_float64_and_the_general_path(block, grid):
  gens, pos = _lattice_case(block, grid=grid)
  # The cotangent lives on the CLS token, the 32 farthest tokens (4x the training range) and 31
  # others: the float64 gradient then needs Frechet derivatives of those tokens only.
  far = np.argsort(-np.abs(pos).sum(-1))[:32]
  some = np.random.default_rng(1).choice(np.setdiff1d(np.arange(1, len(pos)), far), 31, False)
  tokens = np.concatenate([[0], far, some])
  g = np.zeros((1, 1, len(pos), 64 // block, block, block), np.float32)
  g[:, :, tokens] = np.random.default_rng(2).normal(size=g[:, :, tokens].shape)
  out, grads = {}, {}
  for lattice in (False, True):  # One compile each: the rotations and their gradient.
    rot = lambda p, lattice=lattice: rotations.liere_rotations(p, pos, block, lattice=lattice)
    loss = lambda p, rot=rot: (jnp.sum(rot(p) * g), rot(p))
    (_, r), dp = jax.jit(jax.value_and_grad(loss, has_aux=True))(gens)
    out[lattice], grads[lattice] = np.asarray(r), np.asarray(dp)
  assert np.abs(out[True] - out[False]).max() <= 1e-5
  # float64: R(p) by SciPy, the gradient through the Frechet derivative (see above).
  a = np.asarray(rotations.liere_generators(gens.astype(np.float64), pos, block), np.float64)
  a = a[0, 0]
  ref = scipy.linalg.expm(a)
  r = out[True][0, 0]
  assert np.abs(r - ref).max() <= 1e-5
  assert np.abs(np.einsum('...ji,...jk->...ik', r, r) - np.eye(block)).max() <= 1e-5
  at, gt = a[tokens].reshape(-1, block, block), g[0, 0, tokens].astype(np.float64)
  la = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                 for x, y in zip(at, gt.reshape(at.shape))])
  rows, cols = np.triu_indices(block, 1)
  gc = (la[:, rows, cols] - la[:, cols, rows]).reshape(len(tokens), 64 // block, -1)
  gref = np.einsum('tn,tkf->nkf', pos[tokens].astype(np.float64), gc)
  for lattice in (False, True):
    rel = np.abs(grads[lattice][0, 0] - gref).max() / np.abs(gref).max()
    assert rel <= 1e-4, f'lattice={lattice}: gradient relative error {rel:.2e}'
  rel = np.abs(grads[True] - grads[False]).max() / np.abs(grads[False]).max()
  assert rel <= 1e-4


def test_lattice_path_under_jit_and_its_fallbacks():
  from liere_jax.positions import with_prefix
  gens, pos = _lattice_case(8, 2, 3, grid=(5, 5))
  general = rotations.liere_rotations(gens, pos, 8, lattice=False)
  calls = []
  orig = rotations._lattice_rotations

  def spy(*args):
    calls.append(1)
    return orig(*args)

  rotations._lattice_rotations = spy
  try:
    # ViT.pe_context's positions: jnp.asarray of numpy inside jit, a constant of the trace.
    inside = jax.jit(lambda p: rotations.liere_rotations(
        p, with_prefix(grid_positions((5, 5), (9, 9), 'normalized'), 1), 8))(gens)
    assert calls == [1]
    traced = jax.jit(lambda p, x: rotations.liere_rotations(p, x, 8))(gens, pos)
    assert calls == [1]  # traced positions: the general path
  finally:
    rotations._lattice_rotations = orig
  np.testing.assert_allclose(inside, general, atol=1e-5)
  np.testing.assert_allclose(traced, general, atol=1e-6)
  # Negative multiples: R(-q) = R(q)^T; p = 0: exactly I.
  neg = np.array([[0., 0.], [1., 0.], [-1., 0.], [-2., 0.], [2., -2.], [-3., 3.], [.5, 1.]])
  r = rotations.liere_rotations(gens, neg.astype(np.float32), 8)
  np.testing.assert_allclose(r, rotations.liere_rotations(gens, neg, 8, lattice=False),
                             atol=1e-5)
  np.testing.assert_array_equal(np.asarray(r[:, :, 0]),
                                np.broadcast_to(np.eye(8), r[:, :, 0].shape))


@pytest.mark.parametrize('n,layers,heads', [(3, 2, 3), (8, 1, 1)])
def test_lattice_path_split_over_data(n, layers, heads, monkeypatch):
  """On a mesh: every device computes 1/n of the exponentials, then the powers for 1/n of the
  (layer, head) stacks (n need not divide either)."""
  gens, pos = _lattice_case(8, layers, heads, grid=(6, 6))
  shapes, expm_ = [], rotations.expm
  monkeypatch.setattr(rotations, 'expm', lambda a, *m: shapes.append(a.shape) or expm_(a, *m))
  g = jnp.asarray(np.random.default_rng(3).normal(size=(layers, heads, len(pos), 8, 8, 8)),
                  jnp.float32)
  loss = lambda p, lattice: jnp.sum(rotations.liere_rotations(p, pos, 8, lattice=lattice) * g)
  mesh = jax.make_mesh((n,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:n])
  with jax.set_mesh(mesh):
    value, grad = jax.jit(jax.value_and_grad(lambda p: loss(p, True)))(gens)
  n_exp = layers * heads * len(rotations.lattice_plan(pos).primitives) * 8  # 8 blocks of 8
  assert np.prod(shapes[0][:-2]) == -(-n_exp // n)  # per device, at matrix granularity
  ref_value, ref_grad = jax.value_and_grad(lambda p: loss(p, False))(gens)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  assert np.abs(grad - ref_grad).max() <= 1e-4 * np.abs(ref_grad).max()


@pytest.mark.parametrize('lattice', [False, True])
def test_liere_rotations_take_an_exponential_function(lattice):
  """method may be a function [..., b, b] -> [..., b, b]: both paths call it, the lattice path
  at the primitive points only."""
  gens, pos = _lattice_case(8, 2, 1, grid=(5, 5))
  shapes = []
  exp = lambda a: shapes.append(a.shape) or expm(a, 'scipy')
  out = rotations.liere_rotations(gens, pos, 8, exp, lattice=lattice)
  np.testing.assert_array_equal(out, rotations.liere_rotations(gens, pos, 8, 'scipy', lattice))
  n_points = len(rotations.lattice_plan(pos).primitives) if lattice else len(pos)
  assert shapes == [(2, 1, n_points, 8, 8, 8)]


def test_a_single_patch_grid_is_the_identity_rotation():
  """Every position at the origin (input_size == patch): nothing to exponentiate, R = I."""
  gen = jax.random.uniform(jax.random.key(0), (1, 2, 2, 2, 28))  # b = 8: 28 free parameters.
  for pos in (np.zeros((2, 2), np.float32), jnp.zeros((2, 2))):
    rot = rotations.liere_rotations(gen, pos, 8)
    np.testing.assert_array_equal(np.asarray(rot), np.broadcast_to(np.eye(8), rot.shape))


@pytest.mark.parametrize('heads, d', [(3, 64), (1, 70), (3, 7)])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_pairs_on_x_layout_equal_the_blocks_form_forward_and_backward(heads, d, dtype):
  """Blocks of 2 on x's own layout (the default) and as [..., k, 2] x [2, 2] blocks (the form
  before, PAIRS 'blocks'): the same x' and the same gradients in x and R, bit for bit; rotations
  per head or shared (H or 1), dims past the last pair pass through, any 2 x 2 block."""
  rng = np.random.default_rng(d)
  x = jnp.asarray(rng.standard_normal((2, 5, 3, d)), dtype)
  rot = jnp.asarray(rng.standard_normal((heads, 5, min(32, d // 2), 2, 2)), jnp.float32)
  weight = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
  run = lambda: jax.value_and_grad(lambda x, r: jnp.sum(
      rotations.rotate(x, r).astype(jnp.float32) * weight), (0, 1))(x, rot)
  new = run()
  with rotations.PAIRS('blocks'):
    old = run()
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(old)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(rotations.rotate(x, rot)[..., 64:], x[..., 64:])
