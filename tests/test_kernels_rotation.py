"""A TPU's rotation kernel for large blocks (liere_jax.kernels.rotation), run here in interpret
mode (the cpu plan with attention='kernel'), against the einsum rotation then XLA's attention;
the blocks it takes; the model's path through it; its TPU compile (the tpu plan); its cost
estimate against a count of the traced kernel."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from liere_jax import attention, rotations
from liere_jax.encodings.base import Rotate
from liere_jax.kernels import rotation as rotation_kernel
from liere_jax.kernels.common import DECLARED
from liere_jax.numerics import plan
from tests import kernel_count
from tests.helpers import tiny_model

CPU = plan('cpu')


def _kernel_rows(rot, shape):
  """The rotation kernel's operand for rot [H or 1, T, k, b, b] against q of `shape` [B, T, H,
  d] (attention's), or None where the kernel does not take the blocks."""
  ctx = Rotate(rot=rot)
  return attention._rows(ctx, shape) if attention._rotation_kernel_takes(ctx, shape) else None


def _close(got, want, rtol=1e-5):
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(b))))


def _rotations(rng, heads, t, k, b):
  a = jnp.asarray(rng.standard_normal((heads, t, k, b, b)) / 2, jnp.float32)
  return jax.scipy.linalg.expm(a - jnp.swapaxes(a, -1, -2))


@pytest.mark.parametrize('batch, t, heads, d, block, k, shared, devices, pad', [
    (2, 13, 4, 64, 64, 1, False, 1, 0),  # LieRE64: two heads a tile; 13 tokens (8 a step)
    (3, 9, 2, 64, 16, 4, False, 1, 0),  # four blocks a head
    (2, 11, 8, 32, 16, 2, True, 1, 0),  # four heads a tile; rotations shared by heads
    (4, 5, 8, 16, 16, 1, False, 2, 0),  # eight heads a tile; the batch over two devices
    # The rotations' tokens padded and split over the devices, gathered by the kernel's caller:
    (2, 13, 4, 64, 64, 1, False, 2, 1),  # to 14 (the last grid step's 16)
    (4, 5, 8, 16, 16, 1, False, 2, 11),  # to 16, past the last grid step's 8
])
def test_the_kernels_equal_the_einsum_rotation_then_attention(batch, t, heads, d, block, k,
                                                              shared, devices, pad):
  """Attention of q' = R q, k' = R k and v, read from one [B, T, 3 H d] array by the rotation and
  attention kernels, and its gradients in qkv and the rotations, against rotations.rotate (the
  einsum) then jax.nn.dot_product_attention, to float32 rounding. The backward's gradient of v
  stays where the attention kernel wrote it (the rotation's backward writes in place). Padding
  tokens (random rotations here) change nothing, and their gradient is 0."""
  rng = np.random.default_rng(d + block)
  qkv = jnp.asarray(rng.standard_normal((batch, t, 3, heads, d)), jnp.float32)
  g = jnp.asarray(rng.standard_normal((batch, t, heads, d)), jnp.float32)
  rot = _rotations(rng, 1 if shared else heads, t + pad, k, block)
  mesh = jax.make_mesh((devices,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:devices])

  def einsum(qkv, rot):
    q, kk, v = (qkv[:, :, i] for i in range(3))
    rot = rot[:, :t]
    return jax.nn.dot_product_attention(rotations.rotate(q, rot, CPU),
                                        rotations.rotate(kk, rot, CPU), v)

  def kernel(qkv, rot):
    rows = _kernel_rows(rot, qkv[:, :, 0].shape)
    gather = 'data' if pad else None
    run = lambda qkv, rows: rotation_kernel.attention(qkv, rows, True, gather)
    out = jax.shard_map(run, in_specs=(P('data'), P(None, gather)), out_specs=P('data'),
                        check_vma=False)(qkv.reshape(batch, t, -1), rows)
    return out.reshape(g.shape)

  def grads(fn):
    loss = lambda *a: (jnp.sum(fn(*a) * g), fn(*a))
    with jax.set_mesh(mesh):
      (_, out), grad = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(qkv, rot)
    return out, grad  # (the loss sums terms of both signs: its rounding is not relative)
  _close(grads(kernel), grads(einsum))


@pytest.mark.parametrize('block, d, heads, takes', [
    (64, 64, 12, True), (16, 64, 2, True), (16, 32, 4, True), (128, 256, 1, False),
    (8, 64, 2, False), (48, 48, 8, False), (256, 256, 2, False), (64, 64, 1, False),
    (32, 96, 4, False), (64, 192, 2, False)])
