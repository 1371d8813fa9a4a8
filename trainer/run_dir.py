"""A run directory and its lock: a local folder, or a Cloud Storage bucket (`gs://BUCKET/PATH`)
that outlives a preempted VM. One training run at a time holds it: an flock on a local disk; on
Cloud Storage, an object that generation preconditions give one owner, who keeps it fresh so that a
dead owner's lock goes stale. Cloud Storage's failures (no bucket, no permission, no credentials)
end in one line; its clients load only for a `gs://` run directory."""

import contextlib
import datetime
import fcntl
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from etils import epath

from errors import UserError, causes, error_reason, write_failed

REMOTE_PREFIX = 'gs://'
URL_SCHEME = re.compile(r'([A-Za-z][A-Za-z0-9+.-]*)://')  # s3://, https://: no run directory here.
CREDENTIALS_HELP = ('on a Cloud TPU or GCE VM they come with its service account; elsewhere run '
                    '`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS')
# How long the first touch of a bucket retries before the run says Cloud Storage is out of reach
# (the client's default: 120 s); the lock's later writes keep the default's patience.
REACH_TIMEOUT_S = 30.0


def client() -> Any:
  """A Cloud Storage client with no project (google-cloud-storage's `project=None`): objects in a
  named bucket need none, so a machine where none is set (after `gcloud auth application-default
  login`, say) reaches the bucket too.

  From then on google-auth's warnings (no project set, at each credentials lookup, gcsfs's too)
  and urllib3's (each retry of a request) stay off the user's lines: what fails ends in one."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top; only for gs://
  for library in ('google.auth', 'urllib3'):
    logging.getLogger(library).setLevel(logging.ERROR)
  return storage.Client(project=None)


def blob(url: str) -> Any:
  """The Cloud Storage object at a `gs://` URL, from the client whose writes take preconditions."""
  bucket, _, name = url[len(REMOTE_PREFIX):].partition('/')
  return client().bucket(bucket).blob(name)


def reach(workdir: str) -> None:
  """The first touch of a bucket, by the client that words Cloud Storage's refusals in one line,
  within REACH_TIMEOUT_S: gcsfs and orbax would log their retries, then end in tracebacks."""
  from google.cloud.storage.retry import DEFAULT_RETRY  # pylint: disable=g-import-not-at-top
  bucket, _, prefix = workdir[len(REMOTE_PREFIX):].partition('/')
  with user_errors(workdir):
    listed = client().list_blobs(bucket, prefix=prefix, max_results=1, timeout=REACH_TIMEOUT_S,
                                 retry=DEFAULT_RETRY.with_timeout(REACH_TIMEOUT_S))
    next(iter(listed), None)


def _unreachable_reason(error: BaseException) -> str:
  """Why a request never got an answer: the OS's words (Name or service not known, Connection
  refused) where there are some, else the innermost error's first line."""
  chain = [*causes(error)]
  said = [cause.strerror for cause in chain if isinstance(cause, OSError) and cause.strerror]
  return said[-1] if said else error_reason(chain[-1])


@contextlib.contextmanager
def user_errors(workdir: str) -> Iterator[None]:
  """Cloud Storage's refusals as the one line a user acts on, naming the bucket and the fix."""
  # pylint: disable=g-import-not-at-top; only for gs://
  import requests
  from google.api_core import exceptions
  from google.auth import exceptions as auth
  bucket = f'{REMOTE_PREFIX}{workdir[len(REMOTE_PREFIX):].split("/", 1)[0]}'
  try:
    yield
  except (exceptions.RetryError, auth.TransportError, requests.ConnectionError,
          requests.Timeout) as error:  # Offline, or no name server: the retries ran out.
    raise UserError(f'cannot reach Cloud Storage for {bucket} ({_unreachable_reason(error)}); '
                    "check this machine's network connection, then rerun the same "
                    'command') from error
  except exceptions.NotFound as error:
    raise UserError(f'the bucket {bucket} of --workdir={workdir} does not exist; create it '
                    f'(gcloud storage buckets create {bucket} --location=REGION) or pass another '
                    '--workdir') from error
  except (exceptions.Forbidden, exceptions.Unauthorized) as error:
    raise UserError(f'no permission to use {bucket} ({error.code} {error.message}); give this '
                    'machine\'s account the Storage Object Admin role on the bucket (gcloud '
                    f'storage buckets add-iam-policy-binding {bucket} ...) or pass another '
                    '--workdir') from error
  except auth.GoogleAuthError as error:
    raise UserError(f'no Google Cloud credentials to reach {bucket} ({type(error).__name__}); '
                    f'{CREDENTIALS_HELP}') from error


def named_alike_in_utf8(path: str) -> bool:
  """Whether the OS gets the same bytes for `path` from Python (the locale's encoding) as from
  tensorstore (always UTF-8), which writes the checkpoints' arrays: under a Latin-1 locale a
  non-ASCII name is two folders, under an ASCII one tensorstore cannot name it at all."""
  try:
    return path.encode('utf-8') == os.fsencode(path)
  except UnicodeEncodeError:  # Bytes the locale could not decode, kept as surrogates.
    return False


