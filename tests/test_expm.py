"""expm.py and taylor.py: the exponential's pieces (each Taylor scheme, the squarings, the memory
rule), its forms against SciPy in float64, and on accelerators, checked on this CPU: each
platform's plan (liere_jax.numerics) as its lowered program shows it, the form and product
precision as `bench lower` sees them in the lowered train step, and the error of each product
preset, emulated (liere_jax.dots) since the CPU computes the BF16 presets in float32 and refuses
TF32. The tests marked `numerics` (tiny stacks, seconds) are the numerics scope's
selection for expm.py in the mutation runs (docs/mutation.md)."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import dots, expm, numerics, taylor as taylor_lib
from liere_jax.bench import lower, presets
from liere_jax.kernels import expm as expm_kernel
from liere_jax.numerics import plan
from tests import helpers

AUTO_ALGORITHMS = {'cuda': ['BF16_BF16_F32_X6'], 'tpu': ['HIGHEST']}  # TPU HIGHEST: bf16 x6.
ALG = expm.xla_algebra(dots.CPU)  # The CPU's products (float32).


def _skew(seed, block, radius):
  """A stack of random skew-symmetric matrices [3, b, b], each scaled to spectral radius
  `radius` (float64)."""
  g = np.random.default_rng(seed).normal(size=(3, block, block))
  a = g - np.swapaxes(g, -1, -2)
  return a * (radius / np.abs(np.linalg.eigvals(a)).max(axis=-1))[:, None, None]


def _planes(angles, block=4):
  """Rotation generators [len(angles), b, b]: angle t in every 2 x 2 plane, so a^4 = t^4 I
  and the bound ||a^4||_1^(1/4) is t exactly."""
  a = np.zeros((len(angles), block, block), np.float32)
  for i in range(0, block, 2):
    a[:, i, i + 1], a[:, i + 1, i] = angles, -np.asarray(angles)
  return a


@pytest.mark.numerics
@pytest.mark.parametrize('name,layout', [('TAYLOR12_PS', 'stacked'), ('TAYLOR12', 'stacked'),
                                         ('TAYLOR12', 'entries')])
def test_each_scheme_is_exp_s_taylor_polynomial_coefficient_by_coefficient(name, layout):
  # On the shift matrix J (ones above the diagonal), p(J) = sum_k c_k J^k: row 0 holds c_0..c_18,
  # each checked against 1/k! to float32's resolution (a published coefficient off in its 6th
  # digit, or a lost term, shows); nothing past degree 12. TAYLOR12 also in the Pallas kernel's
  # entries layout [b, b, m] (its Algebra: products as multiply-adds, I entry by entry).
  taylor = getattr(taylor_lib, name)
  shift = np.eye(19, k=1, dtype=np.float32)
  if layout == 'entries':
    alg, x = expm_kernel.ENTRIES, jnp.asarray(shift[:, :, None])
  else:
    alg, x = ALG, jnp.asarray(shift)
  got = np.asarray(taylor.polynomial(alg, taylor.powers(alg, x)), np.float64)[0].ravel()
  want = [1 / math.factorial(k) if k <= 12 else 0. for k in range(19)]
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.numerics
def test_the_squarings_thresholds_are_the_published_float32_ones():
  assert (taylor_lib.TAYLOR12_PS.theta, taylor_lib.TAYLOR12.theta) == (1.0, 1.461661507209034)
  assert (taylor_lib.TAYLOR12_PS.products, taylor_lib.TAYLOR12.products) == (5, 4)
  # Bader-Blanes-Casas for 'loop' and the kernel, Paterson-Stockmeyer for 'cond' and 'select'.
  assert taylor_lib.TAYLORS == {'loop': taylor_lib.TAYLOR12, 'cond': taylor_lib.TAYLOR12_PS,
                                'select': taylor_lib.TAYLOR12_PS}
  assert expm_kernel.TAYLOR is taylor_lib.TAYLOR12


@pytest.mark.numerics
@pytest.mark.parametrize('theta,cap', [(1.0, 24), (0.5, 24), (1.0, 3), (1.46, None)])
@pytest.mark.parametrize('name', ['TAYLOR12_PS', 'TAYLOR12'])
def test_each_matrix_gets_the_fewest_squarings_that_bring_its_bound_under_theta(name, theta, cap):
  # 5e7 > 2**24: past the cond form's cap; 1e12: a^4 overflows float32 (the bound falls back
  # to ||a||_1, here the same); no cap ('loop'): every matrix its own count.
  angles = [0., 0.3, 0.9, 1.5, 3.0, 100., 5e7, 1e12]
  a = jnp.asarray(_planes(angles))
  s = taylor_lib.squarings(getattr(taylor_lib, name).powers(ALG, a), theta, cap)
  want = []
  for t in angles:
    n = 0
    while t / 2**n > theta and (cap is None or n < cap):
      n += 1
    want.append(n)
  assert s.dtype == jnp.int32 and s.tolist() == want, (s, want)


@pytest.mark.numerics
def test_a_non_finite_matrix_gets_no_squarings():
  # 'loop''s trip count: a NaN or infinite bound must not become a huge or endless loop.
  a = jnp.asarray(_planes([1.0, np.nan, np.inf, 4.0]))
  s = taylor_lib.squarings(taylor_lib.TAYLOR12.powers(ALG, a), taylor_lib.TAYLOR12.theta)
  assert s.tolist() == [0, 0, 0, 2], s


@pytest.mark.parametrize('form', ['cond', 'loop', 'select'])
@pytest.mark.parametrize('angle', [0.6, 1.99, 5.0, 100.0])
def test_each_form_takes_the_fewest_squarings_that_bring_the_radius_under_theta(
    angle, form, monkeypatch):
  """Each XLA form evaluates its Taylor polynomial at A / 2^s with s the fewest squarings that
  bring the scaled spectral radius under its scheme's theta (one squaring fewer is numerically
  harmless in float32, ~3x the error at the boundary, issue 31: so count what the polynomial
  sees). A rotation generator (angle t in each 2 x 2 plane) has rho = t exactly."""
  b = 4
  a = np.zeros((3, b, b), np.float32)
  for i in range(0, b, 2):
    a[:, i, i + 1], a[:, i + 1, i] = angle, -angle
  a[1] *= 0.5
  seen = []
  scheme = taylor_lib.TAYLORS[form]

  def polynomial(alg, x):
    jax.debug.callback(lambda v: seen.append(float(v)), jnp.max(jnp.abs(x[1])))
    return scheme.polynomial(alg, x)
  monkeypatch.setitem(taylor_lib.TAYLORS, form, scheme._replace(polynomial=polynomial))
  r = np.asarray(jax.block_until_ready(jax.jit(lambda x: expm.expm(x, plan('cpu', expm=form)))(
      jnp.asarray(a))))
  s = max(0, math.ceil(math.log2(angle / scheme.theta)))
  assert seen and max(seen) == pytest.approx(angle / 2**s, rel=1e-6), (seen, s)
  if form != 'select':
    assert int(expm.squarings(jnp.asarray(a), expm_form=form)) == s
  c, sn = np.cos(np.float64(a[0, 0, 1])), np.sin(np.float64(a[0, 0, 1]))
  np.testing.assert_allclose(r[0, :2, :2], [[c, sn], [-sn, c]], atol=1e-6 * max(1, angle))


@pytest.mark.numerics
@pytest.mark.parametrize('form', ['loop', 'cond', 'select'])
def test_each_form_matches_scipy_on_small_and_large_matrices(form, block=5):
  # Small radii alone (no squaring at all), then a stack from 0.05 to 40: `loop` and `cond`
  # scale the whole piece by its largest, `select` each matrix by its own. One shape: one
  # compile.
  for radii in ([0.05, 0.1, 0.2, 0.3], [0.05, 0.7, 3.0, 40.0]):
    a = np.concatenate([_skew(i, block, r)[:1] for i, r in enumerate(radii)])
    got = np.asarray(expm.expm(jnp.asarray(a, jnp.float32), plan('cpu', expm=form)))
    want = np.stack([scipy.linalg.expm(m) for m in a])
    np.testing.assert_allclose(got, want, atol=2e-6 * max(1, math.sqrt(max(radii))), rtol=0)


# The select form's memory rule (expm.select_remat) weighs its residuals in bytes: n matrices of
# b x b count as 4n of (b/2) x (b/2), whatever the threshold.
@pytest.mark.numerics
def test_the_remat_rule_counts_matrix_entries_so_halving_the_block_is_four_times_the_stack():
  limit = 4 * 64 * 100 * 40  # A flip inside n < 400.
  big = [expm.select_remat(n, 8, limit) for n in range(1, 400)]
  small = [expm.select_remat(4 * n, 4, limit) for n in range(1, 400)]
  assert not big[0] and big[-1], 'the threshold must fall inside the range'
  assert big == small
  assert not expm.select_remat(400, 8)  # The default limit (16 GiB) is far above.


def test_select_recomputes_past_its_limit_to_the_same_result():
  """expm._select under the limit keeps its residuals; past it (`limit`, not the default) it
  runs under jax.checkpoint, the same exponential."""
  u = np.random.default_rng(0).standard_normal((40, 8, 8)).astype(np.float32)
  a = jnp.asarray(u - np.swapaxes(u, 1, 2))
  n = plan('cpu', expm='select')
  program = lambda limit: str(jax.make_jaxpr(lambda x: expm._select(n, x, limit=limit))(a))
  assert expm.select_remat(40, 8, 1) and 'remat2[' in program(1)  # jax.checkpoint's primitive
  assert 'remat2[' not in program(expm.REMAT_ABOVE_BYTES)
  np.testing.assert_array_equal(jax.jit(lambda x: expm._select(n, x, limit=1))(a),
                                jax.jit(lambda x: expm.expm(x, n))(a))


def test_identity_at_zero_and_many_chunks():
  a = jnp.zeros((70_000, 8, 8))  # several chunks of the CPU's 'cond', padded at the end
  assert expm.chunked(a, plan('cpu').chunk_bytes).shape[0] > 1
  r = expm.expm(a, plan('cpu'))
  assert r.shape == a.shape
  np.testing.assert_array_equal(np.asarray(r[-1]), np.eye(8))


def test_bad_form_names_the_fix():
  with pytest.raises(ValueError, match=r"expm='pade' is unknown; use one of .*'cond'"):
    plan('cpu', expm='pade')
  with pytest.raises(ValueError, match='square'):
    expm.expm(jnp.zeros((1, 4, 3)), plan('cpu'))


@pytest.mark.parametrize('range_scale', [1, 4])
def test_auto_presets_keep_the_exponential_within_1e_5_and_its_gradient_at_training(range_scale):
  """The presets 'auto' picks on GPU and TPU (emulated), on the loop form they run, against
  float64 on LieRE64's largest matrices: forward <= 1e-5 at the training range and at 4x
  (evaluation on larger grids), the gradient (training: 1x) <= 1e-5 relative. `bench presets`
  prints the whole table (with bf16 x3 backward the gradient misses it: 1.2e-5)."""
  assert dots.preset_names('cuda') == dots.preset_names('tpu') != dots.preset_names('cpu')
  a, g = presets.largest('imagenet_vitb16_liere64', 16, range_scale)
  err, gerr = presets.errors(a, g if range_scale == 1 else None, *dots.preset_names('cuda'))
  assert err <= 1e-5 and (range_scale > 1 or gerr <= 1e-5), (err, gerr)


def test_fewer_passes_are_too_coarse_for_the_exponential():
  """Why 'auto' pays for six passes: one TF32 pass, or bf16 x3, misses 1e-5 forward
  (so the accuracy test above can fail)."""
  a, _ = presets.largest('imagenet_vitb16_liere64', 16)
  ref = np.stack([scipy.linalg.expm(x) for x in a.astype(np.float64)])
  for name in ('TF32_TF32_F32', 'BF16_BF16_F32_X3'):
    n = plan('cpu', expm='loop', products=dots.emulated_dots(name, name))
    r = jax.jit(lambda x: expm.expm(x, n))(a)
    assert np.abs(np.asarray(r, np.float64) - ref).max() > 1e-5, name


def test_emulated_presets_split_operands_into_narrower_numbers():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((64,)), jnp.float32)
  for kind, parts, bits in (('bf16', 3, 8), ('tf32', 2, 11)):
    pieces = dots.split(x, kind, parts)
    for p in pieces:  # Each part has at most `bits` significant bits.
      m, _ = np.frexp(np.asarray(p, np.float64))
      np.testing.assert_array_equal(m * 2**bits, np.round(m * 2**bits))
    np.testing.assert_allclose(sum(pieces), x, rtol=2.0**(-bits * parts + 1))


def test_loop_form_and_its_gradient_within_1e_5_of_float64_at_training():
  """'loop' in float32 on LieRE64's largest matrices at the training range: R within 1e-5 of
  float64 SciPy and orthogonal to 1e-6, the gradient (its VJP: taylor.py's adjoint) within 1e-5
  relative. Bader-Blanes-Casas, with the identity split off (as published, the
  gradient missed: 1.2e-5)."""
  a, g = presets.largest('imagenet_vitb16_liere64', 16)
  fn = lambda x: expm.expm(x, plan('cpu', expm='loop'))
  r, grad = jax.jit(lambda x: (fn(x), jax.grad(lambda y: jnp.sum(fn(y) * g))(x)))(a)
  a64, r = a.astype(np.float64), np.asarray(r, np.float64)
  ref = np.stack([scipy.linalg.expm(x) for x in a64])
  gref = np.stack([scipy.linalg.expm_frechet(x.T, y, compute_expm=False)
                   for x, y in zip(a64, g.astype(np.float64))])
  skew = lambda x: x - np.swapaxes(x, -1, -2)
  gerr = np.abs(skew(np.asarray(grad, np.float64)) - skew(gref)).max() / np.abs(skew(gref)).max()
  orth = np.abs(np.einsum('mji,mjk->mik', r, r) - np.eye(64)).max()
  assert np.abs(r - ref).max() <= 1e-5 and orth <= 1e-6 and gerr <= 1e-5, (
      np.abs(r - ref).max(), orth, gerr)


def test_loop_form_stays_the_exponential_past_any_cap():
  """No cap: a matrix at 2^(SELECT_CAP + 4) of spectral radius gets its 20 squarings (the
  select form stops at SELECT_CAP: far off, below), next to a small one scaled alike; the error
  is float32's, ~1e-7 of the angle."""
  rng = np.random.default_rng(1)
  u = rng.standard_normal((2, 8, 8))
  a = (u - np.swapaxes(u, 1, 2)) / 8
  a[1] *= 2.0**(expm.SELECT_CAP + 4) / np.abs(np.linalg.eigvals(a[1])).max()
  a = a.astype(np.float32)
  ref = np.stack([scipy.linalg.expm(x) for x in a.astype(np.float64)])
  err = lambda form: np.abs(np.asarray(jax.jit(
      lambda x: expm.expm(x, plan('cpu', expm=form)))(a), np.float64) - ref).max(axis=(1, 2))
  loop, select = err('loop'), err('select')
  assert loop[0] <= 1e-5 and loop[1] <= 1e-6 * 2**(expm.SELECT_CAP + 4), loop
  assert not select[1] <= 1e-1, select


def test_loop_form_s_vjp_keeps_no_intermediate():
  """'loop''s backward keeps a and R alone and recomputes its squarings: fwd+bwd temp memory
  a fraction of the select form's, which keeps every squaring's input."""
  u = np.random.default_rng(0).standard_normal((256, 16, 16)).astype(np.float32)
  a = 4 * (u - np.swapaxes(u, 1, 2))
  temp = lambda form: jax.jit(jax.grad(lambda x: jnp.sum(expm.expm(
      x, plan('cpu', expm=form))**2))).lower(a).compile().memory_analysis().temp_size_in_bytes
  assert temp('loop') * 3 < temp('select'), (temp('loop'), temp('select'))


@pytest.mark.parametrize('block', [3, 4, 8, 16, 64])
@pytest.mark.parametrize('form', ['cond', 'loop', 'select'])
def test_each_form_s_gradient_is_exp_s_vjp_in_float64(form, block):
  """The gradient of a linear functional of R (its skew part: what a skew-symmetric
  parametrisation of a sees) against jax.vjp of jax.scipy.linalg.expm in float64, within
  helpers.ADJOINT_RADII's tolerance at each radius from 1e-3 to 250: 3 matrices a radius in one
  stack (cond and loop scale a stack by its largest: the small ones' adjoint runs 8 levels), and
  the two smallest radii alone (no squaring: the adjoint's base and end alone)."""
  radii = list(helpers.ADJOINT_RADII)
  a, g = helpers.skew_of_radii(block, block, radii, per=3)
  ref = helpers.expm_vjp64(a, g)
  n = plan('cpu', expm=form)
  grad = jax.jit(lambda x, g: jax.grad(lambda y: jnp.sum(expm.expm(y, n) * g))(x))
  errors = {'stack': helpers.adjoint_errors(grad(a, g), ref, 3),
            'small alone': helpers.adjoint_errors(grad(a[:6], g[:6]), ref[:6], 3)}
  for name, err in errors.items():
    assert all(e <= helpers.ADJOINT_RADII[r] for e, r in zip(err, radii)), (name, list(err))


@pytest.mark.parametrize('form', ['cond', 'loop', 'select', 'kernel'])
def test_each_form_s_gradient_is_its_forward_s_derivative(form):
  """Finite differences of the float32 forward itself, <G, R(a + hD) - R(a - hD)> / 2h with
  Richardson's extrapolation from h and 2h, along a random skew-symmetric D, against the
  gradient's <abar, D>: within 3e-3 of abar's largest entry for blocks of 3, 8 and 64 at radii
  0.5, 5 and 50, each XLA form and the Pallas kernel (h = 0.05: the forward's float32 rounding
  over 2h bounds it; at most 2.3e-4 measured, at radius 50; a wrong transpose, sign or factor is
  off by O(1))."""
  n = plan('cpu', expm_kernel=True) if form == 'kernel' else plan('cpu', expm=form)
  fn = jax.jit(lambda x: expm.expm(x, n))
  for block in (3, 8, 64):
    a, g = helpers.skew_of_radii(10 + block, block, [0.5, 5.0, 50.0])
    u = np.random.default_rng(block).standard_normal(a.shape)
    d = (u - np.swapaxes(u, -1, -2)) / np.sqrt(2 * block * block)
    grad = np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(fn(x) * g)))(a), np.float64)
    value = lambda x: np.einsum('mij,mij->m', np.asarray(fn(x.astype(np.float32)), np.float64),
                                g.astype(np.float64))
    central = lambda h: (value(a + h * d) - value(a - h * d)) / (2 * h)
    h = 0.05
    fd = (4 * central(h) - central(2 * h)) / 3
    want = np.einsum('mij,mij->m', grad, d)
    err = np.abs(fd - want) / np.abs(grad).max(axis=(1, 2))
    assert (err <= 3e-3).all(), (block, err, fd, want)


