"""liere_jax/encodings/pape.py: PaPE and PaPE-RI as a lift of q and k (encodings.base.Lift)
against the explicit T x T parabolic bias, their relative properties, the padding, the
dispatch of a lifting context, and the model with them (1D / 2D / 3D, a train step); against
the official code (tests/fixtures/pape/, scripts/pape_fixtures.py): its lift, and its
classifiers' layers and logits given their weights (liere_jax/convert/pape_layout.py)."""
import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from helpers import forward, pe_params_around_two_steps, tiny_model, tiny_run_config
from liere_jax import attention, convert, encodings
from liere_jax.config.model import resolve
from liere_jax.encodings.base import LayerContext, Lift
from liere_jax.model import ViT, create_encoding
from liere_jax.numerics import plan
from liere_jax.positions import grid_positions, with_prefix

D, H, HEAD = 32, 2, 16  # width, heads, head size.


def _encoding(pe, grid=(4, 4), num_prefix=1, depth=2, **options):
  enc = create_encoding(pe, grid=grid, heads=H, head_dim=HEAD, depth=depth,
                        num_prefix=num_prefix, rngs=nnx.Rngs(0), **options)
  # Draws that make every term count: a and b of either sign and size, not init's.
  if pe == 'pape':
    enc.ab[...] = 0.5 * jax.random.normal(jax.random.key(7), enc.ab.shape)
  else:
    enc.a[...] = 0.5 * jax.random.normal(jax.random.key(7), enc.a.shape)
  return enc


def _positions(grid=(4, 4), num_prefix=1):
  return with_prefix(grid_positions(grid, grid, 'integer'), num_prefix)


