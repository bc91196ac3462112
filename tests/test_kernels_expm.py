"""expm.expm's 'kernel' form (liere_jax/kernels/expm.py): the exponential as one Pallas kernel, run
here in interpret mode (a CPU plan with expm_kernel) against SciPy in float64, its VJP (taylor.py's
adjoint) against SciPy's Frechet derivative, JAX's float64 VJP and the XLA path's gradient, and
the same program compiled for a TPU v5e (Mosaic, deviceless) and lowered for a GPU (Triton), each
with its platform's plan; its cost estimate against a count of the traced kernel."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import expm, lattice, rotations, taylor as taylor_lib
from liere_jax.bench import expm as bench_expm
from liere_jax.kernels import expm as expm_kernel
from liere_jax.kernels.common import DECLARED
from liere_jax.numerics import PLATFORMS, plan
from tests import helpers, kernel_count

B = 64
KERNEL = plan('cpu', expm_kernel=True)  # The kernel in interpret mode, a TPU's tiling.
XLA_LOOP = plan('cpu', expm='loop')  # The XLA program the kernel runs (float32 products).


@functools.lru_cache(maxsize=None)
def _training(n=12):
  """The n largest of LieRE64's exponentials at the training range (generators U[0, 2 pi) as
  initialised, positions in [0, 1]^2: 2 layers x 2 heads of a 14 x 14 grid), and cotangents;
  spectral radii ~240-260, 8 squarings."""
  a, g = bench_expm.case_inputs(bench_expm.parse_case(f'2x2x14x14/{B}'))
  idx = np.argsort(np.abs(a).sum(-2).max(-1))[-n:]
  return a[idx], g[idx]


def _expm64(a):
  return np.stack([scipy.linalg.expm(x) for x in np.asarray(a, np.float64)])


def _skew(x):
  return x - np.swapaxes(x, -1, -2)


def _kernel(x):
  return expm.expm(x, KERNEL)


def _pallas_and_grad(a, g):
  fn = _kernel
  r, grad = jax.jit(lambda x: (fn(x), jax.grad(lambda y: jnp.sum(fn(y) * g))(x)))(a)
  return np.asarray(r, np.float64), np.asarray(grad, np.float64)


def test_forward_within_1e_5_of_float64_at_training_range_and_orthogonal():
  """12 matrices (not a multiple of the tile: the last tile is padded) against SciPy in float64:
  within 1e-5 and orthogonal to 1e-5; the kernel ran (a pallas_call in the program)."""
  a, _ = _training()
  assert a.shape[0] % expm_kernel.tile_matrices(B)
  assert expm.form(KERNEL, B) == 'kernel' and 'pallas_call' in str(jax.make_jaxpr(_kernel)(a))
  r = np.asarray(jax.jit(_kernel)(a), np.float64)
  err = np.abs(r - _expm64(a)).max()
  orth = np.abs(np.einsum('mji,mjk->mik', r, r) - np.eye(B)).max()
  assert err <= 1e-5 and orth <= 1e-5, (err, orth)


def test_gradient_is_the_frechet_derivative_and_the_xla_path_s():
  """jax.grad of a random linear functional of R: its skew part (what a skew-symmetric
  parametrisation sees) within 1e-5 relative of SciPy's Frechet derivative L(a^T, G) in float64,
  and the whole matrix (skew: the adjoint's all) within 5e-6 of the XLA path's gradient ('loop',
  float32 products: the same adjoint; the kernel's batched products round otherwise than XLA's
  through 8 levels: 1.2e-6 measured, against 1.0e-5 to 1.4e-5 between the two backwards before
  taylor.py's adjoint)."""
  a, g = _training()
  _, grad = _pallas_and_grad(a, g)
  a64, g64 = a.astype(np.float64), g.astype(np.float64)
  ref = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                  for x, y in zip(a64, g64)])
  gerr = np.abs(_skew(grad) - _skew(ref)).max() / np.abs(_skew(ref)).max()
  xla = lambda x: expm.expm(x, XLA_LOOP)
  gx = np.asarray(jax.jit(jax.grad(lambda y: jnp.sum(xla(y) * g)))(a), np.float64)
  xerr = np.abs(grad - gx).max() / np.abs(gx).max()
  skew_err = np.abs(_skew(grad) - _skew(gx)).max() / np.abs(_skew(gx)).max()
  assert gerr <= 1e-5 and skew_err <= 1e-5 and xerr <= 5e-6, (gerr, skew_err, xerr)
  np.testing.assert_array_equal(grad, -np.swapaxes(grad, -1, -2))