def test_the_kernel_takes_blocks_that_divide_a_tile(block, d, heads, takes):
  """Blocks of 16 to 128 filling heads that divide a tile (the attention kernel's), H d whole
  tiles; others attend (the einsum), blocks up to 8 go to the attention kernel's band. Heads
  with unrotated dims past the last block attend too."""
  assert rotation_kernel.supported(block, d, heads) is takes
  rot = jnp.zeros((heads, 3, d // block, block, block))
  shape = (2, 3, heads, d)
  assert (_kernel_rows(rot, shape) is not None) is takes
  kernel = plan('cpu', attention='kernel')
  assert (attention.path(kernel, Rotate(rot=rot), shape) == 'rotation kernel') is takes
  if takes and d > block:
    assert _kernel_rows(rot[:, :, 1:], shape) is None


@pytest.mark.parametrize('data, model_parallel', [(1, 1), (1, 2), (2, 1)])
def test_the_model_rotates_liere64_by_the_kernel_before_the_attention_kernel(data,
                                                                             model_parallel):
  """The tiny ViT's LieRE64 with attention=kernel runs the rotation kernel (forward and
  backward) and then the attention kernel, with no einsum rotation; on a ('data', 'model')
  mesh each device rotates its heads; over 'data' the rotations come split by tokens (17
  padded to 18) and are gathered a layer at a time, their gradient reduce-scattered. Loss and
  gradients equal XLA's attention after the einsum rotation."""
  # The TPU's plan in interpret mode: every token's exponential by the Pallas kernel (which
  # splits the rotations over 'data' by tokens), attention by the kernels or by XLA.
  models = {mode: tiny_model(pe='liere64', width=256, heads=4, numerics=plan(
      'cpu', attention=mode, expm_kernel=True, every_token=True)) for mode in ('kernel', 'xla')}
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  _, params, _ = nnx.split(models['kernel'], nnx.Param, ...)  # Both models take these.
  mesh = jax.make_mesh((data, model_parallel), ('data', 'model'),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:data * model_parallel])

  def run(mode):
    graphdef, _, rest = nnx.split(models[mode], nnx.Param, ...)
    loss = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2)
    with jax.set_mesh(mesh):
      text = str(jax.make_jaxpr(jax.grad(loss))(params))
      return jax.jit(jax.value_and_grad(loss))(params), text
  got, text = run('kernel')
  want, xla_text = run('xla')
  assert 'rotate_forward' in text and 'rotate_backward' in text
  assert 'thkij,bthkj->bthki' not in text and 'rotate_forward' not in xla_text
  # each device's kernel reads the blocks of its heads, two a lane tile side by side: 4 heads
  # (2 pairs), or 1 pair on each of two devices; of its tokens, then gathered, over two data
  # devices
  assert re.search(rf'f32\[{2 // model_parallel},{18 // data if data > 1 else 17},64,128\]', text)
  gathers = re.findall(r"(all_gather|reduce_scatter)\[[^\]]*axis_name=\('data',\)", text)
  assert sorted(set(gathers)) == (['all_gather', 'reduce_scatter'] if data > 1 else []), gathers
  _close(got, want, rtol=2e-5)


def test_the_kernel_compiles_for_a_tpu_slice_deviceless():
  """The TPU compiler (libtpu, no TPU here) compiles LieRE64's rotation and attention and their
  gradients on a v5e-8 mesh, the batch split over 'data': four Mosaic calls (rotation and
  attention, forward and backward), the rotation's on the projection's one array
  ([B, T, 3 H d], 2 rows a chip) and on the blocks of every token in bf16, two heads side by
  side on 128 lanes, gathered from the chips' 25 (197 tokens padded to 200), their gradient
  reduce-scattered; no per-token 64 x 64 product left to XLA; q' and k' written to HBM and read
  from there (their memory space pinned)."""
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
  from jax.sharding import NamedSharding
  from liere_jax import tpu_slices
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=tpu_slices.slice_devices(tpu_slices.parse_slice('v5litepod-8')))
  x = jax.ShapeDtypeStruct((16, 197, 3, 12, 64), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P('data')))
  rot = jax.ShapeDtypeStruct((12, 200, 1, 64, 64), jnp.float32,
                             sharding=NamedSharding(mesh, P(None, 'data')))

  def loss(qkv, rot):
    rows = _kernel_rows(rot, qkv[:, :, 0].shape)
    out = attention._kernel_attention((qkv,), None, plan('tpu'), rows)
    return jnp.sum(out.astype(jnp.float32))
  with jax.set_mesh(mesh):
    hlo = jax.jit(jax.value_and_grad(loss, (0, 1))).trace(x, rot).lower().compile().as_text()
  calls = [line for line in hlo.splitlines() if 'tpu_custom_call' in line]
  names = sorted(n for n in ('rotate_forward', 'rotate_backward', 'attention_forward',
                             'attention_backward') if any(f'%{n}' in c for c in calls))
  assert len(calls) == 4 and len(names) == 4, calls
  rotate = [c for c in calls if c.lstrip().startswith('%rotate_')]
  assert len(rotate) == 2 and all('bf16[2,197,2304]' in c and 'bf16[6,200,64,128]' in c
                                  for c in rotate), rotate
  # q' and k' written to HBM (memory space 0), not VMEM (S(1)) for the compiler to copy out.
  forward = next(c for c in rotate if c.lstrip().startswith('%rotate_forward'))
  assert re.search(r'= bf16\[2,197,1536\]\{[^}S]*\} custom-call', forward), forward
  assert re.search(r'output_memory_space_colors\W*\[\W*\{\W*color\W*0\b', forward), forward
  # ... and the attention kernels read them from there (no prefetch into VMEM first).
  attend = [c for c in calls if c.lstrip().startswith('%attention_')]
  hbm_operand = r'memory_space_colors\W*\[\W*\{\W*operand_index\W*0\W*color\W*0\b'
  assert len(attend) == 2 and all(re.search(hbm_operand, c) for c in attend), attend
  assert re.search(r'all-gather[^\n]*bf16\[6,200,64,128\]|bf16\[6,200,64,128\][^\n]*all-gather',
                   hlo)
  # The blocks' gradient, token-major, reduce-scattered (not all-reduced, then sliced).
  assert re.search(r'reduce-scatter[^\n]*f32\[25,6,64,128\]|'
                   r'f32\[25,6,64,128\][^\n]*reduce-scatter', hlo)
  assert not re.search(r'all-reduce[^\n]*f32\[200,6,64,128\]', hlo)


