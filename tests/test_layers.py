"""The library's import layers (pyproject.toml, [tool.importlinter]): `lint-imports` keeps the
contract, and the graph of units (each top-level module and each sub-package of liere_jax as
one node, imports inside functions counted) has no cycle. Both checks are shown to fail on a
graph that breaks them. The programs' import closure leaves the benchmarks out; the scripts
import the library, never tests/. And tests/ is laid out like the library (TESTED_BY)."""
import ast
import os
import subprocess
import sys
import tomllib

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), 'lint-imports')


def _lint_imports(*args, cwd=ROOT):
  env = {**os.environ, 'PYTHONPATH': ROOT}
  return subprocess.run([LINT_IMPORTS, '--no-cache', *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)


def _contract():
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    return tomllib.load(f)['tool']['importlinter']['contracts'][0]


def unit(module: str) -> str:
  """'liere_jax.data.pipeline' -> 'liere_jax.data'; 'liere_jax.model' stays."""
  return '.'.join(module.split('.')[:2])


def unit_graph(graph, ignore=()) -> dict:
  """{unit: the units it imports}, from a grimp graph, without the `ignore` imports
  ('importer -> imported', as the contract writes them)."""
  ignored = {tuple(s.strip() for s in i.split('->')) for i in ignore}
  edges = {}
  for importer in graph.modules:
    for imported in graph.find_modules_directly_imported_by(importer):
      if (importer, imported) not in ignored and unit(importer) != unit(imported):
        edges.setdefault(unit(importer), set()).add(unit(imported))
  return edges


def cycles(edges: dict) -> list:
  """The strongly connected components of more than one node (Tarjan), each sorted."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
    if v not in index:
      visit(v)
  return found


def test_lint_imports_keeps_the_layers_contract():
  result = _lint_imports()
  assert result.returncode == 0, result.stdout + result.stderr
  assert '0 broken' in result.stdout, result.stdout


def test_the_contract_names_every_unit_of_the_library():
  """exhaustive = true: a new module or package fails lint-imports until it has a layer."""
  contract = _contract()
  assert contract['type'] == 'layers' and contract['exhaustive'] is True
  named = {tail.strip(' ()') for layer in contract['layers'] for tail in layer.split('|')}
  graph = grimp.build_graph('liere_jax', cache_dir=None)
  units = {unit(m) for m in graph.modules} - {'liere_jax'}
  assert {f'liere_jax.{n}' for n in named} == units


def test_the_units_import_each_other_without_a_cycle():
  graph = grimp.build_graph('liere_jax', cache_dir=None)
  edges = unit_graph(graph, _contract().get('ignore_imports', ()))
  assert len(edges) > 10  # The graph was read.
  assert cycles(edges) == []


def test_the_checks_fail_on_a_graph_that_breaks_them(tmp_path):
  """An upward import refused by lint-imports; a cycle found by `cycles`."""
  assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
  assert cycles({'a': {'b'}, 'b': {'c'}}) == []
  # checkpoint imports paths: with paths on top, that import points upward.
  (tmp_path / '.importlinter').write_text(
      '[importlinter]\nroot_package = liere_jax\n\n[importlinter:contract:upside_down]\n'
      'name = upside down\ntype = layers\nlayers =\n    liere_jax.paths\n'
      '    liere_jax.checkpoint\n')
  result = _lint_imports(cwd=str(tmp_path))
  assert result.returncode != 0
  assert 'liere_jax.checkpoint is not allowed to import liere_jax.paths' in result.stdout, (
      result.stdout)



def test_train_imports_no_benchmark_module():
  """train.py --check_fit is the library's (liere_jax/fit.py): a pod's launch imports nothing
  of liere_jax.bench, imports inside functions included."""
  graph = grimp.build_graph('liere_jax', cache_dir=None)
  closure = graph.find_upstream_modules('liere_jax.train')  # All it imports.
  assert 'liere_jax.fit' in closure
  assert sorted(m for m in closure if unit(m) == 'liere_jax.bench') == []


def foreign_imports(source: str, local: set) -> list:
  """The imports of a script's `source` that are neither the library, the standard library nor
  a third-party package: relative ones and the checkout's other top-level names (`local`:
  tests, conftest, train, ...)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      names = [('.' * node.level) + (node.module or '')]
    else:
      continue
    found += [n for n in names if n.startswith('.') or n.split('.')[0] in local]
  return found


