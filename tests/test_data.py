"""The data layer: split syntax, checksummed IDX reading, and the on-device batch plan."""

import errno
import gzip
import os
import re
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlp import augment
from mlp import randomness
from mlp import batches
from data import idx
from data.idx import load_idx
from data.mnist import load_splits
from data.splits import parse_split
from errors import UserError
from configs import best, committee, default, quick
from tests.conftest import ROOT, line_of, make_config


@pytest.mark.parametrize('spec, expected', [
    ('test', ('test', 0, 10_000)),
    ('test[:8000]', ('test', 0, 8000)),
    ('test[8000:]', ('test', 8000, 10_000)),
    ('train[10%:20%]', ('train', 6000, 12_000)),
    ('test[-500:]', ('test', 9500, 10_000)),
])
def test_split_syntax_resolves_to_example_ranges(spec, expected):
  split = parse_split(spec)
  assert (split.name, split.start, split.stop) == expected


@pytest.mark.parametrize('spec, problem_and_fix', [
    ('validation', r"MNIST has no split 'validation'; use one of test, train"),
    ('test[a:b]', r"bound 'a' is not an integer or a percentage; write it like test\[:8000\]"),
    ('test[5000:100]', r'selects no examples; pick a range with start < stop'),
    ('test[:8000', r'is not TFDS split syntax; write it like test, test\[:8000\]')])
def test_bad_split_names_the_fix(spec, problem_and_fix):
  with pytest.raises(UserError, match=problem_and_fix):
    parse_split(spec)


def test_idx_reads_the_real_test_set(mnist_dir):
  images, labels = load_idx(str(mnist_dir), 'test')
  assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
  assert labels.dtype == np.int32
  # The published class counts of the MNIST test set.
  assert np.bincount(labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_two_ranges_of_one_idx_split_read_and_check_its_files_once(mnist_dir, monkeypatch):
  read = []
  verified = idx._read_verified  # pylint: disable=protected-access
  monkeypatch.setattr(idx, '_read_verified', lambda folder, name: read.append(name) or verified(
      folder, name))
  head, tail = load_splits(make_config().data, 'test[:8000]', 'test[8000:]')
  assert sorted(read) == ['t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz']
  images, labels = load_idx(str(mnist_dir), 'test')
  np.testing.assert_array_equal(head.images, images[:8000].reshape(8000, 784))
  np.testing.assert_array_equal(tail.images, images[8000:].reshape(2000, 784))
  np.testing.assert_array_equal(np.concatenate([head.labels, tail.labels]), labels)


def test_the_carried_training_set_is_mnists_and_is_the_default(mnist_dir):
  images, labels = load_idx('', 'train')  # '' reads the copy the project carries.
  assert images.shape == (60_000, 28, 28) and images.dtype == np.uint8
  # The published class counts of the MNIST training set.
  assert np.bincount(labels).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851,
                                          5949]
  assert idx.CARRIED == mnist_dir
  assert default.get_config().data.source == 'idx' and default.get_config().data.dir == ''


def _copy_as(mnist_dir, folder, rename=lambda name: name, transform=lambda payload: payload):
  """MNIST's four files in `folder`, decompressed, transformed and saved under new names."""
  folder.mkdir()
  for source in mnist_dir.glob('*.gz'):
    payload = transform(gzip.decompress(source.read_bytes()))
    (folder / rename(source.name.removesuffix('.gz'))).write_bytes(payload)
  return folder


@pytest.mark.parametrize('form', ['uncompressed (torchvision)', 'dotted names (Kaggle)',
                                  're-gzipped'])
def test_any_faithful_copy_of_mnist_loads_the_same(form, mnist_dir, tmp_path):
  rename, transform = {
      'uncompressed (torchvision)': (lambda n: n, lambda p: p),
      'dotted names (Kaggle)': (lambda n: n.replace('-idx', '.idx'), lambda p: p),
      're-gzipped': (lambda n: n + '.gz', lambda p: gzip.compress(p, compresslevel=1, mtime=1)),
  }[form]
  folder = _copy_as(mnist_dir, tmp_path / 'copy', rename, transform)
  for split in ('train', 'test'):
    for got, expected in zip(load_idx(str(folder), split), load_idx(str(mnist_dir), split)):
      np.testing.assert_array_equal(got, expected)


def _flip_one_label(payload: bytes) -> bytes:
  payload = bytearray(payload)
  if len(payload) < 100_000:  # The labels file.
    payload[100] = (payload[100] + 1) % 10
  return bytes(payload)


