"""The model section resolved (liere_jax/config/model.py): one place for every derived value;
the declarations every config field is built from (liere_jax/config/)."""
import dataclasses
import json
import os
import re

import pytest

from liere_jax.config import model as model_spec
from liere_jax import param_tree
from liere_jax.model import abstract_params
from liere_jax.config import run as run_spec
from liere_jax.config.data import DATA
from liere_jax.config.model import MODEL, PE
from liere_jax.encodings import registry
from tests.helpers import load_config, tiny_model_config


def test_variant_dims_and_derived_values():
  s = model_spec.resolve(load_config('configs/cifar100.py', 'variant=Ti,pe=liere8').model)
  assert (s.width, s.depth, s.heads, s.head_dim, s.mlp_dim) == (192, 12, 3, 64, 768)
  assert s.train_grid == (8, 8) and s.num_prefix == 1 and s.dropout == 0.1
  assert (s.pe.family, s.pe.block, s.pe.positions) == ('liere', 8, 'normalized')
  assert (s.pe.layers, s.pe.heads) == (12, 3)


def test_the_model_is_resolved_once_at_the_edge_and_the_library_takes_the_spec():
  s = model_spec.resolve(tiny_model_config())
  with pytest.raises(TypeError, match='resolved already'):
    model_spec.resolve(s)
  from flax import nnx
  from liere_jax.model import ViT
  with pytest.raises(TypeError, match=re.escape(
      'ViT takes a ModelSpec, not a ConfigDict; build it with '
      'ViT(liere_jax.config.model.resolve(config.model), ...).')):
    ViT(tiny_model_config(), rngs=nnx.Rngs(0))


@pytest.mark.parametrize('share,stacks', [('none', (2, 2)), ('layers', (1, 2)),
                                          ('heads', (2, 1)), ('all', (1, 1))])
def test_share_gives_the_generator_stacks(share, stacks):
  s = model_spec.resolve(tiny_model_config(pe='liere4', share=share))
  assert (s.pe.layers, s.pe.heads) == stacks


def test_position_defaults_follow_the_encoding_and_an_explicit_mode_wins():
  modes = {pe: model_spec.resolve(tiny_model_config(pe=pe)).pe.positions
           for pe in ('none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere8')}
  assert modes == dict(none='integer', abs='integer', sincos='integer', rope_axial='integer',
                       rope_mixed='integer', alibi='integer', liere8='normalized')
  s = model_spec.resolve(tiny_model_config(pe='rope_mixed', positions='normalized'))
  assert s.pe.positions == 'normalized'


def test_scan_layers_defaults_by_depth_and_an_explicit_value_wins():
  for variant, scanned in (('L', True), ('B', False), ('Ti', False)):
    cfg = load_config('configs/cifar100.py', f'variant={variant}')
    assert cfg.model.scan_layers is None
    assert model_spec.resolve(cfg.model).scan_layers == scanned, variant
    cfg.model.scan_layers = not scanned  # As --config.model.scan_layers=... sets it.
    assert model_spec.resolve(cfg.model).scan_layers == (not scanned), variant
  cfg = load_config('configs/arrows.py')
  cfg.model.depth = model_spec.SCAN_FROM_DEPTH  # Any model this deep, not only ViT-L.
  assert model_spec.resolve(cfg.model).scan_layers


def test_json_round_trip():
  s = model_spec.resolve(tiny_model_config(pe='liere8', n_dims=3, pool='mean'))
  obj = json.loads(json.dumps(s.to_json()))
  assert model_spec.ModelSpec.from_json(obj) == s
  del obj['pe']
  with pytest.raises(ValueError, match=r"needs \['pe'\]"):
    model_spec.ModelSpec.from_json(obj)


