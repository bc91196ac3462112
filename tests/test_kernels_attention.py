"""A TPU's attention kernel (liere_jax.kernels.attention), run here in interpret mode (the cpu
plan with attention='kernel'), against XLA's attention and the XLA rotations; the model's train
step either way; its TPU compile (the tpu plan); its cost estimate against a count of the
traced kernel."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from liere_jax import attention, rotations
from liere_jax.encodings.base import Lift, Rotate, RotateEntries
from liere_jax.kernels import attention as attention_kernel
from liere_jax.kernels.common import DECLARED, LANES
from liere_jax.numerics import plan
from tests import helpers, kernel_count
from tests.helpers import tiny_model

CPU = plan('cpu')
KERNEL = plan('cpu', attention='kernel')  # The TPU's kernels, in interpret mode.


def _band(rot, q, numerics=KERNEL):
  """The attention kernel's band of blocks up to 8 for q [B, T, H, d] (attention's)."""
  ctx = Rotate(rot=rot)
  assert attention.path(numerics, ctx, q.shape) == 'kernel, band'
  return attention._band(ctx, q.shape, q.dtype)


def _close(got, want, rtol=1e-5):
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize('block, heads, d, devices, fused', [
    (None, 4, 32, 1, False), (2, 2, 64, 1, True), (8, 4, 64, 1, False), (4, 4, 32, 1, True),
    (8, 2, 64, 2, True), (None, 4, 64, 2, True)])
def test_the_kernel_equals_xla_attention_after_the_rotation_forward_and_backward(
    block, heads, d, devices, fused):
  """softmax(q' k'^T / sqrt(d)) v and its gradients in q, k, v and the rotations, q' = R q by
  the band inside the kernel, against rotations.rotate then jax.nn.dot_product_attention, to
  float32 rounding: 128 // d heads a lane block, 13 tokens (not a multiple of 8), rotations per
  head, pass-through dims (block 8 of 64: 7 blocks of 8); on a mesh each device attends its
  part of the batch and the rotations' gradient is their sum. q, k, v as three arrays or as one
  [B, T, 3, H, d] (the qkv projection's)."""
  rng = np.random.default_rng(d + (block or 0))
  shape = (4, 13, heads, d)
  q, k, v, w = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(4))
  n_blocks = (d - 8) // block if block else 0
  rot = jnp.asarray(rng.standard_normal((heads, 13, n_blocks, block or 1, block or 1)) / 2)
  rot = jax.scipy.linalg.expm(rot - jnp.swapaxes(rot, -1, -2)) if block else None
  mesh = jax.make_mesh((devices,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:devices])

  def xla(q, k, v, rot):
    if rot is not None:
      q, k = rotations.rotate(q, rot, CPU), rotations.rotate(k, rot, CPU)
    return jax.nn.dot_product_attention(q, k, v)

  def kernel(q, k, v, rot):
    band = None if rot is None else _band(rot, q)
    if fused:  # one array, read at three lane offsets; its gradient one array too
      return attention._kernel_attention((jnp.stack([q, k, v], 2),), band, KERNEL)
    return attention._kernel_attention((q, k, v), band, KERNEL)

  def run(fn):  # the output, the gradients
    loss = lambda *a: (jnp.sum(fn(*a) * w), fn(*a))
    with jax.set_mesh(mesh):
      (_, out), grads = jax.jit(jax.value_and_grad(
          loss, (0, 1, 2, 3) if block else (0, 1, 2), has_aux=True))(q, k, v, rot)
    return out, grads
  _close(run(kernel), run(xla))


@pytest.mark.parametrize('pe, split_qkv, kernel, every_token', [
    ('abs', False, (1, 'no band'), False), ('rope_mixed', False, (1, 'band'), False),
    ('liere8', False, (1, 'band'), False), ('liere8', True, (1, 'band'), False),
    ('liere8', False, (1, 'shares'), True), ('liere12', True, (3, 'no band'), False),
    ('liere64', False, (1, 'rows'), False), ('liere64', True, (1, 'rows'), False),
    ('alibi', False, None, False), ('pape', False, (3, 'no band'), False),
    ('liere8+pape', False, (3, 'no band'), False), ('liere8+pape', False, (3, 'no band'), True)])
