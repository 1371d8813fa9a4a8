"""Errors a user can act on: the library raises them, train.py prints each as one line, its fix."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from library_errors import LIBRARY_UNMAPPED, TENSORSTORE_OS_REASON, TENSORSTORE_SPACE_STATUS
from library_errors import THREAD_REFUSED


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


# The fix for a write the OS refused, by its reason; any other (a full disk, lost access): free
# space or restore access.
WRITE_FIXES = {
    # A folder for a file, or back; a file where a folder on the way is made (os.makedirs).
    **dict.fromkeys((os.strerror(errno.EISDIR), os.strerror(errno.ENOTDIR),
                     os.strerror(errno.EEXIST)), 'move the folder or file in its way out of it'),
    # A folder on the way gone, or one that takes no new files.
    os.strerror(errno.ENOENT): 'make sure the folder that holds it is there and takes new files',
    # The process's limit of open files (ulimit -n) reached, or the whole system's.
    os.strerror(errno.EMFILE): 'raise the limit of open files (ulimit -n)',
    os.strerror(errno.ENFILE): "close other programs: the system's open files are at its limit"}


def write_failed(path: str, error: Exception, saved: bool | None = None) -> UserError:
  """A write the machine refused (full disk, lost permission, I/O error), as the user's one line.

  `saved`: whether a checkpoint is there to resume from; None where the writer cannot tell.
  """
  reason = getattr(error, 'strerror', None) or _os_reason(str(error))
  then = {True: ' to resume from the newest checkpoint',
          False: ' to start again: no checkpoint is there to resume from', None: ''}[saved]
  fix = WRITE_FIXES.get(reason, 'free space or restore access there')
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


def shown(path: str) -> str:
  """A path as the user may type it from here: relative below this folder, else absolute; quoted."""
  relative = os.path.relpath(path)
  return shlex.quote(os.path.abspath(path) if relative.startswith('..') else relative)