def _dots(jaxpr):
  """dot_generals in a jaxpr: (outside any loop, in each while loop's body)."""
  outside, inside = 0, []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      outside += 1
    elif eqn.primitive.name == 'while':
      inside.append(_dots(eqn.params['body_jaxpr'].jaxpr)[0])
    else:
      for p in eqn.params.values():
        if hasattr(p, 'jaxpr'):
          sub = _dots(getattr(p.jaxpr, 'jaxpr', p.jaxpr))
          outside, inside = outside + sub[0], inside + sub[1]
  return outside, inside


@pytest.mark.numerics
def test_the_adjoint_costs_its_base_and_three_products_a_level():
  """taylor.py's adjoint as the recomputing forms run it: loop (Bader-Blanes-Casas) 13 products
  (a^2, a^3, W, the powers' tangents 3, the polynomial 2 and its tangent 4, the end) and cond
  (Paterson-Stockmeyer) 15 outside the loop, 3 a level in it (E^2, E M, M E); the backward
  before it: 17 + 3 s (a^T's powers and polynomial differentiated forward after the
  Newton-Schulz adjoint's 5)."""
  a = jnp.zeros((4, 8, 8), jnp.float32)
  for form, base in (('loop', 13), ('cond', 15)):
    n = plan('cpu', expm=form)
    jaxpr = jax.make_jaxpr(lambda a, r, g: expm._scaled_piece_vjp(n, form, a, r, g))(a, a, a)
    assert _dots(jaxpr.jaxpr) == (base, [3]), (form, _dots(jaxpr.jaxpr))


