"""Data: Grain pipelines over TFDS (CIFAR-100, ImageNet-1k, UCF101) and the arrows task.

By stage, in the order an example travels:
  reading         sources.py     random access to a split's raw examples: TFDS array_record
                                 datasets (tfds.data_source), UCF101 records without TFDS
                                 features, arrows prepared or rendered; "not prepared" errors
                  arrows.py      the synthetic arrows task: an example from (seed, index, grid)
  transforms      transform.py   raw example to model input: decoding, crops, clip sampling,
                                 augmentation, normalisation
                  augment.py     the augmentations (RandomResizedCrop, flips, random erasing, ...)
                  randaugment.py the official runs' RandAugments (theirs and timm's)
  pipeline        pipeline.py    Grain datasets of batches (train, eval), workers, iteration
  preparation     prepare.py     `python -m liere_jax.data.prepare NAME`: the originals to TFDS
  (the writers)   write_originals.py  TFDS builders of cifar100 / imagenet2012 / ucf101 that
                                 read the original downloads (run by prepare.py)
                  write_arrows.py     the arrows TFDS builder (prepare_arrows; sources.py reads
                                 its NAME)
                  write_standin.py    stand-ins of the real datasets' sizes, for benchmarks and
                                 tests

The pipeline's functions load TFDS and Grain on first use. What the pipeline knows of each
dataset is liere_jax/config/datasets.py; the data section of a config (DataSpec, resolve_data)
is liere_jax/config/data.py.
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