def test_a_damaged_or_missing_file_is_refused_naming_it(mnist_dir, tmp_path):
  altered = _copy_as(mnist_dir, tmp_path / 'altered', transform=_flip_one_label)
  with pytest.raises(UserError, match=r'altered/t10k-labels-idx1-ubyte is not MNIST\'s '
                     r't10k-labels-idx1-ubyte \(the SHA-256 of its contents is '
                     r'.*download it again'):
    load_idx(str(altered), 'test')
  truncated = tmp_path / 'truncated'
  truncated.mkdir()
  for f in mnist_dir.glob('t10k-*'):
    (truncated / f.name).write_bytes(f.read_bytes()[:-1000])
  with pytest.raises(UserError, match='t10k-images-idx3-ubyte.gz is not a whole gzip file'):
    load_idx(str(truncated), 'test')
  (truncated / 't10k-images-idx3-ubyte.gz').unlink()
  with pytest.raises(UserError, match='t10k-images-idx3-ubyte.gz is missing'):
    load_idx(str(truncated), 'test')
  (truncated / 't10k-images-idx3-ubyte.gz').mkdir()  # Where the file should be, not a file.
  with pytest.raises(UserError, match='t10k-images-idx3-ubyte.gz is not a file; put MNIST'):
    load_idx(str(truncated), 'test')
  with pytest.raises(UserError, match=f'data folder {mnist_dir / "README.md"} is a file; set '):
    load_idx(str(mnist_dir / 'README.md'), 'test')


def test_an_unreadable_file_is_refused_naming_it_and_the_fix(mnist_dir, tmp_path, monkeypatch):
  folder = _copy_as(mnist_dir, tmp_path / 'locked')
  locked, opener = folder / 't10k-labels-idx1-ubyte', pathlib.Path.open

  def open_as_the_os_would(path, *args, **kwargs):
    if path == locked:  # The OS's own error for a file without read permission.
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return opener(path, *args, **kwargs)

  if os.geteuid():
    locked.chmod(0)
  else:  # Root reads any file whatever its permissions (CI runs as root).
    monkeypatch.setattr(pathlib.Path, 'open', open_as_the_os_would)
  assert re.match(r'\S*/locked/t10k-labels-idx1-ubyte cannot be read \(Permission denied\); give '
                  'this user read access', line_of(lambda: load_idx(str(folder), 'test')))
  assert load_idx(str(folder), 'train')[0].shape == (60_000, 28, 28)  # Its other files still read.


def test_idx_path_does_not_import_tensorflow(mnist_dir):
  code = ('import sys; from data.mnist import load_split; from tests.conftest import make_config; '
          'load_split(make_config().data, "test[:10]"); import trainer.loop, trainer.evaluation; '
          'print("tensorflow" in sys.modules)')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == 'False'


def test_epoch_order_depends_only_on_seed_and_epoch():
  key = jax.random.key(7)
  first = batches.epoch_permutation(key, jnp.int32(3), 1000)
  np.testing.assert_array_equal(first, batches.epoch_permutation(key, jnp.int32(3), 1000))
  assert sorted(np.asarray(first).tolist()) == list(range(1000))
  assert not np.array_equal(first, batches.epoch_permutation(key, jnp.int32(4), 1000))
  assert not np.array_equal(first, batches.epoch_permutation(jax.random.key(8), jnp.int32(3), 1000))


def test_shards_split_each_global_batch_in_order():
  order = jnp.arange(100)[::-1]
  whole = batches.shard_steps(order, 24, 1, jnp.int32(0))
  assert whole.shape == (4, 24)  # 100 // 24 steps; the last 4 examples wait for the next epoch.
  pieces = [batches.shard_steps(order, 24, 4, jnp.int32(k)) for k in range(4)]
  np.testing.assert_array_equal(jnp.concatenate(pieces, axis=1), whole)


def test_eval_plan_scores_every_example_once():
  for shards in (1, 4):
    plans = [batches.eval_steps(1999, 1000, shards, jnp.int32(k)) for k in range(shards)]
    indices = np.concatenate([np.asarray(i)[np.asarray(m)] for i, m in plans])
    assert sorted(indices.tolist()) == list(range(1999))


