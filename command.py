"""The commands' flags, shared by train.py, predict.py, export.py and benchmarks/: absl's parsing,
its help, and a mistake in them as a UsageError (the boundary's one line, exit status 2)."""

from __future__ import annotations

import sys

from absl import flags

from errors import During, UsageError
from trainer.host.exits import nowhere

HELP_FLAGS = frozenset({'--help', '--helpshort', '--helpfull', '-h', '-?', '--helpxml'})


def define_member_flag() -> flags.FlagHolder[int | None]:
  """--member of the commands that classify with a run (predict.py, export.py)."""
  return flags.DEFINE_integer(
      'member', None, 'Of a run of several models: member K alone (0 to the count less 1), not '
      'their ensemble; a sweep\'s best member on its eval split by default.', lower_bound=0)


def parse_or_help(argv: list[str]) -> list[str]:
  """absl's parsing for every command: --help and its kin end the program once the help is written
  (0, or where it could not be written, that line, never blaming a flag), and absl then logs
  warnings and errors only. A mistake raises absl's flags.Error; returns the arguments left over."""
  try:
    rest = flags.FLAGS(argv)
  except SystemExit as done:  # absl's --help, --helpshort and --helpfull exit 1 once printed.
    sys.exit(0 if _asks_help(argv) else done.code)
  except OSError as error:  # Of the flags' parsing only the help writes (to stdout).
    if not _asks_help(argv):
      raise
    nowhere(sys.stdout)
    if isinstance(error, BrokenPipeError):
      sys.exit(0)  # A reader that has gone (`| head -3`) read what it wanted.
    with During('writing the output'):
      raise
  if flags.FLAGS['verbosity'].using_default_value:
    # Warnings and errors only (orbax logs every save at info); --verbosity=0 shows info logs.
    # Set here: app.run raises an unset verbosity to info, and a changed default counts as unset.
    flags.FLAGS.verbosity = -1  # type: ignore[assignment]
  return rest


def _asks_help(argv: list[str]) -> bool:
  """Whether a help flag is given, bare or as `--help=true`."""
  return any(arg.split('=', 1)[0] in HELP_FLAGS for arg in argv)


def parse_tool_flags(argv: list[str], usage: str) -> list[str]:
  """Flags of predict.py, export.py and the benchmarks: a mistake is one line with the usage."""
  try:
    return parse_or_help(argv)
  except flags.Error as error:
    raise UsageError(f'{error}; usage: {usage}') from None
