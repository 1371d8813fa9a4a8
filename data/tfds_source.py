"""MNIST through tensorflow-datasets, prepared from MNIST's files on disk: TFDS never downloads."""

import pathlib
import types
from typing import Any

import numpy as np
from absl import logging

from data.idx import FILES, check_folder, data_folder
from errors import During, ExtraMissing, UserError
from native_logs import TENSORFLOW_EXTRA, import_tensorflow_quietly

CANONICAL_FILES = tuple(name for pair in FILES.values() for name in pair)
FILES_HELP = (f'TFDS prepares MNIST from its four canonical files ({", ".join(CANONICAL_FILES)}): '
              "set --config.data.dir to a folder of them, or to '' for the copy this project "
              'carries; --config.data.source=idx reads any faithful copy, gzipped or not')


class _QuietAbsl:
  """absl's logs at errors alone while entered: TFDS's notes are no line of ours."""

  def __enter__(self) -> None:
    self._previous = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)

  def __exit__(self, *exc_info: Any) -> None:
    logging.set_verbosity(self._previous)


def _check_folder(folder: pathlib.Path) -> None:
  """All four files must be there: TFDS would otherwise try to download the missing ones."""
  with During('loading data', str(folder)):  # No permission to read, or a disk fault.
    check_folder(folder, FILES_HELP)
    missing = [name for name in CANONICAL_FILES if not (folder / name).is_file()]
  if missing:
    raise UserError(f'data folder {folder} lacks {", ".join(missing)}; {FILES_HELP}')


def _prepare(tfds: types.ModuleType, builder: Any, folder: pathlib.Path) -> None:
  """TFDS takes each file from manual_dir if its checksum is the registered one, else refuses it."""
  _check_folder(folder)
  download_config = tfds.download.DownloadConfig(manual_dir=str(folder), try_download_gcs=False)
  with During('preparing MNIST', str(folder)):  # Any failure here is about the data: one line.
    builder.download_and_prepare(download_config=download_config)


def load_tfds(split: str, manual_dir: str = '',
              data_dir: str = '') -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, 28, 28], labels int32 [N]) of a split that TFDS prepares from manual_dir."""
  try:
    import_tensorflow_quietly()  # Here, not where TFDS would: in the middle of loading.
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top; heavy, this source only
  except ImportError as error:
    raise ExtraMissing('data.source=tfds', 'TensorFlow and TensorFlow Datasets', TENSORFLOW_EXTRA,
                       'read the same files with --config.data.source=idx') from error

  with _QuietAbsl():  # TFDS warns of a "variant folder" it only looked for; our line says the fix.
    builder = tfds.builder('mnist', data_dir=data_dir or None)
    prepared = builder.is_prepared()
  if not prepared:
    _prepare(tfds, builder, data_folder(manual_dir))
  dataset = builder.as_dataset(split=split, batch_size=10_000, as_supervised=True,
                               shuffle_files=False)
  image_batches, label_batches = zip(*tfds.as_numpy(dataset))
  images = np.concatenate(image_batches).reshape(-1, 28, 28).astype(np.uint8)
  return images, np.concatenate(label_batches).astype(np.int32)