def test_the_model_attends_alike_by_the_kernel_and_by_xla(pe, split_qkv, kernel, every_token,
                                                          monkeypatch):
  """The tiny ViT (2 heads of 64) built with attention='kernel' (the kernel where the encoding
  allows: rotations up to 8 inside it by the band, LieRE64's by the rotation kernel before it,
  LieRE12's (5 blocks and 4 dims that pass through) by XLA before it from three qkv products,
  ALiBi's bias by XLA, PaPE's lift by XLA before it: q' and k' of 256 lanes a head, after
  LieRE8's rotation by XLA in the composition liere8+pape), gives the logits and parameter
  gradients of the one built with XLA's attention (the qkv projection one product or, where
  split_qkv and XLA rotates blocks above 8, three) to float32 rounding. `kernel`: what each layer's kernel is handed (arrays, how it
  rotates: 'shares', LieRE8's entries from rotations.liere_entries under a TPU's every-token
  exponential, the Pallas kernel's in interpret mode), None where it never runs."""
  from flax import nnx
  every = dict(expm_kernel=True, every_token=True) if every_token else {}
  models = {mode: tiny_model(pe=pe, width=128, heads=2,
                             numerics=plan('cpu', attention=mode, split_qkv=split_qkv, **every))
            for mode in ('xla', 'kernel')}
  for model in models.values():
    model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  _, params, _ = nnx.split(models['kernel'], nnx.Param, ...)
  calls, real = [], attention._kernel_attention

  def spy(xs, band, numerics, rot=None, scale=None):
    calls.append((len(xs), 'shares' if isinstance(band, attention.Shares) else
                  'band' if band is not None else 'rows' if rot is not None else 'no band'))
    return real(xs, band, numerics, rot, scale)
  monkeypatch.setattr(attention, '_kernel_attention', spy)

  def run(mode):
    graphdef, _, rest = nnx.split(models[mode], nnx.Param, ...)
    loss = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2)
    return jax.jit(jax.value_and_grad(loss))(params)
  want = run('xla')
  assert calls == []
  got = run('kernel')
  assert set(calls) == ({kernel} if kernel else set()), calls
  _close(got, want, rtol=2e-5)


@pytest.mark.parametrize('m, isotropic, d, lanes', [
    (50, False, 64, 256),  # PaPE at ViT-B's heads: 168 channels, padded to 256.
    (2, True, 64, 128),  # PaPE-RI in 2D: 72 -> 128.
    (3, False, 32, 128),  # PaPE, 3 parabolas: 39 -> 40 -> 128, four heads a lane block.
    (2, True, 32, 128)])  # PaPE-RI: 36 -> 40 -> 128.
def test_the_kernel_takes_a_lift_forward_and_backward(m, isotropic, d, lanes, monkeypatch):
  """attend of a lifting context under the kernel's plan (the lift by XLA, each head's q' and
  k' padded with zeros to whole lane tiles, the kernel at the scale d**-0.5 with v of d) against
  the explicit softmax of the cpu plan: the output and the gradients in x, the qkv kernel (q, k
  and v) and the lift's parameters (u, weights), to float32 rounding; two lane blocks of heads,
  13 tokens."""
  heads, t = 2 * LANES // d, 13
  width = heads * d
  keys = jax.random.split(jax.random.key(m + d), 5)
  x, g = (jax.random.normal(key, (2, t, width)) for key in keys[:2])
  kernel = jax.random.normal(keys[2], (width, 3 * width)) / np.sqrt(width)
  ctx = Lift(0.5 * jax.random.normal(keys[3], (heads, t, m)),
             jax.random.normal(keys[4], (width, heads if isotropic else 2 * heads * m))
             / np.sqrt(width), isotropic=isotropic)
  assert attention.path(KERNEL, ctx, (2, t, heads, d)) == 'kernel, lift'
  calls, real = [], attention._kernel_attention

  def spy(xs, band, numerics, rot=None, scale=None):
    calls.append(([a.shape[-1] for a in xs], scale))
    return real(xs, band, numerics, rot, scale)
  monkeypatch.setattr(attention, '_kernel_attention', spy)

  def run(numerics):
    loss = lambda x, kernel, ctx: jnp.sum(
        attention.attend(x, kernel, None, heads, ctx, numerics).reshape(g.shape) * g)
    return jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(x, kernel, ctx)
  want = run(CPU)
  got = run(KERNEL)
  assert calls == [([lanes, lanes, d], 1 / np.sqrt(d))]
  _close(got, want)


