"""The PyTorch port (liere_jax/torch_vit.py) and the converters (liere_jax/convert/).

JAX (float32) vs PyTorch: logits within 1e-4, rotations within 1e-5, at the training
resolution and at a larger (and for abs a smaller) one; export -> import is bit-identical; wrong
files fail naming the key; the official StanfordMIMI/LieRE layout round-trips and, when the
official checkout is around (env LIERE_OFFICIAL_CHECKOUT=DIR, a checkout of
github.com/StanfordMIMI/LieRE, plus einops; skipped when unset), loads with strict=True into its
RoPEViT with the same logits.
"""
import functools
import glob
import importlib
import importlib.util
import json
import os
import re
import sys
import types
import warnings

import numpy as np
import pytest
from absl import app

torch = pytest.importorskip('torch')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from liere_jax import checkpoint, convert, encodings, torch_vit  # noqa: E402
from liere_jax.config import base_config, data_config
from liere_jax.config.model import MODEL, PE  # noqa: E402
from liere_jax.convert import __main__ as convert_cli  # noqa: E402
from liere_jax.convert import files, official_args, tree  # noqa: E402
from liere_jax.config import model as model_spec  # noqa: E402
from liere_jax.model import ViT  # noqa: E402
from tests.helpers import tiny_model_config, tiny_spec  # noqa: E402

LOGIT_TOL, ROT_TOL = 1e-4, 1e-5
# Official parity: same math, but torch.matrix_exp vs our expm on b=64 blocks with generator
# norms in the hundreds (U[0, 2pi) init) and logits of ~25: 1.2e-4 measured.
OFFICIAL_TOL = 2e-4
ALL = ('none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere2', 'liere8',
       'liere16', 'liere6', 'paper_rope_mixed', 'paper_visionllama', 'pape', 'pape_ri')
SIZES = {1: (16, 28), 2: (16, 24), 3: (8, 12)}  # (training, larger) input sizes, patch 4.


def _random_params(reference, seed, init_scale=2 * np.pi):
  """Random values for every parameter (LayerNorms and biases included, the head too), drawn
  with numpy: building through the initialisers costs seconds of JAX compiles per model."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    shape, name = tuple(leaf.shape), path[-1]
    if name == 'generators':  # The LieRE init: U[0, init_scale), 2 pi by default.
      x = rng.uniform(0, init_scale, shape)
    elif name == 'kernel' and path[0] != 'head':
      x = rng.normal(size=shape) / np.sqrt(np.prod(shape[:-1]))
    elif name == 'scale':
      x = 1 + 0.1 * rng.normal(size=shape)
    elif name == 'bias':
      x = 0.1 * rng.normal(size=shape)
    else:  # head kernel, cls_token, abs embedding, rope_mixed freqs.
      x = rng.normal(size=shape)
    return jnp.asarray(x, jnp.float32)

  flat = {k: draw(k, v) for k, v in convert.flatten(reference).items()}
  return convert.unflatten_like(reference, flat)


def _jax_model(seed=0, qkv_bias=True, mlp_dim=0, **kw):
  """A tiny JAX ViT (tests/helpers.py config) with random parameters, in eval mode."""
  cfg = tiny_model_config(**kw)
  cfg.qkv_bias = qkv_bias
  cfg.mlp_dim = mlp_dim
  abstract = nnx.eval_shape(lambda: ViT(model_spec.resolve(cfg), rngs=nnx.Rngs(seed)))
  graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
  nnx.replace_by_pure_dict(params, _random_params(nnx.to_pure_dict(params), seed,
                                                  cfg.pe.init_scale))
  rest = jax.tree.map(lambda s: jax.random.key(seed) if jax.dtypes.issubdtype(
      s.dtype, jax.dtypes.prng_key) else jnp.zeros(s.shape, s.dtype), rest)
  model = nnx.merge(graphdef, params, rest)
  model.eval()
  return model, cfg


# The JAX side runs jitted, as train/eval run it, with XLA's backend optimisations off: that
# halves the compile time, which is most of this module's runtime (a new shape per case).
_FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}


@functools.partial(jax.jit, static_argnums=(0, 3, 4), compiler_options=_FAST_COMPILE)
def _forward(graphdef, state, x, grid, positions):
  """(logits, the encoding's context) in one compile; the context is what the forward uses."""
  model = nnx.merge(graphdef, state)
  ctx = model.pe_context(grid, positions)
  return model(x, ctx=ctx, positions=positions), ctx


def _jax_run(model, x, positions=None):
  """(logits, the context's array: rotations or biases; None for encodings without one)."""
  grid = tuple(s // p for s, p in zip(x.shape[1:-1], model.patch))
  logits, ctx = _forward(*nnx.split(model), jnp.asarray(x), grid, positions)
  if isinstance(ctx, encodings.Composed):  # 'liere8+pape': the rotary part's rotations.
    ctx = ctx.first
  arrays = jax.tree.leaves(ctx)  # string_cayley: (rotations, P); the rotations come first.
  if hasattr(ctx, 'rot'):  # RoPE's contexts hold angles: their rotations are made from them.
    arrays = [ctx.rot]
  return np.asarray(logits), np.asarray(arrays[0]) if arrays else None


def _jax_logits(model, x, positions=None):
  return _jax_run(model, x, positions)[0]


def _params(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _torch_model(model):
  tm = torch_vit.ViT.from_config(model.spec.to_json())
  tm.load_liere_state_dict(convert.torch_layout(_params(model), model.spec))
  return tm.eval()


def _inputs(n_dims, size, batch=2, seed=0):
  return np.random.default_rng(seed).normal(size=(batch,) + (size,) * n_dims + (3,)).astype(
      np.float32)


def _nchw(x):
  return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1)))


