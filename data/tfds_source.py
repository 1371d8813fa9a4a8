"""MNIST through tensorflow-datasets, failing in seconds (not TFDS's minutes of retries) when offline."""

import contextlib
import os
import socket
import urllib.parse
from collections.abc import Iterator, Mapping

import numpy as np
from absl import logging

from data.idx import FILES
from errors import UserError

# Where TFDS downloads MNIST from (tensorflow_datasets/image_classification/mnist.py).
DOWNLOAD_HOST = ('storage.googleapis.com', 443)

CANONICAL_FILES = tuple(name for pair in FILES.values() for name in pair)
OFFLINE_HELP = (f'to train offline, either put the four canonical files ({", ".join(CANONICAL_FILES)}) '
                'in a folder and pass --config.data.dir=FOLDER (TFDS prepares MNIST from them), or '
                'train on the copy this project carries with --config.data.source=idx (or on '
                'another copy with --config.data.dir=FOLDER as well)')


def https_proxy(environ: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
  """The (host, port) of the HTTPS proxy that downloads go through, if the environment names one."""
  url = environ.get('HTTPS_PROXY') or environ.get('https_proxy')
  if not url:
    return None
  parsed = urllib.parse.urlsplit(url if '://' in url else f'http://{url}')
  if not parsed.hostname:
    return None
  return parsed.hostname, parsed.port or (443 if parsed.scheme == 'https' else 80)


def can_reach(address: tuple[str, int] | None = None, timeout: float = 5.0) -> bool:
  """True when a TCP connection opens within the timeout to the download host, or to the proxy
  that reaches it: many company and university networks reach the internet only through one."""
  address = address or https_proxy() or DOWNLOAD_HOST
  try:
    with socket.create_connection(address, timeout=timeout):
      return True
  except OSError:
    return False


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
  previous = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(previous)


def _check_manual_dir(folder: str) -> None:
  """All four files must be there: TFDS would otherwise try to download the missing ones."""
  if not os.path.isdir(folder):
    raise UserError(f'data folder {folder} does not exist; {OFFLINE_HELP}')
  missing = [name for name in CANONICAL_FILES if not os.path.isfile(os.path.join(folder, name))]
  if missing:
    raise UserError(f'data folder {folder} lacks {", ".join(missing)}; {OFFLINE_HELP}')


def load_tfds(split: str, manual_dir: str = '', data_dir: str = '') -> tuple[np.ndarray, np.ndarray]:
  """Returns (images uint8 [N, 28, 28], labels int32 [N]) of an MNIST split prepared by TFDS."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top; heavy, only for this source

  with _quiet_absl():  # TFDS warns of a "variant folder" it only looked for; our line says what to do.
    builder = tfds.builder('mnist', data_dir=data_dir or None)
    prepared = builder.is_prepared()
  if not prepared:
    if manual_dir:
      _check_manual_dir(os.path.expanduser(manual_dir))
    if not manual_dir and not can_reach():
      raise UserError(f'MNIST is not prepared and {DOWNLOAD_HOST[0]} cannot be reached (nor a proxy '
                      'named by HTTPS_PROXY); '
                      f'{OFFLINE_HELP}')
    download_config = tfds.download.DownloadConfig(
        manual_dir=os.path.expanduser(manual_dir) if manual_dir else None)
    try:
      builder.download_and_prepare(download_config=download_config)
    except Exception as error:  # A third-party boundary: every failure here is about the data.
      reason = str(error).strip().splitlines()[0] if str(error).strip() else ''
      raise UserError(f'TFDS could not prepare MNIST ({type(error).__name__}: {reason}); '
                      f'{OFFLINE_HELP}') from error
  dataset = builder.as_dataset(split=split, batch_size=10_000, as_supervised=True,
                               shuffle_files=False)
  image_batches, label_batches = zip(*tfds.as_numpy(dataset))
  images = np.concatenate(image_batches).reshape(-1, 28, 28).astype(np.uint8)
  return images, np.concatenate(label_batches).astype(np.int32)
