"""Other libraries' C++ logs kept off the user's lines: TensorFlow's, as serving/ and data/ import
it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator



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
  """Imports TensorFlow with its C++ start-up notes muted, and its later logs kept to warnings and
  errors: its own notes are no line of ours. (An ImportError is passed on.)"""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  with native_stderr_muted():
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import; an extra's