def _check_parity(jm, tm, n_dims, sizes, case, positions=None, patch=4):
  for size in sizes:
    x = _inputs(n_dims, size)
    y_jax, ctx_jax = _jax_run(jm, x, positions)
    grid = (size // patch,) * n_dims
    with torch.no_grad():
      y_torch = tm(_nchw(x), positions=positions).numpy()
      ctx_torch = tm.pe_context(grid, positions)
      if isinstance(ctx_torch, tuple):  # A composition: the rotary part's.
        ctx_torch = ctx_torch[0]
    diff = float(np.abs(y_jax - y_torch).max())
    assert diff <= LOGIT_TOL, f'{case} at size {size}: logits differ by {diff:.2e}'
    assert (ctx_jax is None) == (ctx_torch is None)
    if ctx_jax is not None:  # The same array, up to axes of size 1 (a shared layer or head).
      ctx_jax, ctx_torch = np.squeeze(ctx_jax), np.squeeze(ctx_torch.numpy())
      assert ctx_jax.shape == ctx_torch.shape, case
      kind = 'alibi bias' if 'alibi' in case else 'rotations'
      rdiff = float(np.abs(ctx_jax - ctx_torch).max())
      assert rdiff <= ROT_TOL, f'{case} at size {size}: {kind} differ by {rdiff:.2e}'


# ----------------------------------------------------------------------------------------------
# Parity JAX vs PyTorch.


@pytest.mark.parametrize('n_dims', [2, 3])
@pytest.mark.parametrize('pe', ALL)
def test_parity_every_encoding(pe, n_dims):
  """width 32, 2 heads: head_dim 16, so liere16 is one dense block and liere6 leaves 4 dims."""
  jm, _ = _jax_model(pe=pe, n_dims=n_dims, size=SIZES[n_dims][0], width=32, heads=2)
  _check_parity(jm, _torch_model(jm), n_dims, SIZES[n_dims], f'{pe} {n_dims}D')


@pytest.mark.parametrize('case', [
    dict(pe='liere8', n_dims=1),
    dict(pe='rope_mixed', n_dims=1),
    dict(pe='liere2', pool='mean'),
    dict(pe='abs', pool='mean'),
    dict(pe='liere8', qkv_bias=False, sizes='train'),
    dict(pe='liere8', share='heads', sizes='train'),
    dict(pe='liere2', share='layers'),
    dict(pe='liere2', share='all'),
    # Integer positions reach 5 here: the init range shrinks to keep the generator norms
    # (and so the float32 expm accuracy) where the normalized positions have them.
    dict(pe='liere8', positions='integer', init_scale=2 * np.pi / 3, sizes='larger'),
    dict(pe='rope_mixed', positions='normalized'),
    dict(pe='paper_visionllama', n_dims=1),
    dict(pe='liere8+pape', n_dims=2),
    dict(pe='liere8+pape', n_dims=3, sizes='train'),
    dict(pe='rope_mixed+pape_ri', n_dims=2),
], ids=lambda c: ','.join(f'{k}={v}' for k, v in c.items()))
def test_parity_variants(case):
  """(Each new shape costs a JAX compile of ~1-2 s: one size where the other adds nothing.)"""
  case = dict(case)
  n_dims = case.pop('n_dims', 2)
  sizes = {'train': SIZES[n_dims][:1], 'larger': SIZES[n_dims][1:],
           'both': SIZES[n_dims]}[case.pop('sizes', 'both')]
  jm, _ = _jax_model(n_dims=n_dims, size=SIZES[n_dims][0], width=32, heads=2, **case)
  _check_parity(jm, _torch_model(jm), n_dims, sizes, str(case))


def test_parity_positions_override_and_cached_context():
  jm, _ = _jax_model(pe='liere8', width=32, heads=2)
  tm = _torch_model(jm)
  _check_parity(jm, tm, 2, (24,), 'liere8 positions=rescaled', positions='rescaled')
  jr, _ = _jax_model(pe='rope_mixed', width=32, heads=2)
  _check_parity(jr, _torch_model(jr), 2, (24,), 'rope_mixed positions=rescaled',
                positions='rescaled')
  x = _nchw(_inputs(2, 24))
  with torch.no_grad():
    np.testing.assert_array_equal(tm(x, ctx=tm.pe_context((6, 6))).numpy(), tm(x).numpy())


@pytest.mark.parametrize('n_dims,sizes', [(1, (8, 20)), (2, (8, 12)), (3, (4,))])
def test_parity_abs_resize_down_and_up(n_dims, sizes):
  """jax.image.resize ('cubic' in 2D, else 'linear'; antialiased when shrinking), reproduced."""
  train = SIZES[n_dims][0]
  jm, _ = _jax_model(pe='abs', n_dims=n_dims, size=train, width=32, heads=2)
  _check_parity(jm, _torch_model(jm), n_dims, sizes, f'abs {n_dims}D resize')


def test_resize_weights_match_jax_image_resize():
  rng = np.random.default_rng(0)
  for method in ('cubic', 'linear'):
    for n_in, n_out in ((4, 6), (4, 9), (7, 3), (6, 2), (5, 5), (1, 4), (4, 1)):
      x = rng.normal(size=(n_in, 3)).astype(np.float32)
      want = np.asarray(jax.image.resize(jnp.asarray(x), (n_out, 3), method))
      got = torch_vit.resize_grid(torch.from_numpy(x), (n_out,), method).numpy()
      np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f'{method} {n_in}->{n_out}')


