"""Errors a user can act on: the library raises them, train.py prints each as one line, its fix."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import re
import resource
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO


PROJECT_ROOT = os.path.dirname(os.path.abspath(__file__))

# Other libraries' errors that only their text tells apart (no exception type or status code of
# their own), all here; each is provoked from the pinned versions (tests/test_library_errors.py).
# Tensorstore's (through orbax): the OS's reason in its error text, and its status for ENOSPC and
# EDQUOT.
TENSORSTORE_OS_REASON = re.compile(r':\s*([^:\[\]]+?)\s*\[os_error_code')
TENSORSTORE_SPACE_STATUS = 'RESOURCE_EXHAUSTED'
TENSORSTORE_DENIED_STATUS = 'PERMISSION_DENIED'  # A file this user may not read.
# Tensorstore's statuses for bytes that are missing, cut short or wrong, in plain ValueErrors that
# orbax passes on or quotes: 'NOT_FOUND: Error reading ...', 'Truncated Zstd-compressed stream', and
# a chunk that no longer decodes: 'FAILED_PRECONDITION: ... ZSTD_decompressStream() failed: Data
# corruption detected' (or 'Unknown frame descriptor').
TENSORSTORE_DAMAGE_STATUS = re.compile(
    r'^(NOT_FOUND|DATA_LOSS|OUT_OF_RANGE):|Truncated \S+ stream|ZSTD_decompressStream\(\) failed',
    re.M)
# Orbax's ValueErrors for a saved tree that differs from the one asked for: 'User-provided restore
# item and on-disk value metadata tree structures do not match', 'Requested shape: (256,) is not
# compatible with the stored shape: (512,)', and jax's 'pytree structure error: ...' under orbax.
ORBAX_TREE_MISMATCH = re.compile(
    r'tree structures do not match|pytree structure|not compatible with the stored shape')
# Orbax's warning of a step folder without _CHECKPOINT_METADATA: a checkpoint not written whole.
ORBAX_NO_STEP_METADATA = 'Metadata file does not exist'
# Orbax's warning when a checkpoint it is to delete is already gone (removed by hand): the folder.
ORBAX_STEP_GONE = re.compile(r'^Unable to find the step \d+ for deletion.* under (.+)\.$', re.S)
# XLA's words when a device (on the CPU, the machine) cannot allocate a buffer: 'RESOURCE_EXHAUSTED:
# Out of memory while trying to allocate N bytes' or '... Failed to allocate request for ...' on a
# GPU, 'Out of memory allocating N bytes' on the CPU (after 'INTERNAL: ...' from a running program).
DEVICE_OUT_OF_MEMORY = re.compile(r'RESOURCE_EXHAUSTED|Out of memory')
# Python's RuntimeError when the OS will not start another thread (memory, or a limit of processes).
THREAD_REFUSED = "can't start new thread"
# The system's words (glibc's dlerror) when a compiled library cannot be mapped into the process:
# its filesystem is mounted noexec, or the process's memory limit or the machine's memory is spent.
LIBRARY_UNMAPPED = re.compile(r'^(.+?): failed to map segment from shared object')
# Asyncio's RuntimeError when a thread finishes work for an event loop that was closed.
ASYNCIO_LOOP_CLOSED = 'Event loop is closed'
# JAX's warning when its persistent compilation cache cannot be read or written.
JAX_CACHE_TROUBLE = re.compile(r'Error (reading|writing) persistent compilation cache')
# What a collective (gloo), or a barrier of JAX's coordination service, fails with once a peer is
# gone; and the first line of JAX's abort when that service reports a lost process.
PEER_LOST = re.compile(r'Gloo|[Cc]onnection (reset|closed|refused)|Socket closed|UNAVAILABLE|'
                       r'heartbeat|[Bb]arrier')
JAX_ABORT = b'Terminating process because the JAX distributed service detected fatal errors'


def causes(error: BaseException | None) -> Iterator[BaseException]:
  """The error and the errors it was raised from, outermost first."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def first_cause(error: BaseException,
                matches: Callable[[BaseException], bool]) -> BaseException | None:
  """The outermost of `error`'s causes that `matches` (None if none does): libraries wrap them."""
  return next((cause for cause in causes(error) if matches(cause)), None)


def first_line(text: str) -> str:
  """A text's first line: a library's error text may run on over many."""
  return (text.strip().splitlines() or [''])[0]