@pytest.mark.numerics
def test_the_powers_tangents_are_their_jvp():
  """taylor.skew_tangents, a skew-symmetric x in a skew-symmetric direction w (an even power's
  tangent one product and its transpose), against jax.jvp of each scheme's powers."""
  rng = np.random.default_rng(0)
  u, v = rng.standard_normal((2, 3, 8, 8))
  x, w = jnp.asarray(u - np.swapaxes(u, -1, -2)), jnp.asarray(v - np.swapaxes(v, -1, -2))
  alg = taylor_lib.stacked(functools.partial(jnp.matmul, precision='highest'))
  for taylor in (taylor_lib.TAYLOR12, taylor_lib.TAYLOR12_PS):
    powers, want = jax.jvp(lambda y: taylor.powers(alg, y), (x,), (w,))
    got = taylor_lib.skew_tangents(alg, powers, w)
    assert sorted(got) == sorted(want)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-5 * np.abs(want[k]).max())


def test_select_form_scales_each_matrix_and_stops_at_the_cap():
  """Per matrix: a small matrix is exact next to a large one; past 2**SELECT_CAP the squarings
  stop, so the result is no longer the exponential (the documented limit)."""
  rng = np.random.default_rng(1)
  u = rng.standard_normal((3, 8, 8))
  a = (u - np.swapaxes(u, 1, 2)) / 8
  a[1] *= 1e-3
  a[2] *= 2.0**(expm.SELECT_CAP + 3)
  r = np.asarray(jax.jit(lambda x: expm.expm(x, plan('cpu', expm='select')))(
      a.astype(np.float32)))
  ref = [scipy.linalg.expm(x) for x in a]
  assert np.abs(r[1] - ref[1]).max() <= 1e-6 and np.abs(r[0] - ref[0]).max() <= 1e-5
  assert not np.allclose(r[2], ref[2], atol=1e-2)  # NaN, or far off


