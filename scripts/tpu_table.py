"""The paper's configs compiled for TPU slices (bench compile), one cell at a time, resumable:
the cells are kept in ONE JSON file (--out, default docs/results/tpu.json: the compiler's facts
under "compiler", each cell's result under "cells"), rewritten atomically after each cell; a cell
already there is skipped. Then the markdown tables are made from what is there and printed; then
scripts/docs_tables.py rewrites the generated blocks of docs/tpu.md and docs/performance.md from
them (--nowrite: printed only).

  .venv-test/bin/python scripts/tpu_table.py [--out docs/results/tpu.json] [--jobs 1] \\
      [--only imagenet]
  .venv-test/bin/python scripts/tpu_table.py --cells imagenet:liere64:v5litepod-8:1024 ...

A cell is config:pe:topology[:batch[:KEY=VALUE...]] (batch: the config's recipe batch when left
out or empty; KEY=VALUE: --config overrides, e.g. model.pe.expm=scipy). The
compiler's memory and counts are exact for that program; the step time is a roofline estimate.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ('imagenet', 'cifar100', 'ucf101')
PES = ('abs', 'rope_mixed', 'liere8', 'liere64')
TOPOLOGIES = ('v5litepod-8', 'v6e-8', 'v4-8')
# LieRE's TPU cost (docs/performance.md): ImageNet ViT-B/16 at 128 images a chip on v5e-8, and
# PaPE's beside it (a lift: docs/decisions/026). The cells of earlier forms are in git history
# (docs/decisions/ names the commits).
COST_CELLS = tuple(f'imagenet:{pe}:v5litepod-8:1024'
                   for pe in PES + ('pape', 'pape_ri', 'liere8+pape'))


def paper_cells():  # Every config on the first slice, then on the next.
  return [f'{c}:{pe}:{t}' for t in TOPOLOGIES for c in CONFIGS for pe in PES]


_WRITE = threading.Lock()  # --jobs > 1: one cell's read-modify-write at a time


def results(out):
  """The file's {'compiler': facts, 'cells': {cell: result}} (empty when not written yet)."""
  try:
    with open(out) as f:
      return json.load(f)
  except FileNotFoundError:
    return {'compiler': {}, 'cells': {}}


def _keep(out, cell, res):
  with _WRITE:
    data = results(out)
    data['cells'][cell] = res
    with open(out + '.tmp', 'w') as f:
      json.dump(data, f, indent=1)
      f.write('\n')
    os.replace(out + '.tmp', out)


def run_cell(out, cell):
  config, pe, topology, *rest = cell.split(':')
  batch, overrides = rest[:1], rest[1:]
  if cell in results(out)['cells']:
    return cell, 'kept'
  cmd = [sys.executable, '-m', 'liere_jax.bench', 'compile', '--config',
         f'configs/{config}.py:pe={pe}', '--topology', topology, '--train_only', '--json']
  if batch and batch[0]:
    cmd.append(f'--config.batch_size={batch[0]}')
  cmd += [f'--config.{o}' for o in overrides]
  t0 = time.time()
  head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True,
                        text=True, check=False).stdout.strip()  # The code compiled, from here.
  p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                     env={**os.environ, 'ALLOW_MULTIPLE_LIBTPU_LOAD': '1'})
  lines = p.stdout.strip().splitlines()
  if p.returncode not in (0, 2) or not lines or not lines[-1].startswith('['):
    return cell, f'failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}'
  res, = json.loads(lines[-1])
  res.update(cell=cell, compile_s=round(time.time() - t0, 1), command=' '.join(cmd[1:]),
             commit=head)
  _keep(out, cell, res)
  return cell, f"{'fits' if res['fits'] else 'does not fit'} ({res['compile_s']:.0f} s)"


def _gib(x):
  return f'{x / 2**30:.2f}'


