"""One training run per run directory: an flock that its holder keeps until it ends, or dies."""

import fcntl
import os
import socket

from errors import UserError

LOCK_FILE = 'run.lock'


class RunLock:
  """Held while entered; a second holder gets a UserError naming the first one's host and pid.

  The kernel drops an flock when its holder exits or is killed, so a stale lock never blocks.
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self._path = os.path.join(workdir, LOCK_FILE)
    self._enabled = enabled
    self._file = None

  def __enter__(self) -> 'RunLock':
    if not self._enabled:
      return self
    lock = open(self._path, 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock.seek(0)
      holder = lock.read().strip() or 'another process'
      lock.close()
      raise UserError(f'the run directory {os.path.dirname(self._path)} is in use by a training '
                      f'run ({holder}); wait for it to end or stop it, or pass another '
                      '--workdir') from None
    lock.truncate(0)
    lock.write(f'host {socket.gethostname()}, pid {os.getpid()}\n')
    lock.flush()
    self._file = lock
    return self

  def __exit__(self, *exc_info) -> None:
    if self._file is not None:
      self._file.close()  # Closing releases the flock.
      self._file = None
