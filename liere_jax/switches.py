"""Switches: how a computation is traced (not what it computes), set for a block of code.

Benchmarks set one for one side of an A/B (`python -m liere_jax.bench step --vs apply=direct`)
to measure a form against the one that replaced it; programs leave them at their default.
"""
import contextlib
import contextvars
from typing import Dict, Sequence


class Switch:
  """A named choice among `forms`, the first the default, read while tracing."""

  def __init__(self, name: str, forms: Sequence[str], doc: str):
    self.name, self.forms, self.doc = name, tuple(forms), doc
    self._var = contextvars.ContextVar(name, default=self.forms[0])
    SWITCHES[name] = self

  def get(self) -> str:
    return self._var.get()

  @contextlib.contextmanager
  def __call__(self, form: str):
    if form not in self.forms:
      raise ValueError(f'{self.name}={form} is unknown; use one of {self.forms}.')
    token = self._var.set(form)
    try:
      yield
    finally:
      self._var.reset(token)


SWITCHES: Dict[str, Switch] = {}


@contextlib.contextmanager
def using(settings: Dict[str, str]):
  """Every switch of `settings` ({name: form}) set inside."""
  with contextlib.ExitStack() as stack:
    for name, form in settings.items():
      if name not in SWITCHES:
        raise ValueError(f'{name} is not a switch; use one of {sorted(SWITCHES)}.')
      stack.enter_context(SWITCHES[name](form))
    yield