def test_channels_first_and_shape_errors():
  jm, _ = _jax_model(pe='liere8', width=32, heads=2)
  tm = _torch_model(jm)
  with pytest.raises(ValueError, match='channels-first'):
    tm(torch.zeros(1, 16, 16, 3))
  with pytest.raises(ValueError, match='not divisible'):
    tm(torch.zeros(1, 3, 18, 16))


# ----------------------------------------------------------------------------------------------
# Files: to_torch -> safetensors -> from_torch, wrong files, CLI errors.


def _full_config(model_cfg):
  return base_config(model=model_cfg, data=data_config(name='arrows'),
                     batch_size=2, total_steps=1, lr=1e-3)


def _save_run(tmp_path, name, model, cfg):
  workdir = str(tmp_path / name)
  checkpoint.save_params(workdir, _full_config(cfg), _params(model))
  return workdir


def _flat(params):
  return {'/'.join(map(str, k)): np.asarray(v) for k, v in convert.flatten(params).items()}


def _assert_bit_identical(a, b):
  fa, fb = _flat(a), _flat(b)
  assert fa.keys() == fb.keys()
  for key in fa:
    assert fa[key].dtype == fb[key].dtype and fa[key].shape == fb[key].shape, key
    assert np.array_equal(fa[key], fb[key]), f'{key} changed in the round trip'


def test_export_torch_fold_writes_a_rope_mixed_model_with_the_string_cayley_logits(tmp_path):
  jm, cfg = _jax_model(pe='string_cayley', width=32, heads=2)
  assert np.abs(_params(jm)['pe']['cayley']).max() > 0.1  # A non-trivial P.
  out = str(tmp_path / 'folded.safetensors')
  workdir = _save_run(tmp_path, 'run', jm, cfg)
  assert convert_cli.call(['to_torch', '--workdir', workdir, '--out', out, '--fold']) == 0
  with open(str(tmp_path / 'folded.json')) as f:
    assert json.load(f)['pe']['name'] == 'rope_mixed'
  tm = torch_vit.load_liere_safetensors(out).eval()
  assert not any('cayley' in k for k in tm.state_dict())
  x = _inputs(2, cfg.input_size[0])
  with torch.no_grad():
    diff = float(np.abs(_jax_logits(jm, x) - tm(_nchw(x)).numpy()).max())
  assert diff <= LOGIT_TOL


@pytest.mark.parametrize('kw', [dict(pe='liere8', share='heads'),
                                dict(pe='abs', n_dims=3, size=8, qkv_bias=False, pool='mean')],
                         ids=['liere8-2d', 'abs-3d-mean'])