@pytest.mark.parametrize('field,value,match', [
    ('foo', 1, r"model.foo is not a field; the fields of model are \['variant'"),
    ('variant', 'XL', r"model.variant='XL' is unknown"),
    ('pool', 'max', r"model.pool='max' is unknown"),
    ('dtype', 'float16', r"model.dtype='float16' is unknown"),
    ('dropout', 1.0, r'model.dropout=1.0 must be in \[0, 1\)'),
    ('heads', 3, r'model.width=32 is not divisible by model.heads=3'),
])
def test_bad_model_fields_name_the_value(field, value, match):
  cfg = tiny_model_config().to_dict()
  cfg[field] = value
  with pytest.raises(ValueError, match=match):
    model_spec.resolve(cfg)


def test_unknown_pe_field_names_the_valid_ones():
  cfg = tiny_model_config().to_dict()
  cfg['pe']['scale'] = 1.
  with pytest.raises(ValueError, match=r"model.pe.scale is not a field.*'init_scale'"):
    model_spec.resolve(cfg)


NON_LIERE = tuple(name.replace('<b>', '8') for name in registry.NAMES
                  if registry.facts(name.replace('<b>', '8')).family != 'liere')


def test_the_options_some_encodings_read_are_the_declared_ones_at_the_configs_defaults():
  pe = tiny_model_config().pe
  assert {'share', 'init_scale', 'expm', 'expm_precision'} <= set(model_spec.PE_OPTION_DEFAULTS)
  assert set(model_spec.PE_OPTION_DEFAULTS) == set(registry.FAMILIES['liere'].option_names) | set(
      registry.FAMILIES['pape'].option_names)
  assert {key: pe[key] for key in model_spec.PE_OPTION_DEFAULTS} == model_spec.PE_OPTION_DEFAULTS


@pytest.mark.parametrize('pe', NON_LIERE)
@pytest.mark.parametrize('option,value', [('share', 'layers'), ('init_scale', 1.0),
                                          ('expm', 'scipy')])
def test_options_of_other_encodings_are_refused(pe, option, value):
  """share, init_scale and expm are LieRE's: set for another encoding they name the option, the
  encoding and the fix, instead of being ignored; at their defaults they pass."""
  model_spec.resolve(tiny_model_config(pe=pe))
  match = (rf"model.pe.{option}={value!r} does not apply to pe={pe} \(only to liere<b>\); "
           rf"leave it at")
  with pytest.raises(ValueError, match=match):
    model_spec.resolve(tiny_model_config(pe=pe, **{option: value}))


@pytest.mark.parametrize('pe', ('none', 'abs', 'sincos'))
def test_positions_of_positionless_encodings_are_refused(pe):
  with pytest.raises(ValueError, match=rf"model.pe.positions='integer' does not apply to "
                                       rf"pe={pe} \(it reads no positions\); leave it at None"):
    model_spec.resolve(tiny_model_config(pe=pe, positions='integer'))
  with pytest.raises(ValueError, match=rf"pe='{pe}' reads no positions: set it to 0"):
    model_spec.resolve(tiny_model_config(pe=pe, jitter=0.5))
  assert model_spec.resolve(tiny_model_config(pe='liere8', positions='integer',
                                            init_scale=1.0, share='all'))


@pytest.mark.parametrize('config', ('arrows', 'cifar100', 'imagenet', 'ucf101'))
def test_every_shipped_config_resolves_for_every_encoding(config):
  for name in registry.NAMES:
    pe = name.replace('<b>', '8')
    s = model_spec.resolve(load_config(f'configs/{config}.py', f'pe={pe}').model)
    assert s.pe.name == pe


