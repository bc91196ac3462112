"""The official LieRE recipe's model details: dropout sites, initialisation, the paper's
ViT-Tiny, bfloat16 compute (liere_jax/model.py, config/model.py)."""
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax.config import model_config
from liere_jax.config.model import MODEL
from liere_jax import attention, encodings
from liere_jax import model as model_lib
from liere_jax.numerics import plan
from liere_jax.config import model as model_spec
from liere_jax import torch_vit
from liere_jax.model import Block, Mlp, ViT
from tests.helpers import tiny_model_config

WIDTH, HEADS, MLP = 32, 2, 64


def _block(sites, rate=1.0):
  """A block with dropout `rate` at `sites`, in training mode; nonzero biases (official init)
  so that a zeroed MLP hidden layer (output = fc2's bias) differs from a zeroed MLP output.
  The parameters do not depend on the rate or the sites (same seed)."""
  return Block(WIDTH, HEADS, MLP, qkv_bias=True, dropout=rate, dropout_sites=sites,
               init='official', dtype=jnp.float32, rngs=nnx.Rngs(0))


@pytest.mark.parametrize('site', ['attn', 'mlp_hidden', 'mlp', None])
def test_dropout_at_one_site_zeroes_exactly_that_branch(site):
  x = jax.random.normal(jax.random.key(1), (2, 5, WIDTH))
  pe = encodings.LayerContext()  # No position encoding.
  ref = _block(model_spec.DROPOUT_SITES, rate=0.)  # The same parameters, no dropout.
  attn = lambda h: ref.attn(ref.norm1(h), pe)[0]
  mlp = lambda h: ref.mlp(ref.norm2(h))
  x1 = x + attn(x)
  expected = {'attn': x + mlp(x),  # The attention branch adds nothing.
              'mlp_hidden': x1 + ref.mlp.fc2.bias[...],  # fc2 sees zeros.
              'mlp': x1,  # The MLP branch adds nothing.
              None: x1 + mlp(x1)}[site]  # No site: rate 1 changes nothing.
  out, _ = _block((site,) if site else ())(x, pe)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_mlp_hidden_dropout_acts_after_gelu():
  """With fc2 = identity the MLP output is the dropped hidden layer: each unit is 0 or
  gelu(z) / keep (dropout before GELU would give gelu(z / keep))."""
  mlp = Mlp(WIDTH, WIDTH, hidden_dropout=0.5, init='official', dtype=jnp.float32,
            rngs=nnx.Rngs(0))
  mlp.fc2.kernel[...] = jnp.eye(WIDTH)
  mlp.fc2.bias[...] = jnp.zeros(WIDTH)
  x = jax.random.normal(jax.random.key(1), (64, WIDTH))
  out = np.asarray(mlp(x, rngs=jax.random.key(2)))
  kept = np.asarray(jax.nn.gelu(mlp.fc1(x), approximate=False)) / 0.5
  dropped = out == 0
  assert 0.3 < dropped.mean() < 0.7
  np.testing.assert_allclose(out[~dropped], kept[~dropped], rtol=1e-6)


def _model(sites, rate=1.0, **fields):
  """A tiny ViT (official init: a nonzero head) in training mode, dropout `rate` at `sites`;
  rate 1 is built from a ModelSpec (the config allows rates below 1)."""
  cfg = tiny_model_config(pe='abs')
  cfg.init = 'official'
  cfg.update(fields)
  spec = dataclasses.replace(model_spec.resolve(cfg), dropout=rate, dropout_sites=sites)
  model = ViT(spec, rngs=nnx.Rngs(0))
  model.train()
  return model


def test_embed_dropout_zeroes_the_tokens():
  """At p = 1 after the CLS concat and the absolute embedding, every token (CLS included)
  enters the blocks as 0. Without the site the train-mode output is the eval-mode one."""
  x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  model = _model(('embed',))
  tokens = jnp.zeros((2, 1 + 16, WIDTH))
  ctx = model.pe_context((4, 4))
  for layer, block in enumerate(model.blocks):
    tokens, _ = block(tokens, model.pe.layer(ctx, layer))
  np.testing.assert_allclose(model(x), model.head(model.norm(tokens)[:, 0]), atol=1e-6)
  logits = _model(model_spec.DROPOUT_SITES, rate=0.)(x)
  assert np.abs(logits[0] - logits[1]).max() > 1e-2  # The input matters without dropout.
  np.testing.assert_allclose(_model((), rate=1.)(x), logits, atol=1e-6)


@pytest.mark.parametrize('scan_layers,remat', [(True, 'none'), (False, 'block'),
                                                (True, 'block')])
def test_dropout_sites_reach_the_scanned_and_rematerialised_blocks(scan_layers, remat):
  x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  loop = _model(('mlp_hidden',))
  model = _model(('mlp_hidden',), scan_layers=scan_layers, remat=remat)
  np.testing.assert_allclose(model(x), loop(x), rtol=1e-5, atol=1e-5)
  model.eval()
  assert np.abs(model(x) - loop(x)).max() > 1e-2  # The site was active in training.
  # At p = 0.5 the per-block RNG streams give the scan the loop's masks.
  loop, model = (_model(model_spec.DROPOUT_SITES, 0.5, scan_layers=s, remat=remat)
                 for s in (False, scan_layers))
  for m in (loop, model):
    model_lib.reseed(m, dropout=3)
  np.testing.assert_allclose(model(x), loop(x), rtol=1e-5, atol=1e-5)


