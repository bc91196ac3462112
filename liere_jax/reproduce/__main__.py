"""The reproduction CLI: run a suite, rebuild its report, or rebuild the results index."""
from absl import app, flags

from liere_jax import command
from liere_jax.reproduce import reports, runner
from liere_jax.reproduce.suites import SUITES

_SUITE = flags.DEFINE_enum('suite', None, list(SUITES), 'The suite to run or report.')
_RUNS = flags.DEFINE_string('runs', 'runs/reproduce', 'Where the run workdirs go.')
_OUT = flags.DEFINE_string('out', 'docs/results', 'Where the reports go.')
_ONLY = flags.DEFINE_list('only', [], 'Run only these encodings or runs (e.g. '
                          'paper_visionllama,paper_rope_mixed_108px_s0); the report keeps the '
                          'rows it has of the others.')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE config override for every run, e.g. '
                                 'total_steps=2000 (its runs get workdirs of their own).')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the commands without running them.')
# Instead of running a suite:
_LIST = flags.DEFINE_bool('list', False, 'List the suites and their runs.')
_REPORT = flags.DEFINE_bool('report', False, "Only rebuild the suite's report from finished runs.")
_INDEX = flags.DEFINE_bool('index', False, 'Only rebuild --out/README.md, the index of the '
                           "suites' reports (its findings section is kept).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments {argv[1:]}; every option is a flag (--help).')
  if _LIST.value:
    for name, suite in SUITES.items():
      print(f'{name:8s} {len(suite.runs):3d} runs  {suite.doc}')
    return
  if _INDEX.value:
    with command.refusing():
      print('index:', reports.write_index(_OUT.value))
    return
  if not _SUITE.value:
    raise app.UsageError(f'--suite is required: one of {list(SUITES)} (or --list, --index).')
  for kv in _SET.value:
    if '=' not in kv:
      raise app.UsageError(f'--set {kv!r}: write KEY=VALUE, e.g. --set total_steps=2000.')
  extra = tuple(f'--config.{kv}' for kv in _SET.value)
  if _REPORT.value:
    rows = runner.rows(_SUITE.value, _RUNS.value, extra)
  else:
    rows = runner.run_suite(_SUITE.value, _RUNS.value, extra, dry_run=_DRY_RUN.value,
                            only=tuple(_ONLY.value))
  if not _DRY_RUN.value:
    rows = runner.merge_rows(_SUITE.value, rows, extra, _OUT.value)
    print('report:', reports.write_report(_SUITE.value, rows, _OUT.value))


if __name__ == '__main__':
  command.run(main, 'reproduce')
