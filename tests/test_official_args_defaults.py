"""The official init_args that a run's YAML leaves out take the official code's defaults
(models/model_args.py), as the official LiereImageClassification does (a mutation survivor:
docs/mutation.md)."""
from liere_jax.convert import official_args


def test_init_args_without_size_classes_or_dims_take_the_official_defaults():
  kw = official_args.rope_vit_kwargs({'model_architecture': 'liere', 'imsize': 32,
                                      'patch_size': 4})
  assert (kw['dim'], kw['depth'], kw['heads'], kw['mlp_dim']) == official_args.OFFICIAL_SIZES[
      'tiny']
  assert (kw['num_classes'], kw['input_dimensionality'], kw['generator_dim']) == (100, 1, 64)
  assert not kw['rotary_embedding_per_layer'] and not kw['rotary_embedding_per_head']