def test_the_shaping_fields_are_the_fields_that_shape_the_parameters():
  """Fields outside param_tree.SHAPING leave the parameter tree as it is; each field inside it
  changes the tree for some model."""
  base = model_spec.resolve(tiny_model_config(pe='liere8'))
  fields = param_tree.shaping_fields

  def tree(s):
    return {k: v.shape for k, v in param_tree.flatten(abstract_params(s)).items()}

  same = dict(dtype='bfloat16', remat='block', scan_layers=True, dropout=0.1, init='official',
              dropout_sites=('attn',), layer_norm_eps=1e-6, variant='S')
  for key, value in same.items():
    other = dataclasses.replace(base, **{key: value})
    assert fields(other) == fields(base), key
    assert tree(other) == tree(base), key
  for key, value in dict(positions='integer', init_scale=1.0, expm='scipy',
                         jitter=1.0).items():
    other = dataclasses.replace(base, pe=dataclasses.replace(base.pe, **{key: value}))
    assert fields(other) == fields(base), key
  for cfg in (tiny_model_config(pe='liere8', share='layers'), tiny_model_config(pe='liere4'),
              tiny_model_config(pe='rope_mixed'), tiny_model_config(pe='liere8', width=48),
              tiny_model_config(pe='liere8', pool='mean')):
    other = model_spec.resolve(cfg)
    assert param_tree.first_difference(other, base) is not None
    assert tree(other) != tree(base)
  small, large = (model_spec.resolve(tiny_model_config(pe='abs', size=s)) for s in (16, 32))
  assert param_tree.first_difference(small, large) == 'input_size'  # The embedding's length.
  assert tree(small) != tree(large)
  assert json.loads(json.dumps(fields(base))) == fields(base)


def test_the_docs_table_of_every_field_is_made_from_the_declarations():
  with open(os.path.join(os.path.dirname(__file__), '..', 'docs', 'configs.md')) as f:
    doc = f.read()
  assert run_spec.docs_table() in doc, (
      'docs/configs.md "Every field" is stale; paste the output of python -c "from '
      'liere_jax.config.run import docs_table; print(docs_table())"')


def test_a_stored_config_of_each_vintage_is_upgraded_to_what_it_ran():
  """A config.json written before a field existed reads back with the value that reproduces its
  run, not today's default; a field it has is kept."""
  config = load_config('configs/arrows.py').to_dict()
  for section, added in (('', run_spec.RUN.added()), ('model', MODEL.added()),
                         ('model.pe', PE.added()), ('data', DATA.added())):
    stored = json.loads(json.dumps(config))
    inner = stored
    for part in filter(None, section.split('.')):
      inner = inner[part]
    for key in added:
      del inner[key]
    inner = run_spec.upgrade(stored)
    for part in filter(None, section.split('.')):
      inner = inner[part]
    assert {key: inner[key] for key in added} == added, section
  assert run_spec.upgrade(json.loads(json.dumps(config))) == json.loads(json.dumps(config))
  assert MODEL.added()['scan_layers'] is False and PE.added()['expm_precision'] == 'highest'


@pytest.mark.parametrize('pe,precision', [('liere8', 'highest'), ('paper_rope_mixed', 'highest'),
                                          ('rope_mixed', 'auto'), ('abs', 'auto')])
def test_a_stored_config_gets_an_options_old_value_only_where_its_encoding_reads_it(pe, precision):
  """A run stored before model.pe.expm_precision existed computed LieRE's exponential at
  'highest'; an encoding that reads no exponential ignored it, and its run resolves (evaluates)
  with the default. A section a user writes is no stored one: it takes the defaults."""
  stored = json.loads(json.dumps(load_config(f'configs/arrows.py:pe={pe}').to_dict()))
  del stored['model']['pe']['expm_precision']
  assert run_spec.RUN.stored(stored) and MODEL.stored(stored['model'])
  assert run_spec.resolve(run_spec.upgrade(stored), 1).model.pe.expm_precision == precision
  user = {'patch': [4, 4], 'pe': {'name': pe}}
  assert not MODEL.stored(user)
  assert MODEL.upgrade(user, stored=False)['pe'] == {**PE.defaults(), 'name': pe}


def test_a_config_argument_that_is_not_one_is_refused_naming_them():
  """`configs/imagenet.py:depth=2`: depth is no argument of the config file; the refusal names
  the arguments and the form."""
  from liere_jax.config import files
  with pytest.raises(ValueError, match=r"not one of \['pe'\] \(write key=value pairs"
                                       r" separated by commas\)\.$"):
    files.parse_arg('depth=2', pe='liere8')