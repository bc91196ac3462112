"""Every command line refuses bad input in one line with exit status 2 and writes nothing
(liere_jax/command.py: command.run, command.refusing), whichever check finds it: absl's flag parsing, the run's
config, the dataset, the processes, --config.model_init's checkpoint, the converters, the
preparation, the benchmarks, the reproduction suites. Refusals come before anything is compiled,
so each case is one short process."""
import importlib
import os
import pkgutil

import pytest
from absl import flags

import liere_jax
from tests import helpers

# A tiny run's train flags (helpers.TINY_RUN), for the cases that would otherwise train.
TRAIN = ('--config', helpers.ARROWS + ':grid=4', '--workdir', '{tmp}/w', *helpers.TINY_RUN)

CASES = {
    'train: a required flag left out': (
        'train', ('--config', helpers.ARROWS), 'flag --workdir=None: Flag --workdir must have'),
    'train: a config file that does not exist': (
        'train', ('--config', '{tmp}/nonexistent.py', '--workdir', '{tmp}/w'),
        "No such file or directory: '{tmp}/nonexistent.py'"),
    'train: an override of a field the config lacks': (
        'train', (*TRAIN, '--config.model.pe.scale=1'),
        "config.model.pe has no field 'scale'; its fields are ['expm', "),
    'train: a bad value': ('train', (*TRAIN, '--config.batch_size=0'),
                           "--config.batch_size=0 must be a positive multiple of the mesh's 1"),
    'train: a bad value of the data': (
        'train', (*TRAIN, '--config.data.num_eval=-1'), '--config.data.num_eval=-1 must be an '
        'integer >= 1 (held-out examples); the default is --config.data.num_eval=2000.'),
    'train: one process flag of three': (
        'train', (*TRAIN, '--coordinator_address=127.0.0.1:1'), 'give all three, or none'),
    'train: an unprepared dataset': (  # The checkout's train.py and configs/, as in a clone.
        os.path.join(helpers.ROOT, 'train.py'),
        ('--config', os.path.join(helpers.ROOT, 'configs/cifar100.py:variant=Ti'), '--workdir',
         '{tmp}/w', '--config.data.data_dir={tmp}'), 'liere_jax.data.prepare cifar100'),
    'train: model_init of another width': (
        'train', (*TRAIN, '--config.model_init={run}', '--config.model.width=64'),
        '--config.model_init={run}: parameter blocks/0/attn/proj/bias has shape (32,) in the '
        'checkpoint and (64,) in this model;'),
    'eval: a workdir that is not a run': (
        'eval', ('--workdir', '{tmp}'), '--workdir {tmp} has no config.json'),
    'eval: resolutions that are not sizes': (
        'eval', ('--workdir', '{run}', '--resolutions=48,big'), 'input sizes are integers'),
    'convert: no action': ('convert', (), 'takes one action, one of to_torch'),
    'data.prepare: a download that is missing': (
        'data.prepare', ('cifar100', '--download_dir={tmp}', '--data_dir={tmp}/tfds'),
        '{tmp}/cifar-100-binary.tar.gz is missing'),
    'bench: an unknown action': ('bench', ('expmm',), 'takes one action, one of expm, rotations'),
    'bench: an official checkout that is not one': (
        'bench', ('step', '--config', 'configs/cifar100.py:variant=Ti,pe=liere64', '--vs',
                  'pe=abs', '--official', '{tmp}'), '{tmp} has no models/rope_vit.py'),
    'summary: a bad value': ('summary', ('--config', helpers.ARROWS, '--config.model.pe.name='
                                         'liere128'), 'block size 128'),
    'reproduce: a --set without a value': (
        'reproduce', ('--suite', 'fig7', '--set', 'total_steps'), "--set 'total_steps': write "
        'KEY=VALUE'),
}


def _tree(root):
  """Every file and folder under root with its size and modification time."""
  stats = ((os.path.join(d, n), os.stat(os.path.join(d, n)))
           for d, dirs, files in os.walk(root) for n in dirs + files)
  return sorted((os.path.relpath(p, root), s.st_size, s.st_mtime_ns) for p, s in stats)


@pytest.mark.parametrize('case', list(CASES))
def test_a_refusal_is_one_line_with_exit_status_2_and_writes_nothing(case, tiny_run, tmp_path):
  program, args, message = CASES[case]
  fill = lambda s: s.format(tmp=tmp_path, run=tiny_run)
  before = _tree(tmp_path), _tree(tiny_run)
  command = [program] if program.endswith('.py') else ['-m', f'liere_jax.{program}']
  rc, out = helpers.python([*command, *map(fill, args)])
  tool = 'train' if program.endswith('.py') else program
  # Nothing else: no traceback, no log line (TFDS's warnings about a data_dir it probed).
  assert rc == 2 and len(out.splitlines()) == 1, out
  assert out.startswith(f'python -m liere_jax.{tool}: error: ') and fill(message) in out, out
  assert (_tree(tmp_path), _tree(tiny_run)) == before


def test_importing_the_library_defines_no_flag():
  """Flags belong to the command lines (liere_jax/train.py, liere_jax/eval.py, the tools'
  __main__ modules): a notebook or a test imports any other module and calls it, with no flag
  defined behind its back."""
  programs = ('liere_jax.train', 'liere_jax.eval')
  for module in pkgutil.walk_packages(liere_jax.__path__, 'liere_jax.'):
    if '__main__' not in module.name and module.name not in programs:
      importlib.import_module(module.name)
  owners = [m for m in flags.FLAGS.flags_by_module_dict() if m.startswith('liere_jax')]
  assert [m for m in owners if m not in programs] == []
