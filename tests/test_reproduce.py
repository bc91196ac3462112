"""The reproduction suites: real train.py / eval.py runs, resume/skip, and the report files."""
import json
import os
import subprocess
import sys

import pytest

from liere_jax import reproduce

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A run small enough for CI: the suite's own commands, shrunk by config overrides only.
SHRINK = ('--config.total_steps=2', '--config.batch_size=8', '--config.eval_batch_size=16',
          '--config.data.num_eval=16', '--config.model.width=16', '--config.model.heads=2',
          '--config.model.depth=1', '--config.model.mlp_dim=16', '--config.log_every=1')


def test_every_suite_lists_distinct_runs_with_their_commands():
  proc = subprocess.run([sys.executable, '-m', 'liere_jax.reproduce', '--list'], cwd=REPO,
                        capture_output=True, text=True, check=True)
  for name in ('table3', 'table5', 'fig7', 'fig6', 'fig4', 'table4', 'table7'):
    assert name in proc.stdout
  for name, suite in reproduce.SUITES.items():
    names = [r.name for r in suite.runs]
    assert len(names) == len(set(names)), name
  table3 = {(r.pe, r.px) for r in reproduce.SUITES['table3'].runs}
  for pe in reproduce.PAPER_ENCODINGS:
    assert (pe, 108) in table3
  assert {('abs', 168), ('rope_mixed', 168), ('liere8', 168)} <= table3
  # The evaluation-only suites reuse table3's workdirs.
  assert {r.name for r in reproduce.SUITES['fig7'].runs} <= {
      r.name for r in reproduce.SUITES['table3'].runs}


def test_dry_run_prints_the_commands_and_writes_nothing(tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'liere_jax.reproduce', '--suite', 'fig7',
                         '--dry-run', '--runs', str(tmp_path / 'runs'), '--out',
                         str(tmp_path / 'out'), '--set', 'total_steps=2000'], cwd=REPO,
                        capture_output=True, text=True, check=True)
  assert 'python train.py --config configs/arrows.py:pe=liere8,grid=9' in proc.stdout
  assert '--config.total_steps=2000' in proc.stdout
  assert '--out eval_fig7 --resolutions=84,96' in proc.stdout
  assert not (tmp_path / 'runs').exists() and not (tmp_path / 'out').exists()


def test_a_suite_trains_evaluates_skips_when_done_and_reports(tmp_path, monkeypatch):
  suite = reproduce.Suite('test', (reproduce.Run('liere8', seed=1),),
                          reproduce.Eval('eval_fig7', (96, 120), 16), reproduce._report_fig7)
  monkeypatch.setitem(reproduce.SUITES, 'tiny', suite)
  runs, lines = str(tmp_path / 'runs'), []
  rows = reproduce.run_suite('tiny', runs, SHRINK, log=lines.append)
  name = suite.runs[0].dirname(SHRINK)  # liere8_108px_s1_set<hash of SHRINK>
  assert name.startswith('liere8_108px_s1_set') and [r['run'] for r in rows] == [name]
  row = rows[0]
  assert row['steps'] == 2 and row['n_examples'] == 16 and row['wall_s'] > 0
  assert set(row['resolutions']) == {'96', '120'}
  assert set(row['resolutions']['96']) == {'sequential', 'rescaled'}
  assert row['command'].startswith('python train.py --config configs/arrows.py:pe=liere8,grid=9')
  assert '--config.model.width=16' in row['command'] and '--config.seed=1' in row['command']
  with open(os.path.join(runs, name, 'config.json')) as f:
    assert json.load(f)['seed'] == 1

  # Done runs are skipped: nothing runs again.
  lines.clear()
  monkeypatch.setattr(reproduce.subprocess, 'run', lambda *a, **k: pytest.fail('ran again'))
  assert reproduce.run_suite('tiny', runs, SHRINK, log=lines.append) == rows
  assert lines == [f'suite tiny: 1 runs, 1 done here, 0 to run now (workdirs under {runs})']

  # A second evaluation of a trained run evaluates without training again.
  suite2 = reproduce.Suite('test', suite.runs[:1], reproduce.Eval(), reproduce._report_table3)
  monkeypatch.undo()
  monkeypatch.setitem(reproduce.SUITES, 'tiny2', suite2)
  calls = []
  real_run = subprocess.run
  monkeypatch.setattr(reproduce.subprocess, 'run',
                      lambda args, **k: calls.append(args[1]) or real_run(args, **k))
  (row2,) = reproduce.run_suite('tiny2', runs, SHRINK, log=lines.append)
  assert calls == ['eval.py'] and row2['resolutions'] == {}

  out = tmp_path / 'out'
  md = reproduce.write_report('tiny2', [row2], str(out))
  text = open(md).read()
  assert '| LieRE8 | 108 | 1 |' in text and '99.5 (99.2-99.8)' in text  # Ours beside the paper.
  assert row2['command'] in text
  assert json.load(open(out / 'tiny2.json'))[0]['top1'] == row2['top1']
  assert (out / 'tiny2.png').stat().st_size > 1000
  for key in ('pe', 'px', 'seed', 'top1', 'top1_ci95', 'shuffled_top1', 'steps', 'wall_s',
              'command'):
    assert key in row2


