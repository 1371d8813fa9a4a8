"""The one exception type that means "the user's input is wrong", shown as one line, never a traceback."""

import sys
from collections.abc import Callable


class UserError(Exception):
  """A mistake in the user's flags, config or data; the message names the problem and the fix."""


def fail(message: str, status: int, exit_now: Callable[[int], None] = sys.exit) -> None:
  """Ends the program with the one line a user sees for their mistake."""
  print(f'error: {" ".join(message.split())}', file=sys.stderr, flush=True)
  exit_now(status)
