"""Data: Grain pipelines over TFDS (CIFAR-100, ImageNet-1k, UCF101) and the arrows task.

The pipeline's functions load TFDS and Grain on first use; the data section of a config
(DataSpec, resolve_data) is liere_jax/config/data.py, which imports this package's datasets, so
its names here load on first use too.
"""
import importlib

from liere_jax.data.arrows import ArrowsSource, make_example, make_layout, majority_floor

_PIPELINE = ('dataset_info', 'eval_batches', 'to_iterator', 'train_dataset')
_CONFIG = ('DataSpec', 'normalisation', 'resolve_data')


def __getattr__(name):
  if name in _PIPELINE + _CONFIG:
    module = 'liere_jax.data.pipeline' if name in _PIPELINE else 'liere_jax.config.data'
    return getattr(importlib.import_module(module), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(list(globals()) + list(_PIPELINE + _CONFIG))