class RunDirectory:
  """The one owner of a run directory's files, on a disk or in a bucket: the modules that write
  there ask it. A file is written whole (object stores cannot append): a reader sees the old
  version or the new one, never half."""

  def __init__(self, workdir: str | os.PathLike):
    workdir = os.fspath(workdir)
    self.remote = workdir.startswith(REMOTE_PREFIX)
    scheme = URL_SCHEME.match(workdir)
    if scheme and not self.remote:  # Else it would be a local folder named `s3:`.
      raise UserError(f'cannot keep a run directory at {workdir}: a --workdir is a local folder or '
                      f'a Cloud Storage bucket (gs://BUCKET/PATH), not {scheme.group(1)}://; pass '
                      'one of those')
    self.name = workdir.rstrip('/') if self.remote else os.path.abspath(workdir)
    if not self.remote and not named_alike_in_utf8(self.name):
      raise UserError(
          f'the run directory {self.name} has a name that this Python encodes as '
          f'{sys.getfilesystemencoding()} (its locale) and the checkpoint library (tensorstore) '
          'as UTF-8: the checkpoints would go into another folder and not restore; pass a '
          '--workdir whose path is ASCII, or run under a UTF-8 locale (LC_ALL=C.UTF-8)')
    self._reached = False  # A bucket answers once: eval_only checks before make() would again.

  def __str__(self) -> str:
    return self.name

  def file(self, name: str) -> str:
    return f'{self.name}/{name}'

  def path(self, name: str = '') -> epath.Path:
    return epath.Path(self.file(name) if name else self.name)

  def make(self) -> None:
    """A local directory is made and checked writable; a bucket's prefix needs no making, but its
    bucket must be reachable."""
    self.check_usable()
    if self.remote:
      return
    try:
      os.makedirs(self.name, exist_ok=True)
    except OSError as error:
      raise UserError(f'cannot create the run directory {self.name} ({error.strerror}); pass a '
                      '--workdir that can be written to') from error
    if not os.access(self.name, os.W_OK | os.X_OK):
      raise UserError(f'the run directory {self.name} is not writable; pass a --workdir that can '
                      'be written to (a copy of this one, to go on from its checkpoints or '
                      'evaluate them)')

  def refused_write(self, name: str, error: OSError | ValueError,
                    saved: bool | None = None) -> UserError:
    """A refused write of `name` (the folder itself: '') as the user's one line; a local run
    directory that is gone, removed or moved while the run wrote there, is named as such."""
    if not self.remote and not self.exists():
      return UserError(f'the run directory {self.name} was removed or moved while the run wrote '
                       'there; move it back and rerun the same command to resume, or rerun it to '
                       'start again')
    return write_failed(self.file(name) if name else self.name, error, saved)

  def check_usable(self) -> None:
    """A --workdir naming a file, a folder this user may not list (another user's), or a bucket
    this machine cannot use, is the user's one line before the first read or write, not an error
    (a traceback) of each thing it is used for."""
    if self.remote and not self._reached:
      reach(self.name)
      self._reached = True
    elif not self.remote and os.path.exists(self.name) and not os.path.isdir(self.name):
      raise UserError(f'the run directory {self.name} is a file; pass a --workdir that names a '
                      'folder')
    elif not self.remote and os.path.isdir(self.name) and not os.access(self.name,
                                                                       os.R_OK | os.X_OK):
      raise UserError(f'this user may not list the run directory {self.name} (Permission '
                      'denied); let this user read it (its owner can run chmod -R a+rX on it), '
                      'or pass a --workdir that this user can read')

  def exists(self) -> bool:
    return self.path().is_dir()

  def read_bytes(self, name: str) -> bytes | None:
    """A file's bytes, or None if there is none; one line for a file that cannot be read. Bytes:
    what a line that is not UTF-8 text means is the reader's to say."""
    try:
      return self.path(name).read_bytes()
    except FileNotFoundError:
      return None
    except OSError as error:  # A folder of that name, no permission, an I/O error.
      raise UserError(f'cannot read {self.file(name)} ({error.strerror or error}); move it out of '
                      'the run directory or restore it, then rerun the same command') from error

  def write(self, name: str, data: str | bytes) -> None:
    """Replaces the file whole: one upload to a bucket, a rename of a finished copy on a disk; a
    copy that could not be finished (a full disk) is removed, leaving the old file as it was."""
    raw = data.encode('utf-8') if isinstance(data, str) else data
    if self.remote:
      self.path(name).write_bytes(raw)
      return
    partial = self.file(f'{name}.tmp')
    try:
      with open(partial, 'wb') as f:
        f.write(raw)
      os.replace(partial, self.file(name))
    except BaseException:
      with contextlib.suppress(OSError):  # Never hides the write's own error.
        os.remove(partial)
      raise

  def append(self, name: str, data: bytes) -> None:
    """Adds to a local file in place, for a reader that follows it as it grows (TensorBoard); an
    object in a bucket cannot be appended to (write() it whole)."""
    assert not self.remote, 'a bucket object is written whole'
    with open(self.file(name), 'ab') as f:
      f.write(data)

  def checkpoint_epochs(self) -> list[int]:
    """The epochs of complete checkpoints, oldest first, from the folders alone (no manager, no
    peers): orbax's own test, as an unfinished save is a temporary folder, or on a bucket, a folder
    without its commit marker."""
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top; only when listing
    if not self.exists():  # Not there, or a file: no checkpoint to list (orbax would raise).
      return []
    return sorted(ocp.path.step.checkpoint_steps(self.path()))

  def stray_epochs(self) -> list[tuple[int, str]]:
    """(epoch, what it is) of each entry on a disk named as an epoch's checkpoint but no folder: a
    file, or a link to nothing. Orbax passes over them, then deletes one to save its epoch there.
    (A bucket has no folders: a save cut short there may list so, and is orbax's to redo.)"""
    if self.remote or not self.exists():
      return []
    return sorted((int(entry.name), 'it is a file, not a folder' if entry.exists() else
                   'it is a link to nothing') for entry in self.path().iterdir()
                  if re.fullmatch(r'0|[1-9][0-9]*', entry.name) and not entry.is_dir())


