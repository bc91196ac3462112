"""The official checkpoint format in every run, without the official code: the numbers the
official StanfordMIMI/LieRE model computed (tests/fixtures/official/, written by
scripts/official_fixtures.py; tests/official_fixtures.py reads them).

For each tiny official model (LieRE8, the paper's RoPE-Mixed, VisionLlama, absolute; 2D and 3D;
shared and per-layer generators): our export (`official_layout`, `convert to_official`) writes
the official state_dict's keys and shapes; our import (`from_official_layout`,
`convert from_official`, `model_init` from an official Lightning `.ckpt`) of the official
parameters gives the official logits, under the official normalised positions and under our
integer ones (generators divided by n - 1); and export after import gives the official values
back. test_convert.py's parity tests run the official code itself when a checkout is around.
"""
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')

from flax import nnx  # noqa: E402

from liere_jax import checkpoint, convert, model_init, param_tree  # noqa: E402
from liere_jax.config import base_config, data_config, model_config
from liere_jax.convert import __main__ as convert_cli  # noqa: E402
from liere_jax.config import run as run_spec  # noqa: E402
from liere_jax.config.model import resolve  # noqa: E402
from liere_jax.model import ViT  # noqa: E402
from tests import foreign_formats, helpers, official_fixtures  # noqa: E402

FIXTURES = official_fixtures.load()
CASES = FIXTURES['cases']
# The official forward ran in float64 (the script); ours in float32: torch's matrix_exp against
# our expm, and float32 rounding (test_port.OFFICIAL_TOL, measured there at 1.2e-4).
OFFICIAL_TOL = 2e-4


def _case(name, positions=None):
  """(our model for the case's official arguments, the official state, the input, the official
  logits)."""
  case = CASES[name]
  config, model = convert.config_from_json(case['rope_vit_kwargs'], name)
  if positions:
    config.model.pe.positions = positions
    model = resolve(config.model)
  state = official_fixtures.state_dict(case['state_dict'], case['value_seed'], case['zeros'])
  x = official_fixtures.inputs(case['input_shape'], case['input_seed'])
  return model, state, x, np.asarray(case['logits'], np.float32)