@pytest.mark.parametrize('block', [3, 4, 8, 16, 64])
def test_gradient_is_exp_s_vjp_in_float64_at_each_radius(block):
  """The kernel's gradient (the entries layout up to 8, matrices from 16) against jax.vjp of
  jax.scipy.linalg.expm in float64, within helpers.ADJOINT_RADII's tolerance at each radius
  from 1e-3 to 250 (each matrix its own squarings); and the XLA 'loop' form's gradient on the
  same stack (the same adjoint, one scale for the stack) within them too."""
  radii = list(helpers.ADJOINT_RADII)
  a, g = helpers.skew_of_radii(block, block, radii, per=3)
  ref = helpers.expm_vjp64(a, g)
  _, grad = _pallas_and_grad(a, g)
  gx = jax.jit(jax.grad(lambda y: jnp.sum(expm.expm(y, XLA_LOOP) * g)))(a)
  for name, err in (('kernel', helpers.adjoint_errors(grad, ref, 3)),
                    ('loop', helpers.adjoint_errors(gx, ref, 3))):
    assert all(e <= helpers.ADJOINT_RADII[r] for e, r in zip(err, radii)), (name, list(err))


@pytest.mark.parametrize('block', [16, 8])
def test_each_matrix_gets_its_own_squarings_past_any_cap(block):
  """Blocks in one tile (16: matrices; 8: the entries layout): a tiny matrix, a training-sized
  one and one at spectral radius 2^(SELECT_CAP + 4) (20 squarings: past the select form's cap,
  and the kernel's loop has none); each within float32's error of SciPy (~1e-7 of the angle),
  forward and gradient."""
  rng = np.random.default_rng(3)
  u = rng.standard_normal((3, block, block))
  a = (u - np.swapaxes(u, 1, 2)) / 4
  rho = lambda x: np.abs(np.linalg.eigvals(x)).max()
  a[0] *= 1e-3 / rho(a[0])
  a[1] *= 200 / rho(a[1])
  a[2] *= 2.0**(expm.SELECT_CAP + 4) / rho(a[2])
  a = a.astype(np.float32)
  g = rng.standard_normal(a.shape).astype(np.float32)
  r, grad = _pallas_and_grad(a, g)
  err = np.abs(r - _expm64(a)).max(axis=(1, 2))
  assert err[0] <= 1e-6 and err[1] <= 1e-5 and err[2] <= 1e-6 * 2**(expm.SELECT_CAP + 4), err
  taylor = taylor_lib.TAYLOR12
  powers = taylor.powers(expm.xla_algebra(XLA_LOOP.products), jnp.asarray(a))
  counts = np.asarray(expm_kernel.squarings(powers, taylor.theta)).ravel().tolist()
  assert counts == list(taylor_lib.squarings(powers, taylor.theta)), counts
  assert counts[0] == 0 and counts[2] >= expm.SELECT_CAP + 4, counts
  ref = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                  for x, y in zip(a[:2].astype(np.float64), g[:2].astype(np.float64))])
  gerr = np.abs(_skew(grad[:2]) - _skew(ref)).max(axis=(1, 2)) / np.abs(_skew(ref)).max()
  assert (gerr <= 1e-5).all(), gerr


def test_2x2_blocks_take_the_xla_path():
  """b = 2 (RoPE's, and a LieRE's of 2): no kernel, the closed form exactly."""
  u = np.random.default_rng(0).standard_normal((5, 2, 2)).astype(np.float32)
  a = u - np.swapaxes(u, 1, 2)
  assert expm.form(KERNEL, 2) == expm.form(plan('tpu'), 2) == 'closed form'
  assert 'pallas_call' not in str(jax.make_jaxpr(_kernel)(a))
  np.testing.assert_array_equal(jax.jit(_kernel)(a),
                                jax.jit(lambda x: expm.expm(x, plan('cpu')))(a))
  c, s = np.cos(a[:, 0, 1]), np.sin(a[:, 0, 1])
  np.testing.assert_allclose(jax.jit(_kernel)(a)[:, 0], np.stack([c, s], -1), atol=1e-6)


