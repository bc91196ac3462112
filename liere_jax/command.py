"""The command-line convention of every liere_jax tool: absl flags with underscores, a tool
with several actions takes the action as its first word, and every refusal of bad input is one
line with exit status 2, before anything is written:

  python -m liere_jax.bench step --config ... --vs pe=abs
  python -m liere_jax.convert to_torch --workdir runs/x --out x.safetensors

`run(main, tool)` runs a tool (absl's app.run) under that rule: a flag that does not parse, an
app.UsageError and an error of REFUSED raised where `refusing()` marks the checks of the user's
input end as one line `python -m liere_jax.<tool>: error: ...`, exit status 2. Elsewhere an error
keeps its traceback: it is not the input's fault. `subcommand(argv, actions, tool)` returns the
action named in argv or refuses with the list.
"""
import contextlib
import functools
import sys
from typing import Callable, Sequence

from absl import app, flags


def subcommand(argv: Sequence[str], actions: Sequence[str], tool: str) -> str:
  """The action of `python -m liere_jax.<tool> ACTION [flags]`; one line naming the choices
  on anything else."""
  if len(argv) != 2 or argv[1] not in actions:
    got = ' '.join(argv[1:]) or 'nothing'
    raise app.UsageError(f"python -m liere_jax.{tool} takes one action, one of "
                         f"{', '.join(actions)}, then its flags (got {got!r}); see --help.")
  return argv[1]


# What the checks of a user's input raise, their message naming the value and the fix
# (checkpoint.CheckpointError is a ValueError; a path that cannot be read: an OSError).
REFUSED = (ValueError, OSError)


@contextlib.contextmanager
def refusing():
  """Marks the checks of a user's input: an error of REFUSED raised inside is a refusal (one
  line, exit status 2, under `run`)."""
  try:
    yield
  except REFUSED as e:
    raise app.UsageError(str(e)) from None


def run(main: Callable, tool: str, flags_parser: Callable = None):
  """`app.run(main)` for `python -m liere_jax.<tool>`: a bad flag and a refusal (an
  app.UsageError, or an error of REFUSED inside `refusing()`) print one line and exit 2."""
  def refuse(error):
    message = ' '.join(line.strip() for line in str(error).splitlines())  # One line, always.
    print(f'python -m liere_jax.{tool}: error: {message}', file=sys.stderr)
    sys.exit(2)

  def parse(argv):
    try:
      return (flags_parser or flags.FLAGS)(argv)
    except flags.Error as e:  # A missing required flag, a value that does not parse.
      refuse(e)

  @functools.wraps(main)
  def checked(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      refuse(e)
  app.run(checked, flags_parser=parse)
