"""Errors a user can act on; the library raises them, train.py prints each as one line with the fix."""

import sys
from collections.abc import Callable
from typing import Any


class UserError(Exception):
  """A mistake in the user's flags, config or data, or a fault of their machine; names the fix."""


class ConfigError(UserError):
  """A config field that breaks a constraint; train.py words the fix as `--config.FIELD=VALUE`."""

  def __init__(self, field: str, constraint: str, value: Any, fix: str = 'VALUE'):
    super().__init__(f'{field} {constraint}, got {value!r}')
    self.field = field
    self.fix = fix  # A value to pass instead, or the form one takes.


def fail(message: str, status: int, exit_now: Callable[[int], None] = sys.exit) -> None:
  """Ends the program with the one line a user sees for their mistake."""
  print(f'error: {" ".join(message.split())}', file=sys.stderr, flush=True)
  exit_now(status)
