"""encodings/: the position encodings in the ViT (invariances, equivalences, counts, shapes and
errors), the registry, and RoPE-Mixed's rotations against their definition. The tests marked
`numerics` are the numerics scope's selection for encodings/rope.py in the mutation runs
(docs/mutation.md). ComRoPE (encodings/commuting.py): test_commuting.py."""
import dataclasses
import inspect
import types
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liere_jax import encodings, param_tree
from liere_jax.config import model as model_spec
from liere_jax.model import ViT
from liere_jax.positions import grid_positions, with_prefix
from liere_jax.encodings.rope import RopeMixed
from liere_jax.summary import param_counts
from tests.helpers import load_config, tiny_model, tiny_model_config, tiny_spec

ALL = ('none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere2', 'liere8',
       'liere16', 'liere6')
RELATIVE = ('rope_axial', 'rope_mixed', 'alibi', 'liere2', 'liere8', 'liere6')
EVERY = tuple(name.replace('<b>', '4') for name in encodings.NAMES)  # Every registered name.
NUMERICS = pytest.mark.numerics


def _logits(model, pos, q, k, layer=0):
  """Attention logits [H, T, T] of fixed q, k [1, T, H, d] at positions pos [T, n]."""
  ctx = model.pe.context(jnp.asarray(pos))
  q, k, bias = model.pe.layer(ctx, layer).attend(q, k, model.numerics)
  out = jnp.einsum('bqhd,bkhd->hqk', q, k)
  return out if bias is None else out + bias


@pytest.mark.parametrize('pe,n_dims,exact', [
    ('liere8', 1, True), ('liere32', 1, True), pytest.param('rope_mixed', 2, True, marks=NUMERICS),
    pytest.param('rope_axial', 2, True, marks=NUMERICS), ('rope_mixed', 3, True),
    pytest.param('alibi', 2, True, marks=NUMERICS), ('liere8', 2, False)])
def test_relative_position_invariance(pe, n_dims, exact):
  """Shifting every position leaves the logits unchanged exactly where the math says so
  (commuting generators); in 2D LieRE's generators do not commute, and it shows."""
  model = tiny_model(pe=pe, n_dims=n_dims, width=64, heads=1, pool='mean')  # No CLS token.
  rng = np.random.default_rng(0)
  pos = rng.uniform(0, 3, (12, n_dims)).astype(np.float32)
  if pe in ('rope_mixed', 'rope_axial', 'alibi'):
    pos = np.round(pos * 3)
  q = jnp.asarray(rng.normal(size=(1, 12, 1, 64)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 12, 1, 64)), jnp.float32)
  shift = np.asarray([1.5, -2.0, 0.5][:n_dims], np.float32)
  a, b = _logits(model, pos, q, k), _logits(model, pos + shift, q, k)
  diff = float(jnp.abs(a - b).max() / jnp.abs(a).max())
  if exact:
    assert diff < 2e-5, f'{pe} {n_dims}D: relative change {diff:.2e} under a shift'
  else:
    assert diff > 1e-3, f'{pe} {n_dims}D is unexpectedly shift invariant ({diff:.2e})'


def test_liere2_equals_rope_mixed_with_mapped_parameters():
  """LieRE with 2x2 blocks is RoPE-Mixed: generator = -frequency, same positions."""
  kw = dict(n_dims=2, width=32, heads=2, depth=2)
  rope = tiny_model(pe='rope_mixed', **kw)
  liere = tiny_model(pe='liere2', positions='integer', seed=1, **kw)
  n, depth, _ = rope.pe.freqs.shape
  freqs = rope.pe.freqs[...].reshape(n, depth, 2, -1)  # [n, L, H, pairs]
  liere.pe.generators[...] = -jnp.transpose(freqs, (1, 2, 0, 3))[..., None]
  nnx.update(liere, nnx.state(rope, nnx.Not(nnx.PathContains('pe'))))
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  (out_r, att_r), (out_l, att_l) = (m(x, return_attention=True) for m in (rope, liere))
  for a, b in zip(att_r, att_l):
    np.testing.assert_allclose(a, b, atol=1e-6)
  np.testing.assert_allclose(out_r, out_l, atol=1e-5)


@pytest.mark.parametrize('block,count', [(2, 9216), (4, 27648), (8, 64512), (16, 138240),
                                         (32, 285696), (64, 580608)])
