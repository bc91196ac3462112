"""The numerics plan (liere_jax/numerics.py) and `bench plan` (liere_jax/bench/plan.py): each
platform's plan against the program lowered for that platform, the plan as data jit can see,
and bad input refused in one line."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import numerics
from liere_jax.bench import lower
from liere_jax.bench.plan import plan_of
from liere_jax.numerics import plan
from tests import helpers


def _lowered(pe, platform):
  """The tiny model's gradient (4 heads of 64 dims, 17 tokens), traced with the platform's plan
  and lowered for it: (StableHLO text, module)."""
  model = helpers.tiny_model(pe=pe, width=256, heads=4, numerics=plan(platform))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  x = jnp.ones((2, 16, 16, 3))
  grad = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x)))
  lowered = jax.jit(grad).trace(params).lower(lowering_platforms=(platform,))
  return lowered.as_text(debug_info=True), lowered.compiler_ir('stablehlo')


@pytest.mark.parametrize('platform', ['cpu', 'cuda', 'tpu'])
@pytest.mark.parametrize('pe', ['liere8', 'liere64'])
def test_each_platform_s_plan_is_what_its_lowered_program_runs(pe, platform):
  """`bench plan`'s lines, read from the plan the model is built with, hold in the program
  lowered for that platform: Mosaic kernels where it names them and no others, the
  exponential's form by its control flow (cond: conditionals; select: none at all; a kernel: no
  XLA loop), the products at the plan's preset."""
  config = helpers.tiny_run_config(pe=pe, width=256, heads=4)
  said = plan_of(config, platform)
  text, module = _lowered(pe, platform)
  kernels = set(re.findall(r'kernel_name = "([^"]+)"', text))
  summary = lower.summarize(module, platform)
  form = said['exponential'].split(':')[0]
  want = set()
  if form == 'kernel':
    want |= {'liere_expm_forward', 'liere_expm_backward'}
  if said['attention'].startswith('rotation kernel'):
    want |= {'rotate_forward', 'rotate_backward', 'attention_forward', 'attention_backward'}
  elif said['attention'].startswith('kernel'):
    want |= {'attention_forward', 'attention_backward'}
  assert kernels == want, (said, kernels)
  assert summary['platform_cases'] == 0  # No platform_dependent left to fold.
  if form == 'cond':
    assert summary['conditionals'] > 0
  else:  # select, and the kernel: no branch decided while running.
    assert summary['conditionals'] == 0 and summary['while_loops'] == 0, summary
  if form in ('cond', 'select'):
    preset = said['exponential'].split('products at ')[1].split(';')[0]
    names = {'float32': 'HIGHEST', 'BF16_BF16_F32_X6': 'BF16_BF16_F32_X6'}
    assert summary['expm_dot_algorithms'] == [names[preset]], summary
  lattice = said['rotations'].startswith('lattice')
  assert lattice == (platform != 'tpu')  # The TPU's exponential kernel: every token.
  assert ('liere_lattice' in text) == lattice


def test_the_plans_name_each_platform_s_forms():
  """What `bench plan` prints for the paper's ImageNet LieRE8 on each platform."""
  config = helpers.load_config(helpers.ROOT + '/configs/imagenet.py', 'pe=liere8')
  cpu, cuda, tpu = (plan_of(config, p) for p in ('cpu', 'cuda', 'tpu'))
  assert cpu['exponential'].startswith('cond: XLA, products at float32')
  assert cuda['exponential'].startswith('select: XLA, products at BF16_BF16_F32_X6')
  assert tpu['exponential'].startswith('kernel: Pallas (Mosaic), entries layout')
  assert cpu['rotation'] == cuda['rotation'] == 'XLA: einsum, float32 sums'
  assert tpu['rotation'].startswith("inside the attention kernel: the blocks' 8 entries a dim")
  assert (cpu['attention'].split(':')[0], cuda['attention'].split(':')[0],
          tpu['attention'].split(':')[0]) == ('xla', 'cudnn', 'kernel, band')


def test_a_tpu_plan_for_a_chip_names_the_path_its_vmem_allows():
  """UCF101's LieRE8 (785 tokens): its band past v4's VMEM (XLA rotates first, three products,
  from the lattice's table), inside the kernel on v5e's (`bench plan --topology v5litepod-8`;
  every token's exponential, each chip its share)."""
  config = helpers.load_config(helpers.ROOT + '/configs/ucf101.py', 'pe=liere8')
  least, v5e = plan_of(config, 'tpu'), plan_of(config, 'tpu', 'TPU v5 lite')
  assert least['attention'].startswith('kernel after xla') and least['qkv'] == 'three products'
  assert v5e['attention'].startswith('kernel, band') and v5e['qkv'] == 'one product'
  assert least['rotations'].startswith('lattice')
  assert ('split over the data axis by tokens, made and handed to the attention kernel as its '
          'entries') in v5e['rotations']
  assert v5e['platform'] == 'tpu (TPU v5 lite: 128 MiB of VMEM)'


