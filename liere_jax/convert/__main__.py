"""Converts a liere_jax run to PyTorch and back.

  python -m liere_jax.convert to_torch --workdir DIR [--step N | --best] --out FILE.safetensors
      [--fold]
      Weights for liere_jax/torch_vit.py (Linear [out, in], patch conv [D, C, *patch]) and
      FILE.json (the resolved model and the run's config) beside them. --fold (string_cayley
      runs): STRING's P folded into the query / key projections, exported as the plain
      rope_mixed model with the same outputs.
  python -m liere_jax.convert to_official --workdir DIR [--step N | --best] --out FILE.pt
      A state_dict that the official StanfordMIMI/LieRE `RoPEViT` loads with strict=True, and
      FILE.json with its keyword arguments. Representable: 2D (square) or 3D inputs, CLS pooling,
      no qkv bias, head_dim 64, and the encodings the official code has (liere<b>,
      paper_rope_mixed, rope_mixed as LieRE with b = 2, paper_visionllama, abs, none). The
      official model uses layer 0's rotations in every layer: per-layer generators export with
      a warning unless all layers are equal.
  python -m liere_jax.convert from_torch --safetensors FILE [--config F.json] --out_workdir DIR
  python -m liere_jax.convert from_official --state_dict FILE.pt --config F.json|JSON
      --out_workdir DIR
      A params-only checkpoint that eval.py and checkpoint.load_params read. --config (a file,
      or the JSON itself): the JSON written by either export (default for from_torch: FILE.json
      beside it), a workdir's config.json, a model section, or the official model's description:
      its RoPEViT keyword arguments, or the `model` section of its lightning_conf YAML
      (model_architecture visionllama -> pe=paper_visionllama, rope_mixed ->
      paper_rope_mixed, liere -> liere<generator_dim>, absolute -> abs).

Bad input stops in one line (exit status 2) before anything is written.
"""
import sys
from typing import Sequence

from absl import logging
from absl import flags

from liere_jax import command, convert

ACTIONS = ('to_torch', 'to_official', 'from_torch', 'from_official')
# flag -> (help, the actions that take it, the actions that need it).
FLAGS_OF = {
    'workdir': ('The training run (config.json + checkpoints).', ('to_torch', 'to_official'),
                ('to_torch', 'to_official')),
    'step': ('The checkpoint step (default: the latest).', ('to_torch', 'to_official'), ()),
    'best': ('The best checkpoint by eval accuracy.', ('to_torch', 'to_official'), ()),
    'out': ('The output FILE.safetensors (to_torch) or FILE.pt (to_official); FILE.json goes '
            'beside it.', ('to_torch', 'to_official'), ('to_torch', 'to_official')),
    'fold': ('string_cayley runs: fold P into the q/k projections and export the equivalent '
             'rope_mixed model.', ('to_torch',), ()),
    'safetensors': ('The torch_vit weights to import.', ('from_torch',), ('from_torch',)),
    'state_dict': ('The official FILE.pt or Lightning FILE.ckpt (read with weights_only=True).',
                   ('from_official',), ('from_official',)),
    'config': ('The model: a JSON file or the JSON itself (see the module help).',
               ('from_torch', 'from_official'), ('from_official',)),
    'out_workdir': ('The new workdir for the imported parameters.',
                    ('from_torch', 'from_official'), ('from_torch', 'from_official')),
}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS):
  """The CLI's flags, on `flag_values`."""
  for name, (help_, _, _) in FLAGS_OF.items():
    if name == 'step':
      flags.DEFINE_integer(name, None, help_, flag_values=flag_values)
    elif name in ('best', 'fold'):
      flags.DEFINE_bool(name, False, help_, flag_values=flag_values)
    else:
      flags.DEFINE_string(name, None, help_, flag_values=flag_values)


def _check(action, flag_values):
  """ValueError naming the first flag that `action` does not take or lacks."""
  for name, (help_, takes, needs) in FLAGS_OF.items():
    if flag_values[name].present and action not in takes:
      raise ValueError(f'--{name} does not apply to {action}; it is for '
                       f'{" and ".join(takes)}. Remove it.')
    if action in needs and flag_values[name].value is None:
      raise ValueError(f'{action} needs --{name}: {help_}')


def run(action: str, flag_values: flags.FlagValues = flags.FLAGS):
  """Does `action` with parsed `flag_values`; returns the lines to print."""
  _check(action, flag_values)
  f = {name: flag_values[name].value for name in FLAGS_OF}
  if action == 'to_torch':
    paths = convert.export_torch(f['workdir'], f['out'], f['step'], f['best'], fold=f['fold'])
  elif action == 'to_official':
    paths = convert.export_official(f['workdir'], f['out'], f['step'], f['best'])
  else:
    if action == 'from_torch':
      convert.import_torch(f['safetensors'], f['out_workdir'], f['config'])
    else:
      convert.import_official(f['state_dict'], f['config'], f['out_workdir'])
    return [f'wrote a params-only checkpoint to {f["out_workdir"]}']
  return [f'wrote {path}' for path in paths]


def main(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
  """`python -m liere_jax.convert ACTION [flags]` with parsed `flag_values`: 0, or exits with
  status 2 and one line on bad input."""
  action = command.subcommand(argv, ACTIONS, 'convert')
  logging.set_verbosity(logging.WARNING)  # Orbax's INFO lines.
  try:
    lines = run(action, flag_values)
  except (ValueError, FileNotFoundError) as e:
    print(f'python -m liere_jax.convert {action}: error: {e}', file=sys.stderr)
    sys.exit(2)
  for line in lines:
    print(line)
  return 0


def call(argv: Sequence[str]) -> int:
  """The command line `python -m liere_jax.convert *argv` in this process (own flags, no
  absl.app): for tests and scripts."""
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  return main(flag_values(['liere_jax.convert', *argv]), flag_values)


if __name__ == '__main__':
  define_flags()
  command.run(main, 'convert')
