"""rotations.py: LieRE's rotations (skew, the exponential of each block: orthogonality, float64
agreement, gradients), the lattice path (one exponential per primitive lattice point, powers for
the rest; which path runs, how a mesh's data devices share the exponentials), the positions it
reads at trace time, and `rotate`. The tests marked `numerics` (small grids, seconds) are the
numerics scope's selection for rotations.py in the mutation runs (docs/mutation.md)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import lattice, rotations
from liere_jax.expm import expm
from liere_jax.numerics import plan
from liere_jax.positions import grid_positions

CPU = plan('cpu')  # This CPU's plan (liere_jax.numerics); the kernels' tests emulate a TPU's.

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
  r = np.asarray(expm(jnp.asarray(a), CPU))
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
  fast = jax.grad(lambda c: jnp.sum(expm(rotations.skew(c, block), CPU) * g))(jnp.asarray(c))
  a = np.asarray(rotations.skew(jnp.asarray(c, jnp.float32), block), np.float64)
  a, gf = a.reshape(-1, block, block), g.reshape(-1, block, block)
  grad_a = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                     for x, y in zip(a, gf)])
  rows, cols = np.triu_indices(block, 1)
  ref = (grad_a[:, rows, cols] - grad_a[:, cols, rows]).reshape(c.shape)
  rel = np.abs(np.asarray(fast) - ref).max() / np.abs(ref).max()
  assert rel <= 1e-4, f'b={block}: gradient relative error {rel:.2e}'


# ----------------------------------------------------------------------------------------------
# The lattice path: exponentials at primitive grid points, powers for the rest.


@pytest.mark.numerics
def test_lattice_plan_of_a_grid_counts_primitive_points():
  from liere_jax.positions import with_prefix
  pos = np.asarray(with_prefix(grid_positions((14, 14), (14, 14), 'normalized'), 1))
  lat = lattice.lattice_plan(pos)
  assert len(lat.primitives) == 117  # of 195 nonzero points (60%): gcd(i, j) = 1
  assert lat.n_products == 195 - 117  # one product per other point (no intermediates)
  assert len(lat.levels) == 4  # multiples up to 13: ceil(log2 13) levels
  assert lat.token_slot[0] == 0 and not lat.transpose.any()  # CLS: the identity slot
  for mode in ('integer', 'rescaled'):
    assert lattice.lattice_plan(grid_positions((5, 7), (3, 3), mode)) is not None
  assert lattice.lattice_plan(np.array([[0.1, 0.], [0.33, 0.]])) is None  # off a lattice


def _count_exponentials(monkeypatch, identity=False):
  """rotations.expm spied on: the list of matrices each call exponentiates (and the plans it
  was handed), by the real exponential or (identity) the identity."""
  counts, real = [], expm

  def spy(a, numerics):
    counts.append((int(np.prod(a.shape[:-2])), numerics))
    return jnp.broadcast_to(jnp.eye(a.shape[-1]), a.shape) if identity else real(a, numerics)
  monkeypatch.setattr(rotations, 'expm', spy)
  return counts


@pytest.mark.numerics
def test_by_default_a_small_grid_takes_the_lattice_path_and_each_token_gets_its_exponential(
    monkeypatch):
  layers, heads, block, n_blocks = 2, 1, 4, 2
  gens = np.random.default_rng(0).uniform(
      -1, 1, (layers, heads, 2, n_blocks, rotations.num_free(block))).astype(np.float32)
  pos = grid_positions((3, 4), (3, 4), 'integer')  # (2, 0) = 2 (1, 0): powers to share
  lat = lattice.lattice_plan(pos)
  assert lat is not None and len(lat.primitives) < len(pos) - 1
  assert rotations.path(CPU, block, pos) == 'lattice'
  # Exponentiated (the lattice path: the primitive points' only), with the plan handed down.
  counts = _count_exponentials(monkeypatch)
  got = np.asarray(rotations.liere_rotations(jnp.asarray(gens), pos, block, CPU))
  assert counts == [(layers * heads * len(lat.primitives) * n_blocks, CPU)], counts
  assert got.shape == (layers, heads, len(pos), n_blocks, block, block)
  a = np.asarray(rotations.skew(jnp.asarray(np.einsum('tn,lhnkf->lhtkf', pos, gens)), block))
  want = np.vectorize(scipy.linalg.expm, signature='(b,b)->(b,b)')(a.astype(np.float64))
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


@pytest.mark.numerics
def test_lattice_off_and_2x2_blocks_exponentiate_every_token_and_3x3_the_primitives_only(
    monkeypatch):
  # 2 x 2 blocks have a closed form: cheap enough that the lattice's products would cost more.
  pos = grid_positions((3, 4), (3, 4), 'integer')
  n_primitive = len(lattice.lattice_plan(pos).primitives)
  for block, lattice_ok, want, how in ((4, False, len(pos), 'every token'),
                                       (2, True, len(pos), 'every token'),
                                       (3, True, n_primitive, 'lattice')):
    assert rotations.path(CPU, block, pos, lattice_ok) == how, (block, lattice_ok)
    counts = _count_exponentials(monkeypatch, identity=True)
    gens = jnp.zeros((1, 1, 2, 1, rotations.num_free(block)))
    rotations.liere_rotations(gens, pos, block, CPU, lattice_ok=lattice_ok)
    assert [n for n, _ in counts] == [want], (block, lattice_ok, counts)


# concrete_positions: positions known at trace time are read (the lattice path needs them),
# positions that grad or vmap traces are not, and that is not an error.
@pytest.mark.numerics
def test_positions_traced_by_grad_or_vmap_are_unknown_and_constants_under_jit_are_read():
  seen = []
  record = lambda p: seen.append(lattice.concrete_positions(p)) or jnp.sum(p)
  jax.grad(record)(jnp.ones((4, 2)))
  jax.vmap(record)(jnp.ones((3, 4, 2)))
  assert seen == [None, None]
  grid = np.arange(8.).reshape(4, 2)
  jax.jit(lambda: record(jnp.asarray(grid)))()  # A constant under jit: its value is known.
  np.testing.assert_array_equal(seen[-1], grid)


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
  for ok in (False, True):  # One compile each: the rotations and their gradient.
    rot = lambda p, ok=ok: rotations.liere_rotations(p, pos, block, CPU, lattice_ok=ok)
    loss = lambda p, rot=rot: (jnp.sum(rot(p) * g), rot(p))
    (_, r), dp = jax.jit(jax.value_and_grad(loss, has_aux=True))(gens)
    out[ok], grads[ok] = np.asarray(r), np.asarray(dp)
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
  for ok in (False, True):
    rel = np.abs(grads[ok][0, 0] - gref).max() / np.abs(gref).max()
    assert rel <= 1e-4, f'lattice_ok={ok}: gradient relative error {rel:.2e}'
  rel = np.abs(grads[True] - grads[False]).max() / np.abs(grads[False]).max()
  assert rel <= 1e-4


@pytest.mark.numerics
def test_lattice_path_under_jit_and_its_fallbacks():
  """Constant positions under jit take the lattice path; traced ones, and 1D ones, the general
  path; negative multiples and the origin."""
  from liere_jax.positions import with_prefix
  gens, pos = _lattice_case(8, 2, 3, grid=(5, 5))
  general = rotations.liere_rotations(gens, pos, 8, CPU, lattice_ok=False)
  calls = []
  orig = rotations._lattice_rotations

  def spy(*args):
    calls.append(1)
    return orig(*args)

  rotations._lattice_rotations = spy
  try:
    # ViT.pe_context's positions: jnp.asarray of numpy inside jit, a constant of the trace.
    inside = jax.jit(lambda p: rotations.liere_rotations(
        p, with_prefix(grid_positions((5, 5), (9, 9), 'normalized'), 1), 8, CPU))(gens)
    assert calls == [1]
    traced = jax.jit(lambda p, x: rotations.liere_rotations(p, x, 8, CPU))(gens, pos)
    assert calls == [1]  # traced positions: the general path
  finally:
    rotations._lattice_rotations = orig
  assert lattice.lattice_plan(pos[:, 0]) is None  # 1D positions: no lattice
  np.testing.assert_allclose(inside, general, atol=1e-5)
  np.testing.assert_allclose(traced, general, atol=1e-6)
  # Negative multiples: R(-q) = R(q)^T; p = 0: exactly I.
  neg = np.array([[0., 0.], [1., 0.], [-1., 0.], [-2., 0.], [2., -2.], [-3., 3.], [.5, 1.]])
  r = rotations.liere_rotations(gens, neg.astype(np.float32), 8, CPU)
  np.testing.assert_allclose(r, rotations.liere_rotations(gens, neg, 8, CPU, lattice_ok=False),
                             atol=1e-5)
  np.testing.assert_array_equal(np.asarray(r[:, :, 0]),
                                np.broadcast_to(np.eye(8), r[:, :, 0].shape))


@pytest.mark.parametrize('n,layers,heads', [pytest.param(3, 2, 3, marks=pytest.mark.numerics),
                                             (8, 1, 1)])
def test_lattice_path_split_over_data(n, layers, heads, monkeypatch):
  """On a mesh: every device computes 1/n of the exponentials, then the powers for 1/n of the
  stacks, one a block of each layer and head (n need not divide either); without one, a device
  computes them all."""
  seen = []
  out = rotations.split_over_data(lambda x: seen.append(x.shape[0]) or 2 * x,
                                  jnp.arange(20.).reshape(5, 2, 2))
  assert seen == [5], seen
  np.testing.assert_array_equal(out, 2 * np.arange(20.).reshape(5, 2, 2))
  gens, pos = _lattice_case(8, layers, heads, grid=(6, 6))
  shapes, expm_ = [], rotations.expm
  monkeypatch.setattr(rotations, 'expm', lambda a, n: shapes.append(a.shape) or expm_(a, n))
  g = jnp.asarray(np.random.default_rng(3).normal(size=(layers, heads, len(pos), 8, 8, 8)),
                  jnp.float32)
  loss = lambda p, ok: jnp.sum(rotations.liere_rotations(p, pos, 8, CPU, lattice_ok=ok) * g)
  mesh = jax.make_mesh((n,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:n])
  with jax.set_mesh(mesh):
    value, grad = jax.jit(jax.value_and_grad(lambda p: loss(p, True)))(gens)
  n_exp = layers * heads * len(lattice.lattice_plan(pos).primitives) * 8  # 8 blocks of 8
  assert np.prod(shapes[0][:-2]) == -(-n_exp // n)  # per device, at matrix granularity
  n_prim = len(lattice.lattice_plan(pos).primitives)
  assert shapes[0] == (layers * heads * 8 // n, n_prim, 8, 8), shapes  # stacks of one block
  ref_value, ref_grad = jax.value_and_grad(lambda p: loss(p, False))(gens)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  assert np.abs(grad - ref_grad).max() <= 1e-4 * np.abs(ref_grad).max()


# The TPU's exponential of blocks of 16 and up (the Pallas kernel, every token's), here in
# interpret mode: the plan under which liere_rotations splits the tokens.
KERNEL_EVERY_TOKEN = CPU.replace(expm_kernel=True, every_token=True)


@pytest.mark.parametrize('on_lattice', [False, True])
def test_split_tokens_pads_them_by_identities_and_leaves_them_split_over_data(on_lattice):
  """split_tokens, where the plan exponentiates every token by the Pallas kernel (a TPU's, in
  interpret mode here; b = 16, which the rotation kernel takes): on a mesh of 4 data devices 10
  tokens become 12, split over 'data' by tokens (each device exponentiates its tokens, on a
  grid too: the plan's every_token passes over the lattice), the padding the identity; values
  and gradients equal the unsplit rotations'. Without a mesh, or under a plan without the
  kernel, nothing changes."""
  gens, pos = _lattice_case(16, 2, 3, grid=(3, 3))  # 10 tokens (CLS)
  if not on_lattice:
    pos = pos + np.random.default_rng(0).uniform(0, 0.1, pos.shape).astype(np.float32)
  assert rotations.path(CPU, 16, pos) == ('lattice' if on_lattice else 'every token')
  assert rotations.path(KERNEL_EVERY_TOKEN, 16, pos) == 'every token'
  g = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 12, 4, 16, 16)), jnp.float32)
  mesh = jax.make_mesh((4,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])
  rots = lambda p, split=False, numerics=KERNEL_EVERY_TOKEN: rotations.liere_rotations(
      p, pos, 16, numerics, split_tokens=split)
  want = rots(gens)
  want_grad = jax.grad(lambda p: jnp.sum(rots(p) * g[:, :, :10]))(gens)
  assert rots(gens, True).shape == want.shape
  with jax.set_mesh(mesh):
    assert jax.eval_shape(lambda p: rots(p, True, CPU), gens).shape == want.shape

  def run(p):
    out = rots(p, True)
    return jnp.sum(out * g), out
  with jax.set_mesh(mesh):
    (_, out), grad = jax.jit(jax.value_and_grad(run, has_aux=True))(gens)
  assert out.shape == (2, 3, 12, 4, 16, 16)
  assert out.sharding.spec[:3] == (None, None, 'data'), out.sharding
  np.testing.assert_allclose(out[:, :, :10], want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out[:, :, 10:], np.broadcast_to(np.eye(16), out[:, :, 10:].shape))
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-4 * np.abs(want_grad).max())


@pytest.mark.parametrize('block, head_dim', [(8, 64), (4, 18)])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_liere_entries_are_the_kernel_s_entries_of_the_blocks_forward_and_backward(
    block, head_dim, dtype):
  """liere_entries (LieRE8 on a TPU: exponentials and dims laid out entries first, interleaved
  by a permutation product; the Pallas kernel in interpret mode here) equals
  attention_kernel.entries of liere_rotations' blocks, layer by layer, pass-through dims (18 of
  4 x 4 + 2) the identity's, in float32 (three bf16 parts: exact) and bf16; the gradient of the
  generators too."""
  from liere_jax.kernels import attention as attention_kernel  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(block)
  k = head_dim // block
  gens = jnp.asarray(rng.uniform(0, 1, (2, 3, 2, k, block * (block - 1) // 2)), jnp.float32)
  pos = jnp.asarray(rng.uniform(0, 1, (11, 2)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((2, block, 11, 3 * head_dim)), jnp.float32)
  assert rotations.entries_path(KERNEL_EVERY_TOKEN.replace(attention='kernel'), block, len(pos))
  assert not rotations.entries_path(KERNEL_EVERY_TOKEN, block, len(pos))  # XLA's attention

  def got(p):
    return rotations.liere_entries(p, pos, block, head_dim, KERNEL_EVERY_TOKEN, dtype)

  def want(p):
    rot = rotations.liere_rotations(p, pos, block, KERNEL_EVERY_TOKEN, lattice_ok=False)
    return jnp.stack([attention_kernel.entries(jnp.swapaxes(r, 0, 1), head_dim) for r in rot])
  out = got(gens)
  assert out.shape == (2, block, 11, 3 * head_dim) and out.dtype == dtype
  tol = 1e-6 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(out.astype(jnp.float32), want(gens), rtol=tol, atol=tol)
  loss = lambda f: lambda p: jnp.sum(f(p).astype(jnp.float32) * w)
  grad, want_grad = jax.grad(loss(got))(gens), jax.grad(loss(want))(gens)
  np.testing.assert_allclose(grad, want_grad, rtol=tol, atol=tol * np.abs(want_grad).max())


def test_on_a_mesh_liere_entries_stay_split_by_tokens_with_no_array_of_blocks():
  """Over 4 'data' devices, 13 tokens: each device makes its 4 tokens' entries [L, 8, 4, H d]
  (padding tokens the identity's), the result split over 'data' by tokens; no array of every
  token's [.., 8, 8] blocks exists forward or backward (a TPU pads 8 minor dims to 128 lanes)."""
  rng = np.random.default_rng(0)
  gens = jnp.asarray(rng.uniform(0, 1, (1, 2, 2, 8, 28)), jnp.float32)
  pos = jnp.asarray(rng.uniform(0, 1, (13, 2)), jnp.float32)
  mesh = jax.make_mesh((4,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])
  run = lambda p: rotations.liere_entries(p, pos, 8, 64, KERNEL_EVERY_TOKEN, jnp.float32)
  want = run(gens)
  with jax.set_mesh(mesh):
    out = jax.jit(run)(gens)
    text = str(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(run(p) ** 2)))(gens))
  assert out.shape == (1, 8, 16, 128) and out.sharding.spec[:3] == (None, None, 'data')
  np.testing.assert_allclose(out[:, :, :13], want, rtol=1e-6, atol=1e-6)
  eye = np.asarray(rotations.liere_entries(jnp.zeros_like(gens), pos[:3], 8, 64,
                                           KERNEL_EVERY_TOKEN, jnp.float32))
  np.testing.assert_array_equal(out[:, :, 13:], eye)
  assert 'f32[1,8,4,128]' in text  # A device's share
  blocks = [s for s in re.findall(r'f32\[([\d,]+)\]', text) if s.endswith(',8,8')]
  assert all(np.prod([int(x) for x in s.split(',')]) <= 2 * 8 * 8 * 64 for s in blocks), blocks