def test_the_gathered_rotations_in_bf16_give_the_same_attention():
  """bf16 q, k, v: the rotations gathered over two data devices in bf16 (rotation_kernel's
  gather) give the same output as the float32 rotations read whole on one device (the kernel
  rounds them to bf16 either way), and the rotations' gradient, summed in float32, agrees to
  float32 rounding."""
  rng = np.random.default_rng(5)
  qkv = jnp.asarray(rng.standard_normal((4, 13, 3 * 4 * 64)), jnp.bfloat16)
  g = jnp.asarray(rng.standard_normal((4, 13, 4 * 64)), jnp.bfloat16)
  rows = rotation_kernel.rows(_rotations(rng, 4, 14, 1, 64))

  def grads(gather, devices):
    mesh = jax.make_mesh((devices,), ('data',), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:devices])
    run = lambda qkv, rows: rotation_kernel.attention(qkv, rows, True, gather)
    fn = lambda qkv, rows: jax.shard_map(run, in_specs=(P('data'), P(None, gather)),
                                         out_specs=P('data'), check_vma=False)(qkv, rows)
    loss = lambda *a: (jnp.sum(fn(*a).astype(jnp.float32) * g), fn(*a))
    with jax.set_mesh(mesh):
      (_, out), grad = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(qkv, rows)
    return out, grad
  out, (dqkv, drows) = grads('data', 2)
  want, (want_dqkv, want_drows) = grads(None, 1)
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))
  np.testing.assert_array_equal(np.asarray(dqkv, np.float32), np.asarray(want_dqkv, np.float32))
  assert drows.dtype == jnp.float32
  _close(drows, want_drows, rtol=1e-5)


def test_the_cost_estimate_declares_what_the_kernel_does(monkeypatch):
  """Each pass's CostEstimate (rotation_kernel.cost, split in kernels.common.DECLARED) equals an
  independent count of the traced kernel over its grid (tests/kernel_count.py): the MXU's flops
  (the tiles built on chip and their gradient's last product included) and the vector ops, and
  the HBM bytes of every block copied. bf16, LieRE64's two heads a tile, two lane tiles, 13
  tokens (two steps of 8, the second's last 3 padding), 8 batch rows a step of 16."""
  monkeypatch.setattr(rotation_kernel, 'ROW_BYTES', 1)  # 8 rows a step, the fewest
  batch, t, width = 16, 13, 256
  qkv = jnp.zeros((batch, t, 3 * width), jnp.bfloat16)
  rot = jnp.zeros((2, 16, 64, 128), jnp.bfloat16)
  for backward, extra in ((False, ()), (True, (qkv,))):
    call, = kernel_count.pallas_calls(
        lambda qkv, rot: rotation_kernel._call(backward, True, qkv, rot, *extra), qkv, rot)
    assert call.params['grid_mapping'].grid == (2, 2, 2, 2)
    declared = call.params['cost_estimate']
    name, cost = DECLARED[(declared.flops, declared.transcendentals, declared.bytes_accessed)]
    counted = kernel_count.count(call)
    assert name == call.params['name']
    assert cost._asdict() == {k: counted[k] for k in cost._fields}, (name, counted)
