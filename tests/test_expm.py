"""expm.py: the exponential's pieces (each Taylor scheme, the squarings, the memory rule), its
forms against SciPy in float64, and on accelerators, checked on this CPU: the platform's form
and product precision as `bench lower` sees them in the lowered train step, and the error of
each product preset, emulated (liere_jax.dots) since the CPU computes the BF16 presets in float32
and refuses TF32. The tests marked `numerics` (tiny stacks, seconds) are the numerics scope's
selection for expm.py in the mutation runs (docs/mutation.md)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import dots, expm, expm_kernel, platforms
from liere_jax.bench import lower, presets
from tests import helpers

AUTO_ALGORITHMS = {'cuda': ['BF16_BF16_F32_X6'], 'tpu': ['HIGHEST']}  # TPU HIGHEST: bf16 x6.


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
@pytest.mark.parametrize('name,degree', [('TAYLOR12_PS', 12), ('TAYLOR12', 12), ('TAYLOR18', 18)])
def test_each_scheme_is_exp_s_taylor_polynomial_coefficient_by_coefficient(name, degree):
  # On the shift matrix J (ones above the diagonal), p(J) = sum_k c_k J^k: row 0 holds c_0..c_18,
  # each checked against 1/k! to float32's resolution (a published coefficient off in its 6th
  # digit, or a lost term, shows); nothing past the degree.
  taylor = getattr(expm, name)
  shift = jnp.asarray(np.eye(19, k=1, dtype=np.float32))
  got = np.asarray(taylor.polynomial(taylor.powers(shift)), np.float64)[0]
  want = [1 / math.factorial(k) if k <= degree else 0. for k in range(19)]
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.numerics
def test_the_squarings_thresholds_are_the_published_float32_ones():
  assert (expm.TAYLOR12_PS.theta, expm.TAYLOR12.theta, expm.TAYLOR18.theta) == (
      1.0, 1.461661507209034, 3.010066362817634)
  assert (expm.TAYLOR12.products, expm.TAYLOR18.products) == (4, 5)


@pytest.mark.numerics
@pytest.mark.parametrize('theta,cap', [(1.0, 24), (0.5, 24), (1.0, 3), (1.46, None)])
@pytest.mark.parametrize('name', ['TAYLOR12_PS', 'TAYLOR12'])
def test_each_matrix_gets_the_fewest_squarings_that_bring_its_bound_under_theta(name, theta, cap):
  # 5e7 > 2**24: past the cond form's cap; 1e12: a^4 overflows float32 (the bound falls back
  # to ||a||_1, here the same); no cap (fast_loop): every matrix its own count.
  angles = [0., 0.3, 0.9, 1.5, 3.0, 100., 5e7, 1e12]
  a = jnp.asarray(_planes(angles))
  s = expm._squarings(getattr(expm, name).powers(a), theta, cap)
  want = []
  for t in angles:
    n = 0
    while t / 2**n > theta and (cap is None or n < cap):
      n += 1
    want.append(n)
  assert s.dtype == jnp.int32 and s.tolist() == want, (s, want)


@pytest.mark.numerics
def test_a_non_finite_matrix_gets_no_squarings():
  # fast_loop's trip count: a NaN or infinite bound must not become a huge or endless loop.
  a = jnp.asarray(_planes([1.0, np.nan, np.inf, 4.0]))
  s = expm._squarings(expm.TAYLOR12.powers(a), expm.TAYLOR12.theta)
  assert s.tolist() == [0, 0, 0, 2], s


@pytest.mark.parametrize('angle', [0.6, 1.99, 5.0, 100.0])
def test_fast_takes_the_fewest_squarings_that_bring_the_radius_under_theta(angle):
  """`fast` evaluates its Taylor polynomial at A / 2^s with s the fewest squarings that bring
  the scaled spectral radius under theta (one squaring fewer is numerically harmless in
  float32, ~3x the error at the boundary, issue 31: so count what the polynomial sees). A
  rotation generator (angle t in each 2 x 2 plane) has rho = t exactly."""
  b = 4
  a = np.zeros((3, b, b), np.float32)
  for i in range(0, b, 2):
    a[:, i, i + 1], a[:, i + 1, i] = angle, -angle
  a[1] *= 0.5
  seen = []

  def polynomial(x):
    jax.debug.callback(lambda v: seen.append(float(v)), jnp.max(jnp.abs(x[1])))
    return expm.TAYLOR12.polynomial(x)
  taylor = expm.TAYLOR12._replace(polynomial=polynomial)
  r = np.asarray(jax.block_until_ready(expm.fast_expm(jnp.asarray(a), taylor)))
  s = max(0, math.ceil(math.log2(angle / expm.TAYLOR12.theta)))
  assert seen and max(seen) == pytest.approx(angle / 2**s, rel=1e-6), (seen, s)
  assert int(expm.squarings(jnp.asarray(a), form='loop')) == s
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
    got = np.asarray(expm.fast_expm(jnp.asarray(a, jnp.float32), form=form))
    want = np.stack([scipy.linalg.expm(m) for m in a])
    np.testing.assert_allclose(got, want, atol=2e-6 * max(1, math.sqrt(max(radii))), rtol=0)


# fast_select's memory rule (expm.select_remat) weighs its residuals in bytes: n matrices of
# b x b count as 4n of (b/2) x (b/2), whatever the threshold.
@pytest.mark.numerics
def test_the_remat_rule_counts_matrix_entries_so_halving_the_block_is_four_times_the_stack(
    monkeypatch):
  monkeypatch.setattr(expm, 'REMAT_ABOVE_BYTES', 4 * 64 * 100 * 40)  # A flip inside n < 400.
  big = [expm.select_remat(expm.TAYLOR12, n, 8) for n in range(1, 400)]
  small = [expm.select_remat(expm.TAYLOR12, 4 * n, 4) for n in range(1, 400)]
  assert not big[0] and big[-1], 'the threshold must fall inside the range'
  assert big == small


def test_identity_at_zero_and_many_chunks():
  a = jnp.zeros((70_000, 8, 8))  # several chunks of the fast path, padded at the end
  r = expm.expm(a)
  assert r.shape == a.shape
  np.testing.assert_array_equal(np.asarray(r[-1]), np.eye(8))


def test_bad_method_names_the_fix():
  with pytest.raises(ValueError, match=r"method='pade'.*fast"):
    expm.expm(jnp.zeros((1, 4, 4)), 'pade')


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
    prec = dots.Dots(dots.emulated(name), dots.emulated(name))
    r = jax.jit(lambda x: expm.fast_expm(x, form='loop', precision=prec))(a)
    assert np.abs(np.asarray(r, np.float64) - ref).max() > 1e-5, name


def test_emulated_presets_split_operands_into_narrower_numbers():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((64,)), jnp.float32)
  for kind, parts, bits in (('bf16', 3, 8), ('tf32', 2, 11)):
    pieces = dots.split(x, kind, parts)
    for p in pieces:  # Each part has at most `bits` significant bits.
      m, _ = np.frexp(np.asarray(p, np.float64))
      np.testing.assert_array_equal(m * 2**bits, np.round(m * 2**bits))
    np.testing.assert_allclose(sum(pieces), x, rtol=2.0**(-bits * parts + 1))


@pytest.mark.parametrize('taylor', ['TAYLOR12', 'TAYLOR18'])
def test_loop_form_and_its_gradient_within_1e_5_of_float64_at_training(taylor):
  """fast_loop in float32 on LieRE64's largest matrices at the training range: R within 1e-5 of
  float64 SciPy and orthogonal to 1e-6, the gradient (its VJP: the program run forward on a^T)
  within 1e-5 relative. Each Bader-Blanes-Casas scheme, with the identity split off (as
  published, the gradient missed: 1.2e-5)."""
  a, g = presets.largest('imagenet_vitb16_liere64', 16)
  fn = lambda x: expm.fast_expm(x, getattr(expm, taylor), 'loop', dots.CPU)
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
      lambda x: expm.fast_expm(x, form=form))(a), np.float64) - ref).max(axis=(1, 2))
  loop, select = err('loop'), err('select')
  assert loop[0] <= 1e-5 and loop[1] <= 1e-6 * 2**(expm.SELECT_CAP + 4), loop
  assert not select[1] <= 1e-1, select


def test_loop_form_s_vjp_keeps_no_intermediate():
  """fast_loop's backward stores a and its count alone (and Newton-Schulz's few stacks):
  fwd+bwd temp memory a fraction of the select form's, which keeps every squaring."""
  u = np.random.default_rng(0).standard_normal((256, 16, 16)).astype(np.float32)
  a = 4 * (u - np.swapaxes(u, 1, 2))
  temp = lambda form: jax.jit(jax.grad(lambda x: jnp.sum(expm.fast_expm(
      x, form=form)**2))).lower(a).compile().memory_analysis().temp_size_in_bytes
  assert temp('loop') * 3 < temp('select'), (temp('loop'), temp('select'))