def clipped(text: str, limit: int = 160) -> str:
  """A library's text's first line, at most about `limit` characters, cut between words ('...'
  marks the cut): half a number or path would mislead."""
  line = first_line(text)
  cut = line.rfind(' ', 0, limit + 1)
  if cut <= 0:  # One long word (a path, a URL) up to the limit: kept whole.
    cut = line.find(' ', limit)
  return line if len(line) <= limit or cut < 0 else line[:cut].rstrip(',;:') + ' ...'


def error_reason(error: BaseException) -> str:
  """An error's first line, its spaces as one, to quote in a line: XLA's texts run on over many."""
  return ' '.join(first_line(str(error)).split())


def host_limit(error: BaseException) -> str | None:
  """The line for this machine out of threads or memory, found among `error`'s causes (None if
  neither): where no part of a command met it first (e.g. in an import)."""
  memory_error = first_cause(error, lambda cause: isinstance(cause, MemoryError))
  return thread_refused(error) or (host_out_of_memory(memory_error) if memory_error else None)


def thread_refused(error: BaseException) -> str | None:
  """The line for Python's error among `error`'s causes when the OS would not start a thread."""
  refused = first_cause(error, lambda cause: isinstance(cause, RuntimeError)
                        and str(cause) == THREAD_REFUSED)
  return None if refused is None else (
      f'this machine would not start another thread ({refused}): it is short of memory or at its '
      "limit of processes (ulimit -u, or a container's pids limit); free memory or raise that "
      'limit, then rerun the same command')


def library_unmapped(error: BaseException) -> str | None:
  """The line for a compiled library the system would not load, found among `error`'s causes (None
  if none), by its likely reason: the system refuses a noexec filesystem's; memory bounds any."""
  unmapped = next(filter(None, (LIBRARY_UNMAPPED.match(str(cause)) for cause in causes(error)
                                if isinstance(cause, ImportError))), None)
  if unmapped is None:
    return None
  named = unmapped.group(1)  # A path, or a bare name where a library it needs failed.
  library = shown(named) if os.path.isabs(named) else named
  said = f'the system would not load {library} (failed to map segment from shared object)'
  with contextlib.suppress(OSError):
    if os.statvfs(named if os.path.isabs(named) else sys.prefix).f_flag & os.ST_NOEXEC:
      return (f'{said}: its filesystem is mounted noexec; make the environment where programs may '
              'run (make train VENV=/path/there/venv) and run the command with its Python '
              '(/path/there/venv/bin/python)')
  limit = resource.getrlimit(resource.RLIMIT_AS)[0]
  if limit != resource.RLIM_INFINITY:
    return (f"{said}: this process's memory limit ({limit >> 20} MiB of address space, ulimit -v) "
            'is too small; raise it (ulimit -v unlimited), then rerun the same command')
  return (f'{said}: this machine may be short of memory, or a security policy may forbid loading '
          'it from there; free memory and rerun the same command, or make the environment '
          'elsewhere (make train VENV=/path/there/venv)')


def host_out_of_memory(memory_error: BaseException) -> str:
  """The line for Python's MemoryError: the host's memory, whatever the device."""
  reason = error_reason(memory_error)
  return (f'this machine ran out of memory ({f"MemoryError: {reason}" if reason else "MemoryError"}'
          "); free memory (close other programs, or raise the process's memory limit) and rerun "
          'the same command, or lower batch_size, num_models or model.hidden_sizes in a new '
          '--workdir, or use a machine with more memory')


class UserError(Exception):
  """A mistake in the user's flags, config or data, or a fault of their machine; names the fix."""


class ConfigError(UserError):
  """A config field that breaks a constraint; train.py words the fix as `--config.FIELD=VALUE`."""

  def __init__(self, field: str, constraint: str, value: Any, fix: str = 'VALUE'):
    super().__init__(f'{field} {constraint}, got {value!r}')
    self.field = field
    self.fix = fix  # A value to pass instead, or the form one takes.


def _os_reason(text: str) -> str:
  """The OS's reason inside orbax's (tensorstore's) error text, whose form varies by version."""
  found = TENSORSTORE_OS_REASON.search(text)
  if found:
    return found.group(1)
  if TENSORSTORE_SPACE_STATUS in text:
    return 'No space left on device, or over quota'
  return clipped(text)


# A folder for a file, or back.
IN_THE_WAY = (os.strerror(errno.EISDIR), os.strerror(errno.ENOTDIR))
NO_FOLDER = os.strerror(errno.ENOENT)  # A folder on the way gone, or one that takes no new files.