LOCK_FILE = 'run.lock'
STALE_AFTER_S = 120.0  # A Cloud Storage lock silent this long is taken over: its owner is gone.
_HELD: set['RunLock'] = set()  # The locks this process holds, for release_held_locks().


def _owner() -> str:
  return f'host {socket.gethostname()}, pid {os.getpid()}'


def this_machine() -> str | None:
  """This kernel's boot and PID namespace, where a pid names one process; None off Linux.

  A host name alone is not enough: two VMs, or two containers, may share one."""
  try:
    with open('/proc/sys/kernel/random/boot_id', encoding='ascii') as boot:
      namespace = re.sub(r'\D', '', os.readlink('/proc/self/ns/pid'))
      return f'{boot.read().strip()}-{namespace}'
  except OSError:
    return None


def _gone(holder: str) -> bool:
  """Whether a lock's owner ran on this machine and its process has ended: certain, not stale."""
  machine, pid = re.search(r'; machine ([^;\s]+)', holder), re.search(r'\bpid (\d+)', holder)
  if not (machine and pid and machine.group(1) == this_machine()):
    return False
  try:
    os.kill(int(pid.group(1)), 0)  # Signal 0: asks only whether the process exists.
  except ProcessLookupError:
    return True
  except OSError:  # PermissionError: another user's process, alive.
    pass
  return False


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

  def take(self) -> UserError | None:
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
      return self._workdir.refused_write(LOCK_FILE, error)
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
    """Whether the lock file names another run: one that took it, and may have saved since."""
    try:
      with open(self._path, encoding='utf-8', errors='backslashreplace') as lock:
        return lock.read().strip() not in ('', _owner())  # This run's own text copied back: ours.
    except OSError:  # Gone, or not a file to read: take() says what it is.
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

  def take(self) -> UserError | None:
    with user_errors(self._workdir.name):
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

  In a multi-process run one process takes it (`enabled`), and `on_every_process(ok)`, a collective
  that says whether every process got past it, stops them all when that one is refused.
  """

  def __init__(self, workdir: RunDirectory, enabled: bool = True,
               on_every_process: Callable[[bool], bool] = lambda ok: ok,
               stale_after: float = STALE_AFTER_S, warn: Callable[[str], None] = lambda _: None):
    self._workdir, self._enabled, self._on_every_process = workdir, enabled, on_every_process
    self._holder: _Flock | _ObjectLock = (_ObjectLock(workdir, stale_after, warn) if workdir.remote
                                          else _Flock(workdir, warn))
    self._releasing = threading.Lock()

  def __enter__(self) -> 'RunLock':
    refusal = self._holder.take() if self._enabled else None
    if self._enabled and refusal is None:
      _HELD.add(self)
    try:
      if not self._on_every_process(refusal is None):
        raise refusal or UserError(
            f'process 0 found the run directory {self._workdir} in use by another training run; '
            'wait for it to end or stop it, or pass another --workdir')
    except BaseException:  # A refusal, or a peer lost in the vote: no with-block to release it.
      self.release()
      raise
    return self

  def lost(self) -> bool:
    """Whether another run took over the lock this process holds."""
    return self._enabled and self._holder.lost()

  def check(self, lost: bool | None = None) -> None:
    """Stops a run whose lock another run took over, before it writes again: `lost` as every
    process agreed it (processes.agree_at_epoch_end), else as this process sees it."""
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

  def __exit__(self, *exc_info) -> None:
    self.release()

  def release(self) -> None:
    """Lets the lock go if held, once: the run's end and a thread ending the process may both ask.

    A second caller waits for the first; a signal handler interrupting a release gives up after a
    few seconds rather than wait on itself."""
    if not self._releasing.acquire(timeout=5):
      return
    try:
      if self in _HELD:
        _HELD.discard(self)
        self._holder.release()
    finally:
      self._releasing.release()


def release_held_locks() -> None:
  """Releases the run locks this process holds, before it ends at once (os._exit) and so certainly
  writes nothing more: a rerun need not wait for a lock left behind to go stale."""
  for lock in list(_HELD):
    lock.release()
