"""The reproduction suites: real training and evaluation runs (the runner's commands carried
out by the library in this process), resume/skip, the report files and the results index."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import liere_jax
from liere_jax import paths, reproduce
from liere_jax.reproduce import reports, runner, tables
from tests import helpers

# A run small enough for CI: the suite's own commands, shrunk by config overrides only.
SHRINK = ('--config.total_steps=2', '--config.batch_size=8', '--config.eval_batch_size=16',
          '--config.data.num_eval=16', '--config.model.width=16', '--config.model.heads=2',
          '--config.model.depth=1', '--config.model.mlp_dim=16', '--config.log_every=1')


def _row(run, top1, **kw):
  """A report row shaped like run_suite's, for a run that was not trained."""
  return dict(dict(
      run=run.name, pe=run.pe, px=run.px, seed=run.seed, label=run.label,
      overrides=dict(run.overrides), top1=top1, top1_ci95=[top1 - 0.01, min(top1 + 0.01, 1)],
      shuffled_top1=0.3, shuffle_drop_rel=(top1 - 0.3) / top1, n_examples=2000, resolutions={},
      steps=300, plateau_exit=None, wall_s=60., machine='test', commit='abc1234',
      command=f'python -m liere_jax.train # {run.name}'), **kw)


def test_workdir_names_stay_those_of_existing_runs():
  """Runs already trained under runs/reproduce are found by these names."""
  names = {s: {r.name for r in suite.runs} for s, suite in reproduce.SUITES.items()}
  assert {'none_108px_s0', 'rope_mixed_108px_s1', 'liere8_168px_total_steps600_s0',
          'liere8_168px_total_steps600_s1', 'paper_rope_mixed_276px_total_steps600_s1',
          'rope_mixed_276px_total_steps600_s0'} <= names['table3']
  assert {'liere8_108px_shareheads_s0', 'liere32_108px_s0'} <= names['table4']
  assert 'liere8_108px_init_scale1.0_s1' in names['table7']
  assert 'abs_108px_num_train2000_s0' in names['fig4']
  assert reproduce.Run('liere8').dirname(('--config.total_steps=2000',)) == (
      'liere8_108px_s0_set5255fa14')
  for name, suite in reproduce.SUITES.items():
    assert len({r.name for r in suite.runs}) == len(suite.runs), name


def test_the_suites_define_the_larger_grids_with_their_budget():
  table3 = reproduce.SUITES['table3'].runs
  for grid, pes in ((14, reproduce.LARGE_GRID_ENCODINGS[14]), (23, ('paper_rope_mixed',
                                                                   'rope_mixed', 'liere8'))):
    runs = [r for r in table3 if r.grid == grid]
    third = {(pe, 2) for pe in reproduce.THIRD_SEED.get(grid, ())}
    assert {(r.pe, r.seed) for r in runs} == {(pe, s) for pe in pes for s in (0, 1)} | third
    assert all(r.overrides == reproduce.BUDGET[grid] for r in runs)
  assert {'liere8', 'paper_rope_mixed', 'rope_mixed', 'abs'} <= set(
      reproduce.LARGE_GRID_ENCODINGS[14])
  for pe in reproduce.PAPER_ENCODINGS:
    assert any((r.pe, r.px) == (pe, 108) for r in table3)
  # The evaluation-only suites reuse table3's workdirs.
  assert {r.name for r in reproduce.SUITES['fig7'].runs} <= {r.name for r in table3}


