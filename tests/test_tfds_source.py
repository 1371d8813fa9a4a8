"""The TFDS source: its real code path under tfds.testing.mock_data, and the fast offline failure."""

import socket
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from data import tfds_source
from data.mnist import load_split
from trainer import loop
from errors import UserError
from tests.conftest import make_config


def tfds_config(tmp_path, **overrides):
  return make_config(**{'data__source': 'tfds', 'data__dir': '',
                        'data__tfds_data_dir': str(tmp_path / 'tfds'), **overrides})


def test_tfds_split_loads_as_uint8_images_and_int_labels(tmp_path, monkeypatch):
  monkeypatch.setattr(tfds_source, 'can_reach', lambda *a, **k: True)
  with tfds.testing.mock_data(num_examples=300):
    examples = load_split(tfds_config(tmp_path).data, 'train')
  assert examples.images.shape == (300, 784) and examples.images.dtype == np.uint8
  assert examples.labels.shape == (300,) and examples.labels.dtype == np.int32
  assert examples.labels.min() >= 0 and examples.labels.max() <= 9


@pytest.mark.slow
def test_training_runs_end_to_end_on_the_tfds_path(tmp_path, monkeypatch):
  monkeypatch.setattr(tfds_source, 'can_reach', lambda *a, **k: True)
  config = tfds_config(tmp_path, num_epochs=2, batch_size=50, data__train_split='train',
                       data__eval_split='test')
  with tfds.testing.mock_data(num_examples=200):
    record = loop.train_and_evaluate(config, str(tmp_path / 'run'))
  assert record['epoch'] == 2
  assert np.isfinite(record['train_loss']) and 0.0 <= record['eval_accuracy'] <= 1.0


def test_offline_without_files_fails_in_seconds_naming_both_options(tmp_path, monkeypatch):
  monkeypatch.setattr(tfds_source, 'can_reach', lambda *a, **k: False)
  start = time.monotonic()
  with pytest.raises(UserError) as error:
    load_split(tfds_config(tmp_path).data, 'train')
  assert time.monotonic() - start < 10
  message = str(error.value)
  assert 'cannot be reached' in message
  assert '--config.data.dir=FOLDER' in message and '--config.data.source=idx' in message


def test_unreachable_host_is_detected_quickly():
  start = time.monotonic()
  assert not tfds_source.can_reach(('127.0.0.1', 9), timeout=2.0)  # Nothing listens on port 9.
  assert time.monotonic() - start < 5


@pytest.mark.parametrize('variable', ['HTTPS_PROXY', 'https_proxy'])
def test_behind_an_https_proxy_the_proxy_is_probed_not_the_download_host(variable, monkeypatch):
  for name in ('HTTPS_PROXY', 'https_proxy'):
    monkeypatch.delenv(name, raising=False)
  assert tfds_source.https_proxy() is None
  monkeypatch.setenv(variable, 'http://proxy.example.com:3128')
  assert tfds_source.https_proxy() == ('proxy.example.com', 3128)
  with socket.socket() as listener:  # A proxy that accepts connections, on this machine.
    listener.bind(('127.0.0.1', 0))
    listener.listen()
    monkeypatch.setenv(variable, f'127.0.0.1:{listener.getsockname()[1]}')
    assert tfds_source.can_reach(timeout=2.0)
  monkeypatch.setenv(variable, 'http://127.0.0.1:9')  # Nothing listens on port 9.
  assert not tfds_source.can_reach(timeout=2.0)


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
  with pytest.raises(UserError, match='lacks train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz;'):
    load_split(config.data, 'train')
  assert time.monotonic() - start < 10


def test_tfds_is_given_the_parsed_range_in_its_own_syntax(tmp_path, monkeypatch):
  asked = []
  monkeypatch.setattr(tfds_source, 'load_tfds', lambda spec, **_: asked.append(spec) or (
      np.zeros((1, 28, 28), np.uint8), np.zeros(1, np.int32)))
  load_split(tfds_config(tmp_path).data, ' train [ 10% : -100 ] ')
  assert asked == ['train[6000:59900]']  # Spaces are fine here, but TFDS's parser rejects them.