def test_bad_dropout_site_and_init_name_the_valid_ones():
  cfg = tiny_model_config()
  cfg.dropout_sites = ('embed', 'mlp_out')
  with pytest.raises(ValueError, match=r"dropout_sites has 'mlp_out'.*'mlp_hidden'"):
    model_spec.resolve(cfg)
  cfg = tiny_model_config()
  cfg.init = 'torch'
  with pytest.raises(ValueError, match=r"model.init='torch' is unknown.*'official'"):
    model_spec.resolve(cfg)


# ----------------------------------------------------------------------------------------------
# Initialisation.


def _init_stats_model(init):
  cfg = model_config(pe='abs', variant='', patch=(8, 8), input_size=(32, 32),
                     channels=3, num_classes=100, width=256, depth=1, heads=4)
  cfg.init = init
  return ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0))


# name -> (fan_in, fan_out) with width 256, MLP 1024, patch 8x8x3, 100 classes.
LINEARS = {'patch_embed': (192, 256), 'blocks/0/attn/qkv': (256, 768),
           'blocks/0/attn/proj': (256, 256), 'blocks/0/mlp/fc1': (256, 1024),
           'blocks/0/mlp/fc2': (1024, 256), 'head': (256, 100)}


def _params(model):
  return {'/'.join(map(str, k)): np.asarray(v[...])
          for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_official_init_is_torch_default():
  """Every Linear (and the patch embedding, a Linear on the flattened patch): weight and bias
  ~ U(+-1/sqrt(fan_in)), std 1/sqrt(3 fan_in); CLS token and absolute embedding N(0, 1);
  LayerNorm ones / zeros."""
  p = _params(_init_stats_model('official'))
  normalised_biases = []
  for name, (fan_in, _) in LINEARS.items():
    bound = 1 / math.sqrt(fan_in)
    kernel, bias = p[f'{name}/kernel'], p[f'{name}/bias']
    assert kernel.shape[-1] == bias.shape[-1] and kernel[..., 0].size == fan_in, name
    assert np.abs(kernel).max() <= bound and np.abs(bias).max() <= bound, name
    assert np.abs(bias).max() > 0.9 * bound, name  # Not a smaller range.
    assert kernel.std() == pytest.approx(bound / math.sqrt(3), rel=0.05), name
    normalised_biases.append(bias / bound)
  assert np.concatenate(normalised_biases).std() == pytest.approx(1 / math.sqrt(3), rel=0.05)
  embeddings = np.concatenate([p['cls_token'].ravel(), p['pe/embedding'].ravel()])
  assert embeddings.std() == pytest.approx(1., rel=0.05)
  assert p['cls_token'].std() == pytest.approx(1., rel=0.2)
  for name in ('blocks/0/norm1', 'blocks/0/norm2', 'norm'):
    assert (p[f'{name}/scale'] == 1).all() and (p[f'{name}/bias'] == 0).all()


def test_jax_init_is_unchanged():
  """Xavier-uniform kernels, LeCun-normal patch embedding, zero biases and head, 0.02 N(0, 1)
  CLS token and absolute embedding."""
  p = _params(_init_stats_model('jax'))
  for name, (fan_in, fan_out) in LINEARS.items():
    kernel = p[f'{name}/kernel']
    assert (p[f'{name}/bias'] == 0).all(), name
    if name == 'head':
      assert (kernel == 0).all()
    else:
      std = 1 / math.sqrt(fan_in) if name == 'patch_embed' else math.sqrt(2 / (fan_in + fan_out))
      assert kernel.std() == pytest.approx(std, rel=0.05), name
  embeddings = np.concatenate([p['cls_token'].ravel(), p['pe/embedding'].ravel()])
  assert embeddings.std() == pytest.approx(0.02, rel=0.05)


def test_init_keeps_the_parameter_tree_and_its_sharding_axes():
  def logical(init):
    cfg = tiny_model_config(pe='abs')
    cfg.init = init
    model = nnx.eval_shape(lambda: ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0)))
    return nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(model, nnx.Param)))

  official = logical('official')
  assert official == logical('jax')
  assert tuple(official['blocks'][0]['attn']['qkv']['kernel']) == ('embed', 'heads')
  assert tuple(official['head']['kernel']) == ('embed', None)


# ----------------------------------------------------------------------------------------------
# The paper's ViT-Tiny, old specs, bfloat16.


