"""Writes tests/fixtures/pape/<case>.npz with the official PaPE code (DTU-PAS/
parabolic-position-encoding). tests/test_pape.py checks ours against them. Numbers only: the
official code is imported from the checkout given, none of it is copied here.

  git clone <the official repository> /tmp/pape_official
  python scripts/pape_fixtures.py --official /tmp/pape_official [--commit SHA]

Two kinds of case:
  pape_*, pape_ri_*   a tiny PaPE or PaPE-RI position encoder: fixed weights, positions, the
                      attention input x, q and k, and the official lifted q', k'
                      (`encode_query_key`);
  vit_*               a tiny official classifier (pape/nn/image_classifier.py ImageClassifier,
                      2D; pape/nn/video_classifier.py VideoClassifier, 3D, full-length clips)
                      with PaPE or PaPE-RI: its config values (JSON), its whole state_dict
                      (values drawn from a seed, float16-exact: 'state' the float16 values
                      flattened and concatenated in the state_dict's order, 'state_keys' a JSON
                      list of [key, shape]; tests/test_pape.py unpacks them), a fixed input
                      (channels last, float16), and what the official forward gives: the
                      logits, the logits with `encoder.norm_pre` replaced by the identity (the
                      one module our ViT lacks: liere_jax/convert/pape_layout.py), the residual
                      stream entering each layer and leaving the last [L + 1, B, T, D], and each
                      layer's lifted scores q' k'^T [L, B, H, T, T] (unscaled).

Needs torch. The official package's config module (tyro, dataclasses_json) is not imported: a
stand-in `pape.configs` gives the names the modules read, and they get a plain namespace with
the attributes they read. The official modules run in float64 on the float32 values stored, so
the fixtures do not depend on the CPU's float32 kernels (outputs stored in float32); the
classifiers' integer positions reach the encoders as float64 (their `prepare_positions` casts to
float32, exact for these integers, which a float64 Linear would refuse).

Positions as the official classifiers make them (pape/nn/image_classifier.py,
video_classifier.py): CLS at 0, patches at 1..n per axis, (col, row) in 2D and (time, row, col)
in 3D, not normalised (the ImageNet recipe's default).
"""
import argparse
import importlib
import json
import os
import subprocess
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


# name -> the official config values (pape/configs.py names; liere_jax.convert.pape_model
# reads them): tiny, non-square frames ((col, row) against our (row, col) shows), 2 layers.
_TINY = dict(hidden_size=16, num_layers=2, num_heads=2, head_size=8, intermediate_size=16,
             num_classes=5, patch_size=4, height=8, width=12)
VIT_CASES = {
    'vit_pape_2d': dict(_TINY, positional='pape', parabolas=4),
    'vit_pape_ri_2d': dict(_TINY, positional='pape_ri'),
    'vit_pape_3d': dict(_TINY, positional='pape', parabolas=3, width=8, frame_length=2,
                        max_samples=2),
    'vit_pape_ri_3d': dict(_TINY, positional='pape_ri', width=8, frame_length=2, max_samples=2),
}
BATCH = 2


def _stand_in_configs():
  """A `pape.configs` module with the names the official modules import (Config, Positional:
  each member's value its name, as get_position_encoder matches them)."""
  configs = types.ModuleType('pape.configs')  # Stands in for tyro / dataclasses_json configs.
  configs.Config = object
  configs.Positional = types.SimpleNamespace(**{k: k for k in (
      'absolute', 'alibi', 'lookhere', 'nope', 'rope', 'rope_mixed', 'pape', 'pape_ri')})
  sys.modules['pape.configs'] = configs


def official_classes(checkout):
  """(ParabolicPositionEncoder, ParabolicRotationInvariantPositionEncoder) from `checkout`."""
  _stand_in_configs()
  if checkout not in sys.path:
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


def official_classifiers(checkout):
  """(ImageClassifier, VideoClassifier) from `checkout`."""
  _stand_in_configs()
  if checkout not in sys.path:
    sys.path.insert(0, checkout)
  return (importlib.import_module('pape.nn.image_classifier').ImageClassifier,
          importlib.import_module('pape.nn.video_classifier').VideoClassifier)


def official_config(values):
  """The namespace the official classifier reads, for config `values` (VIT_CASES'); training
  settings at the official defaults (pape/configs.py), unused in evaluation."""
  ns = types.SimpleNamespace
  video = 'frame_length' in values
  return ns(
      model=ns(hidden_size=values['hidden_size'], num_layers=values['num_layers'],
               num_heads=values['num_heads'], head_size=values['head_size'],
               intermediate_size=values['intermediate_size'], drop_path=0.1, dropout=0.0),
      positional=values['positional'], pape=ns(parabolas=values.get('parabolas', 50)),
      num_positions=3 if video else 2, patch_size=values['patch_size'],
      height=values['height'], width=values['width'], num_classes=values['num_classes'],
      normalize=False, optimizer=ns(weight_decay=0.05, layer_decay=0.75),
      video=ns(frame_length=values.get('frame_length', 2),
               max_samples=values.get('max_samples', 5)))


