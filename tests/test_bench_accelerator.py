"""The accelerator tools of bench, checked without one: the profile summary on a GPU-shaped
trace, the A/B's numerics fields, rotate's forms, and what the accelerators' plans lower to."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.profiler import ProfileData

from liere_jax import rotations
from liere_jax.bench import step
from liere_jax.numerics import plan
from liere_jax.bench.profile import profile_table, summarize_xspace

# A GPU trace as XLA writes one: stream lines with kernels and copies, a derived line beside.
_GPU_TRACE = '''
planes { name: "/host:CPU" }
planes {
  name: "/device:GPU:0"
  lines { name: "Stream #13(Compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 4000000 }
    events { metadata_id: 2 offset_ps: 2000000 duration_ps: 4000000 }
    events { metadata_id: 1 offset_ps: 12000000 duration_ps: 2000000 }
    events { metadata_id: 3 offset_ps: 9000000 duration_ps: 1000000 } }
  lines { name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 9000000 } }
  event_metadata { key: 1 value { id: 1 name: "gemm_fusion_dot" } }
  event_metadata { key: 2 value { id: 2 name: "loop_multiply_fusion" } }
  event_metadata { key: 3 value { id: 3 name: "MemcpyD2H" } }
}
'''


def test_profile_summary_reads_busy_time_kernels_and_host_copies_from_the_device_plane():
  profile = ProfileData.from_serialized_xspace(
      ProfileData.text_proto_to_serialized_xspace(_GPU_TRACE))
  res = summarize_xspace(profile, steps=2, wall_s=20e-6)
  # Busy: [0, 6] u [9, 10] u [12, 14] us of 20 (overlaps counted once; derived lines ignored).
  assert res['busy_fraction'] == pytest.approx(9 / 20)
  assert (res['kernels_per_step'], res['d2h_copies_per_step']) == (1.5, 0.5)
  assert [k['name'] for k in res['top_kernels']] == ['gemm_fusion_dot', 'loop_multiply_fusion']
  assert res['top_kernels'][0]['share'] == pytest.approx(0.6)
  assert 'busy 45.0%' in profile_table(res)


def test_profile_summary_of_a_trace_without_a_device_says_so():
  empty = ProfileData.from_serialized_xspace(
      ProfileData.text_proto_to_serialized_xspace('planes { name: "/host:CPU" }'))
  res = summarize_xspace(empty, steps=1, wall_s=1.0)
  assert res['device_planes'] == 0 and 'no device plane' in profile_table(res)


def test_vs_numerics_replace_plan_fields_for_the_baseline_only_and_refuse_unknown_values():
  """--vs items naming a field of the numerics plan are parsed by the field's type (strings,
  booleans, integers), the rest are arguments or overrides; an unknown value (or one this
  backend's plan cannot take) is refused in one line."""
  assert step.vs_numerics('pe=abs,attention=xla,pairs=swap_roll,split_qkv=true,'
                          'chunk_bytes=1024,config.a=1') == {
      'attention': 'xla', 'pairs': 'swap_roll', 'split_qkv': True, 'chunk_bytes': 1024}
  assert step.vs_numerics('pe=abs,config.a=1') == {}
  assert step.with_args('c.py:pe=liere8', 'pe=abs,attention=xla') == 'c.py:pe=abs'
  for bad, message in (('attention=fused', r"attention='fused' is unknown; use one of "
                                           r"\('xla', 'cudnn', 'kernel'\)"),
                       ('pairs=direct', r"pairs='direct' is unknown"),
                       ('attention=cudnn', r"attention='cudnn' needs platform='cuda'")):
    with pytest.raises(ValueError, match=message) as e:
      step.vs_numerics(f'pe=abs,{bad}')
    assert str(e.value).startswith('--vs: ') and '\n' not in str(e.value), str(e.value)
  assert plan('cpu').replace(**step.vs_numerics('attention=kernel')).attention == 'kernel'


@pytest.mark.parametrize('block', [2, 4, 8, 16, 64])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_each_platform_s_rotate_applies_r(block, dtype):
  """Each platform's form (its plan's: blocks of 2 on x's layout or as pairs, the einsum above)
  gives x' = R x per block against float64; dims past the last block pass through."""
  rng = np.random.default_rng(block)
  x = jnp.asarray(rng.standard_normal((2, 5, 3, 70)), dtype)
  rot = jnp.asarray(rng.standard_normal((3, 5, 64 // block, block, block)), jnp.float32)
  f64 = lambda a: np.asarray(jnp.asarray(a, dtype).astype(jnp.float32), np.float64)
  ref = np.einsum('htkij,bthkj->bthki', f64(rot),
                  f64(x[..., :64]).reshape(2, 5, 3, 64 // block, block)).reshape(2, 5, 3, 64)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2 * np.abs(ref).max()
  for platform in ('cpu', 'tpu', 'cuda'):
    got = rotations.rotate(x, rot, plan(platform))
    assert got.dtype == dtype
    assert np.abs(f64(got[..., :64]) - ref).max() <= tol, platform
    np.testing.assert_array_equal(got[..., 64:], x[..., 64:])


def test_rotate_takes_the_einsum_everywhere():
  """The elementwise form of blocks above 2 lost on the CPU (1.2x) and on an H200 (1.35x,
  LieRE8 step) and left the library: every platform's plan lowers the einsum, a dot for b = 8
  (a TPU's attention kernel rotates such blocks itself)."""
  x = jnp.ones((2, 5, 3, 64), jnp.bfloat16)
  rot = jnp.ones((3, 5, 8, 8, 8), jnp.float32)
  lowered = lambda p: jax.jit(lambda *a: rotations.rotate(*a, plan(p))).trace(x, rot).lower(
      lowering_platforms=(p,)).as_text()
  for platform in ('cpu', 'cuda', 'tpu'):
    assert rotations.rotation_form(plan(platform), 8) == 'einsum'
    assert 'dot_general' in lowered(platform), platform


def _compiled_ops(cfg, overrides, numerics=None):
  """The op names of the config's compiled train step on this CPU, in order."""
  import re
  from liere_jax import steps
  from liere_jax.bench.step import random_batches
  from liere_jax.config import run as run_spec
  cfg = cfg.copy_and_resolve_references()
  for key, value in overrides.items():
    cfg.model.pe[key] = value
  t = steps.Trainer(run_spec.resolve(cfg, 1), steps.make_mesh(jax.devices()[:1]), numerics)
  train, _ = random_batches(cfg)
  hlo = t.train_step.lower(t.abstract_state, t.global_batch(train)).compile().as_text()
  return re.findall(r'= \S+ ([a-z][\w-]*)\(', hlo)


def test_the_cpu_compiles_the_earlier_train_step_op_for_op():
  """What the GPU path changed folds away on this CPU: the default step (the mesh's plan)
  compiles to the same ops as the one with every earlier form asked for (the stored runs'
  expm name fast_cond, float32 products, branches per chunk, pairs by a product with the
  permutation, XLA attention); so its speed here is the earlier step's."""
  from tests import helpers
  cfg, _ = helpers.tiny_config_and_batch(4)
  new = _compiled_ops(cfg, {})
  old = _compiled_ops(cfg, {'expm': 'fast_cond', 'expm_precision': 'highest'},
                      plan('cpu', expm='cond', pairs='swap_matmul', attention='xla'))
  assert 'conditional' in new and new == old


def test_select_form_chunks_and_recomputes_only_past_its_memory_rule():
  """The cuda plan's exponential (select) runs in one piece (no loop) while its residuals fit
  REMAT_ABOVE_BYTES, and in chunks under remat (a lax.map: a while loop) past it; lowered for
  cuda with the cuda plan."""
  from liere_jax import expm
  from liere_jax.bench import lower
  cuda = plan('cuda')
  assert expm.form(cuda, 8) == 'select'
  loops = lambda m, fn: lower.summarize(jax.jit(jax.grad(lambda x: jnp.sum(fn(x)))).trace(
      jnp.zeros((m, 8, 8))).lower(lowering_platforms=('cuda',)).compiler_ir('stablehlo'),
                                        'cuda')['while_loops']
  assert not expm.select_remat(63, 8) and loops(63, lambda x: expm.expm(x, cuda)) == 0
  four = cuda.replace(chunk_bytes=4 * 64 * 4)  # 4 matrices a chunk
  assert expm.select_remat(64, 8, limit=1000)
  assert loops(64, lambda x: expm._select(four, x, limit=1000)) > 0
  assert loops(64, lambda x: expm._select(four, x)) == 0  # The limit decides, not the chunks.


def test_attention_asks_for_cudnn_on_a_gpu_unless_the_plan_says_xla(monkeypatch):
  """Under the cuda plan (cuDNN itself cannot run here) bf16 heads go to cuDNN's kernel;
  float32, the cpu plan and the cuda plan with attention='xla' go to XLA's."""
  from liere_jax import attention
  from liere_jax.encodings.base import LayerContext
  asked = []
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, implementation=None, **k: (
      asked.append(implementation), real(*a, **k))[1])
  ctx, x = LayerContext(), jnp.ones((1, 5, 32), jnp.bfloat16)
  cases = ((plan('cpu'), jnp.bfloat16, 'xla'), (plan('cuda'), jnp.bfloat16, 'cudnn'),
           (plan('cuda'), jnp.float32, 'cudnn'), (plan('cuda', attention='xla'), jnp.bfloat16,
                                                  'xla'))
  for numerics, dtype, path in cases:
    assert attention.path(numerics, ctx, (1, 5, 2, 16)) == path
    out = attention.attend(x.astype(dtype), jnp.ones((32, 96), dtype), None, 2, ctx, numerics)
    assert out.shape == (1, 5, 2, 16) and out.dtype == dtype
  assert asked == [None, 'cudnn', None, None]
