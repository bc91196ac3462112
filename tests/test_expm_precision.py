"""The exponential on accelerators, checked on this CPU: the platform's form and product
precision as `bench lower` sees them in the lowered train step, and the error of each product
preset, emulated (liere_jax.dots) since the CPU computes the BF16 presets in float32 and
refuses TF32."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from liere_jax import dots, expm
from liere_jax.bench import lower, presets
from tests import helpers

AUTO_ALGORITHMS = {'cuda': ['BF16_BF16_F32_X6'], 'tpu': ['HIGHEST']}  # TPU HIGHEST: bf16 x6.


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


@pytest.mark.parametrize('form', ['loop', 'cond', 'select'])
def test_each_form_agrees_with_scipy(form):
  a, _ = presets.largest('imagenet_vitb16_liere64', 16, 4)
  ref = np.stack([scipy.linalg.expm(x) for x in a.astype(np.float64)])
  r = jax.jit(lambda x: expm.fast_expm(x, form=form, precision=dots.CPU))(a)
  assert np.abs(np.asarray(r, np.float64) - ref).max() <= 1e-5


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


@pytest.mark.parametrize('pe', ['liere8', 'liere64'])
def test_lowered_train_step_has_no_conditionals_on_accelerators(pe):
  """`bench lower`: the whole train step lowered for cuda and tpu holds no data-dependent
  conditional and runs the exponential's products at the platform's presets (the CPU's step,
  with its per-chunk branches: test_the_cpu_compiles_the_earlier_train_step_op_for_op)."""
  cfg, _ = helpers.tiny_config_and_batch(8)
  cfg.model.pe.name = pe
  cfg.model.update(width=128, heads=2)
  rows = {r['platform']: r for r in lower.bench_lower(cfg, ['cuda', 'tpu'])}
  for platform in ('cuda', 'tpu'):
    assert rows[platform]['conditionals'] == 0, rows[platform]
    assert rows[platform]['expm_dot_algorithms'] == AUTO_ALGORITHMS[platform]


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