def test_shift_translates_images_and_fills_with_background():
  image = np.zeros((28, 28), np.uint8)
  image[10, 12] = 255
  images = jnp.asarray(np.stack([image, image]).reshape(2, 784))
  labels = jnp.array([3, 4], jnp.int32)
  # Offsets are (dy, dx) + max_shift: the first image moves down 2 and left 1, the second stays.
  offsets = jnp.array([[0, 3], [2, 2]])
  batch = batches.gather(images, labels, jnp.array([0, 1]), lambda p: augment.shift(p, offsets, 2))
  pixels = np.asarray(batch['image']).reshape(2, 28, 28) * batches.PIXEL_STD + batches.PIXEL_MEAN
  assert np.unravel_index(np.argmax(pixels[0]), (28, 28)) == (12, 11)
  assert np.unravel_index(np.argmax(pixels[1]), (28, 28)) == (10, 12)
  np.testing.assert_allclose(pixels[0].sum(), 1.0, rtol=1e-5)  # Nothing but the one pixel.


def translated(images: np.ndarray, offsets: np.ndarray, max_shift: int) -> np.ndarray:
  """[N, 784] images each moved by max_shift minus its (dy, dx) offset, as in the test above (0
  moves it down or right), background (0) where nothing moved in: plain numpy, slice by slice."""
  out = np.zeros_like(images).reshape(-1, 28, 28)
  for image, moved, (dy, dx) in zip(images.reshape(-1, 28, 28), out, max_shift - offsets):
    moved[max(dy, 0):28 + min(dy, 0), max(dx, 0):28 + min(dx, 0)] = (
        image[max(-dy, 0):28 + min(-dy, 0), max(-dx, 0):28 + min(-dx, 0)])
  return out.reshape(images.shape)


@pytest.mark.parametrize('max_shift', [1, 2])
def test_shift_moves_pixels_bit_for_bit_for_every_offset_also_under_members_vmap(max_shift):
  each_way = range(2 * max_shift + 1)
  offsets = np.array([[dy, dx] for dy in each_way for dx in each_way], np.int32)
  images = np.random.default_rng(0).integers(1, 256, (len(offsets), 784)).astype(np.float32) / 255
  bits = lambda pixels: np.asarray(pixels).view(np.uint32)
  shifted = jax.jit(augment.shift, static_argnums=2)(jnp.asarray(images), offsets, max_shift)
  assert np.array_equal(bits(shifted), bits(translated(images, offsets, max_shift)))
  # As num_models runs it: the images unmapped, each member's offsets its own.
  members = np.stack([offsets, offsets[::-1]])
  together = jax.jit(jax.vmap(augment.shift, in_axes=(None, 0, None)), static_argnums=2)(
      jnp.asarray(images), members, max_shift)
  for member, member_offsets in zip(together, members):
    assert np.array_equal(bits(member), bits(translated(images, member_offsets, max_shift)))


def test_shift_offsets_depend_on_the_example_not_its_position():
  key = jax.random.key(0)
  indices = jnp.array([5, 9, 2, 7])
  together = augment.shift_offsets(key, jnp.int32(1), indices, 2)
  apart = jnp.concatenate([augment.shift_offsets(key, jnp.int32(1), indices[k:k + 2], 2)
                           for k in (0, 2)])
  np.testing.assert_array_equal(together, apart)
  assert int(together.min()) >= 0 and int(together.max()) <= 4
  later = augment.shift_offsets(key, jnp.int32(2), jnp.arange(100), 2)
  assert not np.array_equal(augment.shift_offsets(key, jnp.int32(1), jnp.arange(100), 2), later)


def assert_each_equally_often(draws: np.ndarray, values: list) -> None:
  """Every one of `values` drawn and nothing else, each within 5 standard deviations of its
  share."""
  found, counts = np.unique(draws, axis=0, return_counts=True)
  assert found.tolist() == values, found.tolist()
  share = 1 / len(values)
  spread = 5 * np.sqrt(len(draws) * share * (1 - share))
  assert np.all(np.abs(counts - len(draws) * share) < spread), counts


def assert_fills_evenly(draws: np.ndarray, bound: float) -> None:
  """Draws from all of [-bound, bound] and nothing past it, each tenth of it as often."""
  draws = np.asarray(draws).ravel() / bound
  assert np.all(np.abs(draws) <= 1 + 1e-4) and draws.min() < -0.99 and draws.max() > 0.99
  tenths = np.minimum(np.floor((draws + 1) * 5), 9).astype(int)
  assert_each_equally_often(tenths, list(range(10)))


