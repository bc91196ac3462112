"""The scoped mutation run's mutants (docs/mutation.md): every mutant of the numerically central
functions, plus a seeded random sample of the rest of each mutated module. Prints the names
that have no result yet (so a rerun resumes), one a line; `--all` prints them all.

  python scripts/mutation_sample.py [--per_module 5] [--seed 0] [--only central|sampled] [--all]
      [--scope numerics|core]
  python scripts/mutation_sample.py --numerics_config pyproject.toml  # rewrites its [tool.mutmut]

Reads the mutants mutmut generated (mutants/**/*.py.meta: `mutmut run` writes them first).
The draw: the names of a module's mutants outside CENTRAL, sorted, then
random.Random(seed).sample(names, per_module): the same sample on every machine for the same
generated mutants.
"""
import argparse
import glob
import json
import random
import re

# Functions mutated in full: the patch positions, the exponential's Taylor polynomial and
# squarings, the LieRE rotations, and each encoding's rotations (LieRE's context, RoPE-Mixed's).
CENTRAL = (
    'liere_jax.positions.x_grid_positions__',
    'liere_jax.expm.x__taylor12__', 'liere_jax.expm.x__squarings__',
    'liere_jax.rotations.x_liere_rotations__',
    'liere_jax.encodings.liere.xǁLieREǁcontext__',
    'liere_jax.encodings.rope.xǁRopeMixedǁrotations__',
)

# The numerics scope (scripts/mutation.sh --numerics): these modules' mutants against fast tests
# of their values only. mutmut runs every selected test that reaches a mutated function, and in
# the core's selection the exponential and the positions are reached by model builds, train
# steps and the lattice tests: minutes a surviving mutant. Here: seconds.
NUMERICS_MODULES = ('liere_jax/expm.py', 'liere_jax/positions.py', 'liere_jax/rotations.py',
                    'liere_jax/encodings/rope.py')
NUMERICS_TESTS = (
    # The tests marked `numerics` (pytest.ini) in the test files of these modules, and the fast
    # tests of the sampled functions there that the modules' own files do not reach.
    '-m', 'numerics', 'tests/test_expm.py', 'tests/test_positions.py', 'tests/test_rotations.py',
    'tests/test_encodings.py', 'tests/test_commuting.py',
)


def numerics_config(path):
  """Rewrites `path`'s [tool.mutmut] (a snapshot's pyproject.toml) to the numerics scope."""
  text = open(path, encoding='utf-8').read()
  for key, values in (('only_mutate', NUMERICS_MODULES),
                      ('pytest_add_cli_args_test_selection', NUMERICS_TESTS)):
    text, n = re.subn(rf'^{key} = \[.*?^\]', f'{key} = {json.dumps(list(values))}', text,
                      count=1, flags=re.M | re.S)
    assert n == 1, f'{path} has no {key} list in [tool.mutmut]'
  open(path, 'w', encoding='utf-8').write(text)


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
  parser.add_argument('--scope', choices=('numerics', 'core'),
                      help="NUMERICS_MODULES' mutants, or the other modules'")
  parser.add_argument('--numerics_config', metavar='PYPROJECT', help=numerics_config.__doc__)
  args = parser.parse_args()
  if args.numerics_config:
    return numerics_config(args.numerics_config)
  central, sampled = sample(args.per_module, args.seed)
  if args.scope:
    modules = tuple(m[:-len('.py')].replace('/', '.') + '.' for m in NUMERICS_MODULES)
    keep = lambda n: n.startswith(modules) == (args.scope == 'numerics')
    central, sampled = ([n for n in names if keep(n)] for names in (central, sampled))
  names = {'central': central, 'sampled': sampled}.get(args.only, sampled + central)
  done = {n for by_name in mutants().values() for n, code in by_name.items() if code is not None}
  for name in names:
    if args.all or name not in done:
      print(name)


if __name__ == '__main__':
  main()