@pytest.mark.parametrize('lattice_ok', [False, True])
def test_liere_rotations_exponentiate_by_the_plan_s_form(lattice_ok, monkeypatch):
  """The plan reaches the exponential on both paths (the lattice path at the primitive points
  only): under the SciPy form the general path is SciPy's exponential of the generators,
  exactly."""
  gens, pos = _lattice_case(8, 2, 1, grid=(5, 5))
  scipy_plan = CPU.replace(expm='scipy')
  counts = _count_exponentials(monkeypatch)
  out = rotations.liere_rotations(gens, pos, 8, scipy_plan, lattice_ok=lattice_ok)
  n_points = len(lattice.lattice_plan(pos).primitives) if lattice_ok else len(pos)
  assert counts == [(2 * n_points * 8, scipy_plan)], counts  # L H P k
  if not lattice_ok:
    want = expm(rotations.liere_generators(gens, pos, 8), scipy_plan)
    np.testing.assert_array_equal(out, want)


def test_a_single_patch_grid_is_the_identity_rotation():
  """Every position at the origin (input_size == patch): nothing to exponentiate, R = I."""
  gen = jax.random.uniform(jax.random.key(0), (1, 2, 2, 2, 28))  # b = 8: 28 free parameters.
  for pos in (np.zeros((2, 2), np.float32), jnp.zeros((2, 2))):
    rot = rotations.liere_rotations(gen, pos, 8, CPU)
    np.testing.assert_array_equal(np.asarray(rot), np.broadcast_to(np.eye(8), rot.shape))


