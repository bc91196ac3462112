"""The experiment configs for `--config FILE.py[:key=value,...]`: arrows (the synthetic task),
cifar100, imagenet and ucf101 (the paper's Table 1). In a checkout they are also configs/*.py;
`path(name)` finds them in an installed library.
"""
import os

NAMES = ('arrows', 'cifar100', 'imagenet', 'ucf101')


def path(name: str) -> str:
  """The file of config `name` (one of NAMES), for --config or liere_jax.config.load."""
  if name not in NAMES:
    raise ValueError(f'No config {name!r}; the configs are {NAMES}.')
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), f'{name}.py')