@pytest.mark.parametrize('max_shift', [1, 3])
def test_shifts_are_drawn_evenly_from_every_offset_each_way(max_shift):
  offsets = jax.jit(augment.shift_offsets, static_argnums=3)(
      jax.random.key(0), jnp.int32(1), jnp.arange(20_000), max_shift)
  each_way = list(range(-max_shift, max_shift + 1))
  # Every (dy, dx) as often as any other: neither way favoured, the two directions independent.
  assert_each_equally_often(np.asarray(offsets) - max_shift,
                            [[dy, dx] for dy in each_way for dx in each_way])


def test_shifted_images_move_each_way_equally_often_by_up_to_max_shift():
  dot = np.zeros((28, 28), np.float32)
  dot[13, 14] = 1.0
  count, max_shift = 4000, 2
  shifted = jax.jit(lambda pixels: augment.augmenter(
      jax.random.key(5), jnp.int32(2), jnp.arange(count), max_shift, augment.Distortion())(pixels))(
          jnp.tile(dot.reshape(1, 784), (count, 1)))
  rows, columns = np.unravel_index(np.asarray(shifted).argmax(axis=1), (28, 28))
  each_way = list(range(-max_shift, max_shift + 1))
  assert_each_equally_often(np.stack([rows - 13, columns - 14], axis=1),
                            [[dy, dx] for dy in each_way for dx in each_way])


def drawn_coordinates(distortion: augment.Distortion, count: int = 4000) -> np.ndarray:
  """The source coordinates of `count` examples' distortions, [count, 2, 28, 28]."""
  keys = randomness.example_keys(jax.random.key(1), jnp.int32(1), jnp.arange(count))
  # lax.map, not vmap: the same draws, compiled several times faster.
  draw = jax.jit(lambda keys: jax.lax.map(lambda key: augment.source_coordinates(key, distortion),
                                          keys))
  return np.asarray(draw(keys))


def affine_parts(coordinates: np.ndarray) -> dict[str, np.ndarray]:
  """Each example's rotation, size less 1, shear and (dy, dx), read back from its affine source
  coordinates [N, 2, 28, 28]: pixel p reads the input at map @ (p - centre) + centre - (dy, dx),
  where map = rotation @ shear / size."""
  corner, down, right = (coordinates[:, :, at[0], at[1]].astype(np.float64)
                         for at in ((0, 0), (1, 0), (0, 1)))
  matrix = np.stack([down - corner, right - corner], axis=2)
  centre = (augment.SIDE - 1) / 2
  dy, dx = (centre - centre * matrix.sum(axis=2) - corner).T
  angle = np.arctan2(matrix[:, 1, 0], matrix[:, 0, 0])
  size = 1 / np.hypot(matrix[:, 0, 0], matrix[:, 1, 0])
  shear = (np.cos(angle) * matrix[:, 0, 1] + np.sin(angle) * matrix[:, 1, 1]) * size  # Its tangent.
  return {'rotation': np.degrees(angle), 'scale': size - 1, 'shear': np.degrees(np.arctan(shear)),
          'dy': dy, 'dx': dx}


def test_each_affine_part_is_drawn_evenly_from_its_whole_range_each_way_and_on_its_own():
  ranges = {'rotation': 15.0, 'scale': 0.15, 'shear': 10.0, 'dy': 2.5, 'dx': 2.5}
  parts = affine_parts(drawn_coordinates(augment.Distortion(rotation=15.0, scale=0.15, shear=10.0,
                                                            translate=2.5)))
  for name, bound in ranges.items():
    assert_fills_evenly(parts[name], bound)
  # Five draws, not fewer: no part follows another.
  correlations = np.corrcoef(np.stack([parts[name] for name in ranges]))
  assert np.all(np.abs(correlations - np.eye(len(ranges))) < 0.1), correlations


def test_the_elastic_field_moves_pixels_each_way_alike():
  identity = np.stack(np.meshgrid(np.arange(28), np.arange(28), indexing='ij'))  # Where each reads.
  field = drawn_coordinates(augment.Distortion(elastic_alpha=30.0, elastic_sigma=5.0)) - identity
  for way in (0, 1):  # Rows and columns; at the centre and at a corner of the image.
    for pixel in ((14, 14), (2, 25)):
      moves = field[:, way, pixel[0], pixel[1]]
      spread = moves.std()
      assert abs(moves.mean()) < 0.1 * spread, (way, pixel)  # 4000 draws: 6 standard errors.
      low, high = np.quantile(moves, [0.01, 0.1, 0.25]), np.quantile(moves, [0.99, 0.9, 0.75])
      np.testing.assert_allclose(low, -high, atol=0.15 * spread)  # A symmetric distribution.


