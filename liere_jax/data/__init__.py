"""Data: Grain pipelines over TFDS (CIFAR-100, ImageNet-1k, UCF101) and the arrows task.

The pipeline's functions load TFDS and Grain on first use, so `liere_jax.data.spec` (DataSpec,
resolve_data) is cheap to import.
"""
import importlib

from liere_jax.data.arrows import ArrowsSource, make_example, make_layout, majority_floor
from liere_jax.data.spec import DataSpec, normalisation, resolve_data

_PIPELINE = ('dataset_info', 'eval_batches', 'to_iterator', 'train_dataset')


def __getattr__(name):
  if name in _PIPELINE:
    return getattr(importlib.import_module('liere_jax.data.pipeline'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(list(globals()) + list(_PIPELINE))
