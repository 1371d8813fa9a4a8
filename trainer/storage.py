"""Where a run directory lives: a local folder, or a Cloud Storage bucket (`gs://BUCKET/PATH`)
that outlives a preempted VM. Cloud Storage's failures (no bucket, no permission, no credentials)
end in one line; its clients load only for a `gs://` run directory."""

import contextlib
from collections.abc import Iterator
from typing import Any

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
