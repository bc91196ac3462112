"""The accelerator tools of bench, checked without one: the profile summary on a GPU-shaped
trace, the A/B switches, rotate's forms."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.profiler import ProfileData

from liere_jax import rotations, switches
from liere_jax.bench import step
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


def test_vs_switches_set_a_form_for_the_baseline_only_and_refuse_unknown_forms():
  assert step.vs_switches('pe=abs,apply=einsum,attention=xla,config.a=1') == {
      'apply': 'einsum', 'attention': 'xla'}
  assert step.with_args('c.py:pe=liere8', 'pe=abs,apply=einsum') == 'c.py:pe=abs'
  with pytest.raises(ValueError, match=r"apply=fused is unknown; use one of \('einsum', "):
    step.vs_switches('apply=fused')
  with switches.using({'apply': 'direct'}):
    assert rotations.APPLY.get() == 'direct'
  assert rotations.APPLY.get() == 'einsum'


@pytest.mark.parametrize('block', [2, 4, 8, 16, 64])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_rotate_forms_agree_and_apply_r(block, dtype):
  """'direct' (elementwise up to b = 8, x on the left above) and 'einsum' (the default) both
  give x' = R x per block; dims past the last block pass through."""
  rng = np.random.default_rng(block)
  x = jnp.asarray(rng.standard_normal((2, 5, 3, 70)), dtype)
  rot = jnp.asarray(rng.standard_normal((3, 5, 64 // block, block, block)), jnp.float32)
  with rotations.APPLY('direct'):
    new = rotations.rotate(x, rot)
  with rotations.APPLY('einsum'):
    old = rotations.rotate(x, rot)
  f64 = lambda a: np.asarray(jnp.asarray(a, dtype).astype(jnp.float32), np.float64)
  ref = np.einsum('htkij,bthkj->bthki', f64(rot),
                  f64(x[..., :64]).reshape(2, 5, 3, 64 // block, block)).reshape(2, 5, 3, 64)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2 * np.abs(ref).max()
  assert np.abs(f64(new[..., :64]) - ref).max() <= tol
  assert np.abs(f64(new) - f64(old)).max() <= tol
  np.testing.assert_array_equal(new[..., 64:], x[..., 64:])
  np.testing.assert_array_equal(rotations.rotate(x, rot), old)  # the default


def test_rotate_takes_the_einsum_everywhere():
  """The elementwise form ('direct') lost on the CPU (1.2x) and on an H200 (1.35x, LieRE8 step):
  every platform lowers the einsum, a dot for b = 8 (a TPU's attention kernel rotates such
  blocks itself); 'direct' lowers none."""
  x = jnp.ones((2, 5, 3, 64), jnp.bfloat16)
  rot = jnp.ones((3, 5, 8, 8, 8), jnp.float32)
  lowered = lambda p: jax.jit(lambda *a: rotations.rotate(*a)).trace(x, rot).lower(
      lowering_platforms=(p,)).as_text()  # A new function each time: jit's cache ignores APPLY.
  for platform in ('cpu', 'cuda', 'tpu'):
    assert 'dot_general' in lowered(platform)
  with rotations.APPLY('direct'):
    assert 'dot_general' not in lowered('cuda')


def _compiled_ops(cfg, overrides, settings):
  """The op names of the config's compiled train step on this CPU, in order."""
  import re
  from liere_jax import steps
  from liere_jax.bench.step import load_config, random_batches
  from liere_jax.config import run as run_spec
  cfg = cfg.copy_and_resolve_references()
  for key, value in overrides.items():
    cfg.model.pe[key] = value
  with switches.using(settings):
    t = steps.Trainer(run_spec.resolve(cfg, 1), steps.make_mesh(jax.devices()[:1]))
    train, _ = random_batches(cfg)
    hlo = t.train_step.lower(t.abstract_state, t.global_batch(train)).compile().as_text()
  return re.findall(r'= \S+ ([a-z][\w-]*)\(', hlo)


def test_the_cpu_compiles_the_earlier_train_step_op_for_op():
  """What the GPU path changed folds away on this CPU: the default step compiles to the same
  ops as the one with every earlier form asked for (branches per chunk, float32 products,
  rotate's einsum, XLA attention); so its speed here is the earlier step's."""
  from tests import helpers
  cfg, _ = helpers.tiny_config_and_batch(4)
  new = _compiled_ops(cfg, {}, {})
  old = _compiled_ops(cfg, {'expm': 'fast_cond', 'expm_precision': 'highest'},
                      {'apply': 'einsum', 'attention': 'xla'})
  assert 'conditional' in new and new == old


def test_select_form_chunks_and_recomputes_only_past_its_memory_rule(monkeypatch):
  """fast_select runs in one piece (no loop) while its residuals fit REMAT_ABOVE_BYTES, and in
  chunks under remat (a lax.map: a while loop) past it; lowered for cuda."""
  from liere_jax import expm, platforms
  from liere_jax.bench import lower
  # Branches are traced once per shape: each half takes its own stack size.
  loops = lambda m: lower.summarize(jax.jit(jax.grad(lambda x: jnp.sum(expm.fast_expm(
      x, form='select')))).trace(
      jnp.zeros((m, 8, 8))).lower(lowering_platforms=('cuda',)).compiler_ir('stablehlo'),
                                    'cuda')['while_loops']
  assert not expm.select_remat(expm.TAYLOR12_PS, 63, 8) and loops(63) == 0
  monkeypatch.setattr(expm, 'REMAT_ABOVE_BYTES', 1000)
  monkeypatch.setitem(platforms.PLATFORMS, 'cuda', platforms.PLATFORMS['cuda']._replace(
      chunk_bytes=4 * 64 * 8))  # 4 matrices a chunk
  assert expm.select_remat(expm.TAYLOR12_PS, 64, 8) and loops(64) > 0


def test_attention_asks_for_cudnn_on_a_gpu_unless_switched_to_xla(monkeypatch):
  """On a GPU (faked: cuDNN itself cannot run here) bf16 heads go to cuDNN's kernel; float32,
  the CPU and attention=xla go to XLA's."""
  from liere_jax import model
  asked = []
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, implementation=None, **k: (
      asked.append(implementation), real(*a, **k))[1])
  q = jnp.ones((1, 5, 2, 16), jnp.bfloat16)
  model._fused_attention(q, q, q, None)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  model._fused_attention(q, q, q, None)
  f32 = q.astype(jnp.float32)
  model._fused_attention(f32, f32, f32, None)
  with model.ATTENTION('xla'):
    model._fused_attention(q, q, q, None)
  assert asked == [None, 'cudnn', None, None]


def test_emulating_a_gpu_on_cpu_changes_the_products_to_its_presets(monkeypatch):
  """LIERE_EXPM_EMULATE=cuda: 'auto' on this CPU computes the GPU's bf16 x6 products as the
  emulation does (not float32's)."""
  from liere_jax import dots, expm
  rng = np.random.default_rng(0)
  x, y = (jnp.asarray(rng.standard_normal((2, 16, 16)), jnp.float32) for _ in range(2))
  plain = np.asarray(jax.jit(expm.matmul)(x, y))
  monkeypatch.setenv('LIERE_EXPM_EMULATE', 'cuda')
  emulated = np.asarray(jax.jit(lambda a, b: expm.matmul(a, b))(x, y))
  np.testing.assert_array_equal(emulated, np.asarray(dots.emulated('BF16_BF16_F32_X6')(x, y)))
  assert not np.array_equal(emulated, plain)