def test_export_torch_import_round_trip_is_bit_identical(tmp_path, kw):
  jm, cfg = _jax_model(width=32, heads=2, **kw)
  workdir = _save_run(tmp_path, 'run', jm, cfg)
  out = str(tmp_path / 'model.safetensors')
  assert convert_cli.call(['to_torch', '--workdir', workdir, '--out', out]) == 0
  assert os.path.exists(str(tmp_path / 'model.json'))
  # PyTorch side: one call, same logits.
  tm = torch_vit.load_liere_safetensors(out).eval()
  n_dims = len(cfg.patch)
  x = _inputs(n_dims, cfg.input_size[0])
  with torch.no_grad():
    diff = float(np.abs(_jax_logits(jm, x) - tm(_nchw(x)).numpy()).max())
  assert diff <= LOGIT_TOL, kw
  # And back to JAX.
  back = str(tmp_path / 'back')
  assert convert_cli.call(['from_torch', '--safetensors', out, '--out_workdir', back]) == 0
  config2, params2 = checkpoint.load_params(back)[:2]
  _assert_bit_identical(_params(jm), params2)
  assert config2.model.to_dict() == checkpoint.read_config(workdir).model.to_dict()


def _state(model):
  return convert.torch_layout(_params(model), model.spec)


@pytest.mark.parametrize('edit,key,pattern', [
    ('missing', 'blocks.1.mlp.fc2.bias', 'missing key'),
    ('shape', 'pe.generators', r'has shape \(2, 2, 2, 2, 27\).*expects \(2, 2, 2, 2, 28\)'),
    ('extra', 'blocks.0.attn.qkv.extra', 'unexpected key'),
])
def test_wrong_file_names_the_key(tmp_path, edit, key, pattern):
  jm, cfg = _jax_model(pe='liere8', width=32, heads=2)
  state = _state(jm)
  if edit == 'missing':
    del state[key]
  elif edit == 'shape':
    state[key] = np.ascontiguousarray(state[key][..., :27])
  else:
    state[key] = np.zeros(3, np.float32)
  path = str(tmp_path / 'bad.safetensors')
  save_file(state, path)
  convert.write_json(str(tmp_path / 'bad.json'), convert.export_json(jm.spec, _full_config(cfg)))
  with pytest.raises(torch_vit.WeightsMismatchError) as e:
    torch_vit.load_liere_safetensors(path)
  assert f"'{key}'" in str(e.value) and re.search(pattern, str(e.value)), str(e.value)
  with pytest.raises(ValueError) as e:  # The JAX side (from_torch) checks the same.
    convert.from_torch_layout(load_file(path), jm.spec)
  message = str(e.value)
  assert f"'{key}'" in message and re.search(pattern.split('.*')[0], message), message
  # The CLI refuses before writing anything.
  with pytest.raises(SystemExit) as e:
    convert_cli.call(['from_torch', '--safetensors', path, '--out_workdir', str(tmp_path / 'w')])
  assert e.value.code == 2 and not os.path.exists(str(tmp_path / 'w'))


def test_first_mismatched_key_is_named():
  jm, _ = _jax_model(pe='liere8', width=32, heads=2)
  tm = torch_vit.ViT.from_config(jm.spec.to_json())
  state = _state(jm)
  for key in ('blocks.0.norm1.weight', 'head.bias'):
    del state[key]
  with pytest.raises(torch_vit.WeightsMismatchError,
                     match=r"missing key 'blocks.0.norm1.weight' \(and 1 more\)"):
    tm.load_liere_state_dict(state)


