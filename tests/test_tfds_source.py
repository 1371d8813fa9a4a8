"""The TFDS source's real code path offline (carried files, mock data) and its one-line errors."""

import errno
import gzip
import os
import re
import pathlib
import socket
import time

import numpy as np
import pytest

from data import tfds_source
from data.mnist import Examples, load_split, load_splits
from trainer.plan import resolve
from trainer import loop
from trainer.host.run_dir import RunDirectory
from errors import UserError
from tests.conftest import (TENSORFLOW_LOGS_AT_IMPORT, line_of, make_config, override_flags,
                            run_train)

# The TFDS extra, which make test installs wherever TensorFlow has wheels (not yet Python 3.14).
tfds = pytest.importorskip('tensorflow_datasets', reason='the TFDS extra is not installed: '
                           'TensorFlow has no wheels for this Python')


def tfds_config(tmp_path, **overrides):
  return make_config(**{'data__source': 'tfds', 'data__dir': '',
                        'data__tfds_data_dir': str(tmp_path / 'tfds'), **overrides})


@pytest.fixture
def no_network(monkeypatch):
  """As in CI, no connection can open: each attempt fails, and is recorded for the test to see."""
  attempts = []

  def refuse(*args, **kwargs):
    attempts.append(args)
    raise OSError('the network is unreachable (blocked by the test)')
  for name in ('connect', 'connect_ex'):
    monkeypatch.setattr(socket.socket, name, refuse)
  monkeypatch.setattr(socket, 'create_connection', refuse)
  monkeypatch.setattr(socket, 'getaddrinfo', refuse)
  return attempts


def rows(examples: Examples) -> list[bytes]:
  """The examples as a sorted list of image-and-label rows: the same list for the same examples."""
  labelled = np.column_stack([examples.images, examples.labels.astype(np.uint8)])
  return sorted(map(bytes, labelled))


@pytest.mark.slow
def test_tfds_prepares_the_carried_files_offline_the_idx_examples_and_trains(tmp_path, no_network):
  config = tfds_config(tmp_path, num_epochs=1, batch_size=50, data__train_split='train[:2000]',
                       data__eval_split='test')
  from_tfds = load_splits(config.data, 'train', 'test')  # Prepares into the empty tfds_data_dir.
  assert tfds.builder('mnist', data_dir=str(tmp_path / 'tfds')).is_prepared()
  from_idx = load_splits(make_config(data__dir='').data, 'train', 'test')
  for ours, theirs in zip(from_tfds, from_idx, strict=True):
    assert not np.array_equal(ours.labels, theirs.labels)  # TFDS's own order, as the README says,
    assert rows(ours) == rows(theirs)  # of the very same examples.
  record = loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path / 'run'))
  assert record['epoch'] == 1 and record['eval_accuracy'] > 0.5, record  # Chance: 0.1.
  assert no_network == [], no_network
  by_hand = run_train('--config=configs/quick.py', f'--workdir={tmp_path / "by_hand"}',
                      *override_flags(data__source='tfds', data__dir='', num_epochs=1,
                                      data__tfds_data_dir=str(tmp_path / 'tfds')),
                      env=TENSORFLOW_LOGS_AT_IMPORT)
  assert by_hand.returncode == 0 and by_hand.stderr == '', by_hand.stderr  # Not TensorFlow's notes.


def test_a_copy_that_is_not_byte_for_byte_canonical_is_refused_in_one_line(tmp_path, mnist_dir):
  folder = tmp_path / 'regzipped'  # MNIST's exact contents in another gzip header, as once carried.
  folder.mkdir()
  for f in mnist_dir.glob('*.gz'):
    (folder / f.name).write_bytes(f.read_bytes())
  labels = folder / 'train-labels-idx1-ubyte.gz'
  labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes()), mtime=0))
  said = line_of(lambda: load_split(tfds_config(tmp_path, data__dir=str(folder)).data, 'train'))
  assert re.search(r'^TFDS could not prepare MNIST from \S+ \(NonMatchingChecksumError: .*'
                   r'--config\.data\.source=idx reads', said), said


def test_tfds_split_loads_as_uint8_images_and_int_labels(tmp_path):
  with tfds.testing.mock_data(num_examples=300):
    examples = load_split(tfds_config(tmp_path).data, 'train')
  assert examples.images.shape == (300, 784) and examples.images.dtype == np.uint8
  assert examples.labels.shape == (300,) and examples.labels.dtype == np.int32
  assert examples.labels.min() >= 0 and examples.labels.max() <= 9


def test_manual_dir_that_does_not_exist_is_named(tmp_path):
  config = tfds_config(tmp_path, data__dir=str(tmp_path / 'nowhere'))
  with pytest.raises(UserError, match='nowhere does not exist'):
    load_split(config.data, 'train')


def test_manual_dir_missing_files_is_named_before_tfds_tries_to_download_them(tmp_path, mnist_dir):
  folder = tmp_path / 'manual'
  folder.mkdir()
  for f in mnist_dir.glob('t10k-*'):
    (folder / f.name).write_bytes(f.read_bytes())
  config = tfds_config(tmp_path, data__dir=str(folder))
  start = time.monotonic()
  with pytest.raises(UserError,
                     match='lacks train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz;'):
    load_split(config.data, 'train')
  assert time.monotonic() - start < 10


def test_tfds_is_given_the_parsed_range_in_its_own_syntax(tmp_path, monkeypatch):
  asked = []
  monkeypatch.setattr(tfds_source, 'load_tfds', lambda spec, **_: asked.append(spec) or (
      np.zeros((1, 28, 28), np.uint8), np.zeros(1, np.int32)))
  load_split(tfds_config(tmp_path).data, ' train [ 10% : -100 ] ')
  assert asked == ['train[6000:59900]']  # Spaces are fine here, but TFDS's parser rejects them.


def test_a_data_folder_that_cannot_be_searched_is_named_in_one_line(tmp_path, monkeypatch):
  folder = tmp_path / 'locked'
  folder.mkdir()
  is_file = pathlib.Path.is_file

  def as_the_os_would(path):  # Root searches any folder (CI runs as root): the OS's own error.
    if path.parent == folder:
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return is_file(path)

  monkeypatch.setattr(pathlib.Path, 'is_file', as_the_os_would)
  config = tfds_config(tmp_path, data__dir=str(folder))
  assert re.search(r'/locked/\S+ cannot be read \(Permission denied\); give this user read '
                   'access', line_of(lambda: load_split(config.data, 'train')))
