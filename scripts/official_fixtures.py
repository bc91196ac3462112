"""Writes tests/fixtures/official/cases.json with the official StanfordMIMI/LieRE code: for a
few tiny RoPEViT models (LieRE8, the paper's RoPE-Mixed = LieRE2, VisionLlama, absolute; 2D and
3D; shared and per-layer generators), the official state_dict's keys and shapes, and the logits
the official model gives on a fixed input with parameter values drawn from a seed
(liere_jax/convert/official_values.py; tests/official_fixtures.py draws the same values again).
Numbers only: no official code is copied.

  python scripts/official_fixtures.py --official /tmp/LieRE   # a checkout of StanfordMIMI/LieRE

Needs torch and einops (requirements-test.txt has both); the official code imports ipdb, which
is stubbed when absent. Deterministic: torch runs the official forward in float64 after loading
the float32 values, so the logits do not depend on the CPU's float32 kernels.
"""
import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
import types

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from liere_jax.convert.official_values import draw_input, draw_state_dict  # noqa: E402

FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'official', 'cases.json')
_TINY = dict(num_classes=5, dim=128, depth=2, heads=2, mlp_dim=64, pool='cls', channels=3,
             dim_head=64)
_2D = dict(image_size=16, patch_size=4, input_dimensionality=2)
_3D = dict(image_size=[8, 8, 8], patch_size=[4, 4, 4], input_dimensionality=3)
_LIERE = dict(positional_encoding_type='liere', phase_type='naver', enable_ape=False)
# name -> the official RoPEViT's keyword arguments (models/rope_vit.py).
CASES = {
    'liere8_2d': {**_2D, **_LIERE, 'generator_dim': 8, 'rotary_embedding_per_layer': False,
                  'rotary_embedding_per_head': True},
    'liere8_2d_per_layer': {**_2D, **_LIERE, 'generator_dim': 8,
                            'rotary_embedding_per_layer': True,
                            'rotary_embedding_per_head': True},
    'paper_rope_mixed_2d': {**_2D, **_LIERE, 'generator_dim': 2,
                            'rotary_embedding_per_layer': False,
                            'rotary_embedding_per_head': True},
    'paper_visionllama_2d': {**_2D, 'positional_encoding_type': 'tiled',
                             'phase_type': 'inverse_exp'},
    'abs_2d': {**_2D, 'positional_encoding_type': 'absolute', 'enable_ape': True},
    'liere8_3d': {**_3D, **_LIERE, 'generator_dim': 8, 'rotary_embedding_per_layer': False,
                  'rotary_embedding_per_head': False},
    'paper_visionllama_3d': {**_3D, 'positional_encoding_type': 'tiled',
                             'phase_type': 'inverse_exp'},
}


def rope_vit_class(checkout):
  if importlib.util.find_spec('ipdb') is None:  # Imported (never used) by the official code.
    sys.modules['ipdb'] = types.ModuleType('ipdb')
  pkg = types.ModuleType('_official_models')
  pkg.__path__ = [os.path.join(checkout, 'models')]
  sys.modules['_official_models'] = pkg
  return importlib.import_module('_official_models.rope_vit').RoPEViT


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--official', required=True, help='a StanfordMIMI/LieRE checkout')
  parser.add_argument('--out', default=FIXTURES)
  args = parser.parse_args()
  rope_vit = rope_vit_class(args.official)
  commit = subprocess.run(['git', '-C', args.official, 'rev-parse', 'HEAD'], check=True,
                          capture_output=True, text=True).stdout.strip()
  cases = {}
  for i, (name, kw) in enumerate(CASES.items()):
    kw = {**_TINY, **kw}
    torch.manual_seed(0)
    model = rope_vit(**kw).eval()
    keys_shapes = [(k, list(v.shape)) for k, v in model.state_dict().items()]
    zeros = [k for k, v in model.named_parameters() if not v.requires_grad and not v.any()]
    values = draw_state_dict(keys_shapes, 100 + i, zeros)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in values.items()}, strict=True)
    n = kw['input_dimensionality']
    size = kw['image_size'] if n == 2 else kw['image_size'][0]
    input_shape = [2] + [size] * n + [kw['channels']]
    x = draw_input(input_shape, seed=200 + i)
    with torch.no_grad():
      logits = model.double()(torch.from_numpy(np.moveaxis(x, -1, 1).astype(np.float64)))
    cases[name] = dict(rope_vit_kwargs=kw, state_dict=keys_shapes, zeros=zeros,
                       value_seed=100 + i,
                       input_shape=input_shape, input_seed=200 + i,
                       logits=logits.numpy().tolist())
    print(f'{name}: {len(keys_shapes)} tensors, logits[0] {np.round(logits[0].numpy(), 4)}')
  out = dict(
      official=dict(repository='https://github.com/StanfordMIMI/LieRE', commit=commit),
      command='python scripts/official_fixtures.py --official PATH_TO_CHECKOUT',
      torch=torch.__version__, written=datetime.date.today().isoformat(), cases=cases)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(out, f, indent=1)
    f.write('\n')
  print(f'wrote {args.out} ({os.path.getsize(args.out)} bytes)')


if __name__ == '__main__':
  main()