def test_the_cli_works_from_a_copy_of_the_library(tmp_path):
  """--list, --dry_run and --index with the library on PYTHONPATH and no checkout around."""
  lib = tmp_path / 'lib'
  shutil.copytree(os.path.dirname(liere_jax.__file__), lib / 'liere_jax',
                  ignore=shutil.ignore_patterns('__pycache__'))
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  env = dict(os.environ, PYTHONPATH=str(lib))

  def cli(*args):
    return subprocess.run([sys.executable, '-m', 'liere_jax.reproduce', *args], cwd=cwd,
                          env=env, capture_output=True, text=True, check=True).stdout

  listing = cli('--list')
  for name in reproduce.SUITES:
    assert name in listing
  out = cli('--suite', 'fig7', '--dry_run', '--runs', 'runs', '--out', 'out', '--set',
            'total_steps=2000')
  assert ('python -m liere_jax.train --config configs/arrows.py:pe=liere8,grid=9 '
          '--workdir runs/liere8_108px_s0_set5255fa14') in out
  assert '--config.total_steps=2000' in out
  assert 'python -m liere_jax.eval --workdir runs/' in out
  assert '--out eval_fig7 --resolutions=84,96' in out
  assert os.listdir(cwd) == []
  cli('--index', '--out', 'out')
  assert '| [fig7](fig7.md)' in (cwd / 'out' / 'README.md').read_text()
  assert runner.commit(str(lib / 'liere_jax')) == ''  # No checkout: no commit recorded.


def test_the_programs_get_huge_pages_and_a_compilation_cache_unless_the_user_set_them(
    monkeypatch):
  monkeypatch.delenv('GLIBC_TUNABLES', raising=False)
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  environment = lambda: runner._environment('/runs')  # pylint: disable=protected-access
  env = environment()
  assert env['GLIBC_TUNABLES'] == runner.MALLOC_TUNABLES
  assert runner.MALLOC_TUNABLES.startswith('glibc.malloc.hugetlb=1:')
  assert env['JAX_COMPILATION_CACHE_DIR'] == '/runs/.jax_cache'
  assert env['PYTHONPATH'].split(os.pathsep)[0] == os.path.dirname(runner.LIBRARY)
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.hugetlb=0')
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', '/mine')
  assert environment()['GLIBC_TUNABLES'] == 'glibc.malloc.hugetlb=0'
  assert environment()['JAX_COMPILATION_CACHE_DIR'] == '/mine'


def test_a_run_records_the_commit_it_started_at(tmp_path, monkeypatch):
  """HEAD can move while a run trains for hours: the wall file keeps the commit at its start."""
  suite = reproduce.Suite('test', (reproduce.Run('liere8'),), reproduce.Eval('eval', (), 16),
                          tables.report_fig7, tables.headline_fig7)
  monkeypatch.setitem(reproduce.SUITES, 'fake', suite)
  heads = iter(['start', 'after_train', 'after_eval'])
  monkeypatch.setattr(runner, 'commit', lambda *a: next(heads))
  monkeypatch.setattr(runner.subprocess, 'run', lambda *a, **k: subprocess.CompletedProcess(a, 0))
  monkeypatch.setattr(runner, 'machine', lambda: 'test')
  reproduce.run_suite('fake', str(tmp_path), (), log=lambda s: None)
  (workdir,) = tmp_path.iterdir()
  walls = json.loads((workdir / 'reproduce_wall.json').read_text())
  assert walls['commit'] == 'start' and set(walls) >= {'train_s', 'eval_s'}


def test_a_dry_run_shows_the_larger_grids_budget():
  lines = []
  rows = reproduce.run_suite('table3', '/nonexistent/runs', (), dry_run=True, log=lines.append)
  assert rows == []
  text = '\n'.join(lines)
  assert ('python -m liere_jax.train --config configs/arrows.py:pe=liere8,grid=23 --workdir '
          '/nonexistent/runs/liere8_276px_total_steps600_s1 --config.seed=1 '
          '--config.total_steps=600 --progress=false') in text