def test_the_kernel_compiles_for_a_tpu_slice_deviceless():
  """The TPU compiler (libtpu, no TPU here) compiles a LieRE8 attention and its gradient on a
  v5e-8 mesh, the batch split over 'data': two Mosaic calls on q, k, v as the projection lays
  them out ([B, T, H d], 2 rows a chip), 197 tokens, nothing of [B, H, T, T] in HBM."""
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
  from jax.sharding import NamedSharding
  from liere_jax import tpu_slices
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=tpu_slices.slice_devices(tpu_slices.parse_slice('v5litepod-8')))
  x = jax.ShapeDtypeStruct((16, 197, 12, 64), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P('data')))
  rot = jax.ShapeDtypeStruct((12, 197, 8, 8, 8), jnp.float32, sharding=NamedSharding(mesh, P()))

  def loss(q, k, v, rot):
    band = _band(rot, q, plan('tpu'))
    return jnp.sum(attention._kernel_attention((q, k, v), band, plan('tpu')).astype(jnp.float32))
  with jax.set_mesh(mesh):
    hlo = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3))).trace(x, x, x, rot).lower().compile(
    ).as_text()
  calls = [line for line in hlo.splitlines() if 'tpu_custom_call' in line]
  assert len(calls) == 2 and any('%attention_backward' in c for c in calls), calls
  assert 'bf16[2,197,768]' in calls[0] + calls[1]
  assert not any('197,197]' in line for line in hlo.splitlines())


def test_the_rows_the_kernel_takes_shrink_with_its_band_and_grow_with_the_chip_s_vmem():
  """MAX_TOKENS: a band not listed takes the limit of the next listed above it; none past 15; a
  chip with WIDE_SCOPE's VMEM takes the wide rows (not with a lift, compiled in the default)."""
  takes, wide = attention_kernel.supported, attention_kernel.WIDE_SCOPE
  assert takes(12, 64, 1024) and not takes(12, 64, 1025)  # No band: UCF101's 785 and more.
  assert takes(12, 64, 785, band=3) and not takes(12, 64, 833, band=3)  # RoPE's pairs.
  assert takes(12, 64, 624, band=5) and not takes(12, 64, 625, band=5)  # Blocks of 3: as 7.
  assert takes(12, 64, 368, band=15) and not takes(12, 64, 785, band=15)  # LieRE8.
  assert not takes(12, 64, 17, band=17)
  assert takes(12, 64, 785, band=15, vmem=wide) and takes(12, 64, 785, band=15, vmem=2 * wide)
  assert not takes(12, 64, 785, band=15, vmem=wide - 1)
  assert attention_kernel._scope(368, 15) is None and attention_kernel._scope(785, 15) == wide
  assert not takes(12, 64, 785, 256, vmem=wide)  # A lift: the default scope's rows.


def test_the_kernel_asks_for_the_wide_scope_only_past_the_default_s_rows():
  """The lowered TPU program's forward and backward carry WIDE_SCOPE's VMEM limit for LieRE8's
  band (its entries: 8 rows) at 785 tokens, and no limit (the compiler's default) at 368."""
  def lowered(t):
    qkv = jax.ShapeDtypeStruct((1, t, 3, 2, 64), jnp.bfloat16)
    band = jax.ShapeDtypeStruct((8, t, 128), jnp.bfloat16)
    loss = lambda q, b: attention_kernel.attention_qkv(q, b).astype(jnp.float32).sum()
    return jax.jit(jax.grad(loss, (0, 1))).trace(qkv, band).lower(
        lowering_platforms=('tpu',)).as_text()
  wide = str(attention_kernel.WIDE_SCOPE)
  assert lowered(785).count(wide) == 2 and lowered(368).count(wide) == 0


@pytest.mark.parametrize('scope, band', [
    ('default', 0), ('default', 15), pytest.param('wide', 15, marks=pytest.mark.slow),
    pytest.param('wide', 3, marks=pytest.mark.slow), pytest.param('wide', 0, marks=pytest.mark.slow)])
def test_the_longest_rows_compile_for_the_tpu(scope, band):
  """kernels.attention.MAX_TOKENS against the TPU compiler, deviceless: the forward and backward
  compile at each limit, the default scope's on v4 (16 MiB of VMEM), the wide one's on v5e
  (scripts/kernel_limits.py finds them by bisection: 16 to 32 tokens more did not)."""
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
  from liere_jax import tpu_slices
  kernel_limits = helpers.script('kernel_limits')
  chip = {'default': 'v4-8', 'wide': 'v5litepod-8'}[scope]
  device = tpu_slices.slice_devices(tpu_slices.parse_slice(chip))[0]
  limits = attention_kernel.MAX_TOKENS[{'default': attention_kernel.SCOPE,
                                        'wide': attention_kernel.WIDE_SCOPE}[scope]]
  assert kernel_limits.fits(device, limits[band], band)


