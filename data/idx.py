"""MNIST from its IDX files, verified by content and parsed with NumPy alone (no TensorFlow).

Any faithful copy passes: the `.gz` files TFDS downloads, a re-gzipped copy, or the uncompressed
files torchvision keeps in `MNIST/raw/` or Kaggle serves, because the check is the SHA-256 of the
decompressed IDX bytes, the checksum MNIST publishes for its uncompressed files.
"""

import gzip
import hashlib
import pathlib
import zlib

import numpy as np

from errors import During, UserError

# MNIST's files by split, named as MNIST and TFDS name them (TFDS downloads the `.gz` form).
FILES = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}
# SHA-256 of each file's decompressed IDX bytes.
IDX_SHA256 = {
    'train-images-idx3-ubyte': 'ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db',
    'train-labels-idx1-ubyte': '65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5',
    't10k-images-idx3-ubyte': '0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7',
    't10k-labels-idx1-ubyte': 'ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2',
}
# The copy of all four files that this project carries: the default when no folder is given.
CARRIED = pathlib.Path(__file__).resolve().parent / 'mnist'
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049


def candidates(folder: pathlib.Path, gz_name: str) -> list[pathlib.Path]:
  """Where a file may be: gzipped, uncompressed, or uncompressed under Kaggle's dotted name."""
  stem = gz_name.removesuffix('.gz')
  kaggle = stem.replace('-idx', '.idx')  # train-images.idx3-ubyte
  return [folder / gz_name, folder / stem, folder / kaggle]


def _read_verified(folder: pathlib.Path, gz_name: str) -> bytes:
  """The decompressed bytes of the first copy found, once their SHA-256 is MNIST's."""
  found = [path for path in candidates(folder, gz_name) if path.is_file()]
  if not found:
    odd = [path for path in candidates(folder, gz_name) if path.exists()]  # A folder, say.
    what = f'{odd[0]} is not a file' if odd else (f'{folder / gz_name} is missing (nor is it '
                                                  'there uncompressed)')
    raise UserError(f'{what}; put MNIST\'s four files in that folder or set --config.data.dir to '
                    'the folder that holds them')
  path, stem = found[0], gz_name.removesuffix('.gz')
  raw = path.read_bytes()
  try:
    payload = gzip.decompress(raw) if raw[:2] == b'\x1f\x8b' else raw
  except (OSError, EOFError, zlib.error) as error:
    raise UserError(f'{path} is not a whole gzip file ({error}); download it again') from error
  digest = hashlib.sha256(payload).hexdigest()
  if digest != IDX_SHA256[stem]:
    raise UserError(f'{path} is not MNIST\'s {stem} (the SHA-256 of its contents is '
                    f'{digest[:12]}..., expected {IDX_SHA256[stem][:12]}...); download it again')
  return payload


def _parse(payload: bytes, magic: int) -> np.ndarray:
  """An IDX array of unsigned bytes: the magic number, one size per dimension, then the data."""
  ndim = magic & 0xFF
  shape = tuple(int(n) for n in np.frombuffer(payload, dtype='>u4', count=1 + ndim)[1:])
  return np.frombuffer(payload, dtype=np.uint8, offset=4 * (1 + ndim)).reshape(shape)


def data_folder(folder: str) -> pathlib.Path:
  """The folder data.dir names, for either source: '' is the carried copy, so no run downloads."""
  return pathlib.Path(folder).expanduser() if folder else CARRIED


def load_idx(folder: str, name: str) -> tuple[np.ndarray, np.ndarray]:
  """Split `name` whole: images uint8 [N, 28, 28], labels int32 [N]; '' reads the carried copy."""
  root = data_folder(folder)
  images_name, labels_name = FILES[name]
  with During('loading data', str(root)):  # No permission to read, or a disk fault.
    check_folder(root, 'set --config.data.dir to the folder that holds the MNIST files')
    images = _parse(_read_verified(root, images_name), _IMAGES_MAGIC)
    labels = _parse(_read_verified(root, labels_name), _LABELS_MAGIC)
  return images, labels.astype(np.int32)


def check_folder(root: pathlib.Path, fix: str) -> None:
  """data.dir must name a folder, for either source: a file there is not one that is missing."""
  if not root.is_dir():
    raise UserError(f'data folder {root} {"is a file" if root.exists() else "does not exist"}; '
                    f'{fix}')

