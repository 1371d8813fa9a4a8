"""One training run per run directory: an flock that its holder keeps until it ends, or dies."""

import fcntl
import os
import socket
from collections.abc import Callable
from typing import TextIO

from errors import UserError

LOCK_FILE = 'run.lock'


class RunLock:
  """Held while entered; a second holder gets a UserError naming the first one's host and pid.

  The kernel drops an flock when its holder exits or is killed, so a stale lock never blocks.
  In a multi-process run one process takes it (`enabled`), and `everyone(ok)`, a collective that
  says whether every process got past it, stops them all when that one is refused.
  """

  def __init__(self, workdir: str, enabled: bool = True,
               everyone: Callable[[bool], bool] = lambda ok: ok):
    self._path = os.path.join(workdir, LOCK_FILE)
    self._enabled = enabled
    self._everyone = everyone
    self._file: TextIO | None = None

  def __enter__(self) -> 'RunLock':
    refusal = self._take() if self._enabled else None
    if not self._everyone(refusal is None):
      raise refusal or UserError(
          f'process 0 found the run directory {os.path.dirname(self._path)} in use by another '
          'training run; wait for it to end or stop it, or pass another --workdir')
    return self

  def _take(self) -> UserError | None:
    """Takes the lock and records this process in it, or returns why not."""
    lock = open(self._path, 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock.seek(0)
      holder = lock.read().strip() or 'another process'
      lock.close()
      return UserError(f'the run directory {os.path.dirname(self._path)} is in use by a training '
                       f'run ({holder}); wait for it to end or stop it, or pass another --workdir')
    lock.truncate(0)
    lock.write(f'host {socket.gethostname()}, pid {os.getpid()}\n')
    lock.flush()
    self._file = lock
    return None

  def __exit__(self, *exc_info) -> None:
    if self._file is not None:
      self._file.truncate(0)  # While still held: no ended run is named as if it were running.
      self._file.close()  # Closing releases the flock.
      self._file = None
