"""The paper configs are the official recipe, field by field (liere_jax/recipes.py), and the
"Table 1, as a command" section of docs/configs.md is the one that module prints. The installed
package runs it from any directory."""
import os
import pathlib
import subprocess
import sys

import pytest

from liere_jax import configs, recipes
from liere_jax.config import load
from liere_jax.config import model as model_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _get(config, key):
  for part in key.split('.'):
    config = config[part]
  return tuple(config) if isinstance(config, (list, tuple)) else config


@pytest.mark.parametrize('dataset', recipes.DATASETS)
def test_paper_config_is_the_official_recipe(dataset):
  config = load(configs.path(dataset))
  wrong = {key: (_get(config, key), want) for key, want in recipes.OFFICIAL[dataset].items()
           if _get(config, key) != (tuple(want) if isinstance(want, (list, tuple)) else want)}
  assert not wrong, f'configs/{dataset}.py differs from the official recipe: {wrong}'
  model_spec.resolve(config.model)  # And it resolves.


@pytest.mark.parametrize('dataset', recipes.DATASETS)
@pytest.mark.parametrize('pe', sorted(recipes.COLUMNS.values()))
def test_every_table1_command_resolves(dataset, pe):
  config = load(configs.path(dataset) + f':pe={pe}')
  assert model_spec.resolve(config.model).pe.name == pe


def test_the_docs_carry_the_table():
  assert recipes.table() in (ROOT / 'docs' / 'configs.md').read_text(), (
      'docs/configs.md is out of date: paste the output of `python -m liere_jax.recipes` into '
      'its "Table 1, as a command" section.')


def test_differences_name_a_reason_and_a_flag():
  for d in recipes.DIFFERENCES:
    assert d.why and d.flag and set(d.datasets) <= set(recipes.DATASETS), d


def test_recipe_2_is_a_config_argument():
  """Paper App. B.4: 30 more epochs at 256 px, lr 1e-5, no warmup, from the 224 run."""
  config = load(configs.path('imagenet') + ':finetune=runs/in1k:best')
  base = recipes.OFFICIAL['imagenet']
  assert config.model_init == 'runs/in1k:best' and config.lr == 1e-5
  assert config.warmup_steps == 0 and config.total_steps == base['total_steps'] * 30 // 200
  assert tuple(config.model.input_size) == (256, 256) and config.data.image_size == 256
  assert model_spec.resolve(config.model).train_grid == (16, 16)


def test_the_installed_package_runs_from_any_directory(tmp_path):
  """scripts/test.sh and scripts/main.sh install the package: `python -m liere_jax.recipes`
  works outside the checkout, with nothing on PYTHONPATH."""
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  out = subprocess.run([sys.executable, '-m', 'liere_jax.recipes'], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert '| cifar100 | Absolute |' in out.stdout