def test_pape_s_plan_names_the_lift_s_path_and_the_tpu_program_runs_the_kernel():
  """ImageNet's PaPE (heads of 64, 168 lifted channels): the attention kernel on a TPU (256
  lanes a head), cuDNN on a GPU, XLA's explicit softmax on CPU; the tiny model's gradient
  lowered for a TPU runs the attention kernel's two Mosaic calls and no others."""
  config = helpers.load_config(helpers.ROOT + '/configs/imagenet.py', 'pe=pape')
  cpu, cuda, tpu = (plan_of(config, p)['attention'] for p in ('cpu', 'cuda', 'tpu'))
  assert tpu.startswith('kernel, lift: the Pallas attention kernel of q, k lifted to 168 '
                        'channels at the scale 64**-0.5, v of 64') and '256 lanes' in tpu
  assert cuda.startswith('cudnn, lift: ') and cpu.startswith('xla: an explicit softmax')
  text, _ = _lowered('pape', 'tpu')
  assert set(re.findall(r'kernel_name = "([^"]+)"', text)) == {'attention_forward',
                                                                'attention_backward'}


def test_a_plan_is_data_that_jit_sees():
  """Two plans are two static values: one function traced under each gives each its program
  (no switch set after jitting can be missed by jit's cache)."""
  x, rot = jnp.ones((1, 3, 2, 4)), jnp.ones((2, 3, 2, 2, 2))
  from liere_jax import rotations
  f = jax.jit(rotations.rotate, static_argnums=2)
  texts = {p: f.lower(x, rot, plan('cpu', pairs=p)).as_text() for p in numerics.PAIRS}
  assert len(set(texts.values())) == 3
  assert plan('cpu', pairs='swap_roll') == plan('cpu', pairs='swap_roll')
  assert hash(plan('tpu')) == hash(numerics.PLATFORMS['tpu'])


def test_plans_by_platform_and_bad_fields_refused_naming_them():
  assert plan('gpu') == plan('cuda') == numerics.PLATFORMS['cuda']
  assert plan().platform == 'cpu'  # This backend.
  assert plan('cpu').interpret and not plan('tpu').interpret
  assert plan('tpu').at_precision('highest').products.name == 'HIGHEST'
  assert plan('cpu').at_precision('auto') is numerics.PLATFORMS['cpu']
  for bad, says in [(dict(expm='pade'), "expm='pade' is unknown"),
                    (dict(attention='cudnn'), "attention='cudnn' needs platform='cuda'"),
                    (dict(flash=True), "['flash'] are not numerics fields")]:
    with pytest.raises(ValueError, match=re.escape(says)):
      plan('cpu', **bad)
  with pytest.raises(ValueError, match="No numerics for platform 'metal'"):
    plan('metal')
  mesh = jax.make_mesh((len(jax.devices()),), ('data',))
  assert numerics.for_mesh(mesh, attention='kernel').attention == 'kernel'
  assert numerics.for_mesh(mesh).vmem == numerics.VMEM_LEAST  # Not a TPU: the default.


@pytest.mark.parametrize('topology, mib', [('v4-8', 16), ('v5litepod-8', 128), ('v6e-8', 128),
                                           ('v5p-8', 95)])
def test_a_tpu_mesh_s_plan_holds_its_chip_s_vmem(topology, mib):
  pytest.importorskip('libtpu', reason='requirements-tpu.txt')
  from liere_jax import tpu_slices
  devices = tpu_slices.slice_devices(tpu_slices.parse_slice(topology))
  mesh = jax.sharding.Mesh(np.array(devices).reshape(-1), ('data',))
  assert numerics.for_mesh(mesh).vmem == mib * 2**20
  assert numerics.for_mesh(mesh, vmem=1).vmem == 1  # An A/B's field wins.


@pytest.mark.parametrize('args, says', [
    (['--platform', 'gpu'], "flag --platform=gpu: value should be one of"),
    (['--config', 'configs/imagenet.py:pe=liere9000'], 'liere9000'),
])
def test_bench_plan_refuses_a_bad_platform_or_config_in_one_line(args, says):
  config = ['--config', 'configs/imagenet.py:pe=liere8']
  code, out = helpers.python(['-m', 'liere_jax.bench', 'plan'] + (
      args if args[0] == '--config' else config + args))
  lines = [l for l in out.strip().splitlines() if 'WARNING' not in l]
  assert code == 2 and len(lines) == 1 and says in lines[0], out