def test_rope_s_entries_from_its_angles_are_the_entries_of_its_blocks():
  """kernels.attention.pair_entries (cos and sin, no 2 x 2 blocks) equals `entries` of
  angle_rotations' blocks in float32 and bf16, pass-through dims included, per head or shared."""
  angles = jax.random.normal(jax.random.key(0), (5, 1, 12)) * 3  # [T, 1, k]: shared by heads
  for dtype in (jnp.float32, jnp.bfloat16):
    rot = jnp.broadcast_to(rotations.angle_rotations(angles).astype(dtype), (5, 4, 12, 2, 2))
    np.testing.assert_array_equal(attention_kernel.pair_entries(angles, 4, 32, dtype),
                                  attention_kernel.entries(rot, 32))


@pytest.mark.parametrize('block', [2, 4, 8])
def test_the_entries_hold_each_dim_s_row_of_its_block(block):
  """entries: E_m[i] = R[i % b, m] of dim i's block, the identity's on pass-through dims; by an
  explicit loop (16 dims rotated of 24)."""
  rot = np.random.default_rng(block).standard_normal((3, 2, 16 // block, block, block))
  got = np.asarray(attention_kernel.entries(jnp.asarray(rot, jnp.float32), 24)).reshape(
      block, 3, 2, 24)
  want = np.zeros_like(got)
  for m in range(block):
    for i in range(24):
      want[m, ..., i] = rot[:, :, i // block, i % block, m] if i < 16 else m == i % block
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_on_a_mesh_each_device_hands_the_kernel_its_share_of_the_tokens_entries():
  """Over 4 'data' devices, 13 tokens: LieRE8's entries as rotations.liere_entries leaves them
  (split by tokens, padded to 16) enter the kernel's shard_map as each device's share [8, 4,
  H d], all-gathered for the kernel (which reads its first 13 rows: no slice); the gradient's
  transpose reduce-scatters them, and nothing is psummed. The equality with XLA:
  test_the_model_attends_alike_by_the_kernel_and_by_xla ('shares')."""
  rng = np.random.default_rng(3)
  q = jnp.asarray(rng.standard_normal((4, 13, 2, 64)), jnp.float32)
  gens = jnp.asarray(rng.uniform(0, 1, (1, 2, 2, 8, 28)), jnp.float32)
  pos = jnp.asarray(rng.uniform(0, 1, (13, 2)), jnp.float32)
  numerics = KERNEL.replace(expm_kernel=True, every_token=True)
  mesh = jax.make_mesh((4,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:4])

  def loss(q, g):
    ctx = RotateEntries(rotations.liere_entries(g, pos, 8, 64, numerics, jnp.float32)[0], 64)
    assert attention.path(numerics, ctx, q.shape) == 'kernel, band'
    band = attention._band(ctx, q.shape, q.dtype)
    return jnp.sum(attention._kernel_attention((q, q, q), band, numerics))
  with jax.set_mesh(mesh):
    text = str(jax.make_jaxpr(jax.grad(loss, (0, 1)))(q, gens))
  assert 'all_gather' in text and 'f32[8,16,128]' in text  # the entries, gathered to 16 tokens
  assert 'f32[8,4,128]' in text  # a device's 4 tokens' entries
  # Only the generators' gradient is summed over the devices (each made its tokens' from them).
  assert 'reduce_scatter' in text and set(re.findall(r':(\S+) = psum', text)) == {
      'f32[1,2,2,8,28]'}


@pytest.mark.parametrize('fused', [True, False])
def test_the_kernel_splits_heads_over_a_model_axis(fused):
  """On a ('data', 'model') mesh (model_parallel=2) each device attends its heads (2 of 4 heads
  of 64: one lane block): the output and gradients equal one device's, LieRE8's band split
  with the heads. Over two 'data' devices (the batch split): the same output and gradients."""
  rng = np.random.default_rng(1)
  q, k, v, w = (jnp.asarray(rng.standard_normal((2, 9, 4, 64)), jnp.float32) for _ in range(4))
  rot = jnp.asarray(rng.standard_normal((4, 9, 8, 8, 8)) / 2)
  rot = jax.scipy.linalg.expm(rot - jnp.swapaxes(rot, -1, -2))

  def loss(q, k, v, rot):
    band = _band(rot, q)
    xs = (jnp.stack([q, k, v], 2),) if fused else (q, k, v)
    out = attention._kernel_attention(xs, band, KERNEL)
    return jnp.sum(out * w), out

  def run(mesh):
    with jax.set_mesh(mesh):
      return jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(q, k, v, rot)
  one = jax.make_mesh((1, 1), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                      devices=jax.devices()[:1])
  two = jax.make_mesh((1, 2), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                      devices=jax.devices()[:2])
  data = jax.make_mesh((2, 1), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:2])
  for mesh in (two, data):
    _close(run(mesh)[0][1], run(one)[0][1])
    _close(run(mesh)[1], run(one)[1])
  with jax.set_mesh(two):  # each device's kernel reads its two heads only
    text = str(jax.make_jaxpr(loss)(q, k, v, rot))
  assert ('f32[2,9,384]' if fused else 'f32[2,9,128]') in text


def test_the_kernel_in_bf16_stays_within_bf16_rounding_of_float32():
  """A bf16 model's path: q, k, v and the band in bf16, logits and softmax in float32; the
  output within bf16 rounding (relative 1e-2) of float32 XLA attention after the rotation."""
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 13, 2, 64)), jnp.float32) for _ in range(3))
  rot = jnp.asarray(rng.standard_normal((2, 13, 8, 8, 8)) / 2)
  rot = jax.scipy.linalg.expm(rot - jnp.swapaxes(rot, -1, -2))
  want = jax.nn.dot_product_attention(rotations.rotate(q, rot, CPU), rotations.rotate(k, rot, CPU),
                                      v)
  b16 = [a.astype(jnp.bfloat16) for a in (q, k, v)]
  got = attention._kernel_attention(tuple(b16), _band(rot, b16[0]), KERNEL)
  assert got.dtype == jnp.bfloat16
  rel = jnp.linalg.norm(got.astype(jnp.float32) - want) / jnp.linalg.norm(want)
  assert 1e-4 < rel < 1e-2, rel