def test_paper_tiny_is_the_official_tiny():
  cfg = model_config(pe='liere8', variant='paper_tiny', patch=(4, 4),
                     input_size=(32, 32), channels=3, num_classes=100)
  cfg.qkv_bias = False  # The official to_qkv has no bias.
  s = model_spec.resolve(cfg)
  assert (s.width, s.depth, s.heads, s.head_dim, s.mlp_dim) == (384, 12, 6, 64, 768)
  model = nnx.eval_shape(lambda: ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0)))
  blocks = sum(v.size for v in jax.tree.leaves(nnx.state(model.blocks, nnx.Param)))
  d, m = 384, 768
  # to_qkv (no bias), to_out, fc1, fc2, two LayerNorms: official models/vit.py, rope_vit.py.
  official = 12 * (d * 3 * d + (d * d + d) + (d * m + m) + (m * d + d) + 2 * 2 * d)
  assert blocks == official == 14_192_640
  # The other variants keep MLP = 4 x width, following a width override.
  cfg.variant, cfg.width = 'B', 576
  assert model_spec.resolve(cfg).mlp_dim == 4 * 576


def test_old_spec_json_loads_with_the_old_model():
  s = model_spec.resolve(tiny_model_config())
  assert (s.dropout_sites, s.init) == (model_spec.DROPOUT_SITES, 'jax')
  obj = json.loads(json.dumps(s.to_json()))
  assert model_spec.ModelSpec.from_json(obj) == s
  for key in ('dropout_sites', 'init'):
    del obj[key]
  old = model_spec.ModelSpec.from_json(obj)
  assert (old.dropout_sites, old.init) == (('embed', 'attn', 'mlp'), 'jax')
  old_config = {k: v for k, v in tiny_model_config().to_dict().items()
                if k not in ('dropout_sites', 'init')}
  assert model_spec.resolve(MODEL.upgrade(old_config)) == old
  # The PyTorch port: the same three sites for an old JSON, all four for a new one.
  dropouts = lambda m: [name for name, mod in m.named_modules()
                        if isinstance(mod, torch_vit.nn.Dropout) and mod.p > 0]
  obj['dropout'] = 0.1
  assert dropouts(torch_vit.ViT.from_config(obj)) == [
      'dropout', 'blocks.0.drop_attn', 'blocks.0.drop_mlp', 'blocks.1.drop_attn',
      'blocks.1.drop_mlp']
  new = torch_vit.ViT.from_config({**s.to_json(), 'dropout': 0.1})
  assert 'blocks.0.mlp.dropout' in dropouts(new) and len(dropouts(new)) == 7


def test_bfloat16_computes_in_bf16_with_float32_parameters_and_rotations():
  cfg = tiny_model_config(pe='liere8')
  cfg.init = 'official'
  f32 = ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0))
  cfg.dtype = 'bfloat16'
  bf16 = ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0))
  assert {v.dtype for v in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {jnp.dtype('float32')}
  x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  assert bf16.patch_embed(x).dtype == jnp.bfloat16
  ctx = bf16.pe_context(bf16.grid(x.shape))
  assert ctx.rot.dtype == jnp.float32
  np.testing.assert_array_equal(ctx.rot, f32.pe_context(f32.grid(x.shape)).rot)
  logits, ref = bf16(x, ctx=ctx), f32(x)
  assert logits.dtype == jnp.float32
  assert np.abs(logits - ref).max() < 0.05 * np.abs(ref).max()


@pytest.mark.parametrize('pe', ['liere64', 'liere8', 'rope_mixed', 'string_cayley', 'abs'])
def test_q_k_and_v_as_three_products_equal_one_product(pe):
  """The qkv projection as three products (a TPU's where XLA's einsum rotates q and k) gives the
  model one product gives, to float32 rounding, and the plan asks for them exactly there
  (attention.split_qkv): LieRE64 on a TPU where its rotation cannot go to the rotation kernel
  (1025 tokens: XLA's attention), LieRE8 where its band is past the kernel's rows (785 tokens
  on a plan without a chip: XLA rotates before the kernel), no other here."""
  cfg = tiny_model_config(pe=pe, width=128)  # 2 heads of 64 dims
  cfg.qkv_bias = True
  spec = model_spec.resolve(cfg)
  x = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  vit = ViT(spec, rngs=nnx.Rngs(0), numerics=plan('cpu'))
  one = vit(x)
  ctx = vit.pe.layer(vit.pe_context(vit.grid(x.shape)), 0)
  split = lambda t, platform='tpu': attention.split_qkv(plan(platform), ctx, (2, t, 2, 64))
  assert not split(17) and not split(1025, 'cpu') and not split(1025, 'cuda')  # the TPU's kernels
  assert split(1025) == (pe == 'liere64') and split(785) == (pe == 'liere8')
  if pe == 'liere64':  # Three products where the kernels do not take it: XLA's attention.
    three = ViT(spec, rngs=nnx.Rngs(0), numerics=plan('cpu', split_qkv=True))(x)
    np.testing.assert_allclose(three, one, rtol=1e-5, atol=1e-5 * float(np.abs(one).max()))


def test_qkv_as_three_products_is_three_dots_and_one_product_one():
  """attention.project: three products, or one."""
  x, kernel = jnp.ones((2, 5, 16)), jnp.ones((16, 48))
  dots = lambda three: jax.jit(lambda x: attention.project(x, kernel, None, 2, three)
                               ).trace(x).lower().as_text().count('dot_general')
  assert (dots(True), dots(False)) == (3, 1)
