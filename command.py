"""The commands' plumbing, shared by train.py, predict.py, export.py and benchmarks/: a command's
first step (before its imports: this module imports nothing heavy), its flags and their help,
and its end in one line."""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import sys
from collections.abc import Callable

from errors import first_cause, host_limit, library_unmapped, output_lost, shown


PROJECT_ROOT = os.path.dirname(os.path.abspath(__file__))
STOP_SIGNALS = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}  # A user's, a preempted VM's.


def start_command(stopped_line: str) -> None:
  """A command's first step, before its imports: from now on a Ctrl-C or a SIGTERM (a preempted
  VM's) ends it at once in `stopped_line`, its `{signal}` the one met (a KeyboardInterrupt would end
  in a traceback of whatever it met, an import among them; a SIGTERM, silently); a module this
  Python lacks, a library the system will not load, or a machine out of memory or threads, met
  where no part of the command said so, is one line too."""
  for number, name in STOP_SIGNALS.items():
    line, status = stopped_line.format(signal=name), 128 + number
    signal.signal(number, lambda *_, line=line, status=status: fail(line, status, os._exit))
  default_hook = sys.excepthook

  def one_line_for_the_set_up_or_the_machine(kind, error, trace) -> None:
    try:
      line = set_up_line(error)
    except Exception:  # pylint: disable=broad-except; the error itself is what matters here
      line = None
    if line is None:
      default_hook(kind, error, trace)
    else:
      print(f'error: {line}', file=sys.stderr, flush=True)  # Python's exit status: 1.
  sys.excepthook = one_line_for_the_set_up_or_the_machine


def end_quietly_on_signals() -> None:
  """The command's lines are out: a Ctrl-C or a SIGTERM from now on ends it at once and says no
  more (a line of being stopped would belie the ones before it)."""
  for number in STOP_SIGNALS:
    signal.signal(number, lambda signum, _: os._exit(128 + signum))


def set_up_line(error: BaseException) -> str | None:
  """The line for an error of the set-up or the machine that no part of a command said (None: a
  fault of the code): a module missing, also where a library raised its own ImportError from it
  (jax.export's 'Please install flatbuffers'), a library not loaded, no memory or threads."""
  if isinstance(error, ImportError):
    missing = first_cause(error, lambda cause: isinstance(cause, ModuleNotFoundError))
    if isinstance(missing, ModuleNotFoundError):
      return missing_module(missing)
  return library_unmapped(error) or host_limit(error) if isinstance(error, Exception) else None


def missing_module(error: ModuleNotFoundError) -> str | None:
  """The line for a module this Python lacks, as where a command is run without the project's
  environment; None for a module of the project's own (a fault of the code, not of the set-up)."""
  name = error.name or ''
  top = name.split('.')[0]
  if not top or any(os.path.isfile(os.path.join(PROJECT_ROOT, *path))
                    for path in ((top, '__init__.py'), (f'{top}.py',))):
    return None
  python = shown(sys.executable)
  if top in getattr(sys, 'stdlib_module_names', ()):  # Python 3.10 and later know theirs.
    return (f'this Python ({python}) was built without its standard module {name!r} (a system '
            'library was missing as it was compiled); make the environment with another Python: '
            'make clean-env train PYTHON=/path/to/python3.12')
  what = (f"this Python's {top} has no module {name!r} (another version than the project pins?)"
          if top != name and _installed(top) else f'this Python ({python}) has no module {name!r}')
  venv = os.path.join(PROJECT_ROOT, '.venv')
  reinstall = f'{python} -m pip install -r {shown(os.path.join(PROJECT_ROOT, "requirements.txt"))}'
  if os.path.realpath(sys.prefix) == os.path.realpath(venv):
    return f'{what}, which this project needs; install its requirements again: {reinstall}'
  fix = (f'run the command with the Python of its environment (make train makes it): '
         f'{shown(os.path.join(venv, "bin", "python"))} {shlex.join(sys.argv)}')
  if sys.prefix != sys.base_prefix and sys.version_info >= (3, 11):  # A virtual environment.
    fix += f', or install the requirements into this one: {reinstall}'
  return f'{what}, which this project needs; {fix}'


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def fail(message: str, status: int, exit_now: Callable[[int], None] = sys.exit) -> None:
  """Ends the program with the one line a user sees for their mistake."""
  print(f'error: {" ".join(message.split())}', file=sys.stderr, flush=True)
  exit_now(status)


HELP_FLAGS = frozenset({'--help', '--helpshort', '--helpfull', '-h', '-?', '--helpxml'})


def parse_or_help(argv: list[str]) -> list[str]:
  """absl's parsing for every command: --help and its kin end the program once the help is written
  (0, or where it could not be written, that line, never blaming a flag), and absl then logs
  warnings and errors only. A mistake raises absl's flags.Error; returns the arguments left over."""
  from absl import flags  # pylint: disable=g-import-not-at-top; the library raises, never parses
  try:
    rest = flags.FLAGS(argv)
  except SystemExit as done:  # absl's --help, --helpshort and --helpfull exit 1 once printed.
    sys.exit(0 if _asks_help(argv) else done.code)
  except OSError as error:  # Of the flags' parsing only the help writes (to stdout).
    if not _asks_help(argv):
      raise
    lost = output_lost(error, sys.stdout)
    if lost:
      fail(str(lost), 1)
    sys.exit(0)  # A reader that has gone (`| head -3`) read what it wanted.
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
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    rest = parse_or_help(argv)
  except flags.Error as error:
    fail(f'{error}; usage: {usage}', 2)
  return rest
