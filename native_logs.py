"""Other libraries' C++ logs kept off the user's lines: TensorFlow's, as serving/ and data/ import
it."""

from __future__ import annotations

import os
import sys
from typing import Any

# How to install TensorFlow, an extra that `make train` leaves out.
TENSORFLOW_EXTRA = ('pip install -r requirements/tfds.txt (TensorFlow has wheels for Python 3.11 '
                    'to 3.13)')


class native_stderr_muted:  # pylint: disable=invalid-name; used as a function's context
  """Keeps other libraries' C++ logs off the user's lines while entered: they write to file
  descriptor 2, and TensorFlow 2.19 and later log at import whatever TF_CPP_MIN_LOG_LEVEL says.
  What Python writes meanwhile (a Ctrl-C's line, a library's warning) still reaches the user
  through sys.stderr."""

  def __enter__(self) -> None:
    self._python_stderr = sys.stderr
    self._python_stderr.flush()
    self._devnull = os.open(os.devnull, os.O_WRONLY)
    self._kept = os.dup(2)
    sys.stderr = open(self._kept, 'w', buffering=1, errors='backslashreplace', closefd=False)
    os.dup2(self._devnull, 2)

  def __exit__(self, *exc_info: Any) -> None:
    os.dup2(self._kept, 2)
    sys.stderr.close()  # Flushed; `kept` stays open until here.
    sys.stderr = self._python_stderr
    os.close(self._kept)
    os.close(self._devnull)


def import_tensorflow_quietly() -> None:
  """Imports TensorFlow with its C++ start-up notes muted, and its later logs kept to warnings and
  errors: its own notes are no line of ours. (An ImportError is passed on.)"""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  with native_stderr_muted():
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import; an extra's