def _in_process(args, **kwargs):
  """The runner's `python -m liere_jax.train|eval FLAGS` carried out by the library in this
  process (helpers.train, helpers.evaluate): the command lines are tested elsewhere."""
  del kwargs  # The log file: the output stays with pytest.
  program, flags, rest = args[2], {}, iter(args[3:])
  for arg in rest:
    key, value = arg.split('=', 1) if '=' in arg else (arg, next(rest))
    flags[key.lstrip('-')] = value
  if program == 'liere_jax.train':
    path, _, arg = flags.pop('config').partition(':')
    overrides = helpers.flag_overrides(f'--{k}={v}' for k, v in flags.items()
                                       if k.startswith('config.'))
    helpers.train(helpers.override(helpers.load_config(path, arg), overrides), flags['workdir'])
  else:
    sizes = tuple(int(s) for s in flags['resolutions'].split(',') if s)
    num_eval = {'data__num_eval': int(flags['num_eval'])} if 'num_eval' in flags else {}
    helpers.evaluate(flags['workdir'], out=flags['out'], resolutions=sizes, **num_eval)
  return subprocess.CompletedProcess(args, 0)


def test_a_suite_trains_evaluates_skips_when_done_and_reports(tmp_path, monkeypatch):
  suite = reproduce.Suite('test', (reproduce.Run('liere8', seed=1),),
                          reproduce.Eval('eval_fig7', (96,), 16), tables.report_fig7,
                          tables.headline_fig7)
  monkeypatch.setitem(reproduce.SUITES, 'tiny', suite)
  runs, lines = str(tmp_path / 'runs'), []
  with monkeypatch.context() as patch:
    patch.setattr(runner.subprocess, 'run', _in_process)
    rows = reproduce.run_suite('tiny', runs, SHRINK, log=lines.append)
  name = suite.runs[0].dirname(SHRINK)  # liere8_108px_s1_set<hash of SHRINK>
  assert name.startswith('liere8_108px_s1_set') and [r['run'] for r in rows] == [name]
  row = rows[0]
  assert row['steps'] == 2 and row['n_examples'] == 16 and row['wall_s'] > 0
  assert set(row['resolutions']) == {'96'}
  assert set(row['resolutions']['96']) == {'sequential', 'rescaled'}
  assert row['command'].startswith(
      'python -m liere_jax.train --config configs/arrows.py:pe=liere8,grid=9')
  assert '--config.model.width=16' in row['command'] and '--config.seed=1' in row['command']
  head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=runner.LIBRARY,
                        capture_output=True, text=True, check=True).stdout.strip()
  assert row['commit'].startswith(head)  # Run inside this checkout.
  assert row['plateau_exit'] == runner.plateau_exit(os.path.join(runs, name))
  with open(os.path.join(runs, name, 'config.json')) as f:
    assert json.load(f)['seed'] == 1

  # Done runs are skipped: nothing runs again.
  lines.clear()
  monkeypatch.setattr(runner.subprocess, 'run', lambda *a, **k: pytest.fail('ran again'))
  assert reproduce.run_suite('tiny', runs, SHRINK, log=lines.append) == rows
  assert lines == [f'suite tiny: 1 runs, 1 done here, 0 to run now (workdirs under {runs})']

  # A second evaluation of a trained run evaluates without training again.
  suite2 = reproduce.Suite('test', suite.runs[:1], reproduce.Eval(),
                           reproduce.SUITES['table3'].report, tables.headline_table3)
  monkeypatch.undo()
  monkeypatch.setitem(reproduce.SUITES, 'tiny2', suite2)
  calls = []
  real_run = subprocess.run
  monkeypatch.setattr(runner.subprocess, 'run',
                      lambda args, **k: calls.append(args[2]) or _in_process(args))
  (row2,) = reproduce.run_suite('tiny2', runs, SHRINK, log=lines.append)
  monkeypatch.setattr(runner.subprocess, 'run', real_run)  # matplotlib's first import runs one.
  assert calls == ['liere_jax.eval'] and row2['resolutions'] == {}

  out = tmp_path / 'out'
  md = reproduce.write_report('tiny2', [row2], str(out))
  text = open(md).read()
  assert '| LieRE8 | 1 |' in text and '99.5 (99.2-99.8)' in text  # Ours beside the paper.
  assert row2['command'] in text
  assert json.load(open(out / 'tiny2.json'))[0]['top1'] == row2['top1']
  assert (out / 'tiny2.png').stat().st_size > 1000


