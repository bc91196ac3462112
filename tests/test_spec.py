"""The resolved model configuration (liere_jax/spec.py): one place for every derived value."""
import json

import pytest

from liere_jax import spec as spec_lib
from tests.helpers import load_config, tiny_model_config


def test_variant_dims_and_derived_values():
  s = spec_lib.resolve(load_config('configs/cifar100.py', 'variant=Ti,pe=liere8').model)
  assert (s.width, s.depth, s.heads, s.head_dim, s.mlp_dim) == (192, 12, 3, 64, 768)
  assert s.train_grid == (8, 8) and s.num_prefix == 1 and s.dropout == 0.1
  assert (s.pe.family, s.pe.block, s.pe.positions) == ('liere', 8, 'normalized')
  assert (s.pe.layers, s.pe.heads) == (12, 3)
  assert spec_lib.resolve(s) is s


@pytest.mark.parametrize('share,stacks', [('none', (2, 2)), ('layers', (1, 2)),
                                          ('heads', (2, 1)), ('all', (1, 1))])
def test_share_gives_the_generator_stacks(share, stacks):
  s = spec_lib.resolve(tiny_model_config(pe='liere4', share=share))
  assert (s.pe.layers, s.pe.heads) == stacks


def test_position_defaults_follow_the_encoding_and_an_explicit_mode_wins():
  modes = {pe: spec_lib.resolve(tiny_model_config(pe=pe)).pe.positions
           for pe in ('none', 'abs', 'sincos', 'rope_axial', 'rope_mixed', 'alibi', 'liere8')}
  assert modes == dict(none='integer', abs='integer', sincos='integer', rope_axial='integer',
                       rope_mixed='integer', alibi='integer', liere8='normalized')
  s = spec_lib.resolve(tiny_model_config(pe='rope_mixed', positions='normalized'))
  assert s.pe.positions == 'normalized'


def test_json_round_trip():
  s = spec_lib.resolve(tiny_model_config(pe='liere8', n_dims=3, pool='mean'))
  obj = json.loads(json.dumps(s.to_json()))
  assert spec_lib.ModelSpec.from_json(obj) == s
  del obj['pe']
  with pytest.raises(ValueError, match=r"needs \['pe'\]"):
    spec_lib.ModelSpec.from_json(obj)


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
    spec_lib.resolve(cfg)


def test_unknown_pe_field_names_the_valid_ones():
  cfg = tiny_model_config().to_dict()
  cfg['pe']['scale'] = 1.
  with pytest.raises(ValueError, match=r"model.pe.scale is not a field.*'init_scale'"):
    spec_lib.resolve(cfg)
