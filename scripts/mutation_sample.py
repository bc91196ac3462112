"""The scoped mutation run's mutants (docs/mutation.md): every mutant of the numerically central
functions, plus a seeded random sample of the rest of each mutated module. Prints the names
that have no result yet (so a rerun resumes), one a line; `--all` prints them all.

  python scripts/mutation_sample.py [--per_module 5] [--seed 0] [--only central|sampled] [--all]

Reads the mutants mutmut generated (mutants/**/*.py.meta: `mutmut run` writes them first).
The draw: the names of a module's mutants outside CENTRAL, sorted, then
random.Random(seed).sample(names, per_module): the same sample on every machine for the same
generated mutants.
"""
import argparse
import glob
import json
import random

# Functions mutated in full: the patch positions, the exponential's Taylor polynomial and
# squarings, the LieRE rotations, and each encoding's rotations (LieRE's context, RoPE-Mixed's).
CENTRAL = (
    'liere_jax.positions.x_grid_positions__',
    'liere_jax.expm.x__taylor12__', 'liere_jax.expm.x__squarings__',
    'liere_jax.rotations.x_liere_rotations__',
    'liere_jax.encodings.liere.xǁLieREǁcontext__',
    'liere_jax.encodings.rope.xǁRopeMixedǁrotations__',
)


def mutants():
  """{meta file: {mutant name: exit code or None}}."""
  return {path: json.load(open(path, encoding='utf-8'))['exit_code_by_key']
          for path in sorted(glob.glob('mutants/**/*.py.meta', recursive=True))}


def sample(per_module, seed):
  """(central names, sampled names) in a fixed order."""
  central, sampled = [], []
  for by_name in mutants().values():
    names = sorted(by_name)
    central += [n for n in names if n.startswith(CENTRAL)]
    rest = [n for n in names if not n.startswith(CENTRAL)]
    sampled += random.Random(seed).sample(rest, min(per_module, len(rest)))
  return central, sampled


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--per_module', type=int, default=5)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--only', choices=('central', 'sampled'), help='one half of the run')
  parser.add_argument('--all', action='store_true', help='with those already run')
  args = parser.parse_args()
  central, sampled = sample(args.per_module, args.seed)
  names = {'central': central, 'sampled': sampled}.get(args.only, sampled + central)
  done = {n for by_name in mutants().values() for n, code in by_name.items() if code is not None}
  for name in names:
    if args.all or name not in done:
      print(name)


if __name__ == '__main__':
  main()
