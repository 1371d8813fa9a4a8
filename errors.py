"""Errors a user can act on; the library raises them, train.py prints each as one line with the fix."""

import re
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


class ClosedOnExit:
  """A context manager that closes on exit, where a failure to close never hides an earlier error."""

  def close(self) -> None:
    raise NotImplementedError

  def __enter__(self):
    return self

  def __exit__(self, exc_type, *exc_info) -> None:
    try:
      self.close()
    except UserError:
      if exc_type is None:  # Else the error already on its way out is the one to report.
        raise


def _os_reason(text: str) -> str:
  """The OS's reason inside orbax's (tensorstore's) error text, whose form varies by version."""
  found = re.search(r':\s*([^:\[\]]+?)\s*\[os_error_code', text)
  if found:
    return found.group(1)
  if 'RESOURCE_EXHAUSTED' in text:  # Tensorstore's status for ENOSPC and EDQUOT.
    return 'No space left on device, or over quota'
  return (text.strip().splitlines() or [''])[0][:160]


def write_failed(path: str, error: Exception, saved: bool | None = None) -> UserError:
  """A write the machine refused (full disk, lost permission, I/O error), as the user's one line.

  `saved`: whether a checkpoint is there to resume from; None where the writer cannot tell.
  """
  reason = getattr(error, 'strerror', None) or _os_reason(str(error))
  then = {True: ' to resume from the newest checkpoint',
          False: ' to start again: no checkpoint was saved', None: ''}[saved]
  return UserError(f'cannot write {path} ({reason}); free space or restore access there, then '
                   f'rerun the same command{then}')


def fail(message: str, status: int, exit_now: Callable[[int], None] = sys.exit) -> None:
  """Ends the program with the one line a user sees for their mistake."""
  print(f'error: {" ".join(message.split())}', file=sys.stderr, flush=True)
  exit_now(status)