def _inputs(t, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(keys[0], (2, t, D))
  q, k = (jax.random.normal(key, (2, t, H, HEAD)) for key in keys[1:])
  return x, q, k


def _scores(ctx, x, q, k):
  """q'_i . k'_j [B, H, T, T] of the lift."""
  q2, k2 = ctx.lift(x, q, k)
  return jnp.einsum('bqhd,bkhd->bhqk', q2, k2, precision=jax.lax.Precision.HIGHEST)


def _explicit_bias(enc, pos, x, layer):
  """The parabolic bias [B, H, T, T] written out from the parameters, as the paper states it:
  PaPE -sum_m a_m(i) (u_m(i) - u_m(j))^2 + sum_m b_m(i) (u_m(i) - u_m(j)), u = W p;
  PaPE-RI -a(i) s_h^2 ||p_i - p_j||^2 (p: the official positions, patches one step out)."""
  hi = jax.lax.Precision.HIGHEST
  p = np.asarray(pos, np.float64)
  p[1:] += 1.  # The official patches 1..n, CLS at 0 (integer positions: one step is 1).
  x = np.asarray(x, np.float64)
  softplus = lambda z: np.logaddexp(0., z)
  if isinstance(enc, encodings.PaPE):
    m = enc.parabolas
    u = (p @ np.asarray(enc.position[layer], np.float64)).reshape(len(p), H, m)
    ab = (x @ np.asarray(enc.ab[layer], np.float64)).reshape(*x.shape[:2], 2, H, m)
    a, b = softplus(ab[:, :, 0]), ab[:, :, 1]  # [B, T, H, M]
    diff = u[:, None] - u[None]  # [Tq, Tk, H, M]
    bias = (-np.einsum('bqhm,qkhm->bhqk', a, diff ** 2)
            + np.einsum('bqhm,qkhm->bhqk', b, diff))
  else:
    s = np.asarray(enc.position_scales[layer], np.float64)  # [H]
    a = softplus(x @ np.asarray(enc.a[layer], np.float64))  # [B, T, H]
    dist2 = np.sum((p[:, None] - p[None]) ** 2, -1)  # [Tq, Tk]
    bias = -np.einsum('bqh,h,qk->bhqk', a, s ** 2, dist2)
  del hi
  return bias


@pytest.mark.parametrize('pe', ['pape', 'pape_ri'])
def test_the_lifted_scores_are_q_k_plus_the_explicit_parabolic_bias(pe):
  """q'k'^T = q k^T + bias (the T x T reference) within 1e-5 of the bias' scale, float32, every
  layer (PaPE at its default 50 parabolas)."""
  enc = _encoding(pe)
  pos = _positions()
  x, q, k = _inputs(len(pos))
  ctx = enc.context(pos)
  for layer in range(2):
    got = np.asarray(_scores(enc.layer(ctx, layer), x, q, k), np.float64)
    want = (np.einsum('bqhd,bkhd->bhqk', np.asarray(q, np.float64), np.asarray(k, np.float64))
            + _explicit_bias(enc, pos, x, layer))
    scale = max(1., np.abs(want).max())
    assert np.abs(want).max() > 10.  # The bias is not negligible.
    np.testing.assert_allclose(got / scale, want / scale, atol=1e-5, rtol=0, err_msg=pe)


def test_pape_scores_are_unchanged_by_a_shift_of_every_position():
  enc = _encoding('pape')
  pos = _positions()
  x, q, k = _inputs(len(pos))
  ref = _scores(enc.layer(enc.context(pos), 0), x, q, k)
  for shift in ([3., -2.], [0.5, 7.25]):
    moved = _scores(enc.layer(enc.context(pos + np.float32(shift)), 0), x, q, k)
    np.testing.assert_allclose(moved, ref, atol=2e-4 * np.abs(ref).max(), rtol=0)
  assert np.abs(ref).max() > 10.


@pytest.mark.parametrize('pe, relative', [('pape_ri', True), ('pape', False)])
def test_pape_ri_scores_are_unchanged_by_a_rotation_of_the_positions_and_pape_s_are_not(
    pe, relative):
  """A rotation (about any point: patches only, no CLS at a fixed origin) keeps PaPE-RI's
  Euclidean parabolas; PaPE's learned directions see it."""
  enc = _encoding(pe, num_prefix=0)
  pos = _positions(num_prefix=0) - 1.5  # Centred: the rotation stays near the grid.
  x, q, k = _inputs(len(pos))
  ref = _scores(enc.layer(enc.context(pos), 1), x, q, k)
  phi = 0.7
  rot = np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]], np.float32)
  moved = _scores(enc.layer(enc.context(pos @ rot.T), 1), x, q, k)
  err = np.abs(np.asarray(moved) - np.asarray(ref)).max() / np.abs(ref).max()
  assert (err < 1e-5) == relative, (pe, err)


@pytest.mark.parametrize('pe, head_dim, m, lifted', [
    ('pape', 16, 50, 120),  # 16 + 2 * 50 + 1 = 117 -> 120.
    ('pape', 16, 3, 24),  # 23 -> 24.
    ('pape', 64, 50, 168),  # ViT-B's heads: 165 -> 168 (official: 216, d + 3M + 2).
    ('pape', 61, 1, 64),  # 64: no padding.
    ('pape_ri', 16, 2, 24),  # 2D: 16 + 2 + 2 = 20 -> 24.
    ('pape_ri', 16, 3, 24),  # 3D: 21 -> 24.
    ('pape_ri', 19, 3, 24),  # 24: no padding.
])
def test_the_lift_pads_q_and_k_with_zeros_to_a_multiple_of_8(pe, head_dim, m, lifted):
  iso = pe == 'pape_ri'
  extra = m + 2 if iso else 2 * m + 1
  assert Lift.channels(head_dim, m, iso) == lifted
  t = 5
  u = jax.random.normal(jax.random.key(0), (H, t, m))
  weights = jax.random.normal(jax.random.key(1), (D, H if iso else 2 * H * m))
  x = jax.random.normal(jax.random.key(2), (2, t, D))
  q = k = jax.random.normal(jax.random.key(3), (2, t, H, head_dim))
  q2, k2 = Lift(u, weights, isotropic=iso).lift(x, q, k)
  assert q2.shape == k2.shape == (2, t, H, lifted)
  np.testing.assert_array_equal(q2[..., :head_dim], q)  # q and k come first, unchanged.
  np.testing.assert_array_equal(k2[..., :head_dim], k)
  pad = lifted - head_dim - extra
  assert not np.any(q2[..., lifted - pad:]) and not np.any(k2[..., lifted - pad:])
  assert np.all(np.any(k2[..., head_dim:head_dim + extra] != 0, axis=(0, 1, 2)))


