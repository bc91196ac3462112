r"""The paper's synthetic-task experiments (Sec. 5.2) as suites: train + eval runs, then a report.

  python -m liere_jax.reproduce --list
  python -m liere_jax.reproduce --suite table3 [--dry-run] [--runs runs/reproduce]
  python -m liere_jax.reproduce --suite table3 --report     # rebuild the report, no training

Every run is an ordinary workdir of train.py / eval.py under --runs (resumable: running the
suite again resumes a run from its checkpoint and skips finished ones; a run's name is its
encoding, size, seed and overrides, so suites share runs). The report goes to
--out/<suite>.md, <suite>.json (one row per run: pe, px, seed, top1, top1_ci95, shuffled_top1,
steps, wall_s, command, ...) and <suite>*.png. Every run uses configs/arrows.py as it is (the
main job's model and budget) plus the suite's overrides; `--set total_steps=2000` (repeatable)
changes all runs of a larger-scale reproduction (their workdir names end in a hash of the --set
values, so they never reuse the runs made without them).

The paper's baseline columns ran the official LieRE code's definitions: its "RoPE-Mixed" is
LieRE with 2x2 blocks (pe=paper_rope_mixed) and its "VisionLlama" the fixed-frequency "tiled"
encoding on [0, 1] positions (pe=paper_visionllama). The suites run those in the paper's rows
and naver-ai's RoPE-Mixed (rope_mixed) and rope-vit's axial RoPE (rope_axial) as extra rows.
"""
import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from absl import app, flags

CELL = 12
TRAIN_GRID = 9  # 108 px.
FIG7_GRIDS = (7, 8, 9, 10, 11, 12, 14, 16, 18)  # 84 .. 216 px.
FIG7_EXAMPLES = 500

# Paper, Table 3 (synthetic task, ViT-B): top-1 % and 95% CI per (pe, px).
PAPER_TABLE3 = {
    ('abs', 108): (45.1, 43.1, 47.7), ('abs', 168): (41.0, 39.0, 43.2),
    ('abs', 276): (40.1, 38.2, 42.0),
    ('paper_visionllama', 108): (46.4, 44.0, 47.9), ('paper_visionllama', 168): (48.6, 46.0, 49.9),
    ('paper_visionllama', 276): (48.6, 46.2, 50.1),
    ('paper_rope_mixed', 108): (100., 99.5, 100.), ('paper_rope_mixed', 168): (98.6, 97.6, 98.7),
    ('paper_rope_mixed', 276): (88.6, 87.4, 89.9),
    ('liere8', 108): (99.5, 99.2, 99.8), ('liere8', 168): (99.7, 99.4, 99.9),
    ('liere8', 276): (99.7, 99.5, 99.9),
    ('liere_head', 108): (100., 99.5, 100.), ('liere_head', 168): (100., 99.6, 100.),
    ('liere_head', 276): (100., 99.7, 100.),
}
# The paper has no synthetic-task numbers for its other experiments; these are its CIFAR-100
# ones (ViT-B), shown beside ours as the finding being tested, not as a like-for-like number.
PAPER_CIFAR_SHUFFLE_DROP = {'abs': 69.3, 'paper_visionllama': 54.8, 'paper_rope_mixed': 75.1,
                            'liere8': 82.5, 'liere_head': 84.6}  # Table 5, relative drop %.
PAPER_CIFAR_BLOCKS = {2: 68.84, 4: 69.28, 8: 70.32, 16: 69.85, 32: 69.65, 64: 69.99}  # Table 10.
# Table 4 rows, by our share mode: (RoPE-Mixed, LieRE64, LieRE8). Its first row is Table 1's
# default (per layer and head, with LieRE64's 5.684 GFLOP of Table 8); the FLOPs drop (5.613G)
# in the two rows that share over heads (fewer exponentials); the last row shares both.
PAPER_CIFAR_SHARE = {
    'none': (68.8, 70.0, 70.3), 'layers': (68.7, 69.5, 69.8),
    'heads': (69.5, 69.7, 69.7), 'all': (68.3, 69.4, 69.5)}

