"""One training run at a time in a run directory: an flock on a local disk; on Cloud Storage, an
object that generation preconditions give one owner, who keeps it fresh so that a dead owner's lock
goes stale."""

import contextlib
import datetime
import fcntl
import os
import re
import socket
import threading
from collections.abc import Callable
from typing import Any, TextIO

from errors import During, UserError
from trainer.host.cloud_storage import blob, failures
from trainer.host.boundary import Host
from trainer.host.run_dir import RunDirectory

LOCK_FILE = 'run.lock'


def _owner() -> str:
  return f'host {socket.gethostname()}, pid {os.getpid()}'


def this_machine() -> str | None:
  """This kernel's boot and PID namespace, where a pid names one process; None off Linux.

  A host name alone is not enough: two VMs, or two containers, may share one."""
  with contextlib.suppress(OSError), open('/proc/sys/kernel/random/boot_id',
                                          encoding='ascii') as boot:
    namespace = re.sub(r'\D', '', os.readlink('/proc/self/ns/pid'))
    return f'{boot.read().strip()}-{namespace}'
  return None


def _gone(holder: str) -> bool:
  """Whether a lock's owner ran on this machine and its process has ended: certain, not stale."""
  machine, pid = re.search(r'; machine ([^;\s]+)', holder), re.search(r'\bpid (\d+)', holder)
  if not (machine and pid and machine.group(1) == this_machine()):
    return False
  return not os.path.exists(f'/proc/{pid.group(1)}')  # This PID namespace's, as this_machine().


def _taken_over(workdir: 'RunDirectory', holder: str) -> str:
  return (f'took over the run directory {workdir} from a run that ended without releasing its '
          f'lock ({holder}; that process is gone)')


class Busy(UserError):
  """The run directory is another run's."""


def _taken_again(lock: str) -> str:
  return (f'the run lock {lock} was removed while this run held it; this run took it again (leave '
          f'{LOCK_FILE} in place while a run uses its directory)')


def _busy(workdir: 'RunDirectory', holder: str, note: str = '') -> Busy:
  return Busy(f'the run directory {workdir} is in use by a training run ({holder}{note}); '
              'wait for it to end or stop it, or pass another --workdir')


class _Flock:
  """The kernel drops an flock when its holder exits or is killed, so a stale lock never blocks."""

  def __init__(self, workdir: RunDirectory, warn: Callable[[str], None]):
    self._workdir, self._warn = workdir, warn
    self._file: TextIO | None = None
    self._path = workdir.file(LOCK_FILE)

  def take(self) -> Exception | None:
    try:
      # A lock's text only names its holder; bytes of no text there are shown, never raised.
      lock: TextIO = open(self._path, 'a+', encoding='utf-8',  # pylint: disable=consider-using-with
                          errors='backslashreplace')
    except OSError as error:  # A folder of that name, no permission: not a lock this run can hold.
      return UserError(f'cannot open the run lock {self._path} ({error.strerror}); move it out of '
                       'the run directory, then rerun the same command')
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock.seek(0)
      holder = lock.read().strip() or 'another process'
      lock.close()
      return _busy(self._workdir, holder)
    lock.seek(0)
    left = lock.read().strip()  # A holder that ended releasing it left it empty.
    try:
      lock.truncate(0)
      lock.write(f'{_owner()}\n')
      lock.flush()
    except OSError as error:  # A full disk: no run can start here, and none is named as running.
      with contextlib.suppress(OSError):  # Its flush fails again; the file still closes, unlocked.
        lock.close()
      return self._workdir.during('writing', LOCK_FILE).mark(error)
    if left and left != _owner():
      self._warn(_taken_over(self._workdir, left))
    self._file = lock
    return None

  def release(self) -> None:
    if self._file is not None:
      self._file.truncate(0)  # While still held: no ended run is named as if it were running.
      self._file.close()  # Closing releases the flock.
      self._file = None

  def lost(self) -> bool:
    """Whether another run took the lock file that replaced this run's, held or left (killed): a
    lock on a file gone from its path stops no newcomer. One naming no other run is taken."""
    held = self._file
    if held is None or self._in_place(held):
      return False
    if self._names_a_run():
      return True
    refusal = self.take()
    if refusal is None:
      held.close()
      self._warn(_taken_again(self._path))
    return isinstance(refusal, Busy)

  def _names_a_run(self) -> bool:
    """Whether the lock file names another run: one that took it, and may have saved since. (Gone,
    or not a file to read: take() says what it is.)"""
    with contextlib.suppress(OSError), open(self._path, encoding='utf-8',
                                            errors='backslashreplace') as lock:
      return lock.read().strip() not in ('', _owner())  # This run's own text copied back: ours.
    return False

  def _in_place(self, held: TextIO) -> bool:
    try:
      return os.path.samestat(os.fstat(held.fileno()), os.stat(self._path))
    except FileNotFoundError:
      return False
    except OSError:  # No access to look: nothing says it moved.
      return True


