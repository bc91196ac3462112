"""The docs stay true to the tree: every relative link and #anchor in README.md and docs/**/*.md
resolves (GitHub's heading slugs), every generated block equals what scripts/docs_tables.py
writes from the committed result files, and every program README.md shows answers --help and
knows the action (its first word) and the flags README.md passes it."""
import concurrent.futures
import glob
import os
import re
import subprocess
import sys

import pytest

from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, 'README.md')] + sorted(
    glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True))
FENCE = re.compile(r'^ *```.*?^ *```', re.S | re.M)
CODE = re.compile(r'`[^`\n]*`')
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


def _prose(text):
  """The text without fenced blocks and inline code, where links are not links."""
  return CODE.sub('', FENCE.sub('', text))


def slug(heading):
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading.strip())  # a link's text
  text = re.sub(r'[^\w\- ]', '', text.lower().replace('`', ''))
  return text.replace(' ', '-')


def anchors(path):
  with open(path) as f:
    text = FENCE.sub('', f.read())
  seen, out = {}, set()
  for heading in re.findall(r'^#{1,6} +(.+?) *#* *$', text, re.M):
    base = slug(heading)
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f'{base}-{n}')
  out.update(re.findall(r'<a (?:name|id)="([^"]+)"', text))
  return out


def broken_links(path):
  """The links of one page that do not resolve, as 'target (why)'."""
  with open(path) as f:
    text = _prose(f.read())
  bad = []
  for target in LINK.findall(text):
    if re.match(r'[a-z]+:', target):  # http:, https:, mailto:
      continue
    file, _, anchor = target.partition('#')
    dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if not os.path.exists(dest):
      bad.append(f'{target} (no such file)')
    elif anchor and dest.endswith('.md') and anchor not in anchors(dest):
      bad.append(f'{target} (no such heading in {os.path.relpath(dest, ROOT)})')
  return bad


def test_the_slug_follows_github():
  assert slug("The main job's settings") == 'the-main-jobs-settings'
  assert slug('Depth: scan_layers and remat') == 'depth-scan_layers-and-remat'
  assert slug('4. Install, on every host') == '4-install-on-every-host'
  assert slug('`bench compile` (v5e)') == 'bench-compile-v5e'


@pytest.mark.parametrize('page', [os.path.relpath(p, ROOT) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
  assert broken_links(os.path.join(ROOT, page)) == []


def test_every_generated_block_equals_what_the_result_files_give():
  tables = helpers.script('docs_tables')
  stale = [os.path.relpath(p, ROOT) for p, _ in tables.stale()]
  assert stale == [], f'run `python scripts/docs_tables.py` (stale: {stale})'
  names = set()
  for page in PAGES:
    with open(page) as f:
      names.update(m[2] for m in tables.BLOCK.finditer(f.read()))
  assert names == set(tables.TABLES), 'a table is written nowhere, or a block names none'


def _readme_commands():
  """{program module: (its first words, the flags README.md passes it)} for each python program
  README.md shows; a first word is an action (`bench plan`) or a positional (`prepare cifar100`)."""
  with open(os.path.join(ROOT, 'README.md')) as f:
    text = f.read()
  spans = re.findall(r'```(?:bash)?\n(.*?)```', text, re.S) + re.findall(r'`([^`\n]+)`', text)
  programs = {}
  for span in spans:
    for line in span.replace('\\\n', ' ').splitlines():
      m = re.search(r'python (?:-m (liere_jax[\w.]*)|(train|eval)\.py)\b(.*)', line)
      if m:
        module = m[1] or f'liere_jax.{m[2]}'
        words, flags = programs.setdefault(module, (set(), set()))
        args = m[3].split('#')[0]
        words.update(re.findall(r'^ +([a-z]\w*)\b', args))
        # A flag of the program: not a --config.x override, not an option shown in brackets' |.
        flags.update(f for f in re.findall(r'(?<![\w.])--(\w+)', args))
  return programs


def _help(module):
  p = subprocess.run([sys.executable, '-m', module, '--help'], cwd=ROOT, capture_output=True,
                     text=True, timeout=120, env={**os.environ, 'PYTHONPATH': ROOT})
  return p.returncode, p.stdout + p.stderr


def test_the_programs_readme_shows_answer_help_and_know_its_flags():
  programs = _readme_commands()
  assert {'liere_jax.train', 'liere_jax.eval', 'liere_jax.bench'} <= set(programs)
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    helps = dict(zip(programs, pool.map(_help, programs)))
  assert 'plan' in programs['liere_jax.bench'][0], 'README shows `bench plan`'
  for module, (words, flags) in programs.items():
    rc, out = helps[module]
    assert rc in (0, 1) and 'Traceback' not in out and 'No module named' not in out, (
        f'{module} --help: {out[-2000:]}')
    for word in words:
      assert re.search(rf'\b{word}\b', out), f'{module} --help names no {word}'
    for flag in flags:
      known = flag if not flag.startswith('no') else f'(?:{flag}|\\[no\\]{flag[2:]})'
      assert re.search(rf'--(?:\[no\])?{known}\b', out), f'{module} has no --{flag}'
