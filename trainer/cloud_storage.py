"""Cloud Storage, where a Cloud TPU user keeps a run directory (`gs://BUCKET/PATH`): its client,
and its failures (no bucket, no permission, no credentials, no answer) as the user's one line. Its
libraries load only for a `gs://` run directory."""

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from errors import UserError, causes, error_reason, first_cause

REMOTE_PREFIX = 'gs://'
CREDENTIALS_HELP = ('on a Cloud TPU or GCE VM they come with its service account; elsewhere run '
                    '`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS')
# How long the first touch of a bucket retries before the run says Cloud Storage is out of reach
# (the client's default: 120 s); the lock's later writes keep the default's patience.
REACH_TIMEOUT_S = 30.0
# What a 429 or 5xx that outlasted the retries means, and the fix.
BUSY = ('busy or failing for a while, not this machine; rerun the same command later '
        '(https://status.cloud.google.com)')


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


def _unanswered(bucket: str, error: BaseException) -> str:
  """The line for retries run out: Cloud Storage busy or failing (429, 5xx: the network is fine),
  or no answer at all (offline, no name server)."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top; only for gs://
  answer = first_cause(error, lambda cause: isinstance(
      cause, (exceptions.TooManyRequests, exceptions.ServerError)))
  if isinstance(answer, exceptions.GoogleAPICallError):
    retried = first_cause(error, lambda cause: isinstance(cause, exceptions.RetryError))
    return (f'Cloud Storage answered {bucket} with {answer.code} {error_reason(answer.message)}'
            f'{" until the retries ran out" if retried else ""}: {BUSY}')
  return (f'cannot reach Cloud Storage for {bucket} ({_unreachable_reason(error)}); check this '
          "machine's network connection, then rerun the same command")


@contextlib.contextmanager
def answers_said(url: str, doing: str) -> Iterator[None]:
  """An HTTP error that gcsfs raises once its own retries are spent (429, 5xx; a 401 where the
  credentials lapsed mid-run) as the user's one line: no OSError, it escaped every writer's."""
  from gcsfs.retry import HttpError  # pylint: disable=g-import-not-at-top; only for gs://
  try:
    yield
  except HttpError as error:
    answer = error_reason(error) or type(error).__name__
    if error.code == 401:
      raise UserError(f'Cloud Storage refused the credentials {doing} {url} ({answer}); '
                      f'{CREDENTIALS_HELP}, then rerun the same command') from error
    raise UserError(f'Cloud Storage answered {answer} {doing} {url}, again after the retries: '
                    f'{BUSY}') from error


def _not_refreshed(bucket: str, error: BaseException) -> str:
  """The line for credentials found but not refreshed: the token service out of reach (a VM's
  metadata server: a network fault), failing for now (retryable), or refusing them (expired)."""
  import requests  # pylint: disable=g-import-not-at-top; only for gs://
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  if first_cause(error, lambda cause: isinstance(
      cause, (auth.TransportError, requests.ConnectionError, requests.Timeout))):
    return _unanswered(bucket, error)
  reason = error_reason(error.args[0] if error.args else error)
  if getattr(error, 'retryable', False):
    return (f'the Google Cloud credentials to reach {bucket} could not be refreshed for now '
            f'({reason}); rerun the same command later')
  return (f'the Google Cloud credentials found could not be refreshed to reach {bucket} '
          f'({reason}): expired or revoked; {CREDENTIALS_HELP}')


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
  except (exceptions.RetryError, exceptions.TooManyRequests, exceptions.ServerError,
          auth.TransportError, requests.ConnectionError, requests.Timeout) as error:
    raise UserError(_unanswered(bucket, error)) from error
  except exceptions.NotFound as error:
    raise UserError(f'the bucket {bucket} of --workdir={workdir} does not exist; create it '
                    f'(gcloud storage buckets create {bucket} --location=REGION) or pass another '
                    '--workdir') from error
  except (exceptions.Forbidden, exceptions.Unauthorized) as error:
    raise UserError(f'no permission to use {bucket} ({error.code} {error.message}); give this '
                    'machine\'s account the Storage Object Admin role on the bucket (gcloud '
                    f'storage buckets add-iam-policy-binding {bucket} ...) or pass another '
                    '--workdir') from error
  except auth.RefreshError as error:  # ('invalid_grant: ...', {}): expired or revoked, mostly.
    raise UserError(_not_refreshed(bucket, error)) from error
  except auth.GoogleAuthError as error:
    raise UserError(f'no Google Cloud credentials to reach {bucket} ({type(error).__name__}); '
                    f'{CREDENTIALS_HELP}') from error
