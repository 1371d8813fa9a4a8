"""One entry to MNIST: a config's data section in, host arrays of the train and eval splits out."""

import dataclasses

import ml_collections
import numpy as np

from data import idx
from data.splits import parse_split

SOURCES = ('tfds', 'idx')


@dataclasses.dataclass(frozen=True)
class Examples:
  """A split in memory: images uint8 [N, 784] (raw pixels, 47 MB for all of MNIST), labels int32 [N]."""
  images: np.ndarray
  labels: np.ndarray

  def __len__(self) -> int:
    return int(self.labels.shape[0])


def load_split(data_config: ml_collections.ConfigDict, spec: str) -> Examples:
  """Loads one split (TFDS slice syntax) from the configured source."""
  split = parse_split(spec)
  if data_config.source == 'idx':
    images, labels = idx.load_idx(data_config.dir, split)
  else:
    from data import tfds_source  # pylint: disable=g-import-not-at-top; keeps TensorFlow off the idx path
    # The parsed range, written the way TFDS's own parser accepts it.
    images, labels = tfds_source.load_tfds(f'{split.name}[{split.start}:{split.stop}]',
                                           manual_dir=data_config.dir,
                                           data_dir=data_config.get('tfds_data_dir', ''))
  return Examples(images=np.ascontiguousarray(images.reshape(len(labels), -1)), labels=labels)