DISTORTION = augment.Distortion(rotation=15, scale=0.15, shear=10, translate=2, elastic_alpha=30,
                                elastic_sigma=6)


def _digits(count: int) -> jax.Array:
  return batches.to_unit(jnp.asarray(load_splits(make_config().data, f'test[:{count}]')[0].images))


def test_a_distortion_of_zeros_leaves_every_image_as_it_was():
  assert not augment.Distortion() and DISTORTION
  assert augment.augmenter(jax.random.key(0), jnp.int32(1), jnp.arange(4), 0,
                           augment.Distortion()) is None
  pixels = _digits(4)
  keys = randomness.example_keys(jax.random.key(0), jnp.int32(1), jnp.arange(4))
  np.testing.assert_allclose(augment.distort(pixels, keys, augment.Distortion()), pixels, atol=1e-6)


def test_a_distortion_moves_ink_without_making_or_losing_much_of_it():
  pixels = _digits(64)
  keys = randomness.example_keys(jax.random.key(0), jnp.int32(1), jnp.arange(64))
  moved = np.asarray(augment.distort(pixels, keys, DISTORTION))
  assert moved.min() >= 0 and moved.max() <= 1
  changed = np.abs(moved - np.asarray(pixels)).sum(axis=1) / np.asarray(pixels).sum(axis=1)
  assert changed.min() > 0.1  # Every digit moved: at least a tenth of its ink is elsewhere.
  ink = moved.sum(axis=1) / np.asarray(pixels).sum(axis=1)
  # Scaling, shear and the elastic field stretch and squeeze, but no digit vanishes or doubles,
  # and the background stays background.
  assert 0.5 < ink.min() and ink.max() < 2 and np.median(moved) == 0


def test_the_elastic_field_grows_with_alpha_and_is_smooth():
  d = lambda alpha: augment.Distortion(elastic_alpha=alpha, elastic_sigma=6)
  key = jax.random.key(3)
  identity = augment.source_coordinates(key, augment.Distortion())
  weak, strong = (np.asarray(augment.source_coordinates(key, d(a)) - identity) for a in (10, 40))
  np.testing.assert_allclose(strong, 4 * weak, rtol=1e-4, atol=1e-5)  # One field, scaled by alpha.
  assert 0.2 < np.abs(strong).mean() < 3  # Pixels move by about a pixel, not a digit's width.
  step = np.abs(np.diff(strong, axis=2)).mean()
  assert step < 0.2 * np.abs(strong).mean()  # Neighbours move together: a smooth field.


def test_distortions_depend_on_the_example_not_its_position_and_change_each_epoch():
  pixels = _digits(4)
  indices = jnp.array([5, 9, 2, 7])
  run_key = jax.random.key(0)
  together = augment.augmenter(run_key, jnp.int32(1), indices, 1, DISTORTION)(pixels)
  apart = jnp.concatenate([augment.augmenter(run_key, jnp.int32(1), indices[k:k + 2], 1,
                                             DISTORTION)(pixels[k:k + 2]) for k in (0, 2)])
  np.testing.assert_array_equal(together, apart)
  later = augment.augmenter(run_key, jnp.int32(2), indices, 1, DISTORTION)(pixels)
  assert not np.array_equal(together, later)


@pytest.mark.parametrize('config_file', ['default', 'quick', 'best', 'committee'])
def test_validation_after_the_config_file_holds_out_the_last_10000_training_images(config_file):
  module = {'default': default, 'quick': quick, 'best': best, 'committee': committee}[config_file]
  chosen, held_out = (parse_split(s) for s in (module.get_config().data.train_split,
                                               module.get_config().data.eval_split))
  assert (chosen.name, chosen.size, held_out.name, held_out.size) == ('train', 60_000, 'test',
                                                                      10_000)
  config = module.get_config('validation')
  train, validation = (parse_split(s) for s in (config.data.train_split, config.data.eval_split))
  assert (train.name, train.start, train.stop) == ('train', 0, 50_000)
  assert (validation.name, validation.start, validation.stop) == ('train', 50_000, 60_000)
  with pytest.raises(UserError, match='use test or validation'):
    module.get_config('valid')