HEAD_DIM = 32  # configs/arrows.py: width 128, 4 heads.
# Report labels: every baseline says whose definition it is.
NAMES = {'none': 'None', 'abs': 'Absolute', 'sincos': 'Sin-cos',
         'paper_visionllama': 'VisionLlama RoPE (paper)',
         'paper_rope_mixed': 'RoPE-Mixed (paper: LieRE2)',
         'rope_axial': 'Axial RoPE (rope-vit)', 'rope_mixed': 'RoPE-Mixed (naver-ai)',
         'alibi': '2D ALiBi', 'liere8': 'LieRE8', f'liere{HEAD_DIM}': 'LieRE32 (= head dim)',
         'comrope_ap8': 'ComRoPE-AP8', 'comrope_ld8': 'ComRoPE-LD8',
         'string_cayley': 'STRING (Cayley)', 'string_circulant8': 'STRING (circulant 8)'}
PAPER_ENCODINGS = ('none', 'abs', 'sincos', 'paper_visionllama', 'paper_rope_mixed', 'alibi',
                   'liere8', f'liere{HEAD_DIM}')
LIBRARY_BASELINES = ('rope_axial', 'rope_mixed')  # rope-vit's / naver-ai's, beside the paper's.
SUCCESSORS = ('comrope_ap8', 'comrope_ld8', 'string_cayley', 'string_circulant8')