def test_cli_errors_exit_nonzero_before_writing(tmp_path, capsys):
  jm, cfg = _jax_model(pe='rope_axial', width=128, heads=2, qkv_bias=False, mlp_dim=64)
  workdir = _save_run(tmp_path, 'run', jm, cfg)
  safetensors = str(tmp_path / 'a.safetensors')
  cases = [
      (['to_torch', '--workdir', str(tmp_path / 'nope'), '--out', safetensors],
       'does not exist'),
      (['to_torch', '--workdir', workdir, '--out', str(tmp_path / 'a.pt')], 'should end with'),
      (['to_torch', '--workdir', workdir, '--step', '7', '--out', safetensors], '--step 7'),
      (['to_torch', '--workdir', workdir, '--step', '2', '--best', '--out', safetensors],
       'give one'),
      (['to_torch', '--workdir', workdir], 'to_torch needs --out'),
      (['to_official', '--workdir', workdir, '--out', str(tmp_path / 'a.pt')], 'VisionLlama'),
      (['to_official', '--workdir', workdir, '--out', str(tmp_path / 'a.pt'), '--fold'],
       '--fold does not apply to to_official'),
      (['from_official', '--state_dict', str(tmp_path / 'none.pt'), '--config',
        os.path.join(workdir, 'config.json'), '--out_workdir', str(tmp_path / 'w')],
       'does not exist'),
      (['from_official', '--state_dict', str(tmp_path / 'none.pt'), '--config', '{"pe": 1',
        '--out_workdir', str(tmp_path / 'w')], '--config is not valid JSON'),
  ]
  for argv, message in cases:
    with pytest.raises(SystemExit) as e:
      convert_cli.call(argv)
    assert e.value.code == 2, argv
    err = capsys.readouterr().err
    assert message in err and err.count('\n') == 1, (argv, err)
  with pytest.raises(app.UsageError, match='one of to_torch, to_official'):
    convert_cli.call(['torch', '--workdir', workdir, '--out', safetensors])
  assert sorted(os.listdir(tmp_path)) == ['run'], 'a failed command wrote something'


