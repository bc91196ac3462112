"""Writes tests/fixtures/pape/<case>.npz with the official PaPE code (DTU-PAS/
parabolic-position-encoding): for a few tiny PaPE and PaPE-RI position encoders, fixed weights,
positions, the attention input x, q and k, and the official lifted q', k'
(`encode_query_key`). tests/test_pape.py checks ours against them. Numbers only: the official
code is imported from the checkout given, none of it is copied here.

  git clone <the official repository> /tmp/pape_official
  python scripts/pape_fixtures.py --official /tmp/pape_official

Needs torch. The official package's config module (tyro, dataclasses_json) is not imported: a
stand-in `pape.configs` gives its two names, and the encoders get a plain namespace with the
attributes they read. The official modules run in float64 on the float32 values stored, so the
fixtures do not depend on the CPU's float32 kernels (stored in float32).

Positions as the official classifiers make them (pape/nn/image_classifier.py,
video_classifier.py): CLS at 0, patches at 1..n per axis, (col, row) in 2D and (time, row, col)
in 3D, not normalised (the ImageNet recipe's default).
"""
import argparse
import importlib
import os
import sys
import types

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, 'tests', 'fixtures', 'pape')

# name -> (encoder, grid, heads, head_size, hidden, parabolas (pape only))
CASES = {
    'pape_2d': ('pape', (3, 4), 2, 16, 32, 6),  # Not square: (col, row) vs (row, col) shows.
    'pape_2d_default': ('pape', (2, 3), 2, 8, 16, 50),  # The official default M = 50.
    'pape_3d': ('pape', (2, 2, 2), 2, 16, 32, 5),
    'pape_ri_2d': ('pape_ri', (4, 4), 2, 16, 32, None),
    'pape_ri_3d': ('pape_ri', (2, 2, 2), 3, 8, 24, None),
}


def official_classes(checkout):
  """(ParabolicPositionEncoder, ParabolicRotationInvariantPositionEncoder) from `checkout`."""
  configs = types.ModuleType('pape.configs')  # Stands in for tyro / dataclasses_json configs.
  configs.Config = configs.Positional = object
  sys.modules['pape.configs'] = configs
  sys.path.insert(0, checkout)
  pape = importlib.import_module('pape.nn.positions.pape')
  pape_ri = importlib.import_module('pape.nn.positions.pape_ri')
  return pape.ParabolicPositionEncoder, pape_ri.ParabolicRotationInvariantPositionEncoder


def official_positions(grid):
  """[1, 1 + prod(grid), n]: CLS at 0, patches 1..n per axis; 2D (col, row), 3D (time, row,
  col); patches row-major over the grid in the input's axis order."""
  idx = np.stack([m.reshape(-1) for m in np.meshgrid(*[np.arange(1, n + 1) for n in grid],
                                                     indexing='ij')], -1)
  if len(grid) == 2:
    idx = idx[:, ::-1]  # (row, col) -> (col, row).
  return np.concatenate([np.zeros((1, len(grid))), idx])[None].astype(np.float32)


def make(name, classes, seed):
  kind, grid, heads, head_size, hidden, parabolas = CASES[name]
  n = len(grid)
  config = types.SimpleNamespace(
      model=types.SimpleNamespace(hidden_size=hidden, num_heads=heads, head_size=head_size),
      pape=types.SimpleNamespace(parabolas=parabolas), num_positions=n)
  enc = classes[kind == 'pape_ri'](config)
  enc.register_layer_weights()
  rng = np.random.default_rng(seed)
  pos = official_positions(grid)
  t, b = pos.shape[1], 2
  f32 = lambda *shape, scale=1.: (scale * rng.standard_normal(shape)).astype(np.float32)
  out = {'positions': pos, 'x': f32(b, t, hidden), 'q': f32(b, heads, t, head_size),
         'k': f32(b, heads, t, head_size)}
  if kind == 'pape':
    out['position'] = f32(heads * parabolas, n, scale=0.5)
    out['ab'] = f32(2 * heads * parabolas, hidden, scale=0.3)
    weights = {'position.weight': out['position'], 'ab.weight': out['ab']}
  else:
    out['position_scales'] = rng.uniform(-1, 1, (1, heads, 1, 1)).astype(np.float32) / np.sqrt(n)
    out['a'] = f32(heads, hidden, scale=0.3)
    weights = {'position_scales': out['position_scales'], 'a.weight': out['a']}
  enc.load_state_dict({k: torch.tensor(v) for k, v in weights.items()}, strict=True)
  enc = enc.double()
  t64 = lambda key: torch.tensor(out[key], dtype=torch.float64)
  with torch.no_grad():
    q2, k2 = enc.encode_query_key(t64('x'), t64('q'), t64('k'), t64('positions'))
  # [B, H, T, d'], computed in float64, stored in float32 (relative 6e-8).
  out['q_lifted'], out['k_lifted'] = q2.float().numpy(), k2.float().numpy()
  out['parabolas'] = np.int64(parabolas or 0)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--official', required=True, help='a checkout of the official code')
  parser.add_argument('--out', default=OUT)
  args = parser.parse_args()
  classes = official_classes(os.path.abspath(args.official))
  os.makedirs(args.out, exist_ok=True)
  for i, name in enumerate(CASES):
    arrays = make(name, classes, seed=i)
    np.savez_compressed(os.path.join(args.out, name + '.npz'), **arrays)
    print(name, {k: v.shape for k, v in arrays.items()})


if __name__ == '__main__':
  main()