def test_each_platform_runs_the_form_its_plan_names():
  """liere_jax.numerics decides: lowered for tpu with its plan, 12 x 12 blocks (which its kernel
  does not take) run the loop form (a while loop on the device), 8 x 8 the kernel; for cuda the
  select form (no loop), until cuda's plan names the loop."""
  loops = lambda n, b=8: lower.summarize(jax.jit(lambda x: expm.expm(x, n)).trace(
      jnp.zeros((4, b, b))).lower(lowering_platforms=(n.platform,)).compiler_ir('stablehlo'),
      n.platform)['while_loops']
  tpu, cuda = plan('tpu'), plan('cuda')
  assert numerics.PLATFORMS['tpu'].expm == 'loop' and expm.form(tpu, 12) == 'loop'
  assert loops(tpu, 12) > 0 and expm.form(tpu, 8) == 'kernel'
  assert numerics.PLATFORMS['cuda'].expm == 'select' and expm.form(cuda, 8) == 'select'
  assert loops(cuda) == 0
  assert loops(cuda.replace(expm='loop')) > 0
  assert [expm.form(plan(p), 2) for p in ('cpu', 'cuda', 'tpu')] == ['closed form'] * 3


@pytest.mark.parametrize('pe', ['liere8', 'liere64'])
def test_lowered_train_step_has_no_conditionals_on_accelerators(pe):
  """`bench lower`: the whole train step lowered for cuda and tpu holds no data-dependent
  conditional and runs the exponential's products at the platform's presets, as multiply-adds
  where the platform takes them for the block (LieRE8 on a TPU), or in the Pallas kernel with no
  lattice table (LieRE64 on a TPU: no XLA products left) (the CPU's step, with its per-chunk
  branches: test_the_cpu_compiles_the_earlier_train_step_op_for_op)."""
  cfg, _ = helpers.tiny_config_and_batch(8)
  cfg.model.pe.name = pe
  cfg.model.update(width=128, heads=2)
  rows = {r['platform']: r for r in lower.bench_lower(cfg, ['cuda', 'tpu'])}
  for platform in ('cuda', 'tpu'):
    assert rows[platform]['conditionals'] == 0, rows[platform]
    row, block = numerics.PLATFORMS[platform], int(pe[len('liere'):])
    no_dots = row.elementwise_blocks >= block or (
        row.expm_kernel and expm_kernel.supported(block, platform))
    assert rows[platform]['expm_dot_algorithms'] == (
        [] if no_dots else AUTO_ALGORITHMS[platform]), platform