def test_the_encodings_use_the_official_positions_cls_at_0_and_patches_from_1():
  enc = _encoding('pape_ri')
  pos = _positions()  # Integer: CLS (0, 0), patches (i, j) from (0, 0).
  u = np.asarray(enc.context(pos).u[0])  # [H, T, n] = s_h * official positions.
  s = np.asarray(enc.position_scales[0])
  np.testing.assert_allclose(u[:, 0], 0.)
  np.testing.assert_allclose(u[:, 1:] / s[:, None, None],
                             np.broadcast_to(np.asarray(pos[1:]) + 1., u[:, 1:].shape), rtol=1e-6)
  assert encodings.facts('pape').positions == encodings.facts('pape_ri').positions == 'integer'


@pytest.mark.parametrize('m, iso, shape, tpu, cuda', [
    (50, False, (2, 17, 4, 64), 'kernel, lift', 'cudnn, lift'),  # 168 -> 256 lanes a head.
    (2, True, (2, 17, 4, 64), 'kernel, lift', 'cudnn, lift'),  # PaPE-RI: 72 -> 128.
    (50, False, (2, 197, 8, 32), 'kernel, lift', 'cudnn, lift'),  # 136: 4 x 256 lanes a step.
    (100, False, (2, 17, 4, 64), 'kernel, lift', 'xla'),  # 272: past cuDNN's 256.
    (50, False, (2, 513, 4, 64), 'xla', 'cudnn, lift'),  # Tokens past the kernel's 512.
    (50, False, (2, 512, 8, 32), 'xla', 'cudnn, lift'),  # 512 tokens x 1024 lanes: past VMEM.
])
def test_a_lifting_context_s_path_on_each_plan(m, iso, shape, tpu, cuda):
  """The kernel where it takes the lifted heads (tokens x lanes a grid step), cuDNN where they
  are at most 256 wide, XLA's explicit softmax otherwise and on the cpu plan; one qkv product."""
  _, t, heads, d = shape
  ctx = Lift(jnp.zeros((heads, t, m)), jnp.zeros((heads * d, heads if iso else 2 * heads * m)),
             isotropic=iso)
  assert attention.lifted(ctx, shape) == Lift.channels(d, m, iso)
  for numerics, want in ((plan('tpu'), tpu), (plan('cpu', attention='kernel'), tpu),
                         (plan('cuda'), cuda), (plan('cpu'), 'xla')):
    assert attention.path(numerics, ctx, shape) == want, numerics
    assert not attention.split_qkv(numerics, ctx, shape)
  assert not LayerContext().lifts


def test_cudnn_takes_the_lift_with_v_padded_to_its_width(monkeypatch):
  """On the cuda plan (cuDNN itself cannot run here) bf16 lifted heads go to cuDNN's attention
  with v padded with zeros to d' and the scale d**-0.5, its output sliced back to d: XLA's form
  of that call gives the cpu plan's explicit softmax to bf16 rounding (relative 2e-2); float32
  heads go to the explicit softmax."""
  enc = _encoding('pape', parabolas=3)
  enc.ab[...] = 0.1 * enc.ab[...]  # Logits that bf16 rounds by little.
  ctx = enc.layer(enc.context(_positions()), 0)
  x = jax.random.normal(jax.random.key(3), (2, 17, D))
  kernel = 0.3 * jax.random.normal(jax.random.key(4), (D, 3 * D))
  asked, real = [], jax.nn.dot_product_attention

  def spy(q, k, v, implementation=None, **kw):
    asked.append((implementation, q.shape[-1], v.shape[-1], kw.get('scale')))
    return real(q, k, v, **kw)
  monkeypatch.setattr(jax.nn, 'dot_product_attention', spy)
  assert attention.path(plan('cuda'), ctx, (2, 17, H, HEAD)) == 'cudnn, lift'
  run = lambda numerics, dtype: jax.jit(lambda x, kernel: attention.attend(
      x, kernel, None, H, ctx, numerics))(x.astype(dtype), kernel.astype(dtype))
  want = run(plan('cpu'), jnp.float32)
  d2 = Lift.channels(HEAD, 3)
  for dtype in (jnp.bfloat16, jnp.float32):
    got = run(plan('cuda'), dtype)
    assert got.shape == want.shape and got.dtype == dtype
    rel = jnp.linalg.norm(got.astype(jnp.float32) - want) / jnp.linalg.norm(want)
    assert rel < (2e-2 if dtype == jnp.bfloat16 else 1e-6), (dtype, rel)
  assert asked == [('cudnn', d2, d2, 1 / math.sqrt(HEAD))]