def test_select_form_scales_each_matrix_and_stops_at_the_cap():
  """Per matrix: a small matrix is exact next to a large one; past 2**SELECT_CAP the squarings
  stop, so the result is no longer the exponential (the documented limit)."""
  rng = np.random.default_rng(1)
  u = rng.standard_normal((3, 8, 8))
  a = (u - np.swapaxes(u, 1, 2)) / 8
  a[1] *= 1e-3
  a[2] *= 2.0**(expm.SELECT_CAP + 3)
  r = np.asarray(jax.jit(lambda x: expm.fast_expm(x, form='select'))(a.astype(np.float32)))
  ref = [scipy.linalg.expm(x) for x in a]
  assert np.abs(r[1] - ref[1]).max() <= 1e-6 and np.abs(r[0] - ref[0]).max() <= 1e-5
  assert not np.allclose(r[2], ref[2], atol=1e-2)  # NaN, or far off


def test_platform_cases_fold_away_when_compiled():
  """platform_dependent's cases have a constant selector: XLA removes them before running, so
  the select form compiles to no conditional at all (the CPU's compiled program here)."""
  u = np.random.default_rng(0).standard_normal((4, 8, 8)).astype(np.float32)
  a = u - np.swapaxes(u, 1, 2)
  hlo = jax.jit(lambda x: expm.fast_expm(x, form='select')).lower(a).compile().as_text()
  assert 'conditional' not in hlo
  cond = jax.jit(lambda x: expm.fast_expm(x, form='cond')).lower(a).compile().as_text()
  assert 'conditional' in cond  # The check sees conditionals where there are some.