def test_scripts_import_only_the_library_and_packages():
  """scripts/ use liere_jax, the standard library and installed packages: never the tests'
  helpers (a script must run from an installed liere_jax, tests/ aside)."""
  local = {f.removesuffix('.py') for f in os.listdir(ROOT)
           if f.endswith('.py') or os.path.isdir(os.path.join(ROOT, f))} - {'liere_jax'}
  assert {'tests', 'conftest', 'scripts'} <= local
  assert foreign_imports('import os\nfrom tests import helpers\nfrom liere_jax import fit\n'
                         'import tests.helpers as h\nfrom . import x\nimport torch', local) == [
                             'tests', 'tests.helpers', '.']
  scripts = os.path.join(ROOT, 'scripts')
  found = {f: foreign_imports(open(os.path.join(scripts, f)).read(), local)
           for f in sorted(os.listdir(scripts)) if f.endswith('.py')}
  assert len(found) > 3 and {f: v for f, v in found.items() if v} == {}


# Modules whose tests live in an end-to-end file (each names the module it covers): every other
# module has tests/test_<module>.py, or its package has tests/test_<package>[_*].py.
TESTED_BY = {
    'liere_jax/checkpoint_damage.py': 'test_checkpoint.py',
    'liere_jax/command.py': 'test_cli.py', 'liere_jax/train.py': 'test_cli.py',
    'liere_jax/eval.py': 'test_cli.py', 'liere_jax/summary.py': 'test_cli.py',
    'liere_jax/steps.py': 'test_training.py', 'liere_jax/evaluation.py': 'test_training.py',
    'liere_jax/distributed.py': 'test_pipeline_workers.py',
    'liere_jax/dots.py': 'test_expm.py', 'liere_jax/numerics.py': 'test_bench_plan.py',
    'liere_jax/taylor.py': 'test_expm.py', 'liere_jax/lattice.py': 'test_rotations.py',
    'liere_jax/kernels/common.py': 'test_kernels_attention.py',
    'liere_jax/param_tree.py': 'test_checkpoint.py', 'liere_jax/paths.py': 'test_gcs.py',
    'liere_jax/torch_vit.py': 'test_convert.py', 
    'liere_jax/configs': 'test_user_paths.py',
}


def test_every_library_module_has_the_test_file_that_says_so():
  """tests/ laid out like the library: whoever changes a module knows where its tests are."""
  tests = set(os.listdir(os.path.join(ROOT, 'tests')))
  missing = []
  for dirpath, _, files in os.walk(os.path.join(ROOT, 'liere_jax')):
    for f in files:
      path = os.path.relpath(os.path.join(dirpath, f), ROOT)
      if not f.endswith('.py') or f in ('__init__.py', '__main__.py'):
        continue
      package = os.path.dirname(path).removeprefix('liere_jax').strip('/')
      own = f'test_{f[:-3]}.py' in tests or (package and any(
          t == f'test_{package}.py' or t.startswith(f'test_{package}_') for t in tests))
      e2e = TESTED_BY.get(path) or TESTED_BY.get(os.path.dirname(path))
      if not own and not e2e:
        missing.append(path)
      elif not own:  # The end-to-end file exists and names what it covers.
        text = open(os.path.join(ROOT, 'tests', e2e)).read() if e2e in tests else ''
        if (package or f[:-3]) not in text:
          missing.append(f'{path} (TESTED_BY {e2e})')
  assert not missing, f'modules without a test file: {missing}'
