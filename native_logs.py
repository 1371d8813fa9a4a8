"""Other libraries' C++ logs kept off the user's lines: TensorFlow's, as serving/ and data/ import
it, and XLA's account of a device out of memory, which the run says in one line."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from errors import UserError, library_unmapped


def _stderr_to(target: int) -> int:
  """File descriptor 2, where C++ libraries log, sent to `target`; returns the user's stderr's."""
  sys.stderr.flush()
  kept = os.dup(2)
  os.dup2(target, 2)
  return kept


def _stderr_back(kept: int) -> None:
  """File descriptor 2 the user's stderr again."""
  sys.stderr.flush()  # What Python wrote meanwhile went with the libraries' lines.
  os.dup2(kept, 2)
  os.close(kept)


@contextlib.contextmanager
def native_stderr_muted() -> Iterator[None]:
  """Keeps other libraries' C++ logs off the user's lines: they write to file descriptor 2, and
  TensorFlow 2.19 and later log at import whatever TF_CPP_MIN_LOG_LEVEL says. What Python writes
  meanwhile (a Ctrl-C's line, a library's warning) still reaches the user through sys.stderr."""
  python_stderr = sys.stderr
  devnull = os.open(os.devnull, os.O_WRONLY)
  kept = _stderr_to(devnull)
  sys.stderr = open(kept, 'w', buffering=1, errors='backslashreplace', closefd=False)
  try:
    yield
  finally:
    sys.stderr.close()  # Flushed; `kept` stays open until here.
    sys.stderr = python_stderr
    _stderr_back(kept)
    os.close(devnull)


class HeldLogs:
  """What a block wrote to stderr, said when it ends unless dropped."""

  def __init__(self) -> None:
    self.dropped = False

  def drop(self) -> None:
    """The block's failure is said in a line of ours: its libraries' account is not said too."""
    self.dropped = True


def _holding_file() -> BinaryIO:
  """A file in memory where the system makes one (Linux), else a temporary file."""
  if hasattr(os, 'memfd_create'):
    return open(os.memfd_create('held-logs'), 'w+b')
  return tempfile.TemporaryFile()


@contextlib.contextmanager
def native_stderr_held() -> Iterator[HeldLogs]:
  """Holds the block's writes to stderr (C++ libraries' and Python's) until it ends, then says them
  unless dropped: a GPU's compiler out of memory logs 100 KB before the one line that says so."""
  held = HeldLogs()
  with contextlib.ExitStack() as stack:
    try:
      log = stack.enter_context(_holding_file())
      kept = _stderr_to(log.fileno())
    except OSError:  # No file to hold them in, or no stderr: they go where they would have.
      kept = None
    if kept is None:
      yield held
      return
    try:
      yield held
    finally:
      _stderr_back(kept)
      if not held.dropped:
        log.seek(0)
        with contextlib.suppress(OSError), open(2, 'wb', closefd=False) as stderr:
          shutil.copyfileobj(log, stderr)  # Where stderr is gone, nothing can say them.


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