def test_plateau_exit_is_where_train_accuracy_stays_above_the_threshold(tmp_path):
  def exit_of(*entries):
    with open(tmp_path / 'metrics.jsonl', 'w') as f:
      for e in entries:
        f.write(json.dumps(e) + '\n')
    return runner.plateau_exit(str(tmp_path))

  acc = lambda step, a: dict(step=step, accuracy=a)
  assert exit_of(acc(20, .4), acc(40, .7), acc(60, .5), acc(80, .65), acc(100, .9),
                 dict(step=100, eval_accuracy=.99)) == 80
  assert exit_of(acc(20, .4), acc(40, .7), acc(60, .5)) is None  # Fell back: not left.
  assert exit_of(acc(20, .6), acc(40, .9)) == 20
  # Resumed from step 40: the re-logged steps replace the first attempt's.
  assert exit_of(acc(20, .4), acc(40, .5), acc(60, .9), acc(60, .5), acc(80, .9)) == 80
  os.remove(tmp_path / 'metrics.jsonl')
  assert runner.plateau_exit(str(tmp_path)) is None
  # Runs since write metrics/ objects (one per flush), read after an older run's metrics.jsonl.
  exit_of(acc(20, .4), acc(40, .5))
  for step, a in ((40, .9), (60, .9)):
    writer = paths.MetricsWriter(tmp_path)
    writer.add(step, {'accuracy': a})
    writer.flush()
  assert runner.plateau_exit(str(tmp_path)) == 40


def test_set_overrides_get_workdirs_of_their_own(tmp_path):
  """A run finished without --set is not reused (nor reported) for a --set; without --set the
  workdir name stays `{pe}_{px}px..._s{seed}`, so existing runs are found."""
  run = reproduce.Run('liere8')
  suite = reproduce.Suite('test', (run,), reproduce.Eval(), tables.report_table5,
                          tables.headline_table5)
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
                          tables.report_table5, tables.headline_table5)
  monkeypatch.setitem(reproduce.SUITES, 'bad', suite)
  with pytest.raises(RuntimeError, match=r'python -m liere_jax.train --config configs/arrows.py'
                     r'.* failed \(exit .*reproduce_train.log') as e:
    reproduce.run_suite('bad', str(tmp_path), ('--config.model.pe.expm=pade',), log=print)
  log = str(e.value).split('see ')[1].split('. Fix')[0]
  assert "model.pe.expm='pade' is unknown" in open(log).read()  # The program's own error.


def test_every_suite_report_and_headline_builds_from_rows(tmp_path):
  """Each suite's table, plot and index line from rows shaped like run_suite's."""
  for name, suite in reproduce.SUITES.items():
    rows = [_row(run, 0.4 + 0.6 * (i % 2),
                 resolutions={str(s): {'sequential': 0.9, 'rescaled': 0.5}
                              for s in suite.evaluation.resolutions})
            for i, run in enumerate(suite.runs)]
    md = reproduce.write_report(name, rows, str(tmp_path))
    text = open(md).read()
    assert all(r['command'] in text for r in rows), name
    runs = f"{len(rows)} run{'s' if len(rows) > 1 else ''}"
    assert f'train + eval wall time: {len(rows)} min on test ({runs})' in text, name  # 60 s a row.
    assert (tmp_path / f'{name}.png').exists(), name
    ours, paper = suite.headline(rows)
    assert ours and paper, name