def test_attention_with_a_lift_is_the_softmax_of_the_biased_scores_at_the_head_size_scale():
  """attend and the explicit `weights` both give softmax((q k^T + bias) / sqrt(d)) v with d the
  unlifted head size (the official scale) and v unlifted, under the CPU plan and the kernel's
  (which sends these heads of 16, 32 lanes, to XLA: tests/test_kernels_attention.py runs the
  kernel's)."""
  enc = _encoding('pape')
  enc.ab[...] = 0.1 * enc.ab[...]  # Maps less peaked than the scores test's draws.
  pos = _positions()
  ctx = enc.layer(enc.context(pos), 0)
  x = jax.random.normal(jax.random.key(3), (2, len(pos), D))
  kernel = 0.3 * jax.random.normal(jax.random.key(4), (D, 3 * D))
  qkv = (x @ kernel).reshape(2, len(pos), 3, H, HEAD)
  q, k, v = (np.asarray(qkv[:, :, i], np.float64) for i in range(3))
  logits = (np.einsum('bqhd,bkhd->bhqk', q, k) + _explicit_bias(enc, pos, x, 0)) / math.sqrt(HEAD)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  want = np.einsum('bhqk,bkhd->bqhd', w, v)
  for numerics in (plan('cpu'), plan('cpu', attention='kernel')):
    got = attention.attend(x, kernel, None, H, ctx, numerics)
    np.testing.assert_allclose(got, want, atol=1e-4)
  out, weights = attention.weights(x, kernel, None, H, ctx, plan('cpu'))
  np.testing.assert_allclose(out, want, atol=1e-4)
  np.testing.assert_allclose(weights, w, atol=1e-5)