@pytest.mark.parametrize('heads, d', [(3, 64), (1, 70), (3, 7)])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_pairs_on_x_layout_equal_the_blocks_form_forward_and_backward(heads, d, dtype):
  """Blocks of 2 on x's own layout (CPU and TPU: pairs 'swap_matmul', 'swap_roll') and as
  [..., k, 2] x [2, 2] blocks (a GPU's form, pairs 'blocks'): the same x' and the same gradients
  in x and R, bit for bit; rotations per head or shared (H or 1), dims past the last pair pass
  through, any 2 x 2 block."""
  rng = np.random.default_rng(d)
  x = jnp.asarray(rng.standard_normal((2, 5, 3, d)), dtype)
  rot = jnp.asarray(rng.standard_normal((heads, 5, min(32, d // 2), 2, 2)), jnp.float32)
  weight = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
  run = lambda pairs: jax.value_and_grad(lambda x, r: jnp.sum(
      rotations.rotate(x, r, CPU.replace(pairs=pairs)).astype(jnp.float32) * weight),
                                         (0, 1))(x, rot)
  old = run('blocks')
  for pairs in ('swap_matmul', 'swap_roll'):  # Each platform's exchange of the pair's dims.
    new = run(pairs)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(old)):
      np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(rotations.rotate(x, rot, CPU)[..., 64:], x[..., 64:])


def test_the_blocks_form_in_bf16_at_a_size_xla_cpu_s_ynn_fusion_summed_wrong():
  """rotations._elementwise as a reduce over j, fused with the bf16 convert after it, came out of
  jax 0.10.2's XLA:CPU YNNPACK fusion off by up to 18 here (values of about 5); the unrolled sum
  gives numpy's product to bf16's rounding."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((16, 65, 3, 64)), jnp.bfloat16)
  rot = jnp.asarray(rng.standard_normal((3, 65, 32, 2, 2)), jnp.bfloat16)
  out = jax.jit(lambda x, r: rotations.rotate(x, r, CPU.replace(pairs='blocks')))(x, rot)
  want = np.einsum('htkij,bthkj->bthki', np.asarray(rot, np.float32),
                   np.asarray(x, np.float32).reshape(16, 65, 3, 32, 2)).reshape(x.shape)
  np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=0.07, rtol=0.01)


def test_rotate_takes_each_platforms_form():
  """Each platform's plan, forward and backward: the program lowered for tpu exchanges the dims
  of pairs without a product (roll), for cpu with one (matmul); for cuda it rotates [..., k, 2]
  blocks, the program pairs='blocks' gives on any platform; larger blocks by an einsum
  everywhere (a TPU's attention kernel rotates blocks up to 8 itself:
  tests/test_kernels_attention.py)."""
  x = jnp.ones((2, 3, 2, 16), jnp.bfloat16)
  lowered = lambda platform, block=2, **fields: jax.jit(jax.value_and_grad(
      lambda x: jnp.sum(rotations.rotate(x, jnp.ones((2, 3, 16 // block, block, block)),
                                         plan(platform, **fields)).astype(jnp.float32)))
  ).trace(x).lower(lowering_platforms=(platform,)).as_text()
  platforms = ('cpu', 'tpu', 'cuda')
  for block in (8, 16):
    assert {p: rotations.rotation_form(plan(p), block) for p in platforms} == dict.fromkeys(
        platforms, 'einsum')
  assert {p: rotations.rotation_form(plan(p), 2) for p in platforms} == {
      'cpu': 'swap_matmul', 'tpu': 'swap_roll', 'cuda': 'blocks'}
  assert all('@tpu_custom_call' not in lowered(p, 8) for p in ('tpu', 'cpu'))
  dots = lambda platform: lowered(platform).count('dot_general')
  assert dots('tpu') == 0 and dots('cpu') > 0, (dots('tpu'), dots('cpu'))
  blocks_shape = 'tensor<2x3x2x8x2xbf16>'  # x as [B, T, H, k, 2]
  assert blocks_shape in lowered('cuda') and blocks_shape not in lowered('tpu')
  assert blocks_shape in lowered('tpu', pairs='blocks')


@pytest.mark.numerics
@pytest.mark.parametrize('platform', ['cpu', 'tpu', 'cuda'])
@pytest.mark.parametrize('block', [2, 4, 16])
def test_rotate_applies_r_to_each_block_of_each_token(block, platform):
  """x' = R x per block (not R^T x): a quarter turn takes e_1 to e_2 and e_2 to -e_1 in the
  plane (0, 1), and a random orthogonal R gives numpy's R @ x, head by head and token by token
  (b = 2, 4 and 16 under each platform's plan, run here: rotate's forms differ by block size
  and platform)."""
  numerics = plan(platform)
  angles = jnp.asarray([[[np.pi / 2], [np.pi]]])  # [H, T, k]: a quarter and a half turn
  x = jnp.asarray([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # [B, T, H, d]: e_1, then e_2
  np.testing.assert_allclose(rotations.rotate(x, rotations.angle_rotations(angles), numerics),
                             [[[[0.0, 1.0]], [[0.0, -1.0]]]], atol=1e-6)
  x = jnp.asarray([[[[0.0, 1.0]]]])
  quarter = rotations.angle_rotations(jnp.full((1, 1, 1), np.pi / 2))
  np.testing.assert_allclose(rotations.rotate(x, quarter, numerics), [[[[-1.0, 0.0]]]],
                             atol=1e-7)
  rng = np.random.default_rng(0)
  heads, tokens, k = 2, 3, 2
  q = np.linalg.qr(rng.normal(size=(heads, tokens, k, block, block)))[0].astype(np.float32)
  x = rng.normal(size=(2, tokens, heads, k * block + 1)).astype(np.float32)  # 1 dim unrotated
  out = np.asarray(rotations.rotate(jnp.asarray(x), jnp.asarray(q), numerics))
  xr = x[..., :k * block].reshape(2, tokens, heads, k, block)
  want = np.einsum('htkij,bthkj->bthki', q, xr).reshape(2, tokens, heads, k * block)
  np.testing.assert_allclose(out[..., :-1], want, atol=1e-5)
  np.testing.assert_array_equal(out[..., -1], x[..., -1])


def test_take_static_gradient_is_jnp_take_s():
  """take_static's backward (gathers: first readers masked, further readers added where few or
  gathered where many) equals autodiff of jnp.take, with slots read by none, one, two (a few
  and many of them) and five readers."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((3, 40, 2, 2)), jnp.float32)
  idx = np.concatenate([np.arange(0, 30), [0, 0, 0, 0, 5, 7], np.arange(10, 30)])  # 30..39: none
  g = jnp.asarray(rng.standard_normal((3, len(idx), 2, 2)), jnp.float32)
  got = jax.grad(lambda x: jnp.sum(lattice.take_static(x, idx) * g))(x)
  want = jax.grad(lambda x: jnp.sum(jnp.take(x, idx, axis=1) * g))(x)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(lattice.take_static(x, idx), jnp.take(x, idx, axis=1))