def test_wall_time_is_summed_per_machine(tmp_path):
  """A suite trained partly on a GPU reports the minutes of each machine apart, and its runs
  table says where each run ran."""
  runs = reproduce.SUITES['table5'].runs
  rows = [_row(runs[0], 1., wall_s=600., machine='cpu'),
          _row(runs[1], 1., wall_s=1200., machine='cpu'), _row(runs[2], 1., wall_s=150., machine='gpu')]
  assert reports.wall_by_machine(rows) == '30 min on cpu (2 runs); 2 min on gpu (1 run)'
  text = open(reproduce.write_report('table5', rows, str(tmp_path))).read()
  assert '| run | train + eval wall | machine | commit | command |' in text
  assert f'| {runs[2].name} | 2.5 min | gpu | abc1234 |' in text
  one = open(reproduce.write_report('table5', rows[:2], str(tmp_path))).read()
  assert '| run | train + eval wall | commit | command |' in one


def test_table3_groups_the_larger_grids_by_encoding_with_seed_means():
  runs = {(r.pe, r.grid, r.seed): r for r in reproduce.SUITES['table3'].runs}
  rows = [_row(runs['liere8', 9, 0], 1.),
          _row(runs['liere8', 14, 0], .99, plateau_exit=320, shuffled_top1=.4,
               shuffle_drop_rel=.6),
          _row(runs['liere8', 14, 1], .45, shuffled_top1=.44, shuffle_drop_rel=.2),
          _row(runs['rope_mixed', 14, 0], .8, plateau_exit=200)]
  body, plots = reproduce.SUITES['table3'].report(rows)
  lines = body.splitlines()
  assert '## 168 px (14x14 patches)' in lines and '## 276 px (23x23 patches)' not in lines
  assert "Budget (the suite's definition): total_steps=600;" in body
  at = lines.index('## 168 px (14x14 patches)')
  liere = [l for l in lines[at:] if l.startswith('| LieRE8 |')]
  assert liere == ['| LieRE8 | 0 | 99.0 (98.0-100.0) | 99.7 (99.4-99.9) | 320 | 40.0 | 60.0 |',
                   '| LieRE8 | 1 | 45.0 (44.0-46.0) | 99.7 (99.4-99.9) | - | 44.0 | 20.0 |',
                   '| LieRE8 | mean of 2 | 72.0 | 99.7 (99.4-99.9) | 320 (1/2 left) | 42.0 | '
                   '40.0 |']
  assert set(plots) == {'', '_large'}
  ours, paper = reproduce.SUITES['table3'].headline(rows)
  assert '168 px: LieRE8 72.0 (2 seeds), RoPE-Mixed (naver-ai) 80.0' in ours
  assert '168 px: LieRE8 99.7' in paper
  rows.append(_row(runs['liere8', 23, 0], .9))
  assert '## 276 px (23x23 patches)' in reproduce.SUITES['table3'].report(rows)[0]


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


def test_the_index_has_a_line_per_suite_and_keeps_the_findings(tmp_path):
  table7 = [_row(r, .9 if r.label == 'init 2pi' else .8) for r in reproduce.SUITES['table7'].runs]
  (tmp_path / 'table7.json').write_text(json.dumps(table7))
  path = reproduce.write_index(str(tmp_path))
  text = open(path).read()
  line = next(l for l in text.splitlines() if l.startswith('| [table7](table7.md)'))
  assert 'LieRE8 +10.0 points' in line and 'LieRE8 -1.18 points (p = 0.07)' in line
  assert '| 8 of 8 | 8 min on test (8 runs) |' in line
  assert '| [fig4](fig4.md): Paper Fig. 4 | not run yet | - | 0 of 12 | - |' in text
  assert text.count('| [') == len(reproduce.SUITES)

  written = text.replace(reproduce.reports.PLACEHOLDER, 'LieRE holds up at 168 px.')
  with open(path, 'w') as f:
    f.write(written)
  reproduce.write_index(str(tmp_path))
  assert open(path).read() == written  # Same rows: only the findings, kept.

  with open(path, 'w') as f:
    f.write('# Results\n\nHand-written, no markers.\n')
  with pytest.raises(ValueError, match='<!-- findings --> ... <!-- /findings -->'):
    reproduce.write_index(str(tmp_path))
  assert open(path).read() == '# Results\n\nHand-written, no markers.\n'