def _truncate_arrays(workdir, step):
  """Halves every array file of a checkpoint (a bad copy, a full disk)."""
  paths = glob.glob(os.path.join(workdir, 'checkpoints', str(step), 'state', '**', 'd', '*'),
                    recursive=True)
  assert paths
  for path in paths:
    os.truncate(path, os.path.getsize(path) // 2)


def test_to_torch_exports_the_newest_readable_checkpoint(tmp_path, capsys):
  jm, cfg = _jax_model(pe='liere8', width=32, heads=2)
  workdir = _save_run(tmp_path, 'run', jm, cfg)  # Step 0.
  newer = jax.tree.map(lambda x: np.asarray(x) + 1, _params(jm))
  checkpoint.save_params(workdir, _full_config(cfg), newer, step=1)
  _truncate_arrays(workdir, 1)
  out = str(tmp_path / 'model.safetensors')
  assert convert_cli.call(['to_torch', '--workdir', workdir, '--out', out]) == 0
  np.testing.assert_array_equal(load_file(out)['head.bias'], _params(jm)['head']['bias'])
  _truncate_arrays(workdir, 0)  # None readable: one line, nothing written.
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    convert_cli.call(['to_torch', '--workdir', workdir, '--out', str(tmp_path / 'b.safetensors')])
  err = capsys.readouterr().err
  assert e.value.code == 2 and 'No readable checkpoint' in err and err.count('\n') == 1, err
  assert not os.path.exists(str(tmp_path / 'b.safetensors'))


def test_an_old_export_json_reads_with_the_fields_of_its_time():
  """A model JSON written before dropout_sites / pe.jitter existed gets the values its run had
  (the fields' `added` values), not today's defaults, in every shape that can lack them."""
  cfg = tiny_model_config('liere8')
  config = _full_config(cfg)
  assert tuple(cfg.dropout_sites) != MODEL.added()['dropout_sites']  # Else no test.
  new = convert.export_json(model_spec.resolve(cfg), config)
  old = json.loads(json.dumps(new))
  for section in (old, old['source_config']['model']):
    del section['dropout_sites'], section['pe']['jitter']
  plain = {k: v for k, v in old.items() if k != 'source_config'}
  workdir_config = old['source_config']
  for obj in (old, plain, workdir_config, workdir_config['model']):
    _, model = convert.config_from_json(obj, 'test')
    assert model.dropout_sites == MODEL.added()['dropout_sites'], obj.keys()
    assert model.pe.jitter == PE.added()['jitter'], obj.keys()
  for obj in (new, {k: v for k, v in new.items() if k != 'source_config'}):  # Today's: as is.
    assert convert.config_from_json(obj, 'test')[1] == model_spec.resolve(cfg)


# ----------------------------------------------------------------------------------------------
# The official StanfordMIMI/LieRE layout.

OFFICIAL_CHECKOUT = os.environ.get('LIERE_OFFICIAL_CHECKOUT')  # No default: skipped when unset.
OFFICIAL_CASES = [
    dict(pe='liere8', share='layers'),
    dict(pe='liere64', share='all'),
    dict(pe='liere2', share='layers'),  # The official "rope_mixed".
    dict(pe='liere6', share='layers'),  # 4 head dims left unrotated.
    dict(pe='liere8', share='layers', positions='integer'),  # generators scaled by n - 1.
    dict(pe='liere8', share='none', equal_layers=True),
    dict(pe='rope_mixed', equal_layers=True),
    dict(pe='abs'),
    dict(pe='none'),
    dict(pe='liere8', share='all', n_dims=3),
    dict(pe='paper_rope_mixed', share='layers'),  # liere2 by another name.
    dict(pe='paper_visionllama'),  # The official "tiled" VisionLlama: no parameters.
    dict(pe='paper_visionllama', n_dims=3),  # 10 pairs per axis, 4 head dims unrotated.
]


def _official_jax_model(pe, n_dims=2, equal_layers=False, **kw):
  jm, cfg = _jax_model(pe=pe, n_dims=n_dims, size=16 if n_dims == 2 else 8, width=128,
                       heads=2, mlp_dim=64, qkv_bias=False, **kw)
  if equal_layers:  # Every layer slice equal: the case the layer-0 bug does not touch.
    if pe == 'rope_mixed':
      jm.pe.freqs[...] = jnp.broadcast_to(jm.pe.freqs[:, :1], jm.pe.freqs.shape)
    else:
      jm.pe.generators[...] = jnp.broadcast_to(jm.pe.generators[:1], jm.pe.generators.shape)
  return jm, cfg


def _official_rope_vit():
  """The official RoPEViT class, or None (LIERE_OFFICIAL_CHECKOUT unset, or no einops)."""
  if not OFFICIAL_CHECKOUT:
    return None
  assert os.path.isfile(os.path.join(OFFICIAL_CHECKOUT, 'models', 'rope_vit.py')), (
      f'LIERE_OFFICIAL_CHECKOUT={OFFICIAL_CHECKOUT} has no models/rope_vit.py; point it to a '
      'checkout of github.com/StanfordMIMI/LieRE or unset it.')
  try:
    importlib.import_module('einops')
  except ImportError:
    return None
  name = '_liere_official_models'
  if name not in sys.modules:
    if importlib.util.find_spec('ipdb') is None:  # Imported (never used) by the official code.
      sys.modules['ipdb'] = types.ModuleType('ipdb')
    pkg = types.ModuleType(name)
    pkg.__path__ = [os.path.join(OFFICIAL_CHECKOUT, 'models')]
    sys.modules[name] = pkg
  return importlib.import_module(f'{name}.rope_vit').RoPEViT


def _official_rope_vit_or_skip():
  """The official RoPEViT class; skips the test (with the reason) when there is none."""
  rope_vit = _official_rope_vit()
  if rope_vit is None:
    pytest.skip('needs the official code: set LIERE_OFFICIAL_CHECKOUT to a StanfordMIMI/LieRE '
                'checkout (and install einops); tests/test_official_fixtures.py checks its '
                'numbers in every run')
  return rope_vit


def _case_id(c):
  return ','.join(f'{k}={v}' for k, v in c.items())


@pytest.mark.parametrize('case', OFFICIAL_CASES, ids=_case_id)
def test_official_layout_round_trip(case):
  """Without the official code: official_layout -> from_official_layout gives the same
  params and logits."""
  jm, cfg = _official_jax_model(**case)
  with warnings.catch_warnings():
    warnings.simplefilter('error', convert.Layer0BugWarning)  # No warning: nothing is lost.
    state, kw = convert.official_layout(_params(jm), jm.spec)
    back = convert.from_official_layout(state, jm.spec)
  if jm.spec.pe.positions == 'integer':
    # Multiplied by n - 1 on export, divided on import: equal up to rounding.
    for key, value in _flat(_params(jm)).items():
      np.testing.assert_allclose(_flat(back)[key], value, rtol=1e-6, err_msg=key)
  else:
    _assert_bit_identical(_params(jm), back)
  jm2 = nnx.clone(jm)
  params2 = nnx.state(jm2, nnx.Param)
  nnx.replace_by_pure_dict(params2, back)
  nnx.update(jm2, params2)
  x = _inputs(len(cfg.patch), cfg.input_size[0])
  diff = float(np.abs(_jax_logits(jm, x) - _jax_logits(jm2, x)).max())
  assert diff <= LOGIT_TOL, case


def _official_logits(rope_vit, state, kw, x):
  model = rope_vit(**kw)
  model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()},
                        strict=True)
  model.eval()
  with torch.no_grad():
    return model(_nchw(x)).numpy()


@pytest.mark.parametrize('case', OFFICIAL_CASES, ids=_case_id)
def test_official_rope_vit_parity(case, capsys):
  rope_vit = _official_rope_vit_or_skip()
  jm, cfg = _official_jax_model(**case)
  state, kw = convert.official_layout(_params(jm), jm.spec)
  x = _inputs(len(cfg.patch), cfg.input_size[0])
  y_official = _official_logits(rope_vit, state, kw, x)
  diff = float(np.abs(_jax_logits(jm, x) - y_official).max())
  assert diff <= OFFICIAL_TOL, f'{case}: official logits differ by {diff:.2e}'


