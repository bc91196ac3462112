"""Each suite's report (a markdown table and its plots) and headline (the index's line), made
from the suite's rows."""
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from liere_jax.encodings import registry
from liere_jax.reproduce.paper import (CELL, EXTRAPOLATION_GRIDS, FIG7_EXAMPLES, HEAD_DIM,
                                       ORDER, PAPER_CIFAR_BLOCKS, PAPER_CIFAR_INIT, PAPER_CIFAR_SHARE,
                                       PAPER_CIFAR_SHUFFLE_DROP, PAPER_TABLE3, PLATEAU,
                                       PLATEAU_EXIT, TRAIN_GRID, label, paper_key)

TRAIN_PX = CELL * TRAIN_GRID
# Table 4's columns: RoPE-Mixed (the paper's, LieRE with 2x2 blocks: sharing applies), LieRE64
# (= head dim; ours is 32), LieRE8.
TABLE4_COLUMNS = ('paper_rope_mixed', f'liere{HEAD_DIM}', 'liere8')
SHARE_MODES = ('none', 'layers', 'heads', 'all')
# The encodings a table3 headline names.
HEADLINE_ENCODINGS = ('abs', 'paper_rope_mixed', 'rope_mixed', 'liere8', f'liere{HEAD_DIM}')
Rows = List[dict]


def _pct(x: Optional[float]) -> str:
  return '-' if x is None else f'{100 * x:.1f}'


def _ci(row) -> str:
  lo, hi = row['top1_ci95']
  return f"{_pct(row['top1'])} ({_pct(lo)}-{_pct(hi)})"


def _paper3(pe, px) -> str:
  p = PAPER_TABLE3.get((paper_key(pe), px))
  return f'{p[0]:.1f} ({p[1]:.1f}-{p[2]:.1f})' if p else '-'


def _exit(row) -> str:
  step = row.get('plateau_exit', '?')  # '?': a row from before plateau exits were recorded.
  return '-' if step is None else str(step)


def _means(rows: Rows, key: Callable[[dict], object], value: Callable[[dict], float]):
  """{key: (mean of value, number of rows)} in the rows' order."""
  groups: Dict[object, List[float]] = {}
  for r in rows:
    groups.setdefault(key(r), []).append(value(r))
  return {k: (statistics.fmean(v), len(v)) for k, v in groups.items()}


def _by_order(pe: str) -> int:
  return ORDER.index(pe) if pe in ORDER else len(ORDER)


def _table3_at_train(rows: Rows) -> List[str]:
  lines = ['| encoding | seed | ours | paper | plateau exit | patches shuffled |',
           '|---|---|---|---|---|---|']
  for r in sorted(rows, key=lambda r: (_by_order(r['pe']), r['seed'])):
    lines.append(f"| {label(r['pe'])} | {r['seed']} | {_ci(r)} | {_paper3(r['pe'], r['px'])} | "
                 f"{_exit(r)} | {_pct(r['shuffled_top1'])} |")
  return lines


