"""One training run per run directory: an flock on a local disk; on Cloud Storage, an object that
generation preconditions give one owner, who keeps it fresh so that a dead owner's lock goes stale."""

import datetime
import fcntl
import os
import re
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from errors import UserError
from trainer import storage

LOCK_FILE = 'run.lock'
STALE_AFTER_S = 120.0  # A Cloud Storage lock silent this long is taken over: its owner is gone.


class _Holder(Protocol):
  def take(self) -> UserError | None: ...
  def release(self) -> None: ...
  def lost(self) -> bool: ...


def _owner() -> str:
  return f'host {socket.gethostname()}, pid {os.getpid()}'


def _busy(workdir: str, holder: str, note: str = '') -> UserError:
  return UserError(f'the run directory {workdir} is in use by a training run ({holder}{note}); '
                   'wait for it to end or stop it, or pass another --workdir')


class _Flock:
  """The kernel drops an flock when its holder exits or is killed, so a stale lock never blocks."""

  def __init__(self, workdir: str):
    self._workdir = workdir
    self._file: TextIO | None = None
    self._path = os.path.join(workdir, LOCK_FILE)

  def take(self) -> UserError | None:
    lock: TextIO = open(self._path, 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock.seek(0)
      holder = lock.read().strip() or 'another process'
      lock.close()
      return _busy(self._workdir, holder)
    lock.truncate(0)
    lock.write(f'{_owner()}\n')
    lock.flush()
    self._file = lock
    return None

  def release(self) -> None:
    if self._file is not None:
      self._file.truncate(0)  # While still held: no ended run is named as if it were running.
      self._file.close()  # Closing releases the flock.
      self._file = None

  def lost(self) -> bool:
    return False


class _ObjectLock:
  """Cloud Storage has no flock: the lock object is written only if its generation is the one
  expected (0: absent), so of two runs one wins; its owner rewrites it every `stale_after / 4` s,
  and ends by emptying it. A lock left silent `stale_after` seconds (kill -9, a deleted VM) is
  free; the lock names its owner's `stale_after`, and a newcomer waits the longer of the two."""

  def __init__(self, workdir: str, stale_after: float, warn: Callable[[str], None]):
    self._workdir, self._stale_after, self._warn = workdir, stale_after, warn
    self._blob: Any = None
    self._generation: int | None = None
    self._stop, self._lost = threading.Event(), threading.Event()
    self._beat = threading.Thread(target=self._keep_fresh, daemon=True)

  def take(self) -> UserError | None:
    with storage.user_errors(self._workdir):
      self._blob = storage.blob(f'{self._workdir.rstrip("/")}/{LOCK_FILE}')
      if not self._write(expected=0):
        found = self._blob.bucket.get_blob(self._blob.name)
        holder, silent = self._holder(found) if found else ('', 0)
        stale_after = max(self._stale_after, _stale_after_of(holder))
        if holder and silent < stale_after:
          return _busy(self._workdir, holder.split('; ')[0], f'; its lock was refreshed {silent} s '
                       f'ago, and is taken over once silent for {stale_after:.0f} s')
        if not self._write(expected=found.generation if found else 0):
          return _busy(self._workdir, 'another run took the lock first')
        if holder:
          self._warn(f'took over the run directory {self._workdir} from a run that stopped '
                     f'refreshing its lock {silent} s ago ({holder.split("; ")[0]}): killed, or '
                     'its VM deleted')
    self._beat.start()
    return None

  @staticmethod
  def _holder(found: Any) -> tuple[str, int]:
    """The run a lock names ('' if none), and how many seconds ago it was last written."""
    silent = datetime.datetime.now(datetime.timezone.utc) - found.updated
    return found.download_as_text().strip(), max(0, int(silent.total_seconds()))

  def _write(self, expected: int | None, text: str | None = None) -> bool:
    """Writes the lock if its generation is `expected`; False if another run wrote it first."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top; only for gs://
    owner = f'{_owner()}; stale after {self._stale_after:g} s\n'
    try:
      self._blob.upload_from_string(owner if text is None else text, if_generation_match=expected)
    except exceptions.PreconditionFailed:
      return False
    self._generation = self._blob.generation
    return True

  def _keep_fresh(self) -> None:
    while not self._stop.wait(self._stale_after / 4):
      try:
        if not self._write(expected=self._generation):
          self._lost.set()  # Another run took it over: this run must not write on.
          return
      except Exception:  # pylint: disable=broad-except; a network blip: the next beat retries.
        continue

  def release(self) -> None:
    """Empties the lock if it is still this run's; a failure only warns: the lock goes stale."""
    self._stop.set()
    if self._beat.is_alive():
      self._beat.join()
    if self._generation is not None and not self._lost.is_set():
      try:
        self._write(expected=self._generation, text='')
      except Exception as error:  # pylint: disable=broad-except; never hides the run's own end
        self._warn(f'could not release the run lock of {self._workdir} ({type(error).__name__}); '
                   f'the next run takes it over once it is silent for {self._stale_after:.0f} s')

  def lost(self) -> bool:
    return self._lost.is_set()


def _stale_after_of(holder: str) -> float:
  """The `stale after N s` a lock's owner wrote into it (0 for a lock of another form)."""
  found = re.search(r'; stale after ([\d.]+) s', holder)
  return float(found.group(1)) if found else 0.0


class RunLock:
  """Held while entered; a second holder gets a UserError naming the first one's host and pid.

  In a multi-process run one process takes it (`enabled`), and `everyone(ok)`, a collective that
  says whether every process got past it, stops them all when that one is refused.
  """

  def __init__(self, workdir: str, enabled: bool = True,
               everyone: Callable[[bool], bool] = lambda ok: ok,
               stale_after: float = STALE_AFTER_S, warn: Callable[[str], None] = lambda _: None):
    self._workdir, self._enabled, self._everyone = workdir, enabled, everyone
    self._holder: _Holder = (_ObjectLock(workdir, stale_after, warn) if storage.is_remote(workdir)
                             else _Flock(workdir))

  def __enter__(self) -> 'RunLock':
    refusal = self._holder.take() if self._enabled else None
    if not self._everyone(refusal is None):
      raise refusal or UserError(
          f'process 0 found the run directory {self._workdir} in use by another training run; '
          'wait for it to end or stop it, or pass another --workdir')
    return self

  def check(self) -> None:
    """Stops every process of a run whose lock another run took over, before it writes again (a
    collective: every process calls it)."""
    if not self._everyone(not (self._enabled and self._holder.lost())):
      raise UserError(f'another training run took over the run directory {self._workdir} while '
                      'this one could not refresh its lock (paused, or cut off from Cloud '
                      'Storage); this run stops without writing more')

  def __exit__(self, *exc_info) -> None:
    if self._enabled:
      self._holder.release()