def write_failed(path: str, error: Exception, saved: bool | None = None) -> UserError:
  """A write the machine refused (full disk, lost permission, I/O error), as the user's one line.

  `saved`: whether a checkpoint is there to resume from; None where the writer cannot tell.
  """
  reason = getattr(error, 'strerror', None) or _os_reason(str(error))
  then = {True: ' to resume from the newest checkpoint',
          False: ' to start again: no checkpoint is there to resume from', None: ''}[saved]
  fix = ('move the folder or file in its way out of it' if reason in IN_THE_WAY
         else 'make sure the folder that holds it is there and takes new files'
         if reason == NO_FOLDER else 'free space or restore access there')
  return UserError(f'cannot write {path} ({reason}); {fix}, then rerun the same command{then}')


def say(line: str, stream: TextIO) -> None:
  """Prints a line; a reader that has gone (`python train.py | head -1`) never stops the program,
  and output that cannot be written (redirected to a full disk) is the user's one line."""
  try:
    print(line, file=stream, flush=True)
  except OSError as error:
    lost = output_lost(error, stream)
    if lost:
      raise lost from error


def output_lost(error: OSError, stream: TextIO) -> UserError | None:
  """After a write to `stream` failed: its later lines, and its flush at exit, go nowhere instead of
  raising again. The user's line, or None for a reader that has gone (`| head -1`): no mistake."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, stream.fileno())
  os.close(devnull)
  if isinstance(error, BrokenPipeError):
    return None
  return UserError(f'cannot write the output ({error.strerror}); free space where it is '
                   'redirected, then rerun the same command')


@contextlib.contextmanager
def native_stderr_muted() -> Iterator[None]:
  """Keeps other libraries' C++ logs off the user's lines: they write to file descriptor 2, and
  TensorFlow 2.19 and later log at import whatever TF_CPP_MIN_LOG_LEVEL says. What Python writes
  meanwhile (a Ctrl-C's line, a library's warning) still reaches the user through sys.stderr."""
  python_stderr = sys.stderr
  python_stderr.flush()
  devnull = os.open(os.devnull, os.O_WRONLY)
  kept = os.dup(2)
  sys.stderr = open(kept, 'w', buffering=1, errors='backslashreplace', closefd=False)
  os.dup2(devnull, 2)
  try:
    yield
  finally:
    os.dup2(kept, 2)
    sys.stderr.close()  # Flushed; `kept` stays open until here.
    sys.stderr = python_stderr
    os.close(kept)
    os.close(devnull)


def import_tensorflow_quietly() -> None:
  """Imports TensorFlow (ImportError passed on, but for a library the system would not load: its
  UserError) with its C++ start-up notes muted, and its later logs kept to warnings and errors: its
  own notes are no line of ours."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  try:
    with native_stderr_muted():
      import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import; an extra's
  except ImportError as error:
    if line := library_unmapped(error):  # Not the extra missing: TensorFlow's libraries are large.
      raise UserError(line) from error
    raise


def start_command(ctrl_c_line: str) -> None:
  """A command's first step, before its imports: from now on a Ctrl-C ends it at once in
  `ctrl_c_line` (a KeyboardInterrupt would end in a traceback of whatever it met, an import among
  them); a module this Python lacks, a library the system will not load, or a machine out of
  memory or threads, met where no part of the command said so, is one line too."""
  signal.signal(signal.SIGINT, lambda *_: fail(ctrl_c_line, 130, exit_now=os._exit))
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


def set_up_line(error: BaseException) -> str | None:
  """The line for an error of the set-up or the machine that no part of a command said (None: a
  fault of the code): a module missing, also where a library raised its own ImportError from it
  (jax.export's 'Please install flatbuffers'), a library not loaded, no memory or threads."""
  if isinstance(error, ImportError):
    missing = next((cause for cause in causes(error)
                    if isinstance(cause, ModuleNotFoundError)), None)
    if missing is not None:
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


def shown(path: str) -> str:
  """A path as the user may type it from here: relative below this folder, else absolute; quoted."""
  relative = os.path.relpath(path)
  return shlex.quote(os.path.abspath(path) if relative.startswith('..') else relative)


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
    sys.exit(0 if HELP_FLAGS & set(argv) else done.code)
  except OSError as error:  # Of the flags' parsing only the help writes (to stdout).
    if not HELP_FLAGS & set(argv):
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


def parse_tool_flags(argv: list[str], usage: str) -> list[str]:
  """Flags of predict.py, export.py and the benchmarks: a mistake is one line with the usage."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    rest = parse_or_help(argv)
  except flags.Error as error:
    fail(f'{error}; usage: {usage}', 2)
  return rest
