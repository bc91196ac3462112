"""ComRoPE (comrope_ap<b>, comrope_ld<b>) and STRING (string_cayley, string_circulant<b>).

Commuting generators make the encodings exactly relative: R(x)^T R(y) depends on y - x only and
attention logits do not move under a common shift (LieRE in 2D does, the negative control).
Their exponentials (one eigen-decomposition / solve / DFT per block and step) equal dense
matrix exponentials; the reductions (Cayley with S = 0 is RoPE-Mixed, ComRoPE-AP2 an axial RoPE
with learned frequencies) hold; gradients are exact and finite at zero generators and at init;
the PyTorch port gives the same logits (<= 1e-4) at the training size and a larger one, 2D / 3D.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from flax import nnx

from liere_jax import convert, encodings
from liere_jax.config import model as model_spec
from liere_jax.model import ViT
from liere_jax.numerics import plan
from liere_jax.positions import grid_positions, with_prefix
from tests.helpers import tiny_model_config, tiny_spec

FOUR = ('comrope_ap4', 'comrope_ld4', 'string_cayley', 'string_circulant8')
EXTRA = ('comrope_ap2', 'comrope_ld2', 'comrope_ld16', 'string_circulant5')  # b = 2 closed
# form, one dense block, an odd circulant (with leftover dims).
HI = jax.lax.Precision.HIGHEST


def _encoding(pe, n_dims=2, seed=0, pool='mean', **kw):
  """The encoding alone (no ViT), with a non-zero Cayley S so that P is not the identity; no
  prefix token unless pool='cls'."""
  spec = tiny_spec(pe, n_dims, pool=pool, **kw)
  enc = encodings.build(spec, rngs=nnx.Rngs(seed))
  if hasattr(enc, 'cayley'):
    rng = np.random.default_rng(seed + 1)
    enc.cayley[...] = jnp.asarray(0.3 * rng.normal(size=enc.cayley.shape), jnp.float32)
  return enc, spec


# Jitted with XLA's backend optimisations off: one quick compile per case instead of an eager
# compile per operation (most of this module's runtime either way).
_FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}


@functools.partial(jax.jit, static_argnums=(0, 5), compiler_options=_FAST_COMPILE)
def _attend(graphdef, state, pos, q, k, layer):
  enc = nnx.merge(graphdef, state)
  return _through_attention(enc, enc.context(pos), layer, q, k)


def _through_attention(enc, ctx, layer, q, k):
  """What attention does to q and k [B, T, H, d]: the projection hook (as if q and k were
  the projection's outputs), then the attend hook, with the layer's own context."""
  pe = enc.layer(ctx, layer)
  if pe.projects:
    qkv = jnp.concatenate([q, k, jnp.zeros_like(q)], axis=-2)  # (q|k|v, head) columns.
    qkv, _ = pe.project(qkv.reshape(qkv.shape[:-2] + (-1,)), None)
    q, k, _ = jnp.split(qkv.reshape(q.shape[:-2] + (3,) + q.shape[-2:]), 3, axis=-3)
    q, k = q[..., 0, :, :], k[..., 0, :, :]
  q, k, _ = pe.attend(q, k, plan())
  return q, k


def _rotate(enc, pos, q, k, layer=0):
  graphdef, state = nnx.split(enc)
  return _attend(graphdef, state, jnp.asarray(pos, jnp.float32), jnp.asarray(q, jnp.float32),
                 jnp.asarray(k, jnp.float32), layer)


def _dense(enc, spec, pos, layer=0):
  """R(x_t) [H, T, d, d] through the attend hook: rotate the basis vectors e_i."""
  d, heads = spec.head_dim, spec.heads
  basis = np.broadcast_to(np.eye(d)[:, None, None, :], (d, len(pos), heads, d))
  rq, _ = _rotate(enc, pos, basis, basis, layer)  # rq[i, t, h] = R_t e_i
  return np.asarray(jnp.transpose(rq, (2, 1, 3, 0)), np.float64)


def _logits(enc, pos, q, k, layer=0):
  q, k = (np.asarray(a, np.float64) for a in _rotate(enc, pos, q, k, layer))
  return np.einsum('bqhd,bkhd->hqk', q, k)


def _relative_errors(pe, n_dims):
  """(max |R(x_i)^T R(x_j) - R(0)^T R(x_j - x_i)|, relative logit change under a shift)."""
  enc, spec = _encoding(pe, n_dims, width=32, heads=2)
  rng = np.random.default_rng(1)
  x = rng.uniform(0, 3, (5, n_dims)).astype(np.float32)
  diffs = (x[None, :] - x[:, None]).reshape(-1, n_dims)  # x_j - x_i, row i * 5 + j
  r = _dense(enc, spec, np.concatenate([x, np.zeros((1, n_dims), np.float32), diffs]))
  rx, r0, rd = r[:, :5], r[:, 5], r[:, 6:].reshape(r.shape[0], 5, 5, *r.shape[-2:])
  pair = np.einsum('hiab,hjac->hijbc', rx, rx)  # R(x_i)^T R(x_j)
  from_diff = np.einsum('hab,hijac->hijbc', r0, rd)  # R(0)^T R(x_j - x_i)
  q = jnp.asarray(rng.normal(size=(1, 5, 2, 16)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 5, 2, 16)), jnp.float32)
  shift = np.asarray([1.5, -2.0, 0.7][:n_dims], np.float32)
  a, b = _logits(enc, x, q, k), _logits(enc, x + shift, q, k)
  return float(np.abs(pair - from_diff).max()), float(np.abs(a - b).max() / np.abs(a).max())


@pytest.mark.parametrize('pe,n_dims', [(pe, n) for pe in FOUR for n in (1, 2, 3)] +
                         [(pe, 2) for pe in EXTRA])
def test_exactly_relative(pe, n_dims):
  rot_err, logit_err = _relative_errors(pe, n_dims)
  assert rot_err < 1e-5, f'{pe} {n_dims}D: R(x)^T R(y) - R(0)^T R(y - x) = {rot_err:.2e}'
  assert logit_err < 1e-5, f'{pe} {n_dims}D: logits moved by {logit_err:.2e} under a shift'


def test_relative_check_catches_non_commuting_generators():
  """The same check on LieRE in 2D (generators that do not commute) fails clearly."""
  rot_err, logit_err = _relative_errors('liere4', 2)
  assert rot_err > 1e-2 and logit_err > 1e-3, (rot_err, logit_err)


def _blockdiag(blocks, d):
  """[k, b, b] -> [d, d] (dims past k * b zero)."""
  out = np.zeros((d, d))
  for j, blk in enumerate(blocks):
    b = blk.shape[-1]
    out[j * b:(j + 1) * b, j * b:(j + 1) * b] = blk
  return out


def _dense_generator(enc, spec, x):
  """sum_a x_a A_a for one token (layer 0, head 0) from the raw parameters, float64."""
  d, n = spec.head_dim, spec.n_dims
  if spec.pe.family == 'string_circulant':
    c = np.asarray(enc.circulant[...], np.float64)[0, 0]  # [n, k, b]
    b = c.shape[-1]
    idx = (np.arange(b)[:, None] - np.arange(b)[None]) % b
    circ = c[..., idx]  # C_rs = c_{(r - s) mod b}
    blocks = np.einsum('a,akrs->krs', x, circ - np.swapaxes(circ, -1, -2))
    return _blockdiag(blocks, d)
  p = np.asarray(enc.skew_params[...], np.float64)[0, 0]
  skew = p - np.swapaxes(p, -1, -2)  # [k, b, b]
  xc = np.asarray(enc.token_positions(jnp.asarray(x[None], jnp.float32)))[0]
  if spec.pe.family == 'comrope_ap':
    t = xc[np.arange(len(skew)) % n]
  else:
    t = np.asarray(enc.axis_scales[...], np.float64)[0].T @ xc  # [k]
  return _blockdiag(t[:, None, None] * skew, d)


@pytest.mark.parametrize('pe', ('comrope_ap4', 'comrope_ld8', 'comrope_ap2', 'string_circulant8',
                                'string_circulant5'))
def test_rotations_equal_dense_exponentials(pe):
  """eigh (ComRoPE) and the DFT (circulant) give expm of the dense generator sum (float64)."""
  enc, spec = _encoding(pe, 2, width=32, heads=2)
  x = np.random.default_rng(2).uniform(-1, 4, (6, 2)).astype(np.float32)
  r = _dense(enc, spec, x)[0]
  for t in range(len(x)):
    ref = scipy.linalg.expm(_dense_generator(enc, spec, x[t].astype(np.float64)))
    k_b = spec.head_dim // spec.pe.block * spec.pe.block
    ref[k_b:, k_b:] = np.eye(spec.head_dim - k_b)  # leftover dims pass through
    np.testing.assert_allclose(r[t], ref, atol=1e-5, err_msg=f'{pe} token {t}')


def test_string_cayley_is_rope_mixed_times_p():
  enc, spec = _encoding('string_cayley', 2, width=32, heads=2)
  s = np.zeros((16, 16))
  s[np.triu_indices(16, 1)] = np.asarray(enc.cayley[...])[0, 1]
  s = s - s.T
  p = (np.eye(16) - s) @ np.linalg.inv(np.eye(16) + s)
  np.testing.assert_allclose(np.asarray(enc.orthogonal())[0, 1], p, atol=2e-6)
  np.testing.assert_allclose(p.T @ p, np.eye(16), atol=1e-12)
  x = np.random.default_rng(3).integers(0, 6, (4, 2)).astype(np.float32)
  rope = enc.rotations(jnp.asarray(x))  # RoPE-Mixed's [L, H, T, d/2, 2, 2]
  r = _dense(enc, spec, x)[1]
  for t in range(4):  # RoPE-Mixed's 2x2 blocks (interleaved pairs), then P.
    np.testing.assert_allclose(r[t], _blockdiag(np.asarray(rope)[0, 1, t], 16) @ p, atol=3e-6)
  assert np.abs(r[0] - _blockdiag(np.asarray(rope)[0, 1, 0], 16)).max() > 0.1  # P matters.


def test_string_cayley_with_zero_s_is_rope_mixed():
  """Same seed, same freqs; S = 0 gives RoPE-Mixed's logits, a non-zero S does not."""
  rope, _ = _encoding('rope_mixed', 2, width=32, heads=2)
  cayley, _ = _encoding('string_cayley', 2, width=32, heads=2)
  np.testing.assert_array_equal(rope.freqs[...], cayley.freqs[...])
  rng = np.random.default_rng(4)
  x = rng.integers(0, 6, (7, 2)).astype(np.float32)
  q, k = (jnp.asarray(rng.normal(size=(1, 7, 2, 16)), jnp.float32) for _ in range(2))
  with_s = _logits(cayley, x, q, k, layer=1)
  cayley.cayley[...] = jnp.zeros_like(cayley.cayley[...])
  ref = _logits(rope, x, q, k, layer=1)
  np.testing.assert_allclose(_logits(cayley, x, q, k, layer=1), ref, atol=1e-5)
  assert np.abs(with_s - ref).max() > 1e-2


@pytest.mark.parametrize('n_dims', [2, 3])
def test_comrope_ap2_is_axial_rope_with_learned_frequencies(n_dims):
  """B_j = [[0, beta], [-beta, 0]] on pair j, axis j mod n: RoPE with frequency -beta * scale_a
  on that axis only (RoPE-Mixed's freqs with the other axes zero). ComRoPE's centring offset is a
  constant phase per pair, which cancels between patches."""
  ap2, spec = _encoding('comrope_ap2', n_dims, width=32, heads=2)
  rope, _ = _encoding('rope_mixed', n_dims, width=32, heads=2, positions='normalized')
  beta = np.asarray(ap2.generators())[..., 0, 1]  # [L, H, pairs]
  depth, heads, pairs = beta.shape
  axis = np.arange(pairs) % n_dims
  scale = np.asarray(ap2.pos_scale)
  freqs = np.zeros((n_dims, depth, heads, pairs), np.float32)
  for a in range(n_dims):
    freqs[a] = np.where(axis == a, -beta * scale[a], 0.)
  rope.freqs[...] = jnp.asarray(freqs.reshape(n_dims, depth, heads * pairs))
  rng = np.random.default_rng(5)
  x = grid_positions((3,) * n_dims, spec.train_grid, 'normalized')
  q, k = (jnp.asarray(rng.normal(size=(1, len(x), 2, 16)), jnp.float32) for _ in range(2))
  for layer in range(depth):
    np.testing.assert_allclose(_logits(ap2, x, q, k, layer), _logits(rope, x, q, k, layer),
                               atol=2e-5)


def test_comrope_positions_are_patch_centres_and_cls_is_identity():
  enc, spec = _encoding('comrope_ap4', 2, size=24, width=32, heads=2, pool='cls')  # 6 x 6
  for mode in ('normalized', 'integer'):
    e, _ = _encoding('comrope_ap4', 2, size=24, width=32, heads=2, positions=mode, pool='cls')
    x = np.asarray(e.token_positions(with_prefix(grid_positions((6, 6), (6, 6), mode), 1)))
    np.testing.assert_allclose(x[1:7, 1], (np.arange(6) + 0.5) / 6, atol=1e-7)
    np.testing.assert_array_equal(x[0], [0., 0.])
  ctx = enc.context(with_prefix(grid_positions((6, 6), (6, 6), 'normalized'), 1))
  ctx = np.asarray(ctx.rot)
  np.testing.assert_allclose(ctx[:, :, 0], np.broadcast_to(np.eye(4), ctx[:, :, 0].shape),
                             atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Gradients.


@pytest.mark.parametrize('b', [3, 8])
def test_expm_skew_lines_gradient_is_exact_at_random_zero_and_repeated_eigenvalues(b):
  """The eigen-decomposition's own gradient is NaN at B = 0 and for repeated eigenvalues; the
  custom one equals autodiff through expm there and at a random B."""
  rng = np.random.default_rng(b)
  p = rng.normal(size=(b, b))
  j2 = np.array([[0., 1.], [-1., 0.]])
  repeated = np.zeros((b, b))
  repeated[:b // 2 * 2, :b // 2 * 2] = np.kron(np.eye(b // 2), 1.3 * j2)
  t = jnp.asarray(rng.uniform(-2, 2, 5), jnp.float32)
  g = jnp.asarray(rng.normal(size=(5, b, b)), jnp.float32)
  expm = lambda m, t: jax.vmap(lambda s: jax.scipy.linalg.expm(s * m))(t)
  fast = functools.partial(jax.jit, compiler_options=_FAST_COMPILE)
  ours = fast(jax.value_and_grad(lambda m, t: jnp.sum(encodings.expm_skew_lines(m, t) * g),
                                 (0, 1)))
  ref = fast(jax.value_and_grad(lambda m, t: jnp.sum(expm(m, t) * g), (0, 1)))
  for name, m in (('random', p - p.T), ('zero', np.zeros((b, b))), ('repeated', repeated)):
    m = jnp.asarray(m, jnp.float32)
    np.testing.assert_allclose(encodings.expm_skew_lines(m, t), expm(m, t), atol=1e-5)
    (_, got), (_, want) = ours(m, t), ref(m, t)
    for got, want in zip(got, want):
      assert np.all(np.isfinite(got)), name
      np.testing.assert_allclose(got, want, atol=2e-5 * max(1., float(jnp.abs(want).max())),
                                 err_msg=name)


GENERATORS = {'comrope_ap': 'skew_params', 'comrope_ld': 'skew_params',
              'string_cayley': 'cayley', 'string_circulant': 'circulant'}


@pytest.mark.parametrize('pe', FOUR + ('comrope_ap2', 'comrope_ld2'))
def test_gradients_finite_at_init_and_zero_generators(pe):
  enc, spec = _encoding(pe, 2, width=32, heads=2)
  graphdef, params = nnx.split(enc, nnx.Param)
  rng = np.random.default_rng(6)
  x = rng.integers(0, 4, (6, 2)).astype(np.float32)
  q, k = (jnp.asarray(rng.normal(size=(1, 6, 2, 16)), jnp.float32) for _ in range(2))
  w = jnp.asarray(rng.normal(size=(2, 6, 6)), jnp.float32)

  @functools.partial(jax.jit, compiler_options=_FAST_COMPILE)
  @jax.grad
  def loss_grad(params):
    e = nnx.merge(graphdef, params)
    return sum(jnp.sum(w * _logits_traced(e, x, q, k, layer)) for layer in range(spec.depth))

  name = GENERATORS[spec.pe.family]
  pure = nnx.to_pure_dict(params)
  zero = dict(pure, **{name: jnp.zeros_like(pure[name])})
  for label, p in (('init', pure), ('zero', zero)):
    state = nnx.State(params)
    nnx.replace_by_pure_dict(state, p)
    grads = nnx.to_pure_dict(loss_grad(state))
    for key, value in grads.items():
      assert np.all(np.isfinite(value)), f'{pe} at {label}: {key} gradient not finite'
    assert np.abs(grads[name]).max() > 1e-4, f'{pe} at {label}: no gradient for {name}'


def _logits_traced(enc, pos, q, k, layer):
  ctx = enc.context(jnp.asarray(pos, jnp.float32))
  q, k = _through_attention(enc, ctx, layer, q, k)
  return jnp.einsum('bqhd,bkhd->hqk', q, k, precision=HI)


# ----------------------------------------------------------------------------------------------
# Names, errors, export.


def test_names_families_blocks_and_default_positions():
  got = {pe: (s.pe.family, s.pe.block, s.pe.positions, s.pe.share)
         for pe in ('comrope_ap8', 'comrope_ld4', 'string_cayley', 'string_circulant16',
                    'liere8')
         for s in [tiny_spec(
             pe=pe, share='layers' if pe.startswith('liere') else 'none')]}
  assert got == {'comrope_ap8': ('comrope_ap', 8, 'normalized', 'none'),
                 'comrope_ld4': ('comrope_ld', 4, 'normalized', 'none'),
                 'string_cayley': ('string_cayley', None, 'integer', 'none'),
                 'string_circulant16': ('string_circulant', 16, 'integer', 'none'),
                 'liere8': ('liere', 8, 'normalized', 'layers')}


@pytest.mark.parametrize('pe,match', [
    ('comrope_ap', r"model.pe.name='comrope_ap' needs a block size; use e.g. comrope_ap8"),
    ('comrope_ld1', r'block size 1 must be in \[2, head_dim=16\]'),
    ('string_circulant2', r'block size 2 must be in \[3, head_dim=16\]'),
    ('comrope_ap32', r'block size 32 must be in \[2, head_dim=16\].*comrope_ap16'),
    ('comrope_ap16', r'1 blocks per head, fewer than the 2 position axes'),
    ('string', r"model.pe.name='string' is unknown.*string_circulant<b>"),
])
def test_bad_names_say_why(pe, match):
  if pe == 'comrope_ap16':  # 16 is fine with 1D positions, not in 2D.
    tiny_spec(pe=pe, n_dims=1)
  with pytest.raises(ValueError, match=match):
    tiny_spec(pe=pe)


@pytest.mark.parametrize('pe', FOUR)
def test_torch_export_round_trip_and_official_refusal(pe):
  jm, spec = _random_model(pe, 2)
  params = nnx.to_pure_dict(nnx.state(jm, nnx.Param))
  state = convert.torch_layout(params, spec)
  assert {k for k in state if k.startswith('pe.')} == {
      'comrope_ap4': {'pe.skew_params'}, 'comrope_ld4': {'pe.skew_params', 'pe.axis_scales'},
      'string_cayley': {'pe.freqs', 'pe.cayley'}, 'string_circulant8': {'pe.circulant'}}[pe]
  back = convert.from_torch_layout(state, spec)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  with pytest.raises(ValueError, match=rf'official LieRE layout: pe={pe}: the official LieRE '
                                       'code has no'):
    convert.official_spec(spec)


# ----------------------------------------------------------------------------------------------
# PyTorch port parity.

SIZES = {2: (16, 24), 3: (8, 12)}  # (training, larger) input sizes, patch 4.


def _random_model(pe, n_dims, seed=0):
  """A tiny JAX ViT with every parameter random (numpy draws; no initialiser compiles)."""
  spec = tiny_spec(pe=pe, n_dims=n_dims, size=SIZES[n_dims][0], width=32, heads=2)
  abstract = nnx.eval_shape(lambda: ViT(spec, rngs=nnx.Rngs(seed)))
  graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
  rng = np.random.default_rng(seed)
  std = {'skew_params': 1., 'axis_scales': 1., 'cayley': 0.3, 'circulant': 0.2, 'freqs': 0.5,
         'cls_token': 1., 'scale': 0.1, 'bias': 0.1}

  def draw(path, leaf):
    shape, name = tuple(leaf.shape), str(path[-1])
    if name == 'kernel' and path[0] != 'head':
      x = rng.normal(size=shape) / np.sqrt(np.prod(shape[:-1]))
    else:
      x = std.get(name, 1.) * rng.normal(size=shape) + (name == 'scale')
    return jnp.asarray(x, jnp.float32)

  flat = {k: draw(k, v) for k, v in convert.flatten(nnx.to_pure_dict(params)).items()}
  nnx.replace_by_pure_dict(params, convert.unflatten_like(nnx.to_pure_dict(params), flat))
  rest = jax.tree.map(lambda s: jax.random.key(seed) if jax.dtypes.issubdtype(
      s.dtype, jax.dtypes.prng_key) else jnp.zeros(s.shape, s.dtype), rest)
  model = nnx.merge(graphdef, params, rest)
  model.eval()
  return model, spec


@functools.partial(jax.jit, static_argnums=(0,), compiler_options=_FAST_COMPILE)
def _forward(graphdef, state, x):
  return nnx.merge(graphdef, state)(x)


@pytest.mark.parametrize('pe,n_dims', [(pe, n) for pe in FOUR for n in (2, 3)] +
                         [('comrope_ap2', 2)])
def test_port_parity(pe, n_dims):
  torch = pytest.importorskip('torch')
  from liere_jax import torch_vit
  jm, spec = _random_model(pe, n_dims)
  tm = torch_vit.ViT.from_config(spec.to_json())
  tm.load_liere_state_dict(convert.torch_layout(nnx.to_pure_dict(nnx.state(jm, nnx.Param)), spec))
  tm.eval()
  for size in SIZES[n_dims]:
    x = np.random.default_rng(size).normal(size=(2,) + (size,) * n_dims + (3,)).astype(
        np.float32)
    y_jax = np.asarray(_forward(*nnx.split(jm), jnp.asarray(x)))
    with torch.no_grad():
      y_torch = tm(torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))).numpy()
    diff = float(np.abs(y_jax - y_torch).max())
    assert diff <= 1e-4, f'{pe} {n_dims}D size {size}: logits differ by {diff:.2e}'
    assert np.abs(y_jax).max() > 0.1  # not a trivially small output


# ---------------------------------------------------------------------------------------------
# model.pe.jitter: ComRoPE's training position perturbation, for every encoding with positions.


@pytest.mark.numerics
def test_jitter_offsets_are_bounded_and_spare_the_time_axis():
  from liere_jax.positions import jitter
  off = np.asarray(jitter(jax.random.key(0), (4, 5, 6), 1.0))
  assert off.shape == (120, 3) and (off[:, 0] == 0).all()
  assert np.abs(off).max() <= 0.5 and np.abs(off[:, 1:]).max() == 0.5  # Clipped tails.
  assert 0.3 < off[:, 1:].std() < 0.5  # N(0, 1/2) before clipping.
  small = np.asarray(jitter(jax.random.key(1), (9, 9), 0.1))
  assert 0.04 < small.std() < 0.06 and np.abs(small).max() < 0.5


@pytest.mark.parametrize('pe', ['liere4', 'rope_mixed', 'comrope_ld4', 'string_cayley', 'alibi'])
def test_jitter_perturbs_training_only(pe):
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  plain = ViT(tiny_spec(pe), rngs=nnx.Rngs(0))
  model = ViT(tiny_spec(pe, jitter=1.0), rngs=nnx.Rngs(0))
  head = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  for m in (plain, model):
    m.head.kernel[...] = head  # The head starts at zero; make the logits see the positions.
    m.eval()
  np.testing.assert_array_equal(model(x), plain(x))  # Eval: no jitter, same parameters.
  model.train()
  first, second = model(x), model(x)
  assert not np.allclose(first, plain(x), atol=1e-4) and not np.allclose(first, second, atol=1e-4)
  # The context is the encoding's at the moved positions (patch units, scaled by the mode).
  offsets = model.jitter((4, 4))
  mode = model.spec.pe.positions
  step = 1 / 3 if mode == 'normalized' else 1.
  moved = with_prefix(grid_positions((4, 4), (4, 4), mode) + step * offsets, 1)
  for a, b in zip(jax.tree.leaves(model.pe_context((4, 4), offsets=offsets)),
                  jax.tree.leaves(model.pe.context(moved))):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_jitter_in_a_train_step_is_a_function_of_seed_and_step():
  from tests.helpers import assert_training_randomness_is_a_function_of_seed_and_step
  assert_training_randomness_is_a_function_of_seed_and_step(
      lambda cfg, on: cfg.model.pe.update(jitter=1.0 if on else 0.0))


def test_jitter_is_checked_and_older_specs_read_as_off():
  for pe, jitter, match in (('abs', 1.0, "reads no positions"), ('liere8', -1.0, '>= 0'),
                            ('liere8', float('nan'), '>= 0')):
    with pytest.raises(ValueError, match=f'model.pe.jitter=.*{match}'):
      tiny_spec(pe, jitter=jitter)
  spec = tiny_spec('liere8', jitter=0.5)
  old = spec.to_json()
  del old['pe']['jitter']  # An export written before the field existed.
  assert model_spec.ModelSpec.from_json(old).pe.jitter == 0.0
  cfg = tiny_model_config('liere8').to_dict()
  del cfg['pe']['jitter']  # A run's config.json from before the field.
  assert model_spec.resolve(model_spec.MODEL.upgrade(cfg)).pe.jitter == 0.0  # As read back.


def _with_params(model, params):
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
  model.eval()
  return model


def test_string_cayley_folds_into_a_rope_mixed_model_with_the_same_logits():
  cfg = tiny_model_config('string_cayley')
  params = nnx.to_pure_dict(nnx.state(ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0)), nnx.Param))
  key = jax.random.key(3)
  params['pe']['cayley'] = 0.3 * jax.random.normal(key, params['pe']['cayley'].shape)
  params['head']['kernel'] = jax.random.normal(key, params['head']['kernel'].shape)
  model = _with_params(ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0)), params)
  folded_params, folded = convert.fold_string_cayley(params, model_spec.resolve(cfg))
  cfg.pe.name = 'rope_mixed'  # The model the fold stands for, resolved as a config.
  assert folded == model_spec.resolve(cfg) and set(folded_params['pe']) == {'freqs'}
  plain = _with_params(ViT(folded, rngs=nnx.Rngs(1)), folded_params)
  x = jax.random.normal(jax.random.key(4), (2, 16, 16, 3))
  np.testing.assert_allclose(plain(x), model(x), atol=1e-4, rtol=1e-4)
  # P mattered: without it (S = 0) the same weights give other logits.
  zero = dict(params, pe=dict(params['pe'], cayley=jnp.zeros_like(params['pe']['cayley'])))
  assert not np.allclose(plain(x), _with_params(model, zero)(x), atol=1e-3)
  with pytest.raises(ValueError, match="folds string_cayley runs; this run has pe='liere8'"):
    convert.fold_string_cayley(params, tiny_spec('liere8'))


def test_string_cayley_in_bf16_folds_p_into_the_projection_in_the_model_dtype():
  """bf16 models: P is computed in float32 and folded into the qkv kernel, which is applied in
  bf16 like every projection; logits stay near the float32 model's."""
  logits = {}
  for dtype in ('float32', 'bfloat16'):
    cfg = tiny_model_config('string_cayley')
    cfg.dtype = dtype
    model = ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    params['pe']['cayley'] = 0.3 * jax.random.normal(jax.random.key(3),
                                                     params['pe']['cayley'].shape)
    params['head']['kernel'] = jax.random.normal(jax.random.key(4),
                                                 params['head']['kernel'].shape)
    model = _with_params(model, params)
    assert model.pe.orthogonal().dtype == jnp.float32
    logits[dtype] = np.asarray(model(jax.random.normal(jax.random.key(5), (2, 16, 16, 3))))
  scale = np.abs(logits['float32']).max()
  err = np.abs(logits['bfloat16'] - logits['float32']).max() / scale
  assert np.isfinite(logits['bfloat16']).all() and err < 0.05, err
