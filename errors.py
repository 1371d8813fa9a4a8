"""Errors a user can act on, and what the program was doing when a fault met it: the library raises
and marks them, trainer/host/faults.py words each as the user's one line."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

Raised = TypeVar('Raised', bound=BaseException)


class UserError(Exception):
  """A mistake in the user's flags, config or data, or a fault of their machine; names the fix."""

  exit_status = 1


class UsageError(UserError):
  """A command line that names no work to do: the flags' mistake (exit status 2)."""

  exit_status = 2


class ConfigError(UserError):
  """A config field that breaks a constraint; the line words the fix as `--config.FIELD=VALUE`."""

  def __init__(self, field: str, constraint: str, value: Any, fix: str = 'VALUE'):
    super().__init__(f'{field} {constraint}, got {value!r}')
    self.field = field
    self.fix = fix  # A value to pass instead, or the form one takes.


class ExtraMissing(Exception):
  """A library of an extra that `make train` leaves out, which what the user asked for needs, raised
  from the ImportError; its arguments: what was asked, the library, how to install it, and what to
  do instead that needs no extra."""


class Stopped(Exception):
  """A run that a signal stopped at an epoch's end, once that epoch's checkpoint is saved."""

  def __init__(self, signal_name: str, epoch: int, directory: str):
    super().__init__(f'stopped by {signal_name} after epoch {epoch}, whose checkpoint is saved in '
                     f'{directory}')
    self.exit_status = 128 + signal.Signals[signal_name].value  # The shell's status for it.


class SaveFailed(Exception):
  """A checkpoint's save that failed (raised from the library's error): what a rerun finds."""

  def __init__(self, directory: str, kept: list[int], stopped: str = ''):
    super().__init__(f'the save in {directory} failed')
    self.directory = directory
    self.kept = kept  # The complete checkpoints left, oldest first.
    self.stopped = stopped  # The signal and epoch of a stop whose checkpoint it was ('SIGTERM
    # after epoch 2'), if any.


class CheckpointUnreadable(Exception):
  """A checkpoint that is whole but cannot be read now (no permission, an I/O error): not damage."""

  def __init__(self, directory: str, epoch: int):
    super().__init__(f'the checkpoint of epoch {epoch} in {directory} cannot be read')
    self.directory = directory
    self.epoch = epoch


@dataclasses.dataclass(frozen=True)
class During(contextlib.ContextDecorator):
  """Marks a fault with what the program was doing and on what: the innermost mark is kept.

  `doing`: loading data, training, evaluating, classifying, saving, reading, writing, listing,
  joining. `path`: the file or folder; `run_dir`: the local run directory that holds it, if any.
  """
  doing: str
  path: str = ''
  run_dir: str = ''

  def __enter__(self) -> During:
    return self

  def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
    if error is not None:
      self.mark(error)

  def mark(self, error: Raised) -> Raised:
    """Marks `error` with this, unless it, or an error it was raised from, is marked already."""
    if during(error) is None:
      error.during = self  # type: ignore[attr-defined]
    return error


def during(error: BaseException) -> During | None:
  """The mark of what the program was doing when `error`, or one it was raised from, met it."""
  marked = first_cause(error, lambda cause: isinstance(getattr(cause, 'during', None), During))
  return getattr(marked, 'during', None)


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


def kinds_of(module: str, *names: str) -> tuple[type, ...]:
  """Exception classes of a library imported already (none if it is not: no error is of its)."""
  loaded = sys.modules.get(module)
  return tuple(getattr(loaded, name) for name in names) if loaded else ()


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


def shown(path: str) -> str:
  """A path as the user may type it from here: relative below this folder, else absolute; quoted."""
  relative = os.path.relpath(path)
  return shlex.quote(os.path.abspath(path) if relative.startswith('..') else relative)