class _ObjectLock:
  """Cloud Storage has no flock: the lock object is written only if its generation is the one
  expected (0: absent), so of two runs one wins; its owner rewrites it every `stale_after / 4` s,
  and ends by emptying it. A lock left silent `stale_after` seconds (kill -9, a deleted VM) is
  free; the lock names its owner's `stale_after`, and a newcomer waits the longer of the two."""

  def __init__(self, workdir: RunDirectory, stale_after: float, warn: Callable[[str], None]):
    self._workdir, self._stale_after, self._warn = workdir, stale_after, warn
    self._blob: Any = None
    self._generation: int | None = None
    self._stop, self._lost = threading.Event(), threading.Event()
    self._beat = threading.Thread(target=self._keep_fresh, daemon=True)

  def take(self) -> Exception | None:
    with During('locking', self._workdir.name):
      self._blob = blob(self._workdir.file(LOCK_FILE))
      if not self._write(expected=0):
        found = self._blob.bucket.get_blob(self._blob.name)
        holder, silent = self._holder(found) if found else ('', 0)
        stale_after = max(self._stale_after, _stale_after_of(holder))
        gone = bool(holder) and _gone(holder)
        if holder and silent < stale_after and not gone:
          return _busy(self._workdir, holder.split('; ')[0], f'; its lock was refreshed {silent} s '
                       f'ago, and is taken over once silent for {stale_after:.0f} s')
        if not self._write(expected=found.generation if found else 0):
          return _busy(self._workdir, 'another run took the lock first')
        if holder:
          self._warn(_taken_over(self._workdir, holder.split('; ')[0]) if gone else
                     f'took over the run directory {self._workdir} from a run that stopped '
                     f'refreshing its lock {silent} s ago ({holder.split("; ")[0]}): killed, or '
                     'its VM deleted')
    self._beat.start()
    return None

  @staticmethod
  def _holder(found: Any) -> tuple[str, int]:
    """The run a lock names ('' if none), and how many seconds ago it was last written."""
    silent = datetime.datetime.now(datetime.timezone.utc) - found.updated
    text = found.download_as_bytes().decode('utf-8', 'backslashreplace')  # As _Flock shows it.
    return text.strip(), max(0, int(silent.total_seconds()))

  def _write(self, expected: int | None, text: str | None = None) -> bool:
    """Writes the lock if its generation is `expected`; False if another run wrote it first."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top; only for gs://
    machine = this_machine()  # Lets a newcomer on this machine see at once that the owner is gone.
    owner = (f'{_owner()}{f"; machine {machine}" if machine else ""}; stale after '
             f'{self._stale_after:g} s\n')
    try:
      self._blob.upload_from_string(owner if text is None else text, if_generation_match=expected)
    except exceptions.PreconditionFailed:
      return False
    self._generation = self._blob.generation
    return True

  def _keep_fresh(self) -> None:
    while not self._stop.wait(self._stale_after / 4):
      try:
        if self._write(expected=self._generation):
          continue
        if self._write(expected=0):  # It was removed by hand, and no other run took it.
          self._warn(_taken_again(self._workdir.file(LOCK_FILE)))
          continue
        self._lost.set()  # Another run took it over: this run must not write on.
        return
      except failures():  # A network blip: the next beat retries.
        continue

  def release(self) -> None:
    """Empties the lock if it is still this run's; a failure only warns: the lock goes stale."""
    self._stop.set()
    if self._beat.is_alive():
      self._beat.join()
    if self._generation is not None and not self._lost.is_set():
      try:
        self._write(expected=self._generation, text='')
      except failures() as error:  # Never hides the run's own end.
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

  In a multi-process run process 0 takes it, and every process learns whether it was refused: all
  of them stop then. Released before the host ends the process at once (a Ctrl-C, a lost peer).
  """

  def __init__(self, workdir: RunDirectory, host: Host | None = None):
    self._workdir, self._host = workdir, host or Host()
    warn = self._host.warn
    self._holder: _Flock | _ObjectLock = (_ObjectLock(workdir, workdir.lock_stale_after, warn)
                                          if workdir.remote else _Flock(workdir, warn))
    self._releasing = threading.Lock()
    self._held = False

  def __enter__(self) -> 'RunLock':
    refusal = self._holder.take() if self._host.primary else None
    self._held = self._host.primary and refusal is None
    self._host.exits.hold(self.release)
    with contextlib.ExitStack() as on_refusal:  # A refusal, or a peer lost in the vote.
      on_refusal.callback(self.__exit__)
      if not self._host.on_every_process(refusal is None):
        raise refusal or UserError(
            f'process 0 found the run directory {self._workdir} in use by another training run; '
            'wait for it to end or stop it, or pass another --workdir')
      on_refusal.pop_all()
    return self

  def lost(self) -> bool:
    """Whether another run took over the lock this process holds."""
    return self._host.primary and self._holder.lost()

  def check(self, lost: bool | None = None) -> None:
    """Stops a run whose lock another run took over, before it writes again: `lost` as every
    process agreed it (Host.agree_at_epoch_end), else as this process sees it."""
    if not (self.lost() if lost is None else lost):
      return
    if not self._workdir.remote:
      raise UserError(f'another training run took the run directory {self._workdir} after its '
                      'run lock was removed by hand; this run stops without writing more: once '
                      'that run has ended, the same command resumes from the newest checkpoint '
                      f'there, if any (leave {LOCK_FILE} in place while a run uses its directory)')
    raise UserError(f'another training run took over the run directory {self._workdir} while '
                    'this one could not refresh its lock (paused, or cut off from Cloud Storage) '
                    'or after it was removed by hand; this run stops without writing more')

  def __exit__(self, *exc_info: Any) -> None:
    self.release()
    self._host.exits.let_go(self.release)

  def release(self) -> None:
    """Lets the lock go if held, once: the run's end and a thread ending the process may both ask.

    A second caller waits for the first; a signal handler interrupting a release gives up after a
    few seconds rather than wait on itself."""
    if not self._releasing.acquire(timeout=5):
      return
    try:
      if self._held:
        self._held = False
        self._holder.release()
    finally:
      self._releasing.release()