def test_set_overrides_get_workdirs_of_their_own(tmp_path):
  """A run finished without --set is not reused (nor reported) for a --set; without --set the
  workdir name stays `{pe}_{px}px..._s{seed}`, so existing runs are found."""
  run = reproduce.Run('liere8')
  suite = reproduce.Suite('test', (run,), reproduce.Eval(), reproduce._report_table3)
  runs = str(tmp_path)
  os.makedirs(os.path.join(runs, 'liere8_108px_s0', 'eval'))
  with open(os.path.join(runs, 'liere8_108px_s0', 'eval', 'results.json'), 'w') as f:
    json.dump(dict(top1=1., top1_ci95=[1., 1.], shuffled_top1=.3, n_examples=16, step=300,
                   resolutions={}), f)
  assert reproduce.row(run, suite, runs, ())['run'] == 'liere8_108px_s0'
  sets = ('--config.total_steps=2000',)
  assert reproduce.row(run, suite, runs, sets) is None
  other = run.dirname(('--config.total_steps=3000',))
  assert run.dirname(sets) == run.dirname(sets) != other and other.startswith('liere8_108px_s0')


def test_a_failed_run_names_its_command_and_log(tmp_path, monkeypatch):
  suite = reproduce.Suite('test', (reproduce.Run('liere8'),), reproduce.Eval(),
                          reproduce._report_table3)
  monkeypatch.setitem(reproduce.SUITES, 'bad', suite)
  with pytest.raises(RuntimeError, match=r'train.py .* failed \(exit .*reproduce_train.log'):
    reproduce.run_suite('bad', str(tmp_path), ('--config.model.pe.expm=pade',), log=print)


def test_every_suite_report_builds_from_rows(tmp_path):
  """Each suite's table and plot from rows shaped like run_suite's (no training)."""
  for name, suite in reproduce.SUITES.items():
    rows = []
    for i, run in enumerate(suite.runs):
      top1 = 0.4 + 0.6 * (i % 2)
      rows.append(dict(
          run=run.name, pe=run.pe, px=run.px, seed=run.seed, label=run.label,
          overrides=dict(run.overrides), top1=top1, top1_ci95=[top1 - 0.01, min(top1 + 0.01, 1)],
          shuffled_top1=0.3, shuffle_drop_rel=(top1 - 0.3) / top1, n_examples=2000,
          resolutions={str(s): {'sequential': 0.9, 'rescaled': 0.5}
                       for s in suite.evaluation.resolutions},
          steps=300, wall_s=60., machine='test', command=f'python train.py # {run.name}'))
    md = reproduce.write_report(name, rows, str(tmp_path))
    text = open(md).read()
    assert all(r['command'] in text for r in rows), name
    assert (tmp_path / f'{name}.png').exists(), name


def test_report_rows_merge_over_the_committed_json(tmp_path):
  """A report keeps the committed rows of runs not here, takes this machine's rows over them,
  drops rows of runs the suite no longer defines, and keeps the suite's order."""
  names = [run.dirname() for run in reproduce.SUITES['table3'].runs]
  committed = [dict(run=names[2], top1=0.1), dict(run=names[0], top1=0.2),
               dict(run='gone_108px_s0', top1=0.3)]
  (tmp_path / 'table3.json').write_text(json.dumps(committed))
  merged = reproduce.merge_rows('table3', [dict(run=names[2], top1=0.9)], (), str(tmp_path))
  assert merged == [dict(run=names[0], top1=0.2), dict(run=names[2], top1=0.9)]
  assert reproduce.merge_rows('table3', [], (), str(tmp_path / 'none')) == []