def test_table10_pe_parameter_counts_vit_b(block, count):
  cfg = load_config('configs/cifar100.py', f'pe=liere{block},variant=B')
  counts = param_counts(model_spec.resolve(cfg.model))
  assert counts['params_pe'] == count
  assert 85.1e6 < counts['params_total'] < 85.9e6  # "relative to the model size of 85.2M"


def _rotations(model, grid=(4, 4)):
  """The rotation each layer and head applies to each token, [L, H, T, d, d], through the
  per-layer contexts attention sees (the basis vectors rotated as queries)."""
  ctx = model.pe_context(grid)
  d, heads = model.spec.head_dim, model.spec.heads
  tokens = model.num_prefix + math.prod(grid)
  basis = jnp.broadcast_to(jnp.eye(d)[:, None, None, :], (d, tokens, heads, d))
  return jnp.stack([jnp.moveaxis(model.pe.layer(ctx, i).attend(basis, basis, model.numerics)[0], 0, -1)
                    for i in range(model.spec.depth)]).transpose(0, 2, 1, 3, 4)


@pytest.mark.parametrize('share,shape', [('none', (2, 2)), ('layers', (1, 2)),
                                         ('heads', (2, 1)), ('all', (1, 1))])
def test_sharing_modes(share, shape):
  """Each mode shares the rotations it names and no others: the shared model is the unshared
  one with its generator stacks broadcast over the shared axes (same logits), and its layers /
  heads turn alike exactly where the mode says."""
  model = tiny_model(pe='liere8', share=share)
  assert model.pe.generators.shape == shape + (2, 2, 28)
  model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  full = tiny_model(pe='liere8', share='none')
  nnx.update(full, nnx.state(model, nnx.Not(nnx.PathContains('pe'))))
  full.pe.generators[...] = jnp.broadcast_to(model.pe.generators[...], (2, 2, 2, 2, 28))
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  np.testing.assert_allclose(model(x), full(x), atol=1e-5)
  rot = np.asarray(_rotations(model))  # [L, H, T, d, d]
  same_layers, same_heads = share in ('layers', 'all'), share in ('heads', 'all')
  assert np.allclose(rot[0], rot[1], atol=1e-6) == same_layers, share
  assert np.allclose(rot[:, 0], rot[:, 1], atol=1e-6) == same_heads, share
  assert not np.allclose(rot[..., 1:, :, :], np.eye(16), atol=1e-3)  # Patches do turn.


@pytest.mark.parametrize('pe', ALL)
@pytest.mark.parametrize('n_dims,sizes', [(1, (16, 28)), (2, (16, 24)), (3, (8, 12))])
def test_shapes_1d_2d_3d_and_unseen_resolutions(pe, n_dims, sizes):
  model = tiny_model(pe=pe, n_dims=n_dims, size=sizes[0], width=48, heads=2,
                     pool='mean' if pe == 'liere6' else 'cls')
  forward = nnx.jit(lambda model, x: model(x))
  for size in sizes:
    x = jnp.ones((2,) + (size,) * n_dims + (3,))
    y = forward(model, x)
    assert y.shape == (2, 5) and bool(jnp.all(jnp.isfinite(y))), (pe, size)


@pytest.mark.parametrize('pe', ('none',) + RELATIVE)
def test_shuffling_tokens_changes_relative_encodings_only(pe):
  """Without positions a CLS-pooled ViT is permutation invariant; relative encodings are not."""
  model = tiny_model(pe=pe)
  model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  patches = x.reshape(2, 4, 4, 4, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 16, 4, 4, 3)
  perm = np.random.default_rng(0).permutation(16)
  shuffled = patches[:, perm].reshape(2, 4, 4, 4, 4, 3).transpose(0, 1, 3, 2, 4, 5)
  diff = float(jnp.abs(model(x) - model(shuffled.reshape(x.shape))).max())
  if pe == 'none':
    assert diff < 1e-5
  else:
    assert diff > 1e-4, f'{pe}: shuffling the patches did not change the output'


@pytest.mark.parametrize('pe', RELATIVE[:2] + ('liere8',))
def test_cls_token_is_not_rotated(pe):
  model = tiny_model(pe=pe)
  ctx = model.pe_context((4, 4))
  rot = np.asarray(ctx.rot)[..., 0, :, :, :]  # [..., blocks, b, b] of the CLS token
  np.testing.assert_array_equal(rot, np.broadcast_to(np.eye(rot.shape[-1]), rot.shape))