def paper_table(out) -> str:
  lines = ['| config | slice | pe | fits | GiB a chip (of HBM) | est. step ms | x abs | '
           'bytes x abs | if not: would fit (estimate) |', '|---' * 9 + '|']
  cells = results(out)['cells']
  for config in CONFIGS:
    for topology in TOPOLOGIES:
      base = cells.get(f'{config}:abs:{topology}')
      for pe in PES:
        r = cells.get(f'{config}:{pe}:{topology}')
        if r is None:
          lines.append(f'| {config} | {topology} | {pe} | (not compiled yet) |||||')
          continue
        hbm = _gib(r.get('available', r['hbm']))
        if not r['fits']:
          lines.append(f"| {config} (batch {r['batch']}) | {topology} | {pe} | **no** | "
                       f"{_gib(r['need'])} ({hbm}) | | | | {r['advice']} |")
          continue
        t, b = r['train'], base and base.get('train')
        ratio = lambda k: f'{t[k] / b[k]:.2f}' if b else ''
        lines.append(f"| {config} (batch {r['batch']}) | {topology} | {pe} | yes | "
                     f"{_gib(r['need'])} ({hbm}) | {t['step_s'] * 1e3:.1f} | {ratio('step_s')} "
                     f"| {ratio('bytes')} | |")
  return '\n'.join(lines)


def cost_table(out) -> str:
  cells = results(out)['cells']
  base = cells.get(COST_CELLS[0])
  lines = ['| pe | GiB a chip | XLA TFLOP | kernels\' MXU TFLOP / VPU Tops | XLA GB accessed | '
           'kernels\' GB | x abs | est. step ms | x abs | est. MFU | '
           'exp. / lattice / rotation % of traffic |', '|---' * 11 + '|']
  for cell in COST_CELLS:
    r = cells.get(cell)
    name = cell.split(':')[1] + ''.join(f' ({o})' for o in cell.split(':')[4:])
    if r is None or not r['fits']:
      lines.append(f"| {name} | {'not compiled yet' if r is None else 'no fit'} ||||||||||")
      continue
    t, b = r['train'], base['train'] if base else None
    parts = ' / '.join(f"{100 * t['parts'].get(p, 0):.0f}" for p in
                       ('exponential', 'lattice', 'rotation application'))
    ks = t.get('kernels')  # the Pallas kernels' declared work (cells compiled since issue 54)
    mxu_vpu = (f"{sum(k['mxu_flops'] for k in ks.values()) / 1e12:.2f} / "
               f"{sum(k['vpu_ops'] for k in ks.values()) / 1e12:.3f}" if ks else '-')
    kernel_gb = f"{sum(k['bytes'] for k in ks.values()) / 1e9:.1f}" if ks else '-'
    lines.append(f"| {name} | {_gib(r['need'])} | {t['flops'] / 1e12:.2f} | {mxu_vpu} | "
                 f"{t['bytes'] / 1e9:.0f} | {kernel_gb} | "
                 f"{t['bytes'] / b['bytes'] if b else 0:.2f} | "
                 f"{t['step_s'] * 1e3:.1f} | {t['step_s'] / b['step_s'] if b else 0:.2f} | "
                 f"{t['mfu']:.3f} | {parts} |")
  return '\n'.join(lines)


def write_docs():
  import docs_tables  # scripts/docs_tables.py: every generated block, these tables among them
  docs_tables.write()


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--out', default=os.path.join(ROOT, 'docs', 'results', 'tpu.json'),
                  help='the JSON file of the cells (made when missing)')
  ap.add_argument('--jobs', type=int, default=1, help='cells compiled at once (RAM: ~4 GB each)')
  ap.add_argument('--cells', nargs='*', help='default: the cost cells, then the paper table; '
                  'none: only the tables')
  ap.add_argument('--only', help='only cells of this config')
  ap.add_argument('--nowrite', action='store_true', help='print the tables, leave the docs')
  args = ap.parse_args()
  cells = (list(COST_CELLS) + paper_cells() if args.cells is None
           else args.cells)  # --cells alone: no compile, the tables from what is there.
  cells = [c for c in cells if not args.only or c.startswith(args.only + ':')]
  with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
    for cell, status in pool.map(lambda c: run_cell(args.out, c), cells):
      print(f'{cell}: {status}', flush=True)
  print('\n## The paper configs (docs/tpu.md)\n')
  print(paper_table(args.out))
  print('\n## LieRE and PaPE on v5e-8, ImageNet ViT-B/16 at 128 a chip (docs/performance.md)\n')
  print(cost_table(args.out))
  if not args.nowrite:
    write_docs()


if __name__ == '__main__':
  main()