def _table3_larger(rows: Rows, px: int, budget: Dict[int, tuple]) -> List[str]:
  spend = ', '.join(f'{k}={v}' for k, v in budget.get(px // CELL, ())) or "the main job's"
  lines = [f'## {px} px ({px // CELL}x{px // CELL} patches)', '',
           f"Budget (the suite's definition): {spend}; the model, batch and learning rate of "
           "the main job. Each encoding's last line is the mean over its seeds.", '',
           '| encoding | seed | ours | paper | plateau exit | patches shuffled | drop % |',
           '|---|---|---|---|---|---|---|']
  for pe in sorted({r['pe'] for r in rows}, key=_by_order):
    rs = sorted((r for r in rows if r['pe'] == pe), key=lambda r: r['seed'])
    for r in rs:
      lines.append(f"| {label(pe)} | {r['seed']} | {_ci(r)} | {_paper3(pe, px)} | {_exit(r)} | "
                   f"{_pct(r['shuffled_top1'])} | {100 * r['shuffle_drop_rel']:.1f} |")
    exits = [r.get('plateau_exit') for r in rs]
    left = [e for e in exits if isinstance(e, int)]
    exit_text = (f'{statistics.fmean(left):.0f} ' if left else '') + f'({len(left)}/{len(rs)} left)'
    mean = lambda key: statistics.fmean(r[key] for r in rs)  # pylint: disable=cell-var-from-loop
    lines.append(f"| {label(pe)} | mean of {len(rs)} | {_pct(mean('top1'))} | "
                 f"{_paper3(pe, px)} | {exit_text} | {_pct(mean('shuffled_top1'))} | "
                 f"{100 * mean('shuffle_drop_rel'):.1f} |")
  return lines


def _bars_at_train(rows: Rows):
  def plot(ax):
    rs = sorted((r for r in rows if r['seed'] == 0), key=lambda r: _by_order(r['pe']))
    x = range(len(rs))
    err = [[100 * (r['top1'] - r['top1_ci95'][0]) for r in rs],
           [100 * (r['top1_ci95'][1] - r['top1']) for r in rs]]
    ax.bar([i - 0.2 for i in x], [100 * r['top1'] for r in rs], 0.4, yerr=err,
           label='ours (small ViT, CPU budget)')
    paper = [PAPER_TABLE3.get((paper_key(r['pe']), r['px']), (float('nan'),))[0] for r in rs]
    ax.bar([i + 0.2 for i in x], paper, 0.4, label='paper (ViT-B, 800k examples)')
    ax.axhline(100 * PLATEAU, color='gray', ls=':', label=f'majority-arrow floor {PLATEAU:.1%}')
    ax.set_xticks(list(x), [label(r['pe']) for r in rs], rotation=40, ha='right', fontsize=7)
    ax.set_ylabel(f'top-1 % at {TRAIN_PX} px')
    ax.set_ylim(0, 125)
    ax.legend(fontsize=7, loc='upper left', ncol=3)
  return plot


def _bars_larger(rows: Rows):
  def plot(ax):
    keys = sorted({(r['px'], r['pe']) for r in rows}, key=lambda k: (k[0], _by_order(k[1])))
    for i, (px, pe) in enumerate(keys):
      rs = [r for r in rows if (r['px'], r['pe']) == (px, pe)]
      ax.bar(i, 100 * statistics.fmean(r['top1'] for r in rs), 0.6, color=f'C{px % 10}',
             alpha=0.5)
      ax.plot([i] * len(rs), [100 * r['top1'] for r in rs], 'k.')
      p = PAPER_TABLE3.get((paper_key(pe), px))
      if p:
        ax.plot(i, p[0], 'rx')
    ax.axhline(100 * PLATEAU, color='gray', ls=':')
    ax.set_xticks(range(len(keys)), [f'{label(pe)} {px}' for px, pe in keys], rotation=40,
                  ha='right', fontsize=7)
    ax.set_ylabel('top-1 %: bar mean, dots seeds, x paper')
    ax.set_ylim(0, 105)
  return plot


def report_table3(rows: Rows, budget: Dict[int, tuple]):
  at_train = [r for r in rows if r['px'] == TRAIN_PX]
  larger = sorted({r['px'] for r in rows} - {TRAIN_PX})
  lines = ['Top-1 % on 2,000 held-out examples, bootstrap 95% CI; paper: ViT-B, 800k examples '
           "(Table 3). The paper's rows come first, with its definitions (RoPE-Mixed = the LieRE "
           "code's LieRE2, VisionLlama = its fixed-frequency encoding on [0, 1] positions); then "
           "naver-ai's RoPE-Mixed and rope-vit's axial RoPE (integer positions), which the paper "
           'did not run; ComRoPE and STRING (the last rows) are later work, not in the paper. '
           f"The {len(at_train)} runs at {TRAIN_PX} px took "
           f"{sum(r['wall_s'] for r in at_train) / 60:.0f} min of train + eval wall time. "
           'Plateau exit: the first logged step from which train accuracy stays >= '
           f'{100 * PLATEAU_EXIT:.0f}% (-: never; ?: not recorded).', '',
           f'## {TRAIN_PX} px ({TRAIN_GRID}x{TRAIN_GRID} patches)', ''] + _table3_at_train(
               at_train)
  for px in larger:
    lines += [''] + _table3_larger([r for r in rows if r['px'] == px], px, budget)
  disagree = []
  for r in rows:
    p = PAPER_TABLE3.get((paper_key(r['pe']), r['px']))
    lo, hi = r['top1_ci95']
    if p and (100 * hi < p[1] or 100 * lo > p[2]):
      disagree.append(f"{label(r['pe'])} at {r['px']} px (seed {r['seed']}): ours "
                      f"{_pct(r['top1'])}, paper {p[0]:.1f}")
  if disagree:
    lines += ['', 'Disagreements with the paper (95% CIs do not overlap): ' + '; '.join(disagree)
              + '.']
  plots = {'': _bars_at_train(at_train)} if at_train else {}
  if larger:
    plots['_large'] = _bars_larger([r for r in rows if r['px'] != TRAIN_PX])
  return '\n'.join(lines), plots


def headline_table3(rows: Rows) -> Tuple[str, str]:
  ours, paper = [], []
  for px in sorted({r['px'] for r in rows}):
    at = [r for r in rows if r['px'] == px and r['pe'] in HEADLINE_ENCODINGS]
    means = _means(sorted(at, key=lambda r: _by_order(r['pe'])), lambda r: r['pe'],
                   lambda r: r['top1'])
    ours.append(f'{px} px: ' + ', '.join(f'{label(pe)} {100 * m:.1f}' + (f' ({n} seeds)' if n > 1
                                                                        else '')
                                          for pe, (m, n) in means.items()))
    there = [(pe, PAPER_TABLE3.get((paper_key(pe), px))) for pe in means]
    paper.append(f'{px} px: ' + ', '.join(f'{label(pe)} {p[0]:.1f}' for pe, p in there if p))
  return '; '.join(ours), '; '.join(paper)


def report_table5(rows: Rows):
  lines = ['Patch shuffling (one fixed permutation of the 81 patches) on the table3 runs at '
           f'{TRAIN_PX} px. Drop % = (before - after) / before. Paper: CIFAR-100 (Table 5; no '
           'synthetic-task numbers), shown as the finding to test (LieRE drops most).', '',
           '| encoding | seed | before | after | drop % | paper drop % (CIFAR-100) |',
           '|---|---|---|---|---|---|']
  rows = sorted((r for r in rows if r['px'] == TRAIN_PX), key=lambda r: -r['shuffle_drop_rel'])
  for r in rows:
    p = PAPER_CIFAR_SHUFFLE_DROP.get(paper_key(r['pe']))
    lines.append(f"| {label(r['pe'])} | {r['seed']} | {_pct(r['top1'])} | "
                 f"{_pct(r['shuffled_top1'])} | {100 * r['shuffle_drop_rel']:.1f} | "
                 f"{'-' if p is None else p} |")

  def plot(ax):
    x = range(len(rows))
    ax.bar(x, [100 * r['shuffle_drop_rel'] for r in rows])
    ax.set_xticks(list(x), [f"{label(r['pe'])} s{r['seed']}" for r in rows], rotation=40,
                  ha='right', fontsize=7)
    ax.set_ylabel('relative drop % with shuffled patches')
  return '\n'.join(lines), {'': plot}


def headline_table5(rows: Rows) -> Tuple[str, str]:
  rs = sorted((r for r in rows if r['seed'] == 0 and paper_key(r['pe']) in
               PAPER_CIFAR_SHUFFLE_DROP), key=lambda r: _by_order(r['pe']))
  return ('drop with shuffled patches: ' + ', '.join(
      f"{label(r['pe'])} {100 * r['shuffle_drop_rel']:.1f}%" for r in rs),
          'CIFAR-100: ' + ', '.join(
              f"{label(r['pe'])} {PAPER_CIFAR_SHUFFLE_DROP[paper_key(r['pe'])]}%" for r in rs))


def _modes(pe: str) -> Tuple[Tuple[str, str], ...]:
  """(row label, result key): an encoding that reads no positions has one row for both."""
  if registry.facts(pe).reads_positions:
    return (('sequential', 'sequential'), ('rescaled', 'rescaled'))
  return (('any (reads none)', 'sequential'),)


def report_fig7(rows: Rows):
  sizes = sorted({int(s) for r in rows for s in r['resolutions']})
  lines = [f'Top-1 % on {FIG7_EXAMPLES} held-out examples at other input sizes (12 px cells, '
           f'{sizes[0] // CELL} to {sizes[-1] // CELL} per side) of models trained at '
           f"{TRAIN_PX} px. Sequential: each encoding's own position units, so a larger image "
           'spans a larger range (paper Sec. 5.6; LieRE: i / 8, RoPE: i); rescaled: positions '
           'squeezed into the training range. Paper Fig. 7 is ImageNet (sequential beats '
           'rescaled for LieRE and RoPE-Mixed; LieRE64 holds up better above 320 px).', '',
           '| encoding | positions | ' + ' | '.join(f'{s}' for s in sizes) + ' |',
           '|---|---|' + '---|' * len(sizes)]
  rows = [r for r in rows if r['px'] == TRAIN_PX and r['seed'] == 0]
  for r in rows:
    for name, mode in _modes(r['pe']):
      cells = [_pct(r['resolutions'].get(str(s), {}).get(mode)) for s in sizes]
      lines.append(f"| {label(r['pe'])} | {name} | " + ' | '.join(cells) + ' |')

  def plot(ax):
    for i, r in enumerate(rows):
      for (_, mode), ls in zip(_modes(r['pe']), ('-', ':')):
        pts = [(s, r['resolutions'].get(str(s), {}).get(mode)) for s in sizes]
        pts = [(s, 100 * a) for s, a in pts if a is not None]
        ax.plot(*zip(*pts), ls, color=f'C{i % 10}', marker='.',
                label=label(r['pe']) if mode == 'sequential' else None)
    ax.axvline(TRAIN_PX, color='gray', lw=0.5)
    ax.set_xlabel('input size (px); solid: sequential, dotted: rescaled positions')
    ax.set_ylabel('top-1 %')
    ax.legend(fontsize=6, ncol=2)
  return '\n'.join(lines), {'': plot}


def headline_fig7(rows: Rows) -> Tuple[str, str]:
  size = str(max(int(s) for r in rows for s in r['resolutions']))
  rs = [r for r in rows if r['pe'] in ('paper_rope_mixed', 'rope_mixed', 'liere8')]
  return (f'{size} px, sequential / rescaled: ' + ', '.join(
      f"{label(r['pe'])} {_pct(r['resolutions'].get(size, {}).get('sequential'))} / "
      f"{_pct(r['resolutions'].get(size, {}).get('rescaled'))}" for r in rs),
          'ImageNet, a plot: sequential beats rescaled for LieRE and RoPE-Mixed')


def _sweep(title: str, paper: Callable[[dict], str], x_of: Callable[[dict], float],
           xlabel: str, log_x: bool = False):
  """A report of runs that vary one setting: a row per run, a line per encoding."""
  def report(rows: Rows):
    lines = [title, '', '| encoding | setting | seed | ours | paper |', '|---|---|---|---|---|']
    for r in rows:  # The suite's order.
      lines.append(f"| {label(r['pe'])} | {r['label']} | {r['seed']} | {_ci(r)} | {paper(r)} |")

    def plot(ax):
      for i, pe in enumerate(dict.fromkeys(r['pe'] for r in rows)):
        rs = sorted((r for r in rows if r['pe'] == pe), key=x_of)
        ax.errorbar([x_of(r) for r in rs], [100 * r['top1'] for r in rs],
                    yerr=[[100 * (r['top1'] - r['top1_ci95'][0]) for r in rs],
                          [100 * (r['top1_ci95'][1] - r['top1']) for r in rs]],
                    fmt='o-' if len({r['seed'] for r in rs}) == 1 else 'o', color=f'C{i}',
                    label=label(pe), capsize=2)
      if log_x:
        ax.set_xscale('log', base=2)
      ax.set_xlabel(xlabel)
      ax.set_ylabel(f'top-1 % at {TRAIN_PX} px')
      ax.legend(fontsize=7)
    return '\n'.join(lines), {'': plot}
  return report


def _block(r) -> int:
  return int(r['pe'][len('liere'):])


def _share(r) -> str:
  return r['label'].split()[-1]


def _span(values: Sequence[float]) -> str:
  return f'{min(values):.1f}-{max(values):.1f}'


report_fig6 = _sweep('LieRE block size (Fig. 6). Paper: CIFAR-100 top-1 (Table 10), where 8 is '
                     'best.', lambda r: str(PAPER_CIFAR_BLOCKS.get(_block(r), '-')), _block,
                     'block size', log_x=True)


def headline_fig6(rows: Rows) -> Tuple[str, str]:
  best = max(rows, key=lambda r: r['top1'])
  paper = max(PAPER_CIFAR_BLOCKS, key=PAPER_CIFAR_BLOCKS.get)
  return (f"best block {_block(best)} ({_pct(best['top1'])}); all "
          f"{_span([100 * r['top1'] for r in rows])}",
          f'CIFAR-100: best block {paper} ({PAPER_CIFAR_BLOCKS[paper]}); all '
          f'{_span(list(PAPER_CIFAR_BLOCKS.values()))}')


report_fig4 = _sweep(
    'Training examples (Fig. 4: data.num_train, the same number of steps, so fewer examples '
    'means more epochs). Paper: CIFAR-100 fractions 20-90% as a plot (LieRE and RoPE-Mixed '
    'ahead of abs, most when data is scarce); no numbers in the text.', lambda r: '-',
    lambda r: int(r['label'].split()[0]), 'training examples', log_x=True)


def headline_fig4(rows: Rows) -> Tuple[str, str]:
  fewest = min(int(r['label'].split()[0]) for r in rows)
  rs = [r for r in rows if int(r['label'].split()[0]) == fewest]
  return (f'{fewest} examples: ' + ', '.join(f"{label(r['pe'])} {_pct(r['top1'])}" for r in rs),
          'CIFAR-100, a plot: LieRE and RoPE-Mixed ahead of abs, most when data is scarce')


report_table4 = _sweep(
    'Sharing the generators (Table 4). Paper: CIFAR-100 top-1 (LieRE64 column for our LieRE32 '
    '= head dim).', lambda r: str(PAPER_CIFAR_SHARE[_share(r)][TABLE4_COLUMNS.index(r['pe'])]),
    lambda r: SHARE_MODES.index(_share(r)), 'shared over: 0 none, 1 layers, 2 heads, 3 all')


def headline_table4(rows: Rows) -> Tuple[str, str]:
  pes = [pe for pe in TABLE4_COLUMNS if any(r['pe'] == pe for r in rows)]
  paper = lambda pe: [v[TABLE4_COLUMNS.index(pe)] for v in PAPER_CIFAR_SHARE.values()]
  return ('over the share modes: ' + ', '.join(
      f"{label(pe)} {_span([100 * r['top1'] for r in rows if r['pe'] == pe])}" for pe in pes),
          'CIFAR-100: ' + ', '.join(f'{label(pe)} {_span(paper(pe))}' for pe in pes))


report_table7 = _sweep(
    'Init scale (Table 7). Paper (CIFAR-100, paired z-test 2 pi vs 1): LieRE8 -1.18 points '
    '(p = 0.07), RoPE-Mixed -2.55 (p = 0.0001).', lambda r: '-',
    lambda r: 0 if '1.0' in r['label'] else 1, 'init scale: 0 = 1, 1 = 2 pi')


def headline_table7(rows: Rows) -> Tuple[str, str]:
  means = _means(rows, lambda r: (r['pe'], r['label']), lambda r: r['top1'])
  pes = [pe for pe in PAPER_CIFAR_INIT if (pe, 'init 1.0') in means and (pe, 'init 2pi') in means]
  return ('2 pi - 1 (mean of seeds): ' + ', '.join(
      f"{label(pe)} {100 * (means[pe, 'init 2pi'][0] - means[pe, 'init 1.0'][0]):+.1f} points"
      for pe in pes),
          'CIFAR-100: ' + ', '.join(f'{label(pe)} {d:+.2f} points (p = {p})'
                                     for pe, (d, p) in PAPER_CIFAR_INIT.items()))


# Student's t quantile t(0.975, df) for a 95% interval of a mean over df + 1 seeds.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262}


def seed_interval(values: Sequence[float]) -> Tuple[float, Optional[Tuple[float, float]]]:
  """(mean, its 95% t-interval over seeds, or None for one seed)."""
  mean = statistics.fmean(values)
  if len(values) < 2:
    return mean, None
  half = _T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5
  return mean, (mean - half, mean + half)


def _accuracy(r, grid: int, mode: str) -> Optional[float]:
  """A run's top-1 at `grid` in a positions mode (the training grid: its held-out top-1)."""
  if grid == TRAIN_GRID:
    return r['top1']
  return r['resolutions'].get(str(CELL * grid), {}).get(mode)


def _extrapolation_cells(rows: Rows):
  """{(pe, mode label): {grid: [accuracies over seeds]}} in ORDER."""
  cells: Dict[tuple, Dict[int, List[float]]] = {}
  for r in sorted(rows, key=lambda r: (_by_order(r['pe']), r['seed'])):
    for name, mode in _modes(r['pe']):
      for g in EXTRAPOLATION_GRIDS:
        a = _accuracy(r, g, mode)
        if a is not None:
          cells.setdefault((r['pe'], name), {}).setdefault(g, []).append(a)
  return cells


def _scale(grid: int) -> str:
  return f'{grid / TRAIN_GRID:.3g}x'


def report_extrapolation(rows: Rows):
  cells = _extrapolation_cells(rows)
  head = ' | '.join(f'{CELL * g} px ({_scale(g)})' for g in EXTRAPOLATION_GRIDS)
  lines = [f'Top-1 % of models trained at {TRAIN_PX} px ({TRAIN_GRID}x{TRAIN_GRID} cells), '
           'evaluated on 2,000 held-out examples at 1x, 1.5x (rounded up to whole cells: '
           '1.56x), 2x and 3x the grid: the mean over seeds and its 95% t-interval (n seeds in '
           "each cell). Sequential: each encoding's own position units, a larger grid spans a "
           'larger range; rescaled: positions squeezed into the training range (interpolation). '
           'An encoding that reads no positions has one row.', '',
           f'| encoding | positions | n | {head} |', '|---|---|---|' + '---|' * len(
               EXTRAPOLATION_GRIDS)]
  for (pe, mode), by_grid in cells.items():
    texts = []
    for g in EXTRAPOLATION_GRIDS:
      values = by_grid.get(g)
      if not values:
        texts.append('-')
        continue
      mean, ci = seed_interval(values)
      texts.append(_pct(mean) + (f' ({_pct(max(ci[0], 0.))}-{_pct(min(ci[1], 1.))})'
                                 if ci else ''))
    n = max(len(v) for v in by_grid.values())
    lines.append(f'| {label(pe)} | {mode} | {n} | ' + ' | '.join(texts) + ' |')
  lines += ['', 'Every seed (sequential positions):', '',
            '| encoding | seed | ' + ' | '.join(_scale(g) for g in EXTRAPOLATION_GRIDS) + ' |',
            '|---|---|' + '---|' * len(EXTRAPOLATION_GRIDS)]
  for r in sorted(rows, key=lambda r: (_by_order(r['pe']), r['seed'])):
    lines.append(f"| {label(r['pe'])} | {r['seed']} | " + ' | '.join(
        _pct(_accuracy(r, g, 'sequential')) for g in EXTRAPOLATION_GRIDS) + ' |')

  def plot(ax):
    for i, pe in enumerate(dict.fromkeys(pe for pe, _ in cells)):
      for (name, _), ls in zip(_modes(pe), ('-', ':')):
        by_grid = cells.get((pe, name), {})
        gs = [g for g in EXTRAPOLATION_GRIDS if by_grid.get(g)]
        stats = [seed_interval(by_grid[g]) for g in gs]
        ax.errorbar([g / TRAIN_GRID for g in gs], [100 * m for m, _ in stats],
                    yerr=[[100 * (m - (ci or (m, m))[0]) for m, ci in stats],
                          [100 * ((ci or (m, m))[1] - m) for m, ci in stats]],
                    fmt='.' + ls, color=f'C{i % 10}', capsize=2,
                    label=label(pe) if ls == '-' else None)
    ax.set_xlabel('evaluation grid / training grid; solid: sequential, dotted: rescaled')
    ax.set_ylabel('top-1 %')
    ax.legend(fontsize=6, ncol=2)
  return '\n'.join(lines), {'': plot}


def headline_extrapolation(rows: Rows) -> Tuple[str, str]:
  cells = _extrapolation_cells(rows)
  far = EXTRAPOLATION_GRIDS[-1]
  means = {pe: statistics.fmean(v[far]) for (pe, mode), v in cells.items()
           if mode != 'rescaled' and v.get(far)}
  best = sorted(means, key=means.get, reverse=True)[:3]
  return (f'{_scale(far)} the grid, sequential, mean of seeds: ' + ', '.join(
      f'{label(pe)} {_pct(means[pe])}' for pe in best), 'not in the paper (no study compares '
          'rotary and PaPE encodings across resolutions)')
