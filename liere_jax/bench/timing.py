"""What every benchmark shares: a timed call, rounds of interleaved calls, table text.

  seconds, out = timed(fn, *args)                # fn(*args) run to completion (block_until_ready)
  times = interleaved([f, g], rounds=5, warmup=2, alternate=True)   # [[f's], [g's]] seconds
  statistics.median(times[0])
  table(head, lines)                             # head, a rule as long, the lines
  fmt(None, '8.3f') == '-'                       # a cell that may be missing

Interleaving, not one function's calls in a row, so that load from elsewhere on the machine
falls on all alike; `alternate` reverses the order every other round (f g, g f, f g, ...), as a
call right after another can run slower. Timings use nothing device-specific: the same code runs
on CPU, GPU and TPU.
"""
import time
from typing import Callable, List, Optional, Sequence

import jax


def timed(fn: Callable, *args):
  """(seconds, output) of `fn(*args)`, waiting until its output is ready."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0, out


def interleaved(fns: Sequence[Callable[[], object]], rounds: int, warmup: int = 0,
                alternate: bool = False,
                after_round: Optional[Callable[[bool], None]] = None) -> List[List[float]]:
  """Seconds of each of `fns` (called without arguments) per round, the first `warmup` rounds
  dropped: one call of each per round, in turn (reversed every other round if `alternate`).
  `after_round(kept)` runs after each round, `kept` False during warm-up."""
  times = [[] for _ in fns]
  order = list(range(len(fns)))
  for r in range(warmup + rounds):
    for i in (order[::-1] if alternate and r % 2 else order):
      dt, out = timed(fns[i])
      del out
      if r >= warmup:
        times[i].append(dt)
    if after_round is not None:
      after_round(r >= warmup)
  return times


def fmt(x, spec: str) -> str:
  """`x` formatted by `spec`, '-' for None (a cell not measured)."""
  return '-' if x is None else format(x, spec)


def table(head: str, lines: Sequence[str]) -> str:
  """A fixed-width table: its header, a rule of dashes as long, its lines."""
  return '\n'.join([head, '-' * len(head), *lines])
