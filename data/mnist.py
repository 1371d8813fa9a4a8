"""One entry to MNIST: a config's data section in, host arrays of the train and eval splits out."""

import dataclasses

import ml_collections
import numpy as np

from data import idx
from data.splits import parse_split

SOURCES = ('idx', 'tfds')


@dataclasses.dataclass(frozen=True)
class Examples:
  """A split in memory: images uint8 [N, 784] (raw pixels, 47 MB for all of MNIST), labels int32."""
  images: np.ndarray
  labels: np.ndarray

  def __len__(self) -> int:
    return int(self.labels.shape[0])


def load_splits(data_config: ml_collections.ConfigDict, *specs: str) -> tuple[Examples, ...]:
  """Each split (TFDS slice syntax) from the configured source; each IDX file read, checked once."""
  splits = [parse_split(spec) for spec in specs]
  if data_config.source == 'tfds':
    # pylint: disable-next=g-import-not-at-top; keeps TensorFlow off the idx path
    from data import tfds_source
    # The parsed range, written the way TFDS's own parser accepts it.
    loaded: list[tuple[np.ndarray, ...]] = [tfds_source.load_tfds(
        f'{s.name}[{s.start}:{s.stop}]', manual_dir=data_config.dir,
        data_dir=data_config.tfds_data_dir) for s in splits]
  else:
    whole = {name: idx.load_idx(data_config.dir, name) for name in {s.name for s in splits}}
    loaded = [tuple(array[s.start:s.stop] for array in whole[s.name]) for s in splits]
  return tuple(Examples(np.ascontiguousarray(images.reshape(len(labels), -1)), labels)
               for images, labels in loaded)


def load_split(data_config: ml_collections.ConfigDict, spec: str) -> Examples:
  """One split (TFDS slice syntax) from the configured source."""
  return load_splits(data_config, spec)[0]