def _quietly(fn, *args):
  """fn(*args), without the per-layer cases' Layer0BugWarning (test_port tests it)."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', convert.Layer0BugWarning)
    return fn(*args)


def _logits(spec, params, x):
  model = ViT(spec, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
  nnx.update(model, state)
  model.eval()
  return np.asarray(helpers.forward(model, jnp.asarray(x)))


def _assert_official_logits(spec, params, x, want, what):
  diff = float(np.abs(_logits(spec, params, x) - want).max())
  assert diff <= OFFICIAL_TOL, f'{what}: {diff:.2e} from the official logits'


def test_the_fixtures_name_the_official_commit_and_cover_the_paper_encodings():
  assert len(FIXTURES['official']['commit']) == 40
  kinds = {(c['rope_vit_kwargs']['positional_encoding_type'],
            c['rope_vit_kwargs'].get('generator_dim'), c['rope_vit_kwargs']['input_dimensionality'])
           for c in CASES.values()}
  assert {('liere', 8, 2), ('liere', 2, 2), ('tiled', None, 2), ('absolute', None, 2),
          ('liere', 8, 3), ('tiled', None, 3)} <= kinds


@pytest.mark.parametrize('name', sorted(CASES))
def test_export_writes_the_official_keys_and_shapes(name):
  model, _, _, _ = _case(name)
  params = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), convert.abstract_params(model))
  state, kw = _quietly(convert.official_layout, params, model)
  assert {k: list(v.shape) for k, v in state.items()} == dict(
      (k, shape) for k, shape in CASES[name]['state_dict'])
  official_kw = CASES[name]['rope_vit_kwargs']
  assert {k: v for k, v in kw.items() if k in official_kw} == {
      k: v for k, v in official_kw.items() if k in kw}


@pytest.mark.parametrize('name,positions', [(n, None) for n in sorted(CASES)] + [
    ('liere8_2d', 'integer')])
def test_import_of_official_parameters_gives_the_official_logits_and_exports_them_back(
    name, positions):
  model, state, x, want = _case(name, positions)
  params = _quietly(convert.from_official_layout, state, model)
  _assert_official_logits(model, params, x, want, f'{name} positions={positions}')
  back, _ = _quietly(convert.official_layout, params, model)
  per_layer = CASES[name]['rope_vit_kwargs'].get('rotary_embedding_per_layer')
  for key, value in state.items():
    ours = back[key]
    if key == official_fixtures.GENERATORS:  # The official model reads the strict upper
      value, ours = np.triu(value, 1), np.triu(ours, 1)  # triangles, of layer 0 only when
      if per_layer:  # per layer (test_port: its layer-0 bug).
        value, ours = value[:, :1], ours[:, :1]  # [n, layers, heads * blocks, b, b]
    np.testing.assert_allclose(ours, value, rtol=1e-6, atol=0, err_msg=key)


def test_convert_cli_reads_and_writes_an_official_state_dict(tmp_path):
  """from_official (an official .pt and its RoPEViT arguments) -> a run with the official
  logits; to_official of that run -> the same official values."""
  model, state, x, want = _case('liere8_2d')
  pt, back = str(tmp_path / 'official.pt'), str(tmp_path / 'run')
  torch.save({k: torch.from_numpy(v) for k, v in state.items()}, pt)
  kw = json.dumps(CASES['liere8_2d']['rope_vit_kwargs'])
  assert convert_cli.call(['from_official', '--state_dict', pt, '--config', kw,
                           '--out_workdir', back]) == 0
  config, params = checkpoint.load_params(back)[:2]
  _assert_official_logits(resolve(config.model), params, x, want, 'from_official')
  out = str(tmp_path / 'again.pt')
  assert convert_cli.call(['to_official', '--workdir', back, '--out', out]) == 0
  again = torch.load(out, weights_only=True)
  assert sorted(again) == sorted(state)
  for key, value in state.items():
    upper = (lambda a: np.triu(a, 1)) if key == official_fixtures.GENERATORS else np.asarray
    np.testing.assert_array_equal(upper(again[key].numpy()), upper(value), err_msg=key)


def test_model_init_from_an_official_lightning_checkpoint_gives_the_official_logits(tmp_path):
  """The official LightningModule holds the RoPEViT as `self.model`: its checkpoint's
  state_dict keys are 'model.' + the RoPEViT's, beside Lightning's optimizer, schedule, loop,
  callback and hyper-parameter entries (tests/foreign_formats.py)."""
  model, state, x, want = _case('liere8_2d')
  path = str(tmp_path / 'epoch=199-step=600.ckpt')
  foreign_formats.write_lightning_checkpoint(path, state, epoch=199)
  data = data_config(name='arrows', grid=model.train_grid[0])
  section = convert.config_from_json(CASES['liere8_2d']['rope_vit_kwargs'], 'liere8_2d')[0].model
  config = base_config(model=section, data=data, batch_size=8, total_steps=2, lr=1e-3)
  params = model_init.load(run_spec.resolve(config, 1), path)
  assert all(v is not None for v in params.values())
  tree = convert.unflatten_like(convert.abstract_params(model), params)
  _assert_official_logits(model, tree, x, want, 'model_init')


def test_an_official_checkpoint_saved_on_a_gpu_loads_on_a_machine_without_one(tmp_path):
  """The official runs trained on GPUs: their tensors are tagged 'cuda:0' in the file."""
  _, state, _, _ = _case('liere8_2d')
  path = str(tmp_path / 'gpu.ckpt')
  with foreign_formats.saved_on(torch, 'cuda:0'):
    foreign_formats.write_lightning_checkpoint(path, state)
  assert not torch.cuda.is_available()
  loaded = convert.load_official_state_dict(path)
  assert sorted(loaded) == sorted(state)
  for key, value in state.items():
    np.testing.assert_array_equal(loaded[key], value, err_msg=key)


def test_an_official_checkpoint_holding_python_objects_is_refused_without_unpickling(tmp_path):
  """Lightning 1.x stored hyper-parameters as an argparse.Namespace: torch.load with
  weights_only=True refuses it, and so does the import, in one line."""
  import argparse
  _, state, _, _ = _case('liere8_2d')
  path = str(tmp_path / 'old.ckpt')
  torch.save({'state_dict': {f'model.{k}': torch.from_numpy(v) for k, v in state.items()},
              'hparams': argparse.Namespace(learning_rate=1e-3)}, path)
  with pytest.raises(ValueError) as e:
    convert.load_official_state_dict(path)
  assert str(e.value) == (
      f'--state_dict {path} cannot be read with torch.load(weights_only=True) (UnpicklingError): '
      'it is no plain state_dict of tensors, and this tool never unpickles arbitrary objects.')


# The official RoPEViT's flags: a generator set per layer / per head, or one shared.
@pytest.mark.parametrize('share,per_layer,per_head', [
    ('none', True, True), ('layers', False, True), ('heads', True, False), ('all', False, False)])
def test_export_sets_the_official_per_layer_and_per_head_flags_of_each_sharing(
    share, per_layer, per_head):
  model = helpers.tiny_model_config('liere8', width=128, heads=2, share=share)
  model.qkv_bias = False
  kw = convert.official_spec(resolve(model))
  assert (kw['rotary_embedding_per_layer'], kw['rotary_embedding_per_head']) == (per_layer,
                                                                                 per_head)


# The official repository's test models (its tests/test_forward.py): LiereImageClassification
# with model_size 'tiny', imsize 32, patch 4, in 2D and 3D, for each architecture; and the
# encoding a user names for it.
OFFICIAL_TEST_MODELS = {'liere': 'liere64', 'rope_mixed': 'rope_mixed', 'absolute': 'abs',
                        'visionllama': 'paper_visionllama'}


@pytest.mark.parametrize('n', [2, 3])
@pytest.mark.parametrize('arch', sorted(OFFICIAL_TEST_MODELS))
def test_convert_cli_imports_each_official_test_model_from_a_model_json_a_user_writes(
    tmp_path, arch, n):
  """`convert from_official` with a model JSON that names only what a user would: the run holds
  the model those values build (today's defaults for the rest, not the values that reproduce
  runs stored before a field existed) with the official state_dict's parameters."""
  init_args = dict(model_architecture=arch, model_size='tiny', imsize=32, patch_size=4,
                   input_dimensionality=n)
  official = convert.config_from_json(init_args, arch)[1]
  layout = convert.official_layout(jax.tree.map(lambda a: np.zeros(a.shape, a.dtype),
                                                convert.abstract_params(official)), official)[0]
  state = official_fixtures.state_dict([(k, v.shape) for k, v in layout.items()], seed=n,
                                       zeros=() if arch == 'absolute' else ('pos_embedding',))
  pt, out = str(tmp_path / 'official.pt'), str(tmp_path / 'run')
  torch.save({k: torch.from_numpy(v) for k, v in state.items()}, pt)
  user = dict(variant='paper_tiny', patch=[4] * n, input_size=[32] * n, channels=3,
              num_classes=100, pe={'name': OFFICIAL_TEST_MODELS[arch]})
  assert convert_cli.call(['from_official', '--state_dict', pt, '--config', json.dumps(user),
                           '--out_workdir', out]) == 0
  config, params = checkpoint.load_params(out)[:2]
  spec = resolve(model_config(**{**user, 'pe': user['pe']['name']}))
  assert resolve(config.model) == spec
  want = param_tree.flatten(convert.from_official_layout(state, spec))
  got = param_tree.flatten(params)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=str(key))