@pytest.mark.parametrize('pe', ['pape', 'pape_ri'])
@pytest.mark.parametrize('n_dims', [1, 2, 3])
def test_the_model_builds_and_runs_in_1d_2d_and_3d_and_its_maps_path_agrees(pe, n_dims):
  size = {1: 16, 2: 16, 3: 8}[n_dims]
  model = tiny_model(pe=pe, n_dims=n_dims, size=size, **({'parabolas': 4} if pe == 'pape' else {}))
  x = jax.random.normal(jax.random.key(0), (2,) + (size,) * n_dims + (3,))
  logits = forward(model, x)
  assert logits.shape == (2, 5) and np.all(np.isfinite(logits))
  maps_logits, maps = forward(model, x, return_attention=True)
  np.testing.assert_allclose(maps_logits, logits, atol=1e-5)
  tokens = 1 + (size // 4) ** n_dims
  assert maps[0].shape == (2, 2, tokens, tokens)
  n = model.pe.position.shape[1] if pe == 'pape' else None
  assert n in (n_dims, None)


def test_the_parameter_tree_and_the_parabolas_option():
  pape = tiny_model(pe='pape', parabolas=7).pe
  assert (pape.position.shape, pape.ab.shape) == ((2, 2, 2 * 7), (2, 32, 2 * 2 * 7))
  ri = tiny_model(pe='pape_ri', n_dims=3, size=8).pe
  assert (ri.position_scales.shape, ri.a.shape) == ((2, 2), (2, 32, 2))
  bound = math.sqrt(1 / 3)  # U(-sqrt(1/n), sqrt(1/n)).
  assert np.all(np.abs(np.asarray(ri.position_scales)) <= bound)
  assert encodings.facts('pape').option_names == ('parabolas',)
  assert tiny_model(pe='pape').pe.parabolas == 50  # The official default.
  with pytest.raises(ValueError, match='model.pe.parabolas=0 must be a positive integer'):
    tiny_model(pe='pape', parabolas=0)
  with pytest.raises(ValueError, match='parabolas'):  # Not read by pape_ri.
    tiny_model(pe='pape_ri', parabolas=7)


@pytest.mark.parametrize('pe', ['pape', 'pape_ri'])
def test_a_train_step_on_cpu_moves_the_parabolas_and_not_the_fixed_scales(pe):
  before, after, loss = pe_params_around_two_steps(pe=pe)
  assert np.isfinite(loss)
  moved = 'ab' if pe == 'pape' else 'a'
  assert np.abs(after[moved] - before[moved]).max() > 0
  if pe == 'pape':
    assert np.abs(after['position'] - before['position']).max() > 0
  else:
    np.testing.assert_array_equal(after['position_scales'], before['position_scales'])


def test_a_train_step_with_a_tpu_s_attention_kernel_in_interpret_mode(monkeypatch):
  """A tiny PaPE ViT (2 heads of 64: 168 lifted channels, 256 lanes a head) trains two steps
  with the attention kernel (the tpu plan's attention, in interpret mode): its layer's kernel
  takes q' and k' of 256 lanes, the loss is finite and the parabolas move. (The kernel against
  XLA's softmax, values and gradients: tests/test_kernels_attention.py.)"""
  from liere_jax import steps
  from liere_jax.config import run as run_spec
  run = run_spec.resolve(tiny_run_config(pe='pape', width=128, heads=2, depth=1), 1)
  t = steps.Trainer(run, steps.make_mesh(jax.devices()[:1]), plan('cpu', attention='kernel'))
  rng = np.random.default_rng(0)
  batch = {'image': rng.normal(size=(8, 16, 16, 3)).astype(np.float32),
           'label': np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]}
  calls, real = [], attention._kernel_attention
  monkeypatch.setattr(attention, '_kernel_attention',
                      lambda xs, *a, **kw: calls.append(xs[0].shape) or real(xs, *a, **kw))
  state = t.init_state(0)
  before = jax.device_get(state['params']['pe'])
  for _ in range(2):  # The first step's learning rate is warmup's 0.
    state, metrics = t.train_step(state, t.global_batch(batch))
  after = jax.device_get(state['params']['pe'])
  assert calls == [(8, 17, 2, 256)]  # One layer, traced once.
  assert np.isfinite(float(metrics['loss']))
  for name in ('ab', 'position'):
    assert np.abs(after[name] - before[name]).max() > 0, name


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'pape')
FILES = sorted(f[:-4] for f in os.listdir(FIXTURES) if f.endswith('.npz'))
CASES = [f for f in FILES if not f.startswith('vit_')]  # The encoders' lift.
VIT_CASES = [f for f in FILES if f.startswith('vit_')]  # The classifiers.


def test_the_official_fixtures_are_there():
  assert CASES == ['pape_2d', 'pape_2d_default', 'pape_3d', 'pape_ri_2d', 'pape_ri_3d']
  assert VIT_CASES == ['vit_pape_2d', 'vit_pape_3d', 'vit_pape_ri_2d', 'vit_pape_ri_3d']
  assert sum(os.path.getsize(os.path.join(FIXTURES, f + '.npz')) for f in FILES) < 200_000
  for case in VIT_CASES:  # The official commit they came from.
    assert len(str(np.load(os.path.join(FIXTURES, case + '.npz'))['official_commit'])) == 40