def paper_key(pe: str) -> str:
  return 'liere_head' if pe == f'liere{HEAD_DIM}' else pe


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of configs/arrows.py and its evaluations."""
  pe: str
  grid: int = TRAIN_GRID
  seed: int = 0
  overrides: Tuple[Tuple[str, str], ...] = ()  # (config key, value), e.g. ('data.num_train', '4000').
  label: str = ''  # What the suite varies, for its table ('block 4', 'share layers', ...).

  @property
  def px(self) -> int:
    return CELL * self.grid

  @property
  def name(self) -> str:
    extra = ''.join(f"_{k.split('.')[-1]}{v}" for k, v in self.overrides)
    return f'{self.pe}_{self.px}px{extra}_s{self.seed}'

  def dirname(self, extra: Tuple[str, ...] = ()) -> str:
    """The workdir name: `name`, plus a hash of the --set overrides (`extra`) if any."""
    if not extra:
      return self.name
    return f"{self.name}_set{hashlib.sha1(chr(0).join(extra).encode()).hexdigest()[:8]}"

  def train_args(self, workdir: str, extra: Tuple[str, ...]) -> List[str]:
    return (['train.py', '--config', f'configs/arrows.py:pe={self.pe},grid={self.grid}',
             '--workdir', workdir, f'--config.seed={self.seed}']
            + [f'--config.{k}={v}' for k, v in self.overrides] + list(extra))


@dataclasses.dataclass(frozen=True)
class Eval:
  """An evaluation of a run by eval.py, written to WORKDIR/<out>/results.json."""
  out: str = 'eval'
  resolutions: Tuple[int, ...] = ()
  num_eval: int = 0  # 0: the config's held-out set.

  def args(self, workdir: str) -> List[str]:
    args = ['eval.py', '--workdir', workdir, '--out', self.out,
            '--resolutions=' + ','.join(map(str, self.resolutions))]
    return args + ([f'--num_eval={self.num_eval}'] if self.num_eval else [])


@dataclasses.dataclass(frozen=True)
class Suite:
  doc: str
  runs: Tuple[Run, ...]
  evaluation: Eval
  report: Callable  # (suite name, rows) -> (markdown body, {png name: plot fn}).


def _table3_runs() -> Tuple[Run, ...]:
  runs = [Run(pe) for pe in PAPER_ENCODINGS + LIBRARY_BASELINES]
  runs.append(Run('rope_mixed', seed=1))  # Near a threshold in our runs: a second seed.
  runs += [Run(pe) for pe in SUCCESSORS]
  runs += [Run(pe, grid=14) for pe in ('abs', 'paper_rope_mixed', 'rope_mixed', 'liere8')]
  return tuple(runs)


def _fig6_runs():
  return tuple(Run(f'liere{b}', label=f'block {b}') for b in (2, 4, 8, 16, 32))


def _fig4_runs():
  return tuple(Run(pe, overrides=(('data.num_train', str(n)),), label=f'{n} examples')
               for pe in ('abs', 'paper_rope_mixed', 'rope_mixed', 'liere8')
               for n in (2000, 8000, 32000))


# Table 4's columns: RoPE-Mixed (the paper's, LieRE with 2x2 blocks: sharing applies), LieRE64
# (= head dim; ours is 32), LieRE8.
TABLE4_COLUMNS = ('paper_rope_mixed', f'liere{HEAD_DIM}', 'liere8')


def _table4_runs():
  return tuple(Run(pe, overrides=(('model.pe.share', s),) if s != 'none' else (),
                   label=f'share {s}')
               for pe in TABLE4_COLUMNS for s in ('none', 'layers', 'heads', 'all'))


def _table7_runs():
  # The paper's "RoPE-Mixed" in Table 7 is the LieRE code's, LieRE with 2x2 blocks
  # (paper_rope_mixed); naver-ai's (rope_mixed) has a frequency init of its own, no init scale.
  return tuple(Run(pe, seed=s, overrides=(('model.pe.init_scale', scale),) if scale != '2pi'
                   else (), label=f'init {scale}')
               for pe in ('liere8', 'paper_rope_mixed') for scale in ('1.0', '2pi')
               for s in (0, 1))


# ---------------------------------------------------------------------------------------------
# Reports.


def _pct(x: Optional[float]) -> str:
  return '-' if x is None else f'{100 * x:.1f}'


def _ci(row) -> str:
  lo, hi = row['top1_ci95']
  return f"{_pct(row['top1'])} ({_pct(lo)}-{_pct(hi)})"


def _paper3(pe, px) -> str:
  p = PAPER_TABLE3.get((paper_key(pe), px))
  return f'{p[0]:.1f} ({p[1]:.1f}-{p[2]:.1f})' if p else '-'


def _commands(rows) -> str:
  lines = ['| run | train + eval wall | command |', '|---|---|---|']
  for r in rows:
    lines.append(f"| {r['run']} | {r['wall_s'] / 60:.1f} min | `{r['command']}` |")
  return '\n'.join(lines)


def _report_table3(rows):
  at_train = [r for r in rows if r['px'] == CELL * TRAIN_GRID]
  lines = ['Top-1 % on 2,000 held-out examples, bootstrap 95% CI; paper: ViT-B, 800k examples '
           "(Table 3). The paper's rows come first, with its definitions (RoPE-Mixed = the LieRE "
           "code's LieRE2, VisionLlama = its fixed-frequency encoding on [0, 1] positions); then "
           "naver-ai's RoPE-Mixed and rope-vit's axial RoPE (integer positions), which the paper "
           'did not run; ComRoPE and STRING (the last rows) are later work, not in the paper. '
           f"The {len(at_train)} runs at 108 px took {sum(r['wall_s'] for r in at_train) / 60:.0f} "
           'min of train + eval wall time.', '',
           '| encoding | px | seed | ours | paper | patches shuffled |',
           '|---|---|---|---|---|---|']
  groups = (PAPER_ENCODINGS, LIBRARY_BASELINES, SUCCESSORS)
  order = {pe: i for i, pe in enumerate(sum(groups, ()))}
  group = {pe: g for g, pes in enumerate(groups) for pe in pes}
  for r in sorted(rows, key=lambda r: (group.get(r['pe'], 3), r['px'], order.get(r['pe'], 99),
                                       r['seed'])):
    lines.append(f"| {NAMES.get(r['pe'], r['pe'])} | {r['px']} | {r['seed']} | {_ci(r)} | "
                 f"{_paper3(r['pe'], r['px'])} | {_pct(r['shuffled_top1'])} |")

  def plot(ax):
    rs = [r for r in rows if r['px'] == CELL * TRAIN_GRID and r['seed'] == 0]
    rs.sort(key=lambda r: order.get(r['pe'], 99))
    x = range(len(rs))
    ours = [100 * r['top1'] for r in rs]
    err = [[100 * (r['top1'] - r['top1_ci95'][0]) for r in rs],
           [100 * (r['top1_ci95'][1] - r['top1']) for r in rs]]
    ax.bar([i - 0.2 for i in x], ours, 0.4, yerr=err, label='ours (small ViT, CPU budget)')
    paper = [PAPER_TABLE3.get((paper_key(r['pe']), r['px']), (float('nan'),))[0] for r in rs]
    ax.bar([i + 0.2 for i in x], paper, 0.4, label='paper (ViT-B, 800k examples)')
    ax.axhline(44.2, color='gray', ls=':', label='majority-arrow floor 44.2%')
    ax.set_xticks(list(x), [NAMES.get(r['pe'], r['pe']) for r in rs], rotation=40, ha='right')
    ax.set_ylabel('top-1 % at 108 px')
    ax.set_ylim(0, 125)
    ax.legend(fontsize=7, loc='upper left', ncol=3)
  disagree = []
  for r in rows:
    p = PAPER_TABLE3.get((paper_key(r['pe']), r['px']))
    lo, hi = r['top1_ci95']
    if p and (100 * hi < p[1] or 100 * lo > p[2]):
      disagree.append(f"{NAMES.get(r['pe'], r['pe'])} at {r['px']} px (seed {r['seed']}): ours "
                      f"{_pct(r['top1'])}, paper {p[0]:.1f}")
  if disagree:
    lines += ['', 'Disagreements with the paper (95% CIs do not overlap): ' + '; '.join(disagree)
              + '.']
  return '\n'.join(lines), {'': plot}


def _report_table5(rows):
  lines = ['Patch shuffling (one fixed permutation of the 81 patches) on the table3 runs at '
           '108 px. Drop % = (before - after) / before. Paper: CIFAR-100 (Table 5; no '
           'synthetic-task numbers), shown as the finding to test (LieRE drops most).', '',
           '| encoding | seed | before | after | drop % | paper drop % (CIFAR-100) |',
           '|---|---|---|---|---|---|']
  rows = sorted((r for r in rows if r['px'] == CELL * TRAIN_GRID),
                key=lambda r: -r['shuffle_drop_rel'])
  for r in rows:
    p = PAPER_CIFAR_SHUFFLE_DROP.get(paper_key(r['pe']))
    lines.append(f"| {NAMES.get(r['pe'], r['pe'])} | {r['seed']} | {_pct(r['top1'])} | "
                 f"{_pct(r['shuffled_top1'])} | {100 * r['shuffle_drop_rel']:.1f} | "
                 f"{'-' if p is None else p} |")

  def plot(ax):
    x = range(len(rows))
    ax.bar(x, [100 * r['shuffle_drop_rel'] for r in rows])
    ax.set_xticks(list(x), [f"{NAMES.get(r['pe'], r['pe'])} s{r['seed']}" for r in rows],
                  rotation=40, ha='right', fontsize=7)
    ax.set_ylabel('relative drop % with shuffled patches')
  return '\n'.join(lines), {'': plot}


def _report_fig7(rows):
  sizes = sorted({int(s) for r in rows for s in r['resolutions']})
  lines = [f'Top-1 % on {FIG7_EXAMPLES} held-out examples at other input sizes (12 px cells, '
           f'{sizes[0] // CELL} to {sizes[-1] // CELL} per side) of models trained at 108 px. '
           "Sequential: each encoding's own position units, so a larger image spans a larger "
           'range (paper Sec. 5.6; LieRE: i / 8, RoPE: i); rescaled: positions squeezed into the '
           'training range. Paper Fig. 7 is ImageNet (sequential beats rescaled for LieRE and '
           'RoPE-Mixed; LieRE64 holds up better above 320 px).', '',
           '| encoding | positions | ' + ' | '.join(f'{s}' for s in sizes) + ' |',
           '|---|---|' + '---|' * len(sizes)]
  rows = [r for r in rows if r['px'] == CELL * TRAIN_GRID and r['seed'] == 0]
  for r in rows:
    for mode in ('sequential', 'rescaled'):
      cells = [_pct(r['resolutions'].get(str(s), {}).get(mode)) for s in sizes]
      lines.append(f"| {NAMES.get(r['pe'], r['pe'])} | {mode} | " + ' | '.join(cells) + ' |')

  def plot(ax):
    for i, r in enumerate(rows):
      for mode, ls in (('sequential', '-'), ('rescaled', ':')):
        pts = [(s, r['resolutions'].get(str(s), {}).get(mode)) for s in sizes]
        pts = [(s, 100 * a) for s, a in pts if a is not None]
        ax.plot(*zip(*pts), ls, color=f'C{i % 10}', marker='.',
                label=NAMES.get(r['pe'], r['pe']) if mode == 'sequential' else None)
    ax.axvline(CELL * TRAIN_GRID, color='gray', lw=0.5)
    ax.set_xlabel('input size (px); solid: sequential, dotted: rescaled positions')
    ax.set_ylabel('top-1 %')
    ax.legend(fontsize=6, ncol=2)
  return '\n'.join(lines), {'': plot}


def _report_sweep(title: str, paper: Callable[[dict], str], x_of: Callable[[dict], float],
                  xlabel: str, log_x: bool = False):
  def report(rows):
    lines = [title, '', '| encoding | setting | seed | ours | paper |', '|---|---|---|---|---|']
    for r in rows:  # The suite's order.
      lines.append(f"| {NAMES.get(r['pe'], r['pe'])} | {r['label']} | {r['seed']} | {_ci(r)} | "
                   f'{paper(r)} |')

    def plot(ax):
      for i, pe in enumerate(dict.fromkeys(r['pe'] for r in rows)):
        rs = sorted((r for r in rows if r['pe'] == pe), key=x_of)
        ax.errorbar([x_of(r) for r in rs], [100 * r['top1'] for r in rs],
                    yerr=[[100 * (r['top1'] - r['top1_ci95'][0]) for r in rs],
                          [100 * (r['top1_ci95'][1] - r['top1']) for r in rs]],
                    fmt='o-' if len({r['seed'] for r in rs}) == 1 else 'o', color=f'C{i}',
                    label=NAMES.get(pe, pe), capsize=2)
      if log_x:
        ax.set_xscale('log', base=2)
      ax.set_xlabel(xlabel)
      ax.set_ylabel('top-1 % at 108 px')
      ax.legend(fontsize=7)
    return '\n'.join(lines), {'': plot}
  return report


def _block(r):
  return int(r['pe'][len('liere'):])


def _share(r):
  return r['label'].split()[-1]


SUITES: Dict[str, Suite] = {
    'table3': Suite("Paper Table 3: every encoding at 108 px (the paper's definitions, plus "
                    "naver-ai's RoPE-Mixed with 2 seeds and rope-vit's axial RoPE), abs / both "
                    'RoPE-Mixed / LieRE8 at 168 px; plus ComRoPE and STRING.',
                    _table3_runs(), Eval(), _report_table3),
    'table5': Suite('Paper Table 5: accuracy drop with shuffled patches, for the table3 runs at '
                    '108 px (evaluation only; trains what table3 has not).',
                    tuple(r for r in _table3_runs() if r.grid == TRAIN_GRID), Eval(),
                    _report_table5),
    'fig7': Suite('Paper Fig. 7: accuracy against input size (84-216 px), sequential and '
                  'rescaled positions, for the table3 runs at 108 px (evaluation only).',
                  tuple(r for r in _table3_runs() if r.grid == TRAIN_GRID and r.seed == 0),
                  Eval('eval_fig7', tuple(CELL * g for g in FIG7_GRIDS), FIG7_EXAMPLES),
                  _report_fig7),
    'fig6': Suite('Paper Fig. 6 / Table 10: LieRE block sizes 2 to the head dim (32).',
                  _fig6_runs(), Eval(), _report_sweep(
                      'LieRE block size (Fig. 6). Paper: CIFAR-100 top-1 (Table 10), where 8 is '
                      'best.', lambda r: str(PAPER_CIFAR_BLOCKS.get(_block(r), '-')), _block,
                      'block size', log_x=True)),
    'fig4': Suite('Paper Fig. 4: training-set size (data.num_train = 2k, 8k, 32k examples; the '
                  "main job sees 64k) for abs, RoPE-Mixed (the paper's and naver-ai's), LieRE8.",
                  _fig4_runs(), Eval(),
                  _report_sweep(
                      'Training examples (Fig. 4: data.num_train, the same number of steps, so '
                      'fewer examples means more epochs). Paper: CIFAR-100 fractions 20-90% as '
                      'a plot (LieRE and RoPE-Mixed ahead of abs, most when data is scarce); no '
                      'numbers in the text.', lambda r: '-',
                      lambda r: int(r['label'].split()[0]), 'training examples', log_x=True)),
    'table4': Suite('Paper Table 4: generators shared over layers, heads or both (RoPE-Mixed '
                    '= LieRE2, LieRE32, LieRE8).', _table4_runs(), Eval(), _report_sweep(
                        'Sharing the generators (Table 4). Paper: CIFAR-100 top-1 (LieRE64 '
                        'column for our LieRE32 = head dim).',
                        lambda r: str(PAPER_CIFAR_SHARE[_share(r)][
                            TABLE4_COLUMNS.index(r['pe'])]),
                        lambda r: ('none', 'layers', 'heads', 'all').index(_share(r)),
                        'shared over: 0 none, 1 layers, 2 heads, 3 all')),
    'table7': Suite("Paper Table 7: init scale 1 vs 2 pi for LieRE8 and the paper's RoPE-Mixed "
                    "(paper_rope_mixed: the LieRE code's, LieRE with 2x2 blocks), 2 seeds each.",
                    _table7_runs(), Eval(), _report_sweep(
                        'Init scale (Table 7). Paper (CIFAR-100, paired z-test 2 pi vs 1): '
                        'LieRE8 -1.18 points (p = 0.07), RoPE-Mixed -2.55 (p = 0.0001).',
                        lambda r: '-', lambda r: 0 if '1.0' in r['label'] else 1,
                        'init scale: 0 = 1, 1 = 2 pi')),
}


# ---------------------------------------------------------------------------------------------
# Running.


def machine() -> str:
  import jax
  return (f'{platform.machine()} {os.cpu_count()} cores, {jax.devices()[0].device_kind}, '
          f'jax {jax.__version__}')


def _results(workdir: str, out: str) -> Optional[dict]:
  path = os.path.join(workdir, out, 'results.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _trained(workdir: str) -> bool:
  """Whether train.py finished the run: its final evaluation (at total_steps) is logged."""
  paths = [os.path.join(workdir, f) for f in ('config.json', 'metrics.jsonl')]
  if not all(map(os.path.exists, paths)):
    return False
  with open(paths[0]) as f:
    total = json.load(f)['total_steps']
  with open(paths[1]) as f:
    return any(m.get('step') == total and 'eval_accuracy' in m for m in map(json.loads, f))


def _walls(workdir: str) -> dict:
  path = os.path.join(workdir, 'reproduce_wall.json')
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  return {}


def _commit() -> str:
  """The repo's HEAD (with '+' when tracked files changed), or '' outside a git checkout."""
  def git(*args):  # Popen: the suite's subprocess.run is for train.py / eval.py only.
    with subprocess.Popen(['git', *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as proc:
      out = proc.communicate()[0].strip()
    return out if proc.returncode == 0 else None

  try:
    head, dirty = git('rev-parse', '--short', 'HEAD'), git('status', '--porcelain',
                                                            '--untracked-files=no')
  except OSError:
    return ''
  return '' if head is None else head + ('+' if dirty else '')


def _add_wall(workdir: str, key: str, seconds: float):
  walls = _walls(workdir)
  walls[key] = walls.get(key, 0.) + seconds
  walls['machine'] = machine()
  walls.setdefault('commit', _commit())  # The code the run was trained at.
  with open(os.path.join(workdir, 'reproduce_wall.json'), 'w') as f:
    json.dump(walls, f, indent=1)


def _command(args: List[str]) -> str:
  return 'python ' + ' '.join(args)


def row(run: Run, suite: Suite, runs_dir: str, extra: Tuple[str, ...]) -> Optional[dict]:
  """A run's report row, or None if it has not finished."""
  workdir = os.path.join(runs_dir, run.dirname(extra))
  res = _results(workdir, suite.evaluation.out)
  if res is None:
    return None
  walls = _walls(workdir)
  top1, shuffled = res['top1'], res['shuffled_top1']
  sequential = res.get('positions_default')  # eval.py's name for the encoding's own mode.
  resolutions = {size: {'sequential' if mode == sequential else mode: acc
                        for mode, acc in by_mode.items()}
                 for size, by_mode in res['resolutions'].items()}
  return dict(
      run=run.dirname(extra), pe=run.pe, px=run.px, seed=run.seed, label=run.label,
      overrides=dict(run.overrides), top1=top1, top1_ci95=res['top1_ci95'],
      shuffled_top1=shuffled, shuffle_drop_rel=(top1 - shuffled) / top1 if top1 else 0.,
      n_examples=res['n_examples'], resolutions=resolutions, steps=res['step'],
      wall_s=walls.get('train_s', 0.) + walls.get(suite.evaluation.out + '_s', 0.),
      machine=walls.get('machine', ''), commit=walls.get('commit', ''),
      command=' && '.join(_command(a) for a in (run.train_args(workdir, extra),
                                                suite.evaluation.args(workdir))))


def _cost(run: Run) -> float:
  """A run's cost relative to one at 108 px: its tokens, roughly."""
  return (run.grid / TRAIN_GRID) ** 2


def run_suite(name: str, runs_dir: str, extra: Tuple[str, ...], dry_run: bool = False,
              log=print, only: Tuple[str, ...] = ()) -> List[dict]:
  """Runs the suite's unfinished runs (only those whose encoding or run name is in `only`,
  if given)."""
  suite = SUITES[name]
  todo = [r for r in suite.runs if (not only or r.pe in only or r.dirname(extra) in only)
          and row(r, suite, runs_dir, extra) is None]
  done = sum(row(r, suite, runs_dir, extra) is not None for r in suite.runs)
  log(f'suite {name}: {len(suite.runs)} runs, {done} done here, {len(todo)} to run now '
      f'(workdirs under {runs_dir})')
  spent, cost_done = 0., 0.
  for i, run in enumerate(todo):
    workdir = os.path.join(runs_dir, run.dirname(extra))
    steps = [run.train_args(workdir, extra + ('--progress=false',)),
             suite.evaluation.args(workdir)]
    eta = (spent / cost_done * sum(map(_cost, todo[i:]))) if cost_done else None
    log(f'[{i + 1}/{len(todo)}] {os.path.basename(workdir)}' + (
        f' (ETA {eta / 60:.0f} min for the rest)' if eta is not None else ''))
    if dry_run:
      for args in steps:
        log('  ' + _command(args))
      continue
    os.makedirs(workdir, exist_ok=True)
    start = time.time()
    for key, args in zip(('train_s', suite.evaluation.out + '_s'), steps):
      if key == 'train_s' and _trained(workdir):
        continue  # Trained by this or another suite; only its evaluation is missing.
      t0 = time.time()
      with open(os.path.join(workdir, f"reproduce_{key[:-2]}.log"), 'a') as logf:
        proc = subprocess.run([sys.executable] + args, stdout=logf, stderr=subprocess.STDOUT,
                              cwd=REPO)
      if proc.returncode:
        raise RuntimeError(f'{_command(args)} failed (exit {proc.returncode}); see '
                           f'{logf.name}. Fix it and run the suite again: finished runs are '
                           'kept.')
      _add_wall(workdir, key, time.time() - t0)
    spent += time.time() - start
    cost_done += _cost(run)
  return [r for r in (row(r, suite, runs_dir, extra) for r in suite.runs) if r]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_report(name: str, rows: List[dict], out_dir: str) -> str:
  """docs/results/<name>.md, .json and .png from the rows; returns the markdown path."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  suite = SUITES[name]
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f'{name}.json'), 'w') as f:
    json.dump(rows, f, indent=1)
  body, plots = suite.report(rows) if rows else ('No finished runs yet.', {})
  images = []
  for suffix, plot in plots.items():
    fig, ax = plt.subplots(figsize=(7, 4))
    plot(ax)
    ax.set_title(name, fontsize=9)
    fig.tight_layout()
    png = f'{name}{suffix}.png'
    fig.savefig(os.path.join(out_dir, png), dpi=110)
    plt.close(fig)
    images.append(png)
  machines = sorted({r['machine'] for r in rows if r['machine']})
  total = sum(r['wall_s'] for r in rows)
  text = [f'# {name}', '', suite.doc, '',
          f'Reproduce: `python -m liere_jax.reproduce --suite {name}` (every run below is an '
          'ordinary train.py / eval.py workdir; rebuild this page with `--report`).', '',
          body, ''] + [f'![{name}]({png})' for png in images] + [
              '', f'## Runs ({len(rows)} of {len(suite.runs)}; {total / 60:.0f} min of train + '
              f"eval wall time on {'; '.join(machines) or 'unknown'})", '', _commands(rows), '']
  path = os.path.join(out_dir, f'{name}.md')
  with open(path, 'w') as f:
    f.write('\n'.join(text))
  return path


_SUITE = flags.DEFINE_enum('suite', None, list(SUITES), 'The suite to run or report.')
_LIST = flags.DEFINE_bool('list', False, 'List the suites and their runs.')
_DRY_RUN = flags.DEFINE_bool('dry-run', False, 'Print the commands without running them.')
_REPORT = flags.DEFINE_bool('report', False, 'Only rebuild the report from finished runs.')
_RUNS = flags.DEFINE_string('runs', 'runs/reproduce', 'Where the run workdirs go.')
_OUT = flags.DEFINE_string('out', 'docs/results', 'Where the report goes.')
_ONLY = flags.DEFINE_list('only', [], 'Run only these encodings or runs (e.g. '
                          'paper_visionllama,paper_rope_mixed_108px_s0); the report keeps the '
                          'rows it has of the others.')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE config override for every run, e.g. '
                                 'total_steps=2000 (its runs get workdirs of their own).')


def main(argv):
  del argv
  if _LIST.value:
    for name, suite in SUITES.items():
      print(f'{name:8s} {len(suite.runs):3d} runs  {suite.doc}')
    return
  if not _SUITE.value:
    raise app.UsageError(f'--suite is required: one of {list(SUITES)} (or --list).')
  extra = tuple(f'--config.{kv}' for kv in _SET.value)
  for kv in _SET.value:
    if '=' not in kv:
      raise app.UsageError(f'--set {kv!r}: write KEY=VALUE, e.g. --set total_steps=2000.')
  suite = SUITES[_SUITE.value]
  if _REPORT.value:
    rows = [r for r in (row(r, suite, _RUNS.value, extra) for r in suite.runs) if r]
  else:
    rows = run_suite(_SUITE.value, _RUNS.value, extra, dry_run=_DRY_RUN.value,
                     only=tuple(_ONLY.value))
  if not _DRY_RUN.value:
    rows = merge_rows(_SUITE.value, rows, extra, _OUT.value)
    print('report:', write_report(_SUITE.value, rows, _OUT.value))


def merge_rows(name: str, rows: List[dict], extra: Tuple[str, ...], out_dir: str) -> List[dict]:
  """`rows` (from workdirs here) over the rows of the committed <out_dir>/<name>.json, for
  the runs the suite still defines, in the suite's order: a report is rebuilt without the
  workdirs, and a suite run in parts (or on several machines) adds up."""
  path = os.path.join(out_dir, f'{name}.json')
  old = []
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
  by_run = {r['run']: r for r in old}
  by_run.update({r['run']: r for r in rows})
  order = [run.dirname(extra) for run in SUITES[name].runs]
  return [by_run[n] for n in order if n in by_run]


if __name__ == '__main__':
  app.run(main)
