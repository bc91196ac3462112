"""The files a suite leaves: <suite>.md, .json and .png from its rows, and the index of all
suites (README.md) with a hand-written findings section kept when it is rebuilt."""
import json
import os
from typing import List

from liere_jax.reproduce.suites import SUITES

FINDINGS = ('<!-- findings -->', '<!-- /findings -->')
PLACEHOLDER = ('Which of the paper\'s findings reproduce here, which do not, and why: written by '
               'hand; `--index` keeps the text between these markers.')


def _machine(row) -> str:
  return row.get('machine') or 'unknown'


def _machines(rows) -> List[str]:
  return sorted({_machine(r) for r in rows})


def wall_by_machine(rows) -> str:
  """Train + eval wall time summed per machine ('1171 min on <cpu> (38 runs); 2 min on <gpu>
  (1 run)'): minutes on a GPU and on 2 CPU cores do not add up to one figure."""
  parts = []
  for m in _machines(rows):
    mine = [r for r in rows if _machine(r) == m]
    parts.append(f"{sum(r.get('wall_s', 0.) for r in mine) / 60:.0f} min on {m} "
                 f"({len(mine)} run{'s' if len(mine) > 1 else ''})")
  return '; '.join(parts)


def _commands(rows) -> str:
  """The runs table; with a machine column when the runs ran on more than one."""
  several = len(_machines(rows)) > 1
  lines = ['| run | train + eval wall | ' + ('machine | ' if several else '') + 'commit | command |',
           '|---|---|---|---|' + ('---|' if several else '')]
  for r in rows:
    where = f'{_machine(r)} | ' if several else ''
    lines.append(f"| {r['run']} | {r['wall_s'] / 60:.1f} min | {where}{r.get('commit') or '-'} | "
                 f"`{r['command']}` |")
  return '\n'.join(lines)


def write_report(name: str, rows: List[dict], out_dir: str) -> str:
  """<out_dir>/<name>.md, .json and .png from the rows; returns the markdown path."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  suite = SUITES[name]
  body, plots = suite.report(rows) if rows else ('No finished runs yet.', {})
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f'{name}.json'), 'w') as f:
    json.dump(rows, f, indent=1)
  images = []
  for suffix, plot in plots.items():
    fig, ax = plt.subplots(figsize=(7, 4))
    plot(ax)
    ax.set_title(name + suffix.replace('_', ' '), fontsize=9)
    fig.tight_layout()
    png = f'{name}{suffix}.png'
    fig.savefig(os.path.join(out_dir, png), dpi=110)
    plt.close(fig)
    images.append(png)
  text = [f'# {name}', '', suite.doc, '',
          f'Reproduce: `python -m liere_jax.reproduce --suite {name}` (every run below is an '
          'ordinary liere_jax.train / liere_jax.eval workdir; rebuild this page with '
          '`--report`).', '', body, ''] + [f'![{name}]({png})' for png in images] + [
              '', f'## Runs ({len(rows)} of {len(suite.runs)}; train + eval wall time: '
              f'{wall_by_machine(rows)})', '', _commands(rows), '']
  path = os.path.join(out_dir, f'{name}.md')
  with open(path, 'w') as f:
    f.write('\n'.join(text))
  return path


def _findings(path: str) -> str:
  """The findings section of an existing index, markers included, or the placeholder."""
  if not os.path.exists(path):
    return f'{FINDINGS[0]}\n{PLACEHOLDER}\n{FINDINGS[1]}'
  with open(path) as f:
    text = f.read()
  start, end = text.find(FINDINGS[0]), text.find(FINDINGS[1])
  if start < 0 or end < start:
    raise ValueError(f'{path} has no {FINDINGS[0]} ... {FINDINGS[1]} section to keep: put the '
                     'markers around its hand-written text (or remove the file) and rebuild '
                     'the index.')
  return text[start:end + len(FINDINGS[1])]


def write_index(out_dir: str) -> str:
  """<out_dir>/README.md: a line per suite with its headline from <suite>.json, the paper's
  beside it, and the findings section of the file already there; returns its path."""
  path = os.path.join(out_dir, 'README.md')
  findings = _findings(path)
  lines = ['# Results', '',
           "The paper's experiments, reproduced on its synthetic task at a CPU scale "
           '(`python -m liere_jax.reproduce --list`). One line per suite: our headline from '
           "<suite>.json beside the paper's; each suite's page has every run with its command. "
           'Rebuild this page with `python -m liere_jax.reproduce --index`.', '',
           '| suite | ours | paper | runs | train + eval wall |', '|---|---|---|---|---|']
  for name, suite in SUITES.items():
    rows = []
    if os.path.exists(os.path.join(out_dir, f'{name}.json')):
      with open(os.path.join(out_dir, f'{name}.json')) as f:
        rows = json.load(f)
    ours, paper = suite.headline(rows) if rows else ('not run yet', '-')
    lines.append(f"| [{name}]({name}.md): {suite.doc.split(':')[0]} | {ours} | {paper} | "
                 f'{len(rows)} of {len(suite.runs)} | {wall_by_machine(rows) or "-"} |')
  lines += ['', '## Findings', '', findings, '']
  os.makedirs(out_dir, exist_ok=True)
  with open(path, 'w') as f:
    f.write('\n'.join(lines))
  return path