def test_default_position_modes_and_cached_context():
  assert tiny_model(pe='liere8').spec.pe.positions == 'normalized'
  assert tiny_model(pe='rope_mixed').spec.pe.positions == 'integer'
  model = tiny_model(pe='liere8')
  model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  x = jax.random.normal(jax.random.key(0), (2, 24, 24, 3))
  ctx = model.pe_context((6, 6))
  np.testing.assert_array_equal(model(x), model(x, ctx=ctx))
  assert not np.allclose(model(x), model(x, positions='rescaled'))


def test_positions_modes():
  np.testing.assert_allclose(grid_positions((3,), (3,), 'normalized')[:, 0], [0, .5, 1])
  np.testing.assert_allclose(grid_positions((5,), (3,), 'normalized')[:, 0], [0, .5, 1, 1.5, 2])
  np.testing.assert_allclose(grid_positions((5,), (3,), 'rescaled')[:, 0], [0, .25, .5, .75, 1])
  # Integer-mode models squeeze into their own training span, [0, n_train - 1].
  np.testing.assert_allclose(grid_positions((5,), (3,), 'rescaled', 'integer')[:, 0],
                             [0, .5, 1, 1.5, 2])
  np.testing.assert_allclose(grid_positions((3,), (3,), 'rescaled', 'integer')[:, 0], [0, 1, 2])


@pytest.mark.parametrize('pe', ['liere8', 'rope_mixed', 'rope_axial', 'string_cayley'])
def test_rescaled_positions_are_the_default_at_the_training_size(pe):
  model = tiny_model(pe=pe)
  model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  np.testing.assert_allclose(model(x, positions='rescaled'), model(x), atol=1e-5)
  pos = grid_positions((2, 3), (2, 3), 'integer')
  np.testing.assert_array_equal(pos[:4], [[0, 0], [0, 1], [0, 2], [1, 0]])  # row-major (r, c)
  assert with_prefix(pos, 1).shape == (7, 2)


def test_bf16_compute_keeps_float32_parameters_and_rotations():
  cfg = tiny_model_config(pe='liere8')
  cfg.dtype = 'bfloat16'
  model = ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0))
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert model.pe_context((4, 4)).rot.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(model(jnp.ones((1, 16, 16, 3))))))


def test_abs_resize_keeps_the_training_grid_exact():
  model = tiny_model(pe='abs')
  x = jnp.zeros((1, 17, 32))
  np.testing.assert_array_equal(model.pe.embed(x, (4, 4))[0],
                                model.pe.embedding[0])
  assert model.pe.embed(jnp.zeros((1, 37, 32)), (6, 6)).shape == (1, 37, 32)


@pytest.mark.parametrize('change,match', [
    (dict(pe='rope'), r"model.pe.name='rope' is unknown.*liere<b>"),
    (dict(pe='liere1'), r"block size 1 must be in \[2, head_dim=16\]"),
    (dict(pe='liere32'), r"block size 32 must be in \[2, head_dim=16\].*liere16"),
    (dict(share='layer'), r"model.pe.share='layer' is unknown"),
    (dict(positions='sequential'), r"model.pe.positions='sequential' is unknown"),
    (dict(expm='pade'), r"model.pe.expm='pade' is unknown.*'fast'"),
    (dict(init_scale=0.), r"model.pe.init_scale=0.0 must be positive"),
])
def test_bad_configs_name_the_value_and_the_fix(change, match):
  with pytest.raises(ValueError, match=match):
    tiny_model(**change)


def test_input_dimensionality_mismatch_raises_before_compiling():
  model = tiny_model(pe='liere8')  # 2D model
  lowered = []
  fn = jax.jit(lambda x: (lowered.append(1), model(x))[1])
  with pytest.raises(ValueError, match=r'expects \[batch, 2 spatial axes, 3 channels\]'):
    fn(jnp.ones((1, 4, 16, 16, 3)))  # video into an image model
  with pytest.raises(ValueError, match='not divisible by patch'):
    model(jnp.ones((1, 18, 16, 3)))
  with pytest.raises(ValueError, match=r'patch=\(4, 4\) and model.input_size=\(8, 16, 16\)'):
    cfg = tiny_model_config()
    cfg.input_size = (8, 16, 16)
    ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(0))


