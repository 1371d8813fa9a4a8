"""The one exception type that means "the user's input is wrong", shown as one line, never a traceback."""


class UserError(Exception):
  """A mistake in the user's flags, config or data; the message names the problem and the fix."""
