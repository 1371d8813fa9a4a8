"""Where a run directory lives: a local folder, or a Cloud Storage bucket (`gs://BUCKET/PATH`)
that outlives a preempted VM. Cloud Storage's failures (no bucket, no permission, no credentials)
end in one line; its clients load only for a `gs://` run directory."""

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from etils import epath

from errors import UserError

REMOTE_PREFIX = 'gs://'
CREDENTIALS_HELP = ('on a Cloud TPU or GCE VM they come with its service account; elsewhere run '
                    '`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS')


def is_remote(path: str) -> bool:
  return path.startswith(REMOTE_PREFIX)


def blob(url: str) -> Any:
  """The Cloud Storage object at a `gs://` URL, from the client whose writes take preconditions."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top; only for gs://
  bucket, _, name = url[len(REMOTE_PREFIX):].partition('/')
  return storage.Client().bucket(bucket).blob(name)


@contextlib.contextmanager
def user_errors(workdir: str) -> Iterator[None]:
  """Cloud Storage's refusals as the one line a user acts on, naming the bucket and the fix."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top; only for gs://
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  bucket = f'{REMOTE_PREFIX}{workdir[len(REMOTE_PREFIX):].split("/", 1)[0]}'
  try:
    yield
  except exceptions.NotFound as error:
    raise UserError(f'the bucket {bucket} of --workdir={workdir} does not exist; create it '
                    f'(gcloud storage buckets create {bucket} --location=REGION) or pass another '
                    '--workdir') from error
  except (exceptions.Forbidden, exceptions.Unauthorized) as error:
    raise UserError(f'no permission to use {bucket} ({error.code} {error.message}); give this '
                    'machine\'s account the Storage Object Admin role on the bucket (gcloud storage '
                    f'buckets add-iam-policy-binding {bucket} ...) or pass another --workdir'
                    ) from error
  except auth.GoogleAuthError as error:
    raise UserError(f'no Google Cloud credentials to reach {bucket} ({type(error).__name__}); '
                    f'{CREDENTIALS_HELP}') from error


class RunDirectory:
  """The one owner of a run directory's files, on a disk or in a bucket: the modules that write
  there ask it. A file is written whole (object stores cannot append): a reader sees the old
  version or the new one, never half."""

  def __init__(self, workdir: str):
    self.name = workdir.rstrip('/') if is_remote(workdir) else os.path.abspath(workdir)
    self.remote = is_remote(workdir)

  def __str__(self) -> str:
    return self.name

  def file(self, name: str) -> str:
    return f'{self.name}/{name}'

  def path(self, name: str = '') -> epath.Path:
    return epath.Path(self.file(name) if name else self.name)

  def make(self) -> None:
    """A local directory is made and checked writable; a bucket's prefix needs no making."""
    if self.remote:
      return
    try:
      os.makedirs(self.name, exist_ok=True)
    except OSError as error:
      raise UserError(f'cannot create the run directory {self.name} ({error.strerror}); pass a '
                      '--workdir that can be written to') from error
    if not os.access(self.name, os.W_OK | os.X_OK):
      raise UserError(f'the run directory {self.name} is not writable; pass a --workdir that can '
                      'be written to')

  def exists(self) -> bool:
    return self.path().is_dir()

  def read(self, name: str) -> str | None:
    """A file's text, or None if there is none."""
    try:
      return self.path(name).read_text(encoding='utf-8')
    except FileNotFoundError:
      return None

  def write(self, name: str, data: str | bytes) -> None:
    """Replaces the file whole: one upload to a bucket, a rename of a finished copy on a disk."""
    raw = data.encode('utf-8') if isinstance(data, str) else data
    if self.remote:
      self.path(name).write_bytes(raw)
      return
    partial = self.file(f'{name}.tmp')
    with open(partial, 'wb') as f:
      f.write(raw)
    os.replace(partial, self.file(name))

  def glob(self, pattern: str) -> list[str]:
    return sorted(str(p) for p in self.path().glob(pattern))
