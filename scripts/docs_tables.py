"""The generated tables of README.md and docs/*.md, written from the committed result files in
docs/results/ (no measurement runs here): each block between `<!-- generated: NAME -->` and
`<!-- end generated -->` is replaced by TABLES[NAME](). The TPU compiler's tables are
scripts/tpu_table.py's (which compiles the cells and then calls write()).

  python scripts/docs_tables.py           # rewrite every block
  python scripts/docs_tables.py --check   # exit 1 and name the stale blocks, writing nothing
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpu_table  # noqa: E402  (scripts/ is not a package)

ROOT = tpu_table.ROOT
RESULTS = os.path.join(ROOT, 'docs', 'results')
TPU = os.path.join(RESULTS, 'tpu.json')
GPU = os.path.join(RESULTS, 'gpu', 'h200_2026-11-28.jsonl')
CPU = os.path.join(RESULTS, 'cpu_steps.json')
PES = ('rope_mixed', 'liere8', 'liere64')
BLOCK = re.compile(r'(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)', re.S)


def _json(path):
  with open(path) as f:
    return json.load(f)


def _gpu():
  """The H200 file's sections by name (the machine line's facts under 'machine')."""
  with open(GPU) as f:
    lines = [json.loads(line) for line in f if line.strip()]
  return {d['section']: d if d['section'] == 'machine' else d['result'] for d in lines}


def _gpu_steps(g):
  """pe -> (its step, abs's step, ratio, command) at batch 128 on the H200."""
  out = {}
  for section, r in g.items():
    if section.startswith('step_'):
      a, b = r['config'], r['baseline']
      if b.endswith('pe=abs'):  # A = the encoding
        pe, t, base = a.split('pe=')[1], r['train_s'], r['baseline_train_s']
      else:  # A = abs, B = the encoding in another form
        pe, t, base = b.split('pe=')[1], r['baseline_train_s'], r['train_s']
      out[pe.split(',')[0]] = (t, base, t / base, section)
  return out


def _versions(v):
  return ', '.join(f'{k} {x}' for k, x in v.items())


def speed():
  """README: the train step against abs's, one row a platform."""
  cpu, g = _json(CPU), _gpu()
  m, steps = g['machine'], _gpu_steps(g)
  tpu = tpu_table.results(TPU)
  cost = {c.split(':')[1]: tpu['cells'][c] for c in tpu_table.COST_CELLS}
  against_abs = [r for r in cpu['rows'] if r['against'] == 'abs']
  cpu_r = {r['pe']: r['step_ratio'] for r in against_abs}
  tpu_r = {pe: cost[pe]['train']['step_s'] / cost['abs']['train']['step_s'] for pe in PES}
  facts = tpu['compiler']
  rows = [
      ('CPU (measured)', f"{cpu['machine']}; {', '.join(sorted({r['date'] for r in against_abs}))}; "
       f"{_versions(cpu['versions'])}", 'ViT-Ti, CIFAR-100', cpu_r),
      ('GPU (measured)', f"one {m['device']}; {m['date']}; {_versions(m['versions'])}",
       'ViT-B/16, 224 px, batch 128', {pe: steps[pe][2] for pe in PES}),
      ('TPU (compiler estimate)', f"v5litepod-8, deviceless; {facts['dates']}; libtpu 0.0.42.1",
       'ViT-B/16, 224 px, 128 a chip', tpu_r)]
  lines = ['| platform | device, date, versions | model | ' + ' | '.join(PES) + ' |',
           '|---' * (3 + len(PES)) + '|']
  for name, where, model, r in rows:
    lines.append(f'| {name} | {where} | {model} | '
                 + ' | '.join(f'{r[pe]:.2f}' if pe in r else '-' for pe in PES) + ' |')
  return '\n'.join(lines)


def main_job():
  r = _json(os.path.join(RESULTS, 'main_job.json'))
  e, w = r['eval'], r['wall']
  return (f"Held-out top-1 **{e['top1']:.3f}** [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}] "
          f"(n={e['n']}, 95% CI), {e['patches_shuffled']:.3f} with the patches shuffled, "
          f"{e['at_168px_normalized']} / {e['at_168px_rescaled']} at 168 px (normalized / rescaled "
          f"positions); **{w['script']}** for the whole script (train {w['train']}, eval "
          f"{w['eval']}): `{r['command']}` on a {r['machine']}; {r['date']}, "
          f"{_versions(r['versions'])}.")


def _table(caption, header, rows):
  """A caption, then a Markdown table of the header's columns and the rows' cells."""
  lines = [caption, '', '| ' + ' | '.join(header) + ' |', '|---' * len(header) + '|']
  return '\n'.join(lines + ['| ' + ' | '.join(map(str, row)) + ' |' for row in rows])


def cpu_steps():
  cpu = _json(CPU)
  return _table(f"{cpu['machine']}; {_versions(cpu['versions'])}. {cpu['what']}",
                ('pe', 'train step x', 'against', 'date', 'measured', 'command'),
                [(r['pe'], f"{r['step_ratio']:.3f}", r['against'], r['date'], r['measured'],
                  f"`{r['command']}`") for r in cpu['rows']])


def gpu_steps():
  g = _gpu()
  m, steps = g['machine'], _gpu_steps(g)
  return _table(f"One {m['device']} ({m['memory_mib']:,} MiB, driver {m['driver']}), {m['date']}, "
                f"{_versions(m['versions'])}; ViT-B/16 at 224 px in bf16, batch 128, A and abs "
                'alternating in one process, medians of 8 steps.',
                ('pe', 'step (s)', 'abs (s)', 'x abs', 'command'),
                [(pe, f'{t:.4f}', f'{base:.4f}', f'{ratio:.2f}', f"`{m['commands'][section]}`")
                 for pe, (t, base, ratio, section) in ((pe, steps[pe]) for pe in PES)])


# bench expm's --impl names of the time -> today's for the same computation (issue 51's rename).
IMPLS_NOW = {'fast_loop': 'loop'}


def gpu_expm():
  g = _gpu()
  now = lambda name: IMPLS_NOW.get(name, name)
  command = re.sub(r'(?<=--impl )(\w+)', lambda m: now(m[1]),
                   g['machine']['commands']['ab_expm_pallas'])
  return _table(f"`{command}` on the same H200, ms, medians of 3, torch.matrix_exp in the same "
                'process (impls by their names today):',
                ('case', 'impl', 'fwd ms', 'fwd+bwd ms', 'max err'),
                [(f"{r['case']} ({r['n_matrices']:,} of {r['size']}x{r['size']})", now(r['impl']),
                  f"{r['fwd_s'] * 1e3:.1f}", f"{r['fwd_bwd_s'] * 1e3:.1f}",
                  f"{r['max_abs_err']:.1e}") for r in g['ab_expm_pallas']])


def _tpu_facts():
  f = tpu_table.results(TPU)['compiler']
  return f"{f['compiler']}, {f['dates']}: {f['exact']}"


def tpu_cost():
  return (f"{_tpu_facts()}\n\n{tpu_table.cost_table(TPU)}\n\nEach cell: "
          '`python scripts/tpu_table.py --cells imagenet:PE:v5litepod-8:1024` (its command is '
          'in its entry of `docs/results/tpu.json`).')


def tpu_paper():
  return (f"{_tpu_facts()}\n\n{tpu_table.paper_table(TPU)}\n\nEvery cell: "
          '`python scripts/tpu_table.py` (resumable: a cell already in `docs/results/tpu.json` is kept).')


TABLES = {'main-job': main_job, 'speed': speed, 'cpu-steps': cpu_steps, 'gpu-steps': gpu_steps, 'gpu-expm': gpu_expm,
          'tpu-cost': tpu_cost, 'tpu-paper': tpu_paper}


def pages():
  return [os.path.join(ROOT, 'README.md')] + sorted(
      glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True))


def render(text):
  """text with every generated block rewritten; KeyError for an unknown block name."""
  return BLOCK.sub(lambda m: f'{m[1]}{TABLES[m[2]]()}\n{m[4]}', text)


def stale():
  """[(page, its text as it should be)] for each page whose blocks differ from the files."""
  out = []
  for path in pages():
    with open(path) as f:
      text = f.read()
    new = render(text)
    if new != text:
      out.append((path, new))
  return out


def write():
  for path, new in stale():
    with open(path, 'w') as f:
      f.write(new)
    print(f'rewrote {os.path.relpath(path, ROOT)}')


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--check', action='store_true', help='name stale pages, write nothing')
  if ap.parse_args().check:
    bad = [os.path.relpath(p, ROOT) for p, _ in stale()]
    print('stale: ' + ', '.join(bad) if bad else 'every generated block is current')
    sys.exit(1 if bad else 0)
  write()


if __name__ == '__main__':
  main()