@pytest.mark.parametrize('block,n', [(8, 1100), (4, 20)])
def test_small_blocks_in_the_entries_layout_against_float64(block, n):
  """Blocks of 3 to ENTRIES_UP_TO (LieRE8's) run entries first, [b, b, m / 128, 128]: LieRE8's
  exponentials at the training range (ImageNet's 14 x 14 grid; 1,100 of them: two grid steps,
  the second padded) within 1e-5 of SciPy in float64 and orthogonal to 1e-5, the gradient's skew
  part within 1e-5 of SciPy's Frechet derivative and the whole within 1e-5 of the XLA path's."""
  a, g = bench_expm.case_inputs(bench_expm.parse_case(f'2x2x14x14/{block}'))
  idx = np.argsort(np.abs(a).sum(-2).max(-1))[::-1][:n]  # The largest first.
  a, g = a[idx], g[idx]
  assert len(a) == n and (n <= expm_kernel.LANES or n > expm_kernel.ENTRY_ROWS * 128)
  assert 'pallas_call' in str(jax.make_jaxpr(_kernel)(a))
  r, grad = _pallas_and_grad(a, g)
  b64 = lambda x: x.astype(np.float64)
  err = np.abs(r - _expm64(a)).max()
  orth = np.abs(np.einsum('mji,mjk->mik', r, r) - np.eye(block)).max()
  ref = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                  for x, y in zip(b64(a[:64]), b64(g[:64]))])
  gerr = np.abs(_skew(grad[:64]) - _skew(ref)).max() / np.abs(_skew(ref)).max()
  xla = lambda x: expm.expm(x, XLA_LOOP)
  gx = np.asarray(jax.jit(jax.grad(lambda y: jnp.sum(xla(y) * g)))(a), np.float64)
  xerr = np.abs(grad - gx).max() / np.abs(gx).max()
  assert err <= 1e-5 and orth <= 1e-5 and gerr <= 1e-5 and xerr <= 1e-5, (err, orth, gerr, xerr)


def test_liere_rotations_take_the_kernel_from_the_plan():
  """`model.pe.expm=pallas` reaches the kernel: the encoding's plan takes it, and LieRE rotations
  of 16 x 16 blocks on a lattice under that plan run it and match the CPU plan's ('cond')."""
  from flax import nnx
  from liere_jax import model as model_lib
  enc = lambda m: model_lib.create_encoding('liere16', grid=(3, 3), heads=1, head_dim=16,
                                             rngs=nnx.Rngs(0), expm=m)
  assert enc('pallas').numerics(plan('cpu')) == KERNEL
  assert enc('fast').numerics(plan('cpu')) == plan('cpu')
  gens = np.random.default_rng(0).uniform(0, 2 * np.pi, (1, 1, 2, 1, 120)).astype(np.float32)
  pos = np.stack(np.meshgrid(np.arange(3) / 2, np.arange(3) / 2, indexing='ij'), -1)
  pos = pos.reshape(-1, 2).astype(np.float32)
  fn = lambda n: lambda g: rotations.liere_rotations(g, pos, 16, n)
  assert 'pallas_call' in str(jax.make_jaxpr(fn(KERNEL))(gens))
  assert 'pallas_call' not in str(jax.make_jaxpr(fn(plan('cpu')))(gens))
  rot = lambda n: np.asarray(jax.jit(fn(n))(gens))
  np.testing.assert_allclose(rot(KERNEL), rot(plan('cpu')), atol=1e-5)
  with pytest.raises(ValueError, match='expm_precision'):
    KERNEL.at_precision('float64')


def _loss(numerics):
  return lambda x: jnp.sum(expm.expm(x, numerics) * jnp.arange(x.shape[-1], dtype=jnp.float32))