def draw_state(model, rng):
  """Values for every state_dict entry, float16-exact (stored as float16): LayerNorm weights
  1 + N(0, 0.1^2); weights N(0, 1 / fan_in) (PaPE's `position` N(0, 0.5^2)); biases, the CLS
  token N(0, 0.1^2); PaPE-RI's fixed scales U(-sqrt(1/n), sqrt(1/n)) (the official init)."""
  out = {}
  for key, value in model.state_dict().items():
    shape = tuple(value.shape)
    module, _, leaf = key.rpartition('.')  # ('', '', 'cls') for the CLS token.
    if key.endswith('position_scales'):
      n = model.positions.shape[-1]
      x = rng.uniform(-1, 1, shape) * np.sqrt(1 / n)
    elif 'norm' in module.rsplit('.', 1)[-1] and leaf == 'weight':
      x = 1 + 0.1 * rng.standard_normal(shape)
    elif key.endswith('position.weight'):
      x = 0.5 * rng.standard_normal(shape)
    elif leaf == 'weight':
      x = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
    else:
      x = 0.1 * rng.standard_normal(shape)
    out[key] = x.astype(np.float16)
  return out


def make_vit(name, classifiers, seed):
  values = VIT_CASES[name]
  video = 'frame_length' in values
  torch.manual_seed(seed)
  model = classifiers[video](official_config(values)).eval()
  rng = np.random.default_rng(seed)
  state = draw_state(model, rng)
  model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in state.items()},
                        strict=True)
  model = model.double()
  # Its prepare_positions casts the integer positions to float32 (exact): float64 here.
  model.encoder.position_encoder.prepare_positions = lambda p: p.double()
  frames = (values['frame_length'] * values['max_samples'],) if video else ()
  shape = (BATCH,) + frames + (values['height'], values['width'], 3)
  x = rng.standard_normal(shape).astype(np.float16)  # Channels last, as ours.
  inputs = torch.from_numpy(np.moveaxis(x, -1, 1).astype(np.float64))
  batch = (types.SimpleNamespace(videos=inputs, lengths=torch.full((BATCH,), values[
      'max_samples'])) if video else types.SimpleNamespace(images=inputs))
  stream, scores = [], []
  model.encoder.norm_pre.register_forward_hook(lambda m, i, o: stream.append(o))
  for layer in model.encoder.layers:
    layer.register_forward_hook(lambda m, i, o: stream.append(o))
    encoder = layer.attention.position_encoder
    lift = encoder.encode_query_key

    def recorded(*args, lift=lift):
      q, k = lift(*args)
      scores.append(q @ k.transpose(-2, -1))  # [B, H, T, T], unscaled.
      return q, k
    encoder.encode_query_key = recorded
  with torch.no_grad():
    logits = model(batch)
    out = {'stream': torch.stack(stream).float().numpy(),
           'scores': torch.stack(scores).float().numpy(), 'logits': logits.float().numpy()}
    model.encoder.norm_pre = torch.nn.Identity()
    out['logits_without_norm_pre'] = model(batch).float().numpy()
  out['input'] = x
  out['config'] = np.asarray(json.dumps(values))
  out['state'] = np.concatenate([v.reshape(-1) for v in state.values()])
  out['state_keys'] = np.asarray(json.dumps([[k, list(v.shape)] for k, v in state.items()]))
  return out


def _commit(checkout):
  try:
    return subprocess.run(['git', '-C', checkout, 'rev-parse', 'HEAD'], check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return ''


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--official', required=True, help='a checkout of the official code')
  parser.add_argument('--commit', default='', help="the checkout's commit (default: git's, if "
                      'the checkout is a git work tree)')
  parser.add_argument('--out', default=OUT)
  args = parser.parse_args()
  checkout = os.path.abspath(args.official)
  commit = args.commit or _commit(checkout)
  classes = official_classes(checkout)
  os.makedirs(args.out, exist_ok=True)
  for i, name in enumerate(CASES):
    arrays = make(name, classes, seed=i)
    np.savez_compressed(os.path.join(args.out, name + '.npz'), **arrays)
    print(name, {k: v.shape for k, v in arrays.items()})
  classifiers = official_classifiers(checkout)
  for i, name in enumerate(VIT_CASES):
    arrays = make_vit(name, classifiers, seed=100 + i)
    arrays['official_commit'] = np.asarray(commit)
    np.savez_compressed(os.path.join(args.out, name + '.npz'), **arrays)
    print(name, np.round(arrays['logits'][0], 4),
          f"{os.path.getsize(os.path.join(args.out, name + '.npz'))} bytes")


if __name__ == '__main__':
  main()
