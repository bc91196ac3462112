"""Small configs and utilities shared by the tests."""
from flax import nnx

from liere_jax import config_lib
from liere_jax.model import ViT


def load_config(path: str, arg: str = ''):
  return config_lib.load(f'{path}:{arg}' if arg else path)


def tiny_model_config(pe='liere8', n_dims=2, patch=4, size=16, width=32, depth=2, heads=2,
                      pool='cls', **pe_overrides):
  cfg = config_lib.model_config(pe=pe, variant='', patch=(patch,) * n_dims,
                                input_size=(size,) * n_dims, channels=3, num_classes=5,
                                width=width, depth=depth, heads=heads, pool=pool)
  cfg.pe.update(pe_overrides)
  return cfg


def tiny_model(seed=0, **kw):
  model = ViT(tiny_model_config(**kw), rngs=nnx.Rngs(seed))
  model.eval()
  return model