def _documented_tree(spec):
  """{path: shape} of the parameter tree as model.py and encodings/__init__.py document it."""
  n, depth, heads, d, width = spec.n_dims, spec.depth, spec.heads, spec.head_dim, spec.width
  b, mlp = spec.pe.block, spec.mlp_dim
  tree = {'patch_embed/kernel': spec.patch + (spec.channels, width), 'patch_embed/bias': (width,),
          'norm/scale': (width,), 'norm/bias': (width,),
          'head/kernel': (width, spec.num_classes), 'head/bias': (spec.num_classes,)}
  if spec.num_prefix:
    tree['cls_token'] = (1, 1, width)
  for i in range(depth):
    for key, shape in {'norm1/scale': (width,), 'norm1/bias': (width,),
                       'attn/qkv/kernel': (width, 3 * width), 'attn/qkv/bias': (3 * width,),
                       'attn/proj/kernel': (width, width), 'attn/proj/bias': (width,),
                       'norm2/scale': (width,), 'norm2/bias': (width,),
                       'mlp/fc1/kernel': (width, mlp), 'mlp/fc1/bias': (mlp,),
                       'mlp/fc2/kernel': (mlp, width), 'mlp/fc2/bias': (width,)}.items():
      tree[f'blocks/{i}/{key}'] = shape
  freqs = {'freqs': (n, depth, heads * d // 2)}
  skew = {'skew_params': (depth, heads, d // (b or 1), b, b)}
  pe = {'abs': {'embedding': (1, spec.num_prefix + math.prod(spec.train_grid), width)},
        'rope_mixed': freqs,
        'liere': {'generators': (spec.pe.layers, spec.pe.heads, n, d // (b or 1),
                                 (b or 0) * ((b or 0) - 1) // 2)},
        'comrope_ap': skew,
        'comrope_ld': {**skew, 'axis_scales': (depth, n, d // (b or 1))},
        'string_cayley': {**freqs, 'cayley': (depth, heads, d * (d - 1) // 2)},
        'string_circulant': {'circulant': (depth, heads, n, d // (b or 1), b)},
        'pape': {'position': (depth, n, heads * 50), 'ab': (depth, width, 2 * heads * 50)},
        'pape_ri': {'position_scales': (depth, heads), 'a': (depth, width, heads)},
        }.get(spec.pe.family, {})
  tree.update({f'pe/{k}': v for k, v in pe.items()})
  return tree


@pytest.mark.parametrize('pe', EVERY)
def test_parameter_tree_is_the_documented_one_and_scan_matches_the_loop(pe):
  """Every encoding: the parameter names and shapes checkpoints and the port rely on, and the
  same logits whether the blocks run in a loop, under lax.scan or rematerialised (each way
  hands each block its own layer's context)."""
  cfg = tiny_model_config(pe=pe)
  model = tiny_model(pe=pe)
  state = nnx.state(model, nnx.Param)
  tree = {'/'.join(map(str, k)): tuple(v.shape) for k, v in nnx.to_flat_state(state)}
  assert tree == _documented_tree(model.spec)
  model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  if pe == 'string_cayley':  # S = 0 at init: make P matter.
    model.pe.cayley[...] = 0.3 * jax.random.normal(jax.random.key(2), model.pe.cayley.shape)
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  ref = model(x)
  for key, value in (('scan_layers', True), ('remat', 'block')):
    cfg[key] = value
    other = ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(1))
    other.eval()
    state = nnx.to_pure_dict(nnx.state(model))
    nnx.update(other, param_tree.to_scan_params(state) if key == 'scan_layers' else state)
    np.testing.assert_allclose(other(x), ref, atol=1e-5, err_msg=f'{pe} {key}')
    cfg[key] = False if key == 'scan_layers' else 'none'
  if encodings.facts(pe).reads_positions:  # The positions reach attention.
    offsets = jax.random.uniform(jax.random.key(3), (16, 2), minval=-0.5, maxval=0.5)
    moved = model(x, ctx=model.pe_context((4, 4), offsets=offsets))
    assert np.abs(np.asarray(moved) - np.asarray(ref)).max() > 1e-5, pe


def test_every_family_has_a_class_and_a_port_mirror():
  assert set(encodings.families()) == set(encodings.FAMILIES)
  for family, cls in encodings.families().items():
    assert cls.facts == encodings.FAMILIES[family]
  torch_vit = pytest.importorskip('liere_jax.torch_vit')
  assert set(torch_vit.BUILDERS) == set(encodings.FAMILIES)


def test_an_encodings_options_are_declared_once_with_it_and_have_no_default_below():
  """model.pe's option fields (default, doc, stored value) and the resolved PESpec's fields are
  the encodings' Option declarations; each encoding takes its options from spec.pe.options as
  keywords without defaults, so no default lower down can stand in for a missed value."""
  declared = encodings.registry.options()
  assert set(declared) == set(model_spec.PE_OPTION_DEFAULTS)
  pe_fields = {f.name for f in dataclasses.fields(model_spec.PESpec)}
  for name, (option, families) in declared.items():
    field = model_spec.PE[name]
    assert (field.default, field.doc.endswith(option.doc)) == (option.default, True), name
    assert name in pe_fields
  for cls in encodings.families().values():
    keywords = inspect.signature(cls.__init__).parameters
    for option in cls.facts.options:
      assert keywords[option.name].default is inspect.Parameter.empty, (cls, option.name)
  options = tiny_spec('liere8', expm_precision='highest', init_scale=1.0).pe.options
  assert set(options) == set(encodings.FAMILIES['liere'].option_names)
  assert (options['expm_precision'], options['init_scale'], options['share']) == (
      'highest', 1.0, 'none')
  assert tiny_spec('rope_mixed').pe.options == {}


def test_the_docs_table_of_the_names_gives_each_its_positions_and_options():
  """docs/encodings.md's table of names (by hand) names every encoding with the default
  positions and the options its declaration gives (a new option goes in its rows)."""
  with open(os.path.join(os.path.dirname(__file__), '..', 'docs', 'encodings.md')) as f:
    text = f.read()
  header = '| name | family | positions (default) | options besides name, positions, jitter |'
  lines = text[text.index(header):].split('\n\n')[0].splitlines()[2:]
  rows = [line.split('|')[1:-1] for line in lines]
  table = {cells[0].strip().strip('`'): cells for cells in rows}
  assert set(table) == set(encodings.NAMES)
  for name, cells in table.items():
    facts = encodings.facts(name.replace('<b>', '8'))
    positions = cells[2].strip()
    assert positions == (facts.positions if facts.reads_positions else 'none read'), name
    assert [o.strip().strip('`') for o in cells[3].split(',') if o.strip()] == list(
        facts.option_names), name


def test_the_names_and_facts_read_in_a_process_without_jax_and_are_the_classes():
  """Tools (config checks, docs, data preparation) read the registry without importing jax;
  what it reads from the @register declarations is what the imported classes declare."""
  code = ('import dataclasses, json, sys\n'
          'from liere_jax.encodings import registry\n'
          "assert 'jax' not in sys.modules, [m for m in sys.modules if m.startswith('jax')]\n"
          'print(json.dumps([registry.NAMES, {f: dataclasses.asdict(facts) '
          'for f, facts in registry.FAMILIES.items()}]))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  names, facts = json.loads(out.stdout)
  assert tuple(names) == encodings.NAMES
  assert facts == json.loads(json.dumps({family: dataclasses.asdict(cls.facts)
                                         for family, cls in encodings.families().items()}))


@pytest.mark.parametrize('pe', ['alibi', 'sincos'])  # comrope: test_commuting.
def test_an_encoding_gets_the_prefix_tokens_when_built_and_leaves_the_cls_token_unencoded(pe):
  """num_prefix comes with the build (ModelSpec.num_prefix), not with each call: a CLS token
  (first) gets no bias or a zero table row; without one the first token is a patch like the
  others."""
  for pool in ('cls', 'mean'):
    spec = tiny_spec(pe, pool=pool)
    enc = encodings.build(spec, rngs=nnx.Rngs(0))
    grid = spec.train_grid
    first = {  # What the encoding does to the first token.
        'alibi': lambda: np.asarray(enc.context(with_prefix(grid_positions(
            grid, grid, 'integer'), spec.num_prefix)).bias)[..., 0, 1:],
        'sincos': lambda: np.asarray(enc.embed(jnp.zeros((1, spec.num_prefix + 16, 32)),
                                               grid))[0, 0]}[pe]()
    assert (np.abs(first).max() == 0) == (pool == 'cls'), (pe, pool)


def test_a_family_the_registry_does_not_read_is_refused_at_registration():
  with pytest.raises(ValueError, match="registry.py reads the facts of 'unread' otherwise"):
    encodings.register('unread', label='Unread')(type('Unread', (encodings.Encoding,), {}))
  assert 'unread' not in encodings.families()


def test_the_port_imports_no_jax():
  """liere_jax/torch_vit.py is self-contained: torch, numpy and the standard library."""
  import ast
  import liere_jax
  path = os.path.join(os.path.dirname(liere_jax.__file__), 'torch_vit.py')
  tree = ast.parse(open(path).read())
  modules = {alias.name.split('.')[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
  modules |= {node.module.split('.')[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
  assert not modules & {'jax', 'flax', 'liere_jax', 'optax', 'ml_collections'}, modules


def test_names_parse_to_registered_families():
  for name in encodings.NAMES:
    family, block = encodings.parse(name.replace('<b>', '8'))
    assert family in encodings.FAMILIES and (block is not None) == ('<b>' in name
                                                                    or name in encodings.ALIASES)
  assert encodings.parse('paper_rope_mixed') == ('liere', 2)
  assert encodings.label('liere8') == 'LieRE8'
  with pytest.raises(ValueError, match=r"model.pe.name='rope' is unknown.*liere<b>"):
    encodings.facts('rope')


def test_layer_norm_eps_reaches_every_layer_norm():
  spec = dataclasses.replace(tiny_spec(), layer_norm_eps=1e-3)
  model = nnx.eval_shape(lambda: ViT(spec, rngs=nnx.Rngs(0)))
  norms = [m for _, m in nnx.iter_modules(model) if isinstance(m, nnx.LayerNorm)]
  assert len(norms) == 2 * spec.depth + 1
  assert all(norm.epsilon == 1e-3 for norm in norms)


def test_an_unknown_encoding_name_lists_the_known_ones_with_two_examples():
  with pytest.raises(ValueError) as e:
    encodings.facts('liere_typo8')
  message = str(e.value)
  assert message.startswith("model.pe.name='liere_typo8' is unknown; use one of ")
  assert message.endswith(' (e.g. pe=liere8 or pe=rope_mixed).'), message
  assert all(name in message for name in encodings.NAMES)


# ----------------------------------------------------------------------------------------------
# RoPE-Mixed's rotations against their definition: angle_{l,h,j}(p) = sum_a freqs[a, l, h*d/2 + j]
# p_a, each pair turned by [[cos, -sin], [sin, cos]].


@pytest.mark.numerics
def test_each_layer_head_and_pair_turns_by_its_frequencies_dotted_with_the_position():
  n, depth, heads, pairs, tokens = 2, 2, 3, 4, 5  # every axis its own size
  rng = np.random.default_rng(0)
  freqs = rng.normal(size=(n, depth, heads * pairs)).astype(np.float32)
  pos = rng.uniform(0, 8, (tokens, n)).astype(np.float32)
  # The rotations read the learned frequencies and the head count only (whatever builds them).
  got = np.asarray(RopeMixed.rotations(
      types.SimpleNamespace(freqs=jnp.asarray(freqs), heads=heads), jnp.asarray(pos)))
  assert got.shape == (depth, heads, tokens, pairs, 2, 2)
  for l in range(depth):
    for h in range(heads):
      for t in range(tokens):
        angle = pos[t].astype(np.float64) @ freqs[:, l, h * pairs:(h + 1) * pairs]
        c, s = np.cos(angle), np.sin(angle)
        np.testing.assert_allclose(got[l, h, t], np.stack([np.stack([c, -s], -1),
                                                           np.stack([s, c], -1)], -2),
                                   atol=3e-6)


@pytest.mark.numerics
def test_the_angles_are_computed_at_highest_precision_on_every_platform():
  # A GPU's default float32 dot rounds through TF32 (10-bit mantissa): ~1e-3 relative on the
  # angles, 0.01 rad at position 14 and frequency 1. CPU computes float32 either way.
  stand_in = types.SimpleNamespace(freqs=jnp.ones((2, 1, 4)), heads=2)
  hlo = jax.jit(lambda p: RopeMixed.rotations(stand_in, p)).lower(jnp.ones((3, 2))).as_text()
  assert 'dot_general' in hlo and 'precision = [HIGHEST, HIGHEST]' in hlo, hlo