def _compact(q, k, d, m, iso, size):
  """The official q', k' (d + 3M + 2 channels; PaPE-RI d + 2n + 1, n = m) in our channels
  (encodings.base.Lift: u centred over the tokens), built from the official a, b and u after
  checking the products that let them share: PaPE's b block meets -u, its first channels are
  -sum a u^2 and sum b u, and PaPE-RI's a is one value in n channels."""
  a = q[..., d + 1:d + 1 + m]
  u = k[..., d + 1 + m:d + 1 + 2 * m]  # [B, T, H, m]
  np.testing.assert_allclose(k[..., d + 1:d + 1 + m], -u * u, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(q[..., d + 1 + m:d + 1 + 2 * m], 2 * a * u, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(q[..., d], -(a * u * u).sum(-1), rtol=1e-5, atol=1e-5)
  c = u - u.mean(1, keepdims=True)
  if iso:
    np.testing.assert_array_equal(a, np.broadcast_to(a[..., :1], a.shape))
    a = a[..., :1]
    u2 = (c * c).sum(-1, keepdims=True)
    b = 0.
  else:
    b = q[..., d + 2 + 2 * m:d + 2 + 3 * m]
    np.testing.assert_array_equal(k[..., d + 1 + 2 * m], 1.)
    np.testing.assert_allclose(k[..., d + 2 + 2 * m:d + 2 + 3 * m], -u, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(q[..., d + 1 + 2 * m], (b * u).sum(-1), rtol=1e-5, atol=1e-5)
    u2 = c * c
  first = (b * c - a * u2).sum(-1, keepdims=True) if not iso else -(a * u2)
  qs = [q[..., :d], first, a, 2 * a * c - b]
  ks = [k[..., :d], np.ones_like(first), np.broadcast_to(-u2, first.shape[:-1] + u2.shape[-1:]),
        c]
  pad = lambda parts: np.concatenate(
      parts + [np.zeros(q.shape[:-1] + (size - sum(p.shape[-1] for p in parts),), q.dtype)], -1)
  return pad(qs), pad(ks)


@pytest.mark.parametrize('case', CASES)
def test_the_official_code_s_lift_is_ours_given_its_weights(case):
  """scripts/pape_fixtures.py ran the official encode_query_key (float64) on these weights,
  positions, x, q and k: ours gives its q', k' (in our fewer channels, `_compact`) within 1e-5
  (relative where large) and its scores q'k'^T within 1e-5 of their scale. The official
  weights map as pape.py documents: Linear weights transposed, with a layer axis; 2D
  `position` rows swapped ((col, row) -> (row, col)); PaPE-RI's buffer [1, H, 1, 1] -> [1, H]."""
  f = dict(np.load(os.path.join(FIXTURES, case + '.npz')))
  pe = 'pape_ri' if case.startswith('pape_ri') else 'pape'
  b, heads, t, head_dim = f['q'].shape
  n = f['positions'].shape[-1]
  grid = {'pape_2d': (3, 4), 'pape_2d_default': (2, 3), 'pape_ri_2d': (4, 4)}.get(
      case, (2, 2, 2))
  options = {'parabolas': int(f['parabolas'])} if pe == 'pape' else {}
  enc = create_encoding(pe, grid=grid, heads=heads, head_dim=head_dim, num_prefix=1,
                        rngs=nnx.Rngs(0), **options)
  order = slice(None, None, -1) if n == 2 else slice(None)  # Their (col, row), our (row, col).
  if pe == 'pape':
    enc.position[...] = jnp.asarray(f['position'].T[order][None])
    enc.ab[...] = jnp.asarray(f['ab'].T[None])
  else:
    enc.position_scales[...] = jnp.asarray(f['position_scales'].reshape(1, heads))
    enc.a[...] = jnp.asarray(f['a'].T[None])
  pos = with_prefix(grid_positions(grid, grid, 'integer'), 1)
  np.testing.assert_array_equal(enc.official_positions(pos)[:, order], f['positions'][0])
  ctx = enc.layer(enc.context(pos), 0)
  ours = lambda a: jnp.asarray(np.swapaxes(a, 1, 2))  # [B, H, T, d] <-> [B, T, H, d].
  q2, k2 = ctx.lift(jnp.asarray(f['x']), ours(f['q']), ours(f['k']))
  want_q, want_k = np.swapaxes(f['q_lifted'], 1, 2), np.swapaxes(f['k_lifted'], 1, 2)
  if pe == 'pape_ri' and n == 2:  # Its coordinate channels in their order: (col, row).
    idx = np.arange(want_q.shape[-1])
    for start in (head_dim + 1, head_dim + 1 + n):  # The blocks a | -u^2 and 2 a u | u.
      idx[start:start + n] = idx[start:start + n][::-1]
    want_q, want_k = want_q[..., idx], want_k[..., idx]
  want = np.einsum('bqhd,bkhd->bhqk', want_q.astype(np.float64), want_k.astype(np.float64))
  want_q, want_k = _compact(want_q, want_k, head_dim, ctx.u.shape[-1], pe == 'pape_ri',
                            q2.shape[-1])
  assert q2.shape == want_q.shape and k2.shape == want_k.shape
  np.testing.assert_allclose(q2, want_q, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(k2, want_k, rtol=1e-5, atol=1e-5)
  scores = np.einsum('bqhd,bkhd->bhqk', np.asarray(q2, np.float64), np.asarray(k2, np.float64))
  scale = np.abs(want).max()
  np.testing.assert_allclose(scores / scale, want / scale, atol=1e-5, rtol=0)


# The official classifiers (pape/nn/image_classifier.py, video_classifier.py) against our ViT.
# The official forward ran in float64 on float16-exact weights and inputs; ours runs in float32
# (measured: logits 7e-7, layers 7e-7, scores 4e-6 of scores up to 25).
LOGITS_TOL, SCORES_TOL = 1e-4, 1e-5


def _fixture(case):
  return dict(np.load(os.path.join(FIXTURES, case + '.npz')))


def _official_state(f):
  """The official state_dict of a vit_* fixture: its float16 values, packed in the state_dict's
  order (scripts/pape_fixtures.py), as float32."""
  values, state, start = f['state'], {}, 0
  for key, shape in json.loads(str(f['state_keys'])):
    size = math.prod(shape)
    state[key] = values[start:start + size].reshape(shape).astype(np.float32)
    start += size
  assert start == values.size
  return state


def _official_vit(case, norm_pre=True):
  """(our ViT holding the official classifier's weights, the fixture); without norm_pre: our
  ViT with model.norm_pre off, the official's encoder.norm_pre left out."""
  f = _fixture(case)
  spec = resolve(convert.pape_model(**json.loads(str(f['config']))))
  params = convert.from_pape_layout(_official_state(f), spec)
  if not norm_pre:
    spec = dataclasses.replace(spec, norm_pre=False)
    del params['norm_pre']
  model = ViT(spec, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  nnx.update(model, state)
  model.eval()
  return model, f


def _max_err(got, want):
  return float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max())


@pytest.mark.parametrize('case', VIT_CASES)
def test_the_official_classifier_without_its_norm_pre_is_our_vit_without_it(case):
  """Our ViT with model.norm_pre off and the official weights (convert.from_pape_layout)
  gives the logits of the official classifier whose encoder.norm_pre is the identity, within
  1e-4; the parabolas count (zero positions move the logits far more)."""
  model, f = _official_vit(case, norm_pre=False)
  x = jnp.asarray(f['input'], jnp.float32)
  logits = forward(model, x)
  assert _max_err(logits, f['logits_without_norm_pre']) <= LOGITS_TOL
  key = 'position' if 'pape_ri' not in case else 'position_scales'
  getattr(model.pe, key)[...] = jnp.zeros_like(getattr(model.pe, key)[...])  # u = 0: no bias.
  assert _max_err(forward(model, x), f['logits_without_norm_pre']) > 100 * LOGITS_TOL


@pytest.mark.parametrize('case', VIT_CASES)
def test_the_official_classifier_is_our_vit_with_model_norm_pre(case):
  """The official encoder normalises the tokens (CLS included) once before its first layer
  (pape/nn/encoder.py:18,36): with model.norm_pre (convert.pape_model sets it) our ViT gives the
  official logits within 1e-4, and that LayerNorm changes them by far more than that."""
  model, f = _official_vit(case)
  assert model.spec.norm_pre
  assert _max_err(f['logits'], f['logits_without_norm_pre']) > 0.5
  assert _max_err(forward(model, jnp.asarray(f['input'], jnp.float32)), f['logits']) <= LOGITS_TOL


@pytest.mark.parametrize('case', VIT_CASES)
def test_each_official_layer_is_our_block_and_gives_our_lifted_scores(case):
  """Each official encoder layer (norm1, qkv, PaPE's lift, attention, out_proj, norm2, MLP) on
  the official residual stream is our Block with its weights (1e-4), and its lifted scores
  q' k'^T (official encode_query_key, unscaled) are ours within 1e-5 of their scale."""
  model, f = _official_vit(case)
  spec = model.spec
  ctx = model.pe_context(model.train_grid)
  for i, block in enumerate(model.blocks):
    layer = model.pe.layer(ctx, i)
    stream = jnp.asarray(f['stream'][i])
    out, _ = block(stream, layer)
    assert _max_err(out, f['stream'][i + 1]) <= LOGITS_TOL, i
    x = block.norm1(stream)
    qkv = x @ block.attn.qkv.kernel[...] + block.attn.qkv.bias[...]
    qkv = qkv.reshape(*x.shape[:2], 3, spec.heads, spec.head_dim)
    q2, k2 = layer.lift(x, qkv[:, :, 0], qkv[:, :, 1])
    scores = jnp.einsum('bqhd,bkhd->bhqk', q2, k2, precision=jax.lax.Precision.HIGHEST)
    want = f['scores'][i]
    assert scores.shape == want.shape
    assert _max_err(scores, want) <= SCORES_TOL * np.abs(want).max(), i


def test_the_official_classifier_config_and_state_dict_are_checked():
  f = _fixture('vit_pape_2d')
  config = json.loads(str(f['config']))
  spec = resolve(convert.pape_model(**config))
  assert (spec.width, spec.depth, spec.heads, spec.mlp_dim, spec.patch, spec.input_size,
          spec.pe.parabolas, spec.qkv_bias, spec.pool) == (16, 2, 2, 16, (4, 4), (8, 12), 4,
                                                          True, 'cls')
  video = resolve(convert.pape_model(**json.loads(str(_fixture('vit_pape_ri_3d')['config']))))
  assert (video.patch, video.input_size, video.pe.name) == ((2, 4, 4), (4, 8, 8), 'pape_ri')
  base = resolve(convert.pape_model(positional='pape', size='base', num_classes=1000,
                                    patch_size=16, height=224, width=224))
  assert (base.width, base.depth, base.heads, base.head_dim, base.mlp_dim) == (
      768, 12, 12, 64, 3072)
  for bad, match in [(dict(normalize=True), 'normalize=True'),
                     (dict(head_size=4), 'num_heads \\* head_size'),
                     (dict(width=10), 'not divisible by patch_size'),
                     (dict(positional='rope'), "only the official 'pape' and 'pape_ri'"),
                     (dict(frame_length=2), 'both frame_length and max_samples')]:
    with pytest.raises(ValueError, match=match):
      convert.pape_model(**{**config, **bad})
  state = _official_state(f)
  del state['encoder.norm_pre.bias']
  with pytest.raises(ValueError, match="missing key 'encoder.norm_pre.bias'"):
    convert.from_pape_layout(state, spec)
  state = _official_state(f)
  state['encoder.layers.1.attention.position_encoder.ab.weight'] = np.zeros((4, 16), np.float32)
  with pytest.raises(ValueError, match='ab.weight.* has shape \\(4, 16\\)'):
    convert.from_pape_layout(state, spec)
