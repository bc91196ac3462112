"""The command-line convention of every liere_jax tool: absl flags with underscores, and a tool
with several actions takes the action as its first word:

  python -m liere_jax.bench step --config ... --vs pe=abs
  python -m liere_jax.convert to_torch --workdir runs/x --out x.safetensors

`subcommand(argv, actions, usage)` returns the action named in argv or raises a UsageError that
lists them.
"""
import functools
import sys
from typing import Callable, Sequence, Tuple

from absl import app, flags


def subcommand(argv: Sequence[str], actions: Sequence[str], tool: str) -> str:
  """The action of `python -m liere_jax.<tool> ACTION [flags]`; one line naming the choices
  on anything else."""
  if len(argv) != 2 or argv[1] not in actions:
    got = ' '.join(argv[1:]) or 'nothing'
    raise app.UsageError(f"python -m liere_jax.{tool} takes one action, one of "
                         f"{', '.join(actions)}, then its flags (got {got!r}); see --help.")
  return argv[1]


def one_line(main: Callable, errors: Tuple[type, ...], tool: str) -> Callable:
  """`main` that ends with one line `python -m liere_jax.<tool>: error: ...` (exit status 2)
  on any of `errors` (those whose message already names the value and the fix)."""
  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except errors as e:
      print(f'python -m liere_jax.{tool}: error: {e}', file=sys.stderr)
      sys.exit(2)
  return wrapped


def process_flags():
  """--coordinator_address, --num_processes, --process_id: the flags of every program that runs
  on several processes (train, eval); train_lib.init_distributed reads them."""
  return (flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (leave out '
                              'on TPU VMs, GKE, SLURM: jax finds it).'),
          flags.DEFINE_integer('num_processes', None, 'Processes in the job.'),
          flags.DEFINE_integer('process_id', None, 'This process.'))


def init_distributed(process_flags_):
  """train_lib.init_distributed with the values of process_flags(); bad values: UsageError."""
  from liere_jax import train_lib  # pylint: disable=import-outside-toplevel
  try:
    train_lib.init_distributed(*(f.value for f in process_flags_))
  except ValueError as e:
    raise app.UsageError(str(e)) from None