@pytest.mark.parametrize('block', [B, 8])
def test_compiles_for_a_tpu_v5e_deviceless(block):
  """The TPU compiler (libtpu, no TPU here) compiles the forward and the gradient (64 x 64
  blocks; 8 x 8 in the entries layout): one Mosaic custom call each way, no XLA while loop left
  (the squarings run inside the kernel), and the compiler counts the kernels' products (their
  CostEstimate, at COUNTED_SQUARINGS): at least (6 + s) products a matrix forward, 2 b^3 FLOPs
  each, over its tiles (padded)."""
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
  from jax.sharding import SingleDeviceSharding
  from liere_jax import tpu_slices
  dev = tpu_slices.parse_slice('v5litepod-1').devices()[0]
  x = jax.ShapeDtypeStruct((20, block, block), jnp.float32, sharding=SingleDeviceSharding(dev))
  tile = expm_kernel.LANES if block <= expm_kernel.ENTRIES_UP_TO else expm_kernel.tile_matrices(B)
  tpu = plan('tpu')
  assert expm.form(tpu, block) == 'kernel'
  for fn, kernels in ((lambda y: expm.expm(y, tpu), ['liere_expm_forward']),
                      (jax.grad(_loss(tpu)), ['liere_expm_forward', 'liere_expm_backward'])):
    compiled = jax.jit(fn).trace(x).lower().compile()
    hlo = compiled.as_text()
    n = -(-20 // tile) * tile
    assert compiled.cost_analysis().get('flops', 0) >= (
        2 * block**3 * (6 + expm_kernel.COUNTED_SQUARINGS) * n), compiled.cost_analysis()
    calls = [line for line in hlo.splitlines() if 'tpu_custom_call' in line]
    assert [k for k in kernels if any(f'%{k}' in c for c in calls)] == kernels, calls
    assert len(calls) == len(kernels) and ' while(' not in hlo


def test_lowers_for_a_gpu_as_triton_kernels():
  """Lowered for cuda on this CPU with the kernel in its plan (model.pe.expm=pallas): the forward
  is one Triton custom call, the gradient two (the forward, whose R the backward keeps, and the
  backward), and no XLA loop around them."""
  x = jax.ShapeDtypeStruct((20, B, B), jnp.float32)
  cuda = plan('cuda', expm_kernel=True)
  assert expm.form(cuda, B) == 'kernel'
  for fn, n in ((lambda y: expm.expm(y, cuda), 1), (jax.grad(_loss(cuda)), 2)):
    text = jax.jit(fn).trace(x).lower(lowering_platforms=('cuda',)).as_text()
    assert text.count('xla.gpu.triton') == n and 'stablehlo.while' not in text, text[-3000:]


def test_blocks_a_platform_s_kernel_does_not_take_run_the_plan_s_xla_form():
  """Triton takes power-of-2 blocks up to GPU_MAX_BLOCK: 48 lowers for cuda with no Triton call,
  as the cuda plan's XLA form (it does take the TPU's kernel); expm.expm decides before calling
  the kernel, which refuses the blocks it does not take."""
  x = jax.ShapeDtypeStruct((5, 48, 48), jnp.float32)
  assert not expm_kernel.supported(48, 'cuda') and expm_kernel.supported(48, 'tpu')
  cuda = plan('cuda', expm_kernel=True)
  assert expm.form(cuda, 48) == 'select' and expm.form(plan('tpu'), 48) == 'kernel'
  lower = lambda n: jax.jit(jax.grad(_loss(n))).trace(x).lower(
      lowering_platforms=(n.platform,)).as_text()
  text = lower(cuda)
  assert 'xla.gpu.triton' not in text and 'stablehlo.dot_general' in text
  assert lower(plan('tpu')).count('tpu_custom_call') == 2
  with pytest.raises(ValueError, match='no blocks of 48 on cuda'):
    expm_kernel.expm_pallas(jnp.zeros((5, 48, 48)), cuda)


def test_the_default_is_the_kernel_on_a_tpu_and_xla_elsewhere():
  """Each platform's plan (model.pe.expm='fast', the default) lowers to the Mosaic kernel for a
  TPU (its row: expm_kernel), to XLA's forms for cpu and cuda; the TPU plan with the kernel off
  keeps XLA's 'loop'; 8 x 8 blocks take it in the entries layout, 2 x 2 never."""
  x = jax.ShapeDtypeStruct((4, 64, 64), jnp.float32)
  lower = lambda n, x=x: jax.jit(jax.grad(lambda y: jnp.sum(expm.expm(y, n)))).trace(x).lower(
      lowering_platforms=(n.platform,)).as_text()
  assert PLATFORMS['tpu'].expm_kernel and not PLATFORMS['cpu'].expm_kernel
  assert not PLATFORMS['cuda'].expm_kernel
  assert lower(plan('tpu')).count('tpu_custom_call') == 2  # forward and backward kernels
  no_kernel = lower(plan('tpu', expm_kernel=False))
  assert 'tpu_custom_call' not in no_kernel and 'stablehlo.while' in no_kernel
  small = lambda b: lower(plan('tpu'), jax.ShapeDtypeStruct((4, b, b), jnp.float32))
  assert small(8).count('tpu_custom_call') == 2 and 'tpu_custom_call' not in small(2)
  assert 'pallas' not in lower(plan('cpu')) and 'xla.gpu.triton' not in lower(plan('cuda'))


def test_a_tpu_exponentiates_every_token_where_the_kernel_runs_them():
  """On a grid the lattice path exponentiates the primitive points only (9 of a 4 x 4 grid's 16)
  and multiplies the rest from a table; where a TPU's exponential is the Pallas kernel, the
  TPU's program exponentiates every token instead (fewer bytes: docs/decisions/008-lattice.md), the
  same rotations (CPU, the TPU's path in interpret mode against the CPU plan's lattice, to
  float32 rounding)."""
  from liere_jax import positions
  pos = positions.grid_positions((4, 4), (4, 4), 'normalized')
  assert len(lattice.lattice_plan(pos).primitives) == 9
  gens = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 2, 1, 2016)) / 16,
                     jnp.float32)
  fn = lambda n: lambda g: rotations.liere_rotations(g, pos, 64, n)
  emulated = KERNEL.replace(every_token=True)  # The TPU's choice, in interpret mode.
  assert rotations.path(plan('tpu'), 64, pos) == rotations.path(emulated, 64, pos) == 'every token'
  assert rotations.path(plan('cpu'), 64, pos) == rotations.path(KERNEL, 64, pos) == 'lattice'
  text = jax.jit(fn(plan('tpu'))).trace(gens).lower(lowering_platforms=('tpu',)).as_text()
  calls = [line for line in text.splitlines() if 'tpu_custom_call' in line]
  # L H T = 32 matrices (the lattice's 2 x 9 would be padded to 24: 8 a grid step)
  assert len(calls) == 1 and '(tensor<32x64x64xf32>)' in calls[0], calls
  np.testing.assert_allclose(jax.jit(fn(emulated))(gens), jax.jit(fn(plan('cpu')))(gens),
                             atol=2e-5)