def test_each_platform_runs_the_form_its_row_of_the_table_names(monkeypatch):
  """liere_jax.platforms decides: lowered for tpu, 'fast' is the loop form (a while loop on the
  device); for cuda the select form (none), until cuda's row names the loop."""
  a = jnp.zeros((4, 8, 8))
  loops = lambda platform: lower.summarize(jax.jit(lambda x: expm.expm(x, 'fast')).trace(
      a).lower(lowering_platforms=(platform,)).compiler_ir('stablehlo'), platform)['while_loops']
  assert platforms.PLATFORMS['tpu'].expm_form == 'loop' and loops('tpu') > 0
  assert platforms.PLATFORMS['cuda'].expm_form == 'select' and loops('cuda') == 0
  monkeypatch.setitem(platforms.PLATFORMS, 'cuda', platforms.PLATFORMS['cuda']._replace(
      expm_form='loop'))
  assert loops('cuda') > 0


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
    row, block = platforms.PLATFORMS[platform], int(pe[len('liere'):])
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
    rot_sum = lambda s: jnp.sum(nnx.merge(graphdef, s).context(pos).rot)
    module = jax.jit(jax.grad(rot_sum)).trace(state).lower(
        lowering_platforms=('cuda',)).compiler_ir('stablehlo')
    found[precision] = lower.summarize(module, 'cuda')['expm_dot_algorithms']
  assert found == {'auto': ['BF16_BF16_F32_X6'], 'highest': ['HIGHEST']}, found


@pytest.mark.parametrize('method', ['fast_loop', 'fast_cond', 'fast_select'])
def test_small_blocks_multiply_add_on_the_vector_units_as_the_dots_compute(method):
  """block_products=elementwise: products of blocks up to 8 as float32 multiply-adds, no dot in
  the exponential lowered for any platform (forward and backward, fast_loop's VJP included, which
  is traced outside the platform's branch); R and the gradient as the dots give them."""
  rng = np.random.default_rng(8)
  a = rng.standard_normal((16, 8, 8)).astype(np.float32) * 3
  a = jnp.asarray(a - np.swapaxes(a, -1, -2))
  g = jnp.asarray(rng.standard_normal(a.shape), jnp.float32)
  loss = lambda a: jnp.sum(expm.expm(a, method) * g)
  with expm.BLOCK_PRODUCTS('dot'):
    want = expm.expm(a, method), jax.grad(loss)(a)
  with expm.BLOCK_PRODUCTS('elementwise'):
    got = expm.expm(a, method), jax.grad(loss)(a)
    text = jax.jit(jax.grad(lambda a: loss(a))).trace(a).lower(  # Every platform's branch.
        lowering_platforms=('cpu', 'cuda', 'tpu')).as_text()
    assert 'dot_general' not in text
  np.testing.assert_allclose(got[0], want[0], atol=1e-6)
  np.testing.assert_allclose(got[1], want[1], atol=1e-5 * float(jnp.max(jnp.abs(want[1]))))


def test_a_tpu_multiplies_blocks_up_to_8_on_its_vector_units_and_dots_the_rest():
  """liere_jax.platforms' elementwise_blocks: LieRE8's exponential lowered for a TPU has no dot,
  forward or backward; for a GPU and this CPU it has dots, and so has a TPU's 16 x 16."""
  def dots(b, platform):
    a = jnp.zeros((4, b, b))
    grad = jax.grad(lambda a: jnp.sum(expm.expm(a, 'fast')))  # A new function: switches.
    return jax.jit(grad).trace(a).lower(lowering_platforms=(platform,)).as_text().count(
        'dot_general')
  assert dots(8, 'tpu') == 0
  assert min(dots(8, 'cuda'), dots(8, 'cpu'), dots(16, 'tpu')) > 0
