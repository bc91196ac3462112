"""Data: Grain pipelines over TFDS (CIFAR-100, ImageNet-1k, UCF101) and the arrows task.

The pipeline's functions load TFDS and Grain on first use. The data section of a config
(DataSpec, resolve_data) is liere_jax/config/data.py.
"""
import importlib

from liere_jax.data.arrows import ArrowsSource, make_example, make_layout, majority_floor

_PIPELINE = ('check_data', 'dataset_info', 'eval_batches', 'to_iterator', 'train_dataset')


def __getattr__(name):
  if name in _PIPELINE:
    return getattr(importlib.import_module('liere_jax.data.pipeline'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(list(globals()) + list(_PIPELINE))