@pytest.mark.numerics
def test_expm_precision_highest_keeps_float32_products_on_accelerators():
  """model.pe.expm_precision reaches the products: the encoding's rotations and their gradient
  lowered for cuda take the bf16 x6 preset under 'auto' and HIGHEST under 'highest'."""
  from flax import nnx
  from liere_jax import model as model_lib
  from liere_jax.positions import grid_positions
  pos = grid_positions((3, 3), (3, 3), 'normalized')
  found = {}
  for precision in ('auto', 'highest'):
    enc = model_lib.create_encoding('liere8', grid=(3, 3), heads=2, head_dim=16,
                                    rngs=nnx.Rngs(0), expm_precision=precision)
    graphdef, state = nnx.split(enc)
    rot_sum = lambda s: jnp.sum(nnx.merge(graphdef, s).context(pos, plan('cuda')).rot)
    module = jax.jit(jax.grad(rot_sum)).trace(state).lower(
        lowering_platforms=('cuda',)).compiler_ir('stablehlo')
    found[precision] = lower.summarize(module, 'cuda')['expm_dot_algorithms']
  assert found == {'auto': ['BF16_BF16_F32_X6'], 'highest': ['HIGHEST']}, found


@pytest.mark.parametrize('form', ['loop', 'cond', 'select'])
def test_small_blocks_multiply_add_on_the_vector_units_as_the_dots_compute(form):
  """Numerics.elementwise_blocks: products of blocks up to 8 as float32 multiply-adds, no dot in
  the exponential (forward and backward, the loop form's VJP included); R and the gradient as
  the dots give them."""
  rng = np.random.default_rng(8)
  a = rng.standard_normal((16, 8, 8)).astype(np.float32) * 3
  a = jnp.asarray(a - np.swapaxes(a, -1, -2))
  g = jnp.asarray(rng.standard_normal(a.shape), jnp.float32)
  run = lambda n: jax.jit(lambda a: (expm.expm(a, n), jax.grad(
      lambda a: jnp.sum(expm.expm(a, n) * g))(a)))
  dot, elementwise = plan('cpu', expm=form), plan('cpu', expm=form, elementwise_blocks=8)
  want, got = run(dot)(a), run(elementwise)(a)
  assert 'dot_general' in run(dot).trace(a).lower().as_text()
  assert 'dot_general' not in run(elementwise).trace(a).lower().as_text()
  np.testing.assert_allclose(got[0], want[0], atol=1e-6)
  np.testing.assert_allclose(got[1], want[1], atol=1e-5 * float(jnp.max(jnp.abs(want[1]))))


def test_a_tpu_multiplies_blocks_up_to_8_on_its_vector_units_and_dots_the_rest():
  """The TPU plan's elementwise_blocks: LieRE8's XLA exponential (its kernel off) lowered for a
  TPU has no dot, forward or backward; for a GPU and this CPU it has dots, and so has a TPU's
  16 x 16."""
  def dots_in(b, n):
    a = jnp.zeros((4, b, b))
    grad = jax.grad(lambda a: jnp.sum(expm.expm(a, n)))
    return jax.jit(grad).trace(a).lower(lowering_platforms=(n.platform,)).as_text().count(
        'dot_general')
  tpu = plan('tpu', expm_kernel=False)
  assert tpu.elementwise_blocks == 8 and dots_in(8, tpu) == 0
  assert min(dots_in(8, plan('cuda')), dots_in(8, plan('cpu')), dots_in(16, tpu)) > 0