def test_small_blocks_on_a_tpu_exponentiate_every_token_in_the_entries_layout():
  """LieRE8 on a TPU: every token's exponential (a 4 x 4 grid: 16, not the lattice's 9 primitive
  points and a table), the kernel in the entries layout: [8, 8, 1, 128] (L H T k = 1 x 2 x 16 x 2
  = 64 matrices, padded to a row of 128); on a mesh each chip exponentiates its share of the
  tokens (docs/decisions/030)."""
  from liere_jax import positions
  pos = positions.grid_positions((4, 4), (4, 4), 'normalized')
  gens = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 2, 2, 28)) / 4, jnp.float32)
  assert rotations.path(plan('tpu'), 8, pos) == 'every token'
  assert rotations.path(plan('cpu'), 8, pos) == 'lattice'
  fn = lambda g: rotations.liere_rotations(g, pos, 8, plan('tpu'))
  text = jax.jit(jax.grad(lambda g: jnp.sum(fn(g) ** 3))).trace(gens).lower(
      lowering_platforms=('tpu',)).as_text()
  calls = [line for line in text.splitlines() if 'tpu_custom_call' in line]
  assert len(calls) == 2 and all('tensor<8x8x1x128xf32>' in c for c in calls), calls


@pytest.mark.parametrize('block, m', [(8, 1100), (16, 70)])
def test_the_cost_estimate_declares_what_the_kernel_does(block, m):
  """Each pass's CostEstimate (expm_kernel.cost, split in kernels.common.DECLARED) equals an
  independent count of the traced kernel over its grid (tests/kernel_count.py) with every
  matrix's squaring loop run COUNTED_SQUARINGS times (its trip count is data): MXU flops
  (stacks) or the products' multiply-adds on the vector unit (entries), the vector ops, the
  logs and exp2s, and the HBM bytes as laid out. 8 x 8 in the entries layout (1,100 matrices:
  two steps of 1,024, the last padded); 16 x 16 as stacks (70: three steps of 32, rows of 16
  on 128 lanes)."""
  entries = block <= expm_kernel.ENTRIES_UP_TO
  a = jnp.zeros((block, block, m) if entries else (m, block, block), jnp.float32)
  for kind, args in (('forward', (a,)), ('backward', (a, a, a))):
    call, = kernel_count.pallas_calls(
        lambda *x, kind=kind: expm_kernel._pallas(kind, plan('tpu'), entries, *x), *args)
    assert call.params['grid_mapping'].grid == (2 if block == 8 else 3,)
    declared = call.params['cost_estimate']
    name, cost = DECLARED[(declared.flops, declared.transcendentals, declared.bytes_accessed)]
    counted = kernel_count.count(call, while_trips=expm_kernel.COUNTED_SQUARINGS)
    assert name == call.params['name'] == f'liere_expm_{kind}'
    assert cost._asdict() == {k: counted[k] for k in cost._fields}, (name, counted)