def _per_layer_export_and_import():
  """A per-layer LieRE8 model exported to the official layout and imported back (both warn):
  the model, its config, the official state and kwargs, and the imported generators."""
  jm, cfg = _official_jax_model(pe='liere8', share='none')
  with pytest.warns(convert.Layer0BugWarning, match="layer 0's rotations in every layer"):
    state, kw = convert.official_layout(_params(jm), jm.spec)
  with pytest.warns(convert.Layer0BugWarning, match='importing layer 0'):
    back = convert.from_official_layout(state, jm.spec)
  return jm, cfg, state, kw, back['pe']['generators']


def test_per_layer_export_warns_and_import_copies_layer_0_to_every_layer():
  _, _, state, kw, gen = _per_layer_export_and_import()
  assert state['position_encoder.generator_raw_params'].shape == (2, 2, 2 * 8, 8, 8)
  assert kw['rotary_embedding_per_layer'] and kw['rotary_embedding_per_head']
  np.testing.assert_array_equal(gen[1], gen[0])  # What the official model computes.


def test_the_official_model_computes_the_layer0_bug_as_the_import_models_it():
  rope_vit = _official_rope_vit_or_skip()
  jm, _, state, kw, gen = _per_layer_export_and_import()
  x = _inputs(2, 16)
  y_official = _official_logits(rope_vit, state, kw, x)
  y_ours = _jax_logits(jm, x)
  jm.pe.generators[...] = jnp.asarray(gen)
  y_bug = _jax_logits(jm, x)
  assert np.abs(y_ours - y_official).max() > 1e-2  # The bug changes the model...
  diff = float(np.abs(y_bug - y_official).max())  # ...exactly as modelled by the import.
  assert diff <= OFFICIAL_TOL


@pytest.mark.parametrize('kw,message', [
    (dict(pe='rope_axial'), 'VisionLlama.*pe=paper_visionllama is the official one'),
    (dict(pe='paper_visionllama', positions='integer'), 'use positions=normalized'),
    (dict(pe='sincos'), 'no sincos encoding'),
    (dict(pe='alibi'), 'no alibi encoding'),
    (dict(pe='liere8', pool='mean'), "pool='mean'"),
    (dict(pe='liere8', width=64, heads=2), 'head_dim=32'),
    (dict(pe='liere8', n_dims=1), '1D inputs'),
    (dict(pe='liere8', qkv_bias=True), 'qkv bias'),
])
def test_official_export_refuses_what_it_cannot_represent(kw, message):
  kw = {**dict(width=128, heads=2, mlp_dim=64, qkv_bias=False, size=16), **kw}
  jm, _ = _jax_model(**kw)
  if kw['qkv_bias']:
    jm.blocks[0].attn.qkv.bias[...] = jnp.ones_like(jm.blocks[0].attn.qkv.bias[...])
  with pytest.raises(ValueError, match=message):
    convert.official_layout(_params(jm), jm.spec)


def _cli_export(tmp_path):
  """A LieRE8 run exported by `convert to_official`: the model, the .pt path, its state."""
  jm, cfg = _official_jax_model(pe='liere8', share='layers')
  workdir = _save_run(tmp_path, 'run', jm, cfg)
  out = str(tmp_path / 'official.pt')
  assert convert_cli.call(['to_official', '--workdir', workdir, '--out', out]) == 0
  return jm, out, torch.load(out, weights_only=True)


def test_official_cli_round_trip(tmp_path):
  """to_official (.pt + .json) -> from_official, through files and torch.load."""
  jm, out, state = _cli_export(tmp_path)
  assert state['position_encoder.generator_raw_params'].shape == (2, 1, 2 * 8, 8, 8)
  back = str(tmp_path / 'back')
  assert convert_cli.call(['from_official', '--state_dict', out, '--config',
                           str(tmp_path / 'official.json'), '--out_workdir', back]) == 0
  _assert_bit_identical(_params(jm), checkpoint.load_params(back)[1])


def test_the_official_model_reads_a_cli_export_with_our_logits(tmp_path):
  rope_vit = _official_rope_vit_or_skip()
  jm, _, state = _cli_export(tmp_path)
  with open(str(tmp_path / 'official.json')) as f:
    kw = json.load(f)['rope_vit_kwargs']
  x = _inputs(2, 16)
  diff = float(np.abs(_official_logits(rope_vit, {k: v.numpy() for k, v in state.items()},
                                       kw, x) - _jax_logits(jm, x)).max())
  assert diff <= OFFICIAL_TOL