@pytest.mark.parametrize('block, fused, lift', [
    (None, True, None), (8, False, None), (2, True, None), (None, False, 256),
    (None, False, 128)])
def test_the_cost_estimate_declares_what_the_kernel_does(block, fused, lift, monkeypatch):
  """Each pass's CostEstimate (attention_kernel.cost, split in kernels.common.DECLARED) equals
  an independent count of the traced kernel over its grid (tests/kernel_count.py): the MXU's
  flops and the vector ops (its flops), the exps, and the HBM bytes of every block copied. bf16
  q, k, v and band, 21 tokens (rows padded to 32 as laid out), heads of 64 (each product on all
  128 lanes, or on a lift's 256 or 128 lanes a head), two lane tiles, 2 batch rows a step (3
  steps over the batch); q, k, v as one array (the backward's three steps a tile) or three."""
  b, t, width, d = 6, 21, 256, 64
  lanes = LANES if lift is None else LANES // d * lift  # q's lanes a grid step
  monkeypatch.setattr(attention_kernel, 'ROW_BYTES', 2 * t * lanes * 2)
  x = jnp.zeros((b, t, width), jnp.bfloat16)
  q = x if lift is None else jnp.zeros((b, t, width // d * lift), jnp.bfloat16)
  xs = (jnp.zeros((b, t, 3 * width), jnp.bfloat16),) if fused else (q, q, x)
  band = None if block is None else jnp.zeros((block, t, width), jnp.bfloat16)
  for kernel, extra in ((attention_kernel._forward_kernel, ()),
                        (attention_kernel._backward_kernel, (x, x))):
    call, = kernel_count.pallas_calls(
        lambda xs, band: attention_kernel._call(kernel, True, d, None, xs, band, *extra), xs,
        band)
    assert call.params['grid_mapping'].grid[1] == 3
    _assert_declared(call, kernel_count.count(call))
  if block is not None:  # The band is built at a lane tile's first batch step: the batch in order.
    tpu, = kernel_count.pallas_calls(
        lambda xs, band: attention_kernel._call(attention_kernel._forward_kernel, False, d, None,
                                                xs, band), xs, band)
    assert tpu.params['compiler_params'].dimension_semantics == ('parallel', 'arbitrary')


def _assert_declared(call, counted):
  declared = call.params['cost_estimate']
  name, cost = DECLARED[(declared.flops, declared.transcendentals, declared.bytes_accessed)]
  assert name == call.params['name']
  assert cost._asdict() == {k: counted[k] for k in cost._fields}, (
      name, cost, counted['vpu_by_primitive'])
