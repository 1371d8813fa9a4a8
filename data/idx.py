"""MNIST from its canonical IDX `.gz` files, checksummed and parsed with NumPy alone (no TensorFlow)."""

import gzip
import hashlib
import pathlib

import numpy as np

from errors import UserError

# The files TFDS registers for MNIST, with their SHA-256 (tensorflow_datasets/url_checksums/mnist.txt).
FILES = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}
SHA256 = {
    'train-images-idx3-ubyte.gz': '440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609',
    'train-labels-idx1-ubyte.gz': '3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c',
    't10k-images-idx3-ubyte.gz': '8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6',
    't10k-labels-idx1-ubyte.gz': 'f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6',
}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049


def _read_verified(path: pathlib.Path) -> bytes:
  if not path.is_file():
    raise UserError(f'{path} is missing; put the canonical MNIST files in that folder or set '
                    '--config.data.dir to the folder that holds them')
  raw = path.read_bytes()
  digest = hashlib.sha256(raw).hexdigest()
  if digest != SHA256[path.name]:
    raise UserError(f'{path} fails its SHA-256 check (got {digest[:12]}..., expected '
                    f'{SHA256[path.name][:12]}...); download the file again')
  return gzip.decompress(raw)


def _parse(payload: bytes, magic: int, path: pathlib.Path) -> np.ndarray:
  ndim = magic & 0xFF
  header = np.frombuffer(payload, dtype='>u4', count=1 + ndim)
  if int(header[0]) != magic:
    raise UserError(f'{path} is not an IDX file of the expected kind; download the file again')
  shape = tuple(int(n) for n in header[1:])
  return np.frombuffer(payload, dtype=np.uint8, offset=4 * (1 + ndim)).reshape(shape)


def load_idx(folder: str, name: str) -> tuple[np.ndarray, np.ndarray]:
  """Returns split `name` whole: images uint8 [N, 28, 28], labels int32 [N]."""
  if not folder:
    raise UserError('data.source=idx needs the folder of MNIST .gz files; set --config.data.dir=DIR')
  root = pathlib.Path(folder).expanduser()
  if not root.is_dir():
    raise UserError(f'data folder {root} does not exist; set --config.data.dir to the folder '
                    'that holds the MNIST .gz files')
  images_name, labels_name = FILES[name]
  images = _parse(_read_verified(root / images_name), _IMAGES_MAGIC, root / images_name)
  labels = _parse(_read_verified(root / labels_name), _LABELS_MAGIC, root / labels_name)
  return images, labels.astype(np.int32)
