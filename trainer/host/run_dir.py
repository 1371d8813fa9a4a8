"""A run directory, a local folder or a Cloud Storage bucket (`gs://BUCKET/PATH`, which outlives a
preempted VM), and the one owner of its files."""

import contextlib
import os
import re
import sys

from etils import epath

from errors import During, UserError
from trainer.host.cloud_storage import REMOTE_PREFIX, reach

URL_SCHEME = re.compile(r'([A-Za-z][A-Za-z0-9+.-]*)://')  # s3://, https://: no run directory here.
STALE_AFTER_S = 120.0  # A Cloud Storage lock silent this long is taken over: its owner is gone.


def named_alike_in_utf8(path: str) -> bool:
  """Whether the OS gets the same bytes for `path` from Python (the locale's encoding) as from
  tensorstore (always UTF-8), which writes the checkpoints' arrays: under a Latin-1 locale a
  non-ASCII name is two folders, under an ASCII one tensorstore cannot name it at all."""
  with contextlib.suppress(UnicodeEncodeError):  # Bytes the locale could not decode, kept as
    return path.encode('utf-8') == os.fsencode(path)  # surrogates.
  return False


def _remove_if_there(path: str) -> None:
  with contextlib.suppress(OSError):
    os.remove(path)


class RunDirectory:
  """The one owner of a run directory's files, on a disk or in a bucket: the modules that write
  there ask it. A file is written whole (object stores cannot append): a reader sees the old
  version or the new one, never half."""

  def __init__(self, workdir: str | os.PathLike, lock_stale_after: float = STALE_AFTER_S):
    workdir = os.fspath(workdir)
    self.lock_stale_after = lock_stale_after  # On a bucket: a silent lock is taken over after it.
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
    with During('creating the run directory', self.name):
      os.makedirs(self.name, exist_ok=True)
    if not os.access(self.name, os.W_OK | os.X_OK):
      raise UserError(f'the run directory {self.name} is not writable; pass a --workdir that can '
                      'be written to (a copy of this one, to go on from its checkpoints or '
                      'evaluate them)')

  def check_usable(self) -> None:
    """A --workdir naming a file, a folder this user may not list (another user's), or a bucket
    this machine cannot use, is the user's one line before the first read or write, not an error
    (a traceback) of each thing it is used for."""
    if self.remote and not self._reached:
      with During('reaching', self.name):
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

  def during(self, doing: str, name: str = '') -> During:
    """Marks a fault met on the file `name` (the folder itself: '') with what was being done."""
    return During(doing, self.file(name) if name else self.name,
                  '' if self.remote else self.name)

  def exists(self) -> bool:
    return self.path().is_dir()

  def read_bytes(self, name: str) -> bytes | None:
    """A file's bytes, or None if there is none; one line for a file that cannot be read. Bytes:
    what a line that is not UTF-8 text means is the reader's to say."""
    with self.during('reading', name), contextlib.suppress(FileNotFoundError):
      return self.path(name).read_bytes()
    return None

  def write(self, name: str, data: str | bytes) -> None:
    """Replaces the file whole: one upload to a bucket, a rename of a finished copy on a disk; a
    copy that could not be finished (a full disk) is removed, leaving the old file as it was."""
    raw = data.encode('utf-8') if isinstance(data, str) else data
    with self.during('writing', name):
      if self.remote:
        self.path(name).write_bytes(raw)
        return
      partial = self.file(f'{name}.tmp')
      with contextlib.ExitStack() as on_failure:
        on_failure.callback(_remove_if_there, partial)  # Never hides the write's own error.
        with open(partial, 'wb') as f:
          f.write(raw)
        os.replace(partial, self.file(name))
        on_failure.pop_all()

  def append(self, name: str, data: bytes) -> None:
    """Adds to a local file in place, for a reader that follows it as it grows (TensorBoard); an
    object in a bucket cannot be appended to (write() it whole)."""
    assert not self.remote, 'a bucket object is written whole'
    with self.during('writing', name), open(self.file(name), 'ab') as f:
      f.write(data)

  def checkpoint_epochs(self) -> list[int]:
    """The epochs of complete checkpoints, oldest first, from the folders alone (no manager, no
    peers): orbax's own test, as an unfinished save is a temporary folder, or on a bucket, a folder
    without its commit marker."""
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top; only when listing
    with During('listing', self.file(''), '' if self.remote else self.name):
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