@pytest.mark.parametrize('pe', ['paper_visionllama', 'paper_rope_mixed'])
def test_import_official_with_the_official_model_description(tmp_path, pe):
  """An official checkpoint plus only its RoPEViT kwargs (no liere_jax config, given inline)
  imports as the paper's encoding, with the same parameters."""
  jm, cfg = _official_jax_model(pe=pe, **({'share': 'layers'} if pe == 'paper_rope_mixed' else {}))
  out = str(tmp_path / 'official.pt')
  workdir = _save_run(tmp_path, 'run', jm, cfg)
  assert convert_cli.call(['to_official', '--workdir', workdir, '--out', out]) == 0
  with open(str(tmp_path / 'official.json')) as f:
    kw = json.load(f)['rope_vit_kwargs']
  back = str(tmp_path / 'back')  # --config: the JSON itself.
  assert convert_cli.call(['from_official', '--state_dict', out, '--config', json.dumps(kw),
                           '--out_workdir', back]) == 0
  config, params = checkpoint.load_params(back)[:2]
  assert config.model.pe.name == pe and config.model.pe.share == (
      'layers' if pe == 'paper_rope_mixed' else 'none')
  _assert_bit_identical(_params(jm), params)


@pytest.mark.parametrize('arch,pe,share', [
    ('visionllama', 'paper_visionllama', 'none'), ('rope_mixed', 'paper_rope_mixed', 'layers'),
    ('liere', 'liere8', 'layers'), ('absolute', 'abs', 'none')])
def test_official_init_args_map_to_the_paper_encodings(arch, pe, share):
  """The official YAML's model section (LiereImageClassification init_args) -> our config;
  exporting that config gives back the RoPEViT arguments the official module builds."""
  init_args = dict(imsize=32, patch_size=[4, 4], model_architecture=arch, model_size='base',
                   input_dimensionality=2, generator_dim=8, rotary_embedding_per_layer=False,
                   rotary_embedding_per_head=True)
  for obj in ({'model': {'class_path': 'LiereImageClassification', 'init_args': init_args}},
              init_args):
    config, model = convert.config_from_json(obj, 'test')
    m = config.model
    assert (m.pe.name, m.pe.share, m.width, m.patch, m.input_size) == (
        pe, share, 768, (4, 4), (32, 32))
  kw, spec = convert.rope_vit_kwargs(init_args), convert.official_spec(model)
  for key in ('dim', 'depth', 'heads', 'mlp_dim', 'positional_encoding_type', 'phase_type',
              'generator_dim', 'rotary_embedding_per_layer', 'rotary_embedding_per_head'):
    assert spec.get(key) == kw.get(key), key


# The official init_args that a run's YAML leaves out take the official code's defaults
# (models/model_args.py), as the official LiereImageClassification does.
def test_init_args_without_size_classes_or_dims_take_the_official_defaults():
  kw = official_args.rope_vit_kwargs({'model_architecture': 'liere', 'imsize': 32,
                                      'patch_size': 4})
  assert (kw['dim'], kw['depth'], kw['heads'], kw['mlp_dim']) == official_args.OFFICIAL_SIZES[
      'tiny']
  assert (kw['num_classes'], kw['input_dimensionality'], kw['generator_dim']) == (100, 1, 64)
  assert not kw['rotary_embedding_per_layer'] and not kw['rotary_embedding_per_head']


# ----------------------------------------------------------------------------------------------
# Inputs the converters cannot use stop in one line naming what is wrong.


def test_a_model_json_that_is_no_object_is_named_by_its_flag_and_path(tmp_path):
  path = tmp_path / 'model.json'
  path.write_text('[1, 2]')
  with pytest.raises(ValueError, match=re.escape(f'--config {path} is not a JSON object.')):
    files.read_config_arg(str(path))


def test_a_checkpoint_missing_a_parameter_is_named_as_the_checkpoint():
  model = tiny_spec('liere8')
  params = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), convert.abstract_params(model))
  del params['head']['bias']
  with pytest.raises(ValueError, match=re.escape(
      "The checkpoint does not match the model config: missing key 'head/bias'.")):
    tree.check_params(params, model)


def test_a_checkpoint_with_one_unexpected_parameter_is_refused_naming_it_alone():
  model = tiny_spec('liere8')
  params = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), convert.abstract_params(model))
  params['head']['extra'] = np.zeros(3, np.float32)
  with pytest.raises(ValueError, match=re.escape(
      "The checkpoint does not match the model config: unexpected key 'head/extra'.")):
    tree.check_params(params, model)
