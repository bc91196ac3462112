"""liere_jax/attention.py: the one dispatch of an encoding's context, by plan and shape; the
explicit softmax (attention maps) against it. The kernels' own values: test_kernels_*.py; each
platform's lowered program: test_bench_plan.py."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from liere_jax import attention, rotations
from liere_jax.encodings.base import Angles, Bias, LayerContext, Rotate
from liere_jax.numerics import plan

# 4 heads of 64: a kernel's. 785 tokens (UCF101's): the kernel's rows, but past LieRE8's band;
# 1025: past every row of the kernel.
SHORT, VIDEO, LONG = (2, 17, 4, 64), (2, 785, 4, 64), (2, 1025, 4, 64)


def _rot(block, tokens=17):
  return Rotate(jnp.zeros((1, tokens, 64 // block, block, block)))


@pytest.mark.parametrize('ctx, shape, want', [
    (_rot(8), SHORT, 'kernel, band'), (Angles(jnp.zeros((1, 17, 32))), SHORT, 'kernel, band'),
    (_rot(64), SHORT, 'rotation kernel'), (_rot(32), SHORT, 'rotation kernel'),
    (_rot(12), SHORT, 'kernel after xla'), (LayerContext(), SHORT, 'kernel'),
    (Bias(jnp.zeros((4, 17, 17))), SHORT, 'xla'),  # A logit bias: never the kernel.
    (_rot(8, 785), VIDEO, 'kernel after xla'), (_rot(64, 785), VIDEO, 'rotation kernel'),
    (Angles(jnp.zeros((1, 785, 32))), VIDEO, 'kernel, band'), (LayerContext(), VIDEO, 'kernel'),
    (_rot(8, 1025), LONG, 'xla'), (_rot(64, 1025), LONG, 'xla'),  # Rows past the kernel's.
    (Angles(jnp.zeros((1, 1025, 32))), LONG, 'xla'), (LayerContext(), LONG, 'xla'),
])
def test_the_tpu_plan_s_path_for_each_context(ctx, shape, want):
  assert attention.path(plan('tpu'), ctx, shape) == want
  assert attention.path(plan('cpu'), ctx, shape) == 'xla'
  assert attention.path(plan('cuda'), ctx, shape) == 'cudnn'
  assert attention.path(plan('cpu', attention='kernel'), ctx, shape) == want  # Interpret mode.


def test_a_chip_with_more_vmem_rotates_longer_rows_inside_the_kernel():
  """LieRE8's band at UCF101's 785 tokens: past v4's VMEM (and a plan without a chip), inside
  the kernel on v5e's (the kernel asks for the wider scope itself)."""
  v5e = plan('tpu', vmem=128 * 2**20)
  assert attention.path(plan('tpu'), _rot(8, 785), VIDEO) == 'kernel after xla'
  assert attention.path(plan('tpu', vmem=16 * 2**20), _rot(8, 785), VIDEO) == 'kernel after xla'
  assert attention.path(v5e, _rot(8, 785), VIDEO) == 'kernel, band'
  assert not attention.split_qkv(v5e, _rot(8, 785), VIDEO)
  assert attention.path(v5e, _rot(8, 1360), (2, 1360, 4, 64)) == 'kernel after xla'
  assert attention.path(v5e, _rot(8, 2049), (2, 2049, 4, 64)) == 'xla'


def test_three_products_only_where_xla_rotates_first_on_the_plan_that_asks():
  split = lambda p, ctx, shape: attention.split_qkv(p, ctx, shape)
  assert split(plan('tpu'), _rot(64, 1025), LONG)  # XLA's attention after XLA's rotation.
  assert split(plan('tpu'), _rot(12), SHORT)  # XLA's rotation, then the kernel.
  assert split(plan('tpu'), _rot(8, 785), VIDEO)  # Past the band's rows: the same.
  assert not split(plan('tpu'), _rot(64), SHORT)  # The rotation kernel reads one product.
  assert not split(plan('tpu'), _rot(64, 785), VIDEO)
  assert not split(plan('tpu'), _rot(8), SHORT)  # The band: one product.
  assert not split(plan('tpu'), _rot(8, 1025), LONG)  # XLA's blocks up to 8: one product.
  assert not split(plan('tpu'), Angles(jnp.zeros((1, 785, 32))), VIDEO)
  assert not split(plan('cuda'), _rot(64, 1025), LONG) and split(
      plan('cuda', split_qkv=True), _rot(64, 1025), LONG)


@pytest.mark.parametrize('kind', ['rotate', 'angles', 'bias', 'none'])
def test_the_maps_path_gives_what_attend_gives(kind):
  """attention.weights (the explicit softmax) against attend, on this CPU's plan and on a plan
  asking for the kernel (a bias still goes to XLA: its result is the same)."""
  rng = np.random.default_rng(0)
  b, t, heads, d = 2, 9, 2, 8
  x = jnp.asarray(rng.standard_normal((b, t, heads * d)), jnp.float32)
  kernel = jnp.asarray(rng.standard_normal((heads * d, 3 * heads * d)) / 4, jnp.float32)
  ctx = {'rotate': Rotate(rotations.angle_rotations(jnp.asarray(
             rng.uniform(0, 3, (heads, t, d // 2)), jnp.float32))),
         'angles': Angles(jnp.asarray(rng.uniform(0, 3, (1, t, d // 2)), jnp.float32)),
         'bias': Bias(jnp.asarray(rng.standard_normal((heads, t, t)), jnp.float32)),
         'none': LayerContext()}[kind]
  out = attention.attend(x, kernel, None, heads, ctx, plan('cpu'))
  maps, w = attention.weights(x, kernel, None, heads, ctx, plan('cpu'))
  np.testing.assert_allclose(maps, out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jnp.sum(w, -1), 1, rtol=1e-5)
  if kind == 'bias':
    kernel_plan = plan('cpu', attention='kernel')
    np.testing.assert_array_equal(attention.attend(x, kernel, None, heads, ctx, kernel_plan), out)
    assert jax.jit(lambda x: attention.attend(x, kernel, None, heads, ctx, kernel_plan)).lower(
        x).as_text().count('pallas') == 0
