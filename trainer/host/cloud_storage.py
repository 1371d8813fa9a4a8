"""Cloud Storage, where a Cloud TPU user keeps a run directory (`gs://BUCKET/PATH`): its client.
Its failures (no bucket, no permission, no credentials, no answer) are worded in
trainer/host/faults.py.
Its libraries load only for a `gs://` run directory."""

import logging
from typing import Any

from errors import kinds_of

REMOTE_PREFIX = 'gs://'
# How long the first touch of a bucket retries before the run says Cloud Storage is out of reach
# (the client's default: 120 s); the lock's later writes keep the default's patience.
REACH_TIMEOUT_S = 30.0


def failures() -> tuple[type[BaseException], ...]:
  """What a request to a run directory raises when the disk, the network or Cloud Storage fails
  for a while: OSError (requests' errors among them), and the errors of Cloud Storage's libraries
  where they are imported (a local run directory imports none)."""
  return (OSError, *kinds_of('google.api_core.exceptions', 'GoogleAPIError'),
          *kinds_of('google.auth.exceptions', 'GoogleAuthError'),
          *kinds_of('gcsfs.retry', 'HttpError'))


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
  listed = client().list_blobs(bucket, prefix=prefix, max_results=1, timeout=REACH_TIMEOUT_S,
                               retry=DEFAULT_RETRY.with_timeout(REACH_TIMEOUT_S))
  next(iter(listed), None)
