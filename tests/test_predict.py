"""After training: predict.py on pictures of digits, and the pictures a run draws of its errors."""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import types

import jax
import numpy as np
import pytest
from PIL import Image

from data import digit_images
from data.mnist import load_split
from library_errors import THREAD_REFUSED
from tests.conftest import ROOT, line_of, make_config, read_metrics, run_train, signalled_in
from trainer.plan import resolve
from trainer import checkpoints, config_fields, evaluation, pictures
from trainer.reporting import EVAL_FILE
from trainer.host.run_dir import RunDirectory

SAME_COUNT, PHOTO_COUNT = 1000, 300  # Eval images saved as PNG files; of them, photographed.


@pytest.fixture(scope='module')
def quick_run(tmp_path_factory, mnist_dir):
  """A run of configs/quick.py by train.py, as a user makes it."""
  workdir = tmp_path_factory.mktemp('quick')
  out = run_train('--config=configs/quick.py', f'--workdir={workdir}')
  assert out.returncode == 0, out.stderr
  return workdir, out.stdout


def run_config(workdir):
  """The config saved with the run's checkpoints, and its eval split's images and labels."""
  config = config_fields.config_from_flat(checkpoints.saved_config(RunDirectory(workdir))[1])
  return config, load_split(config.data, config.data.eval_split)


def photograph(pixels: np.ndarray, rng: np.random.Generator) -> Image.Image:
  """An MNIST digit as a photo of it: 4-8x larger, dark ink on grey-white paper, off-centre."""
  scale = int(rng.integers(4, 9))
  side = 28 * scale
  ink = np.asarray(Image.fromarray(255 - pixels.reshape(28, 28)).resize(
      (side, side), Image.Resampling.BICUBIC), float)
  height, width = (int(n) for n in rng.integers(side + 60, 2 * side + 100, size=2))
  page = 235 + rng.normal(0, 4, (height, width))
  top, left = int(rng.integers(0, height - side)), int(rng.integers(0, width - side))
  page[top:top + side, left:left + side] = np.minimum(page[top:top + side, left:left + side], ink)
  return Image.fromarray(np.clip(page, 0, 255).astype(np.uint8)).convert('RGB')


@pytest.fixture(scope='module')
def predicted(quick_run, tmp_path_factory):
  """predict.py --json once on eval images saved as PNG and on photos of them: file -> object."""
  workdir, _ = quick_run
  _, examples = run_config(workdir)
  folder = tmp_path_factory.mktemp('images')
  (folder / 'png').mkdir()
  (folder / 'photos').mkdir()
  rng = np.random.default_rng(0)
  for i in range(SAME_COUNT):
    Image.fromarray(examples.images[i].reshape(28, 28)).save(folder / 'png' / f'{i:04d}.png')
  for i in range(PHOTO_COUNT):
    photograph(examples.images[i], rng).save(folder / 'photos' / f'{i:04d}.jpg', quality=90)
  out = run_train(f'--workdir={workdir}', '--json', str(folder / 'png'), str(folder / 'photos'),
                  script='predict.py')
  assert out.returncode == 0, out.stderr
  assert out.stderr.strip().splitlines()[-1].startswith(
      f'classified {SAME_COUNT + PHOTO_COUNT} images with the checkpoint of epoch ')
  objects = [json.loads(line) for line in out.stdout.splitlines()]
  return {str(pathlib.Path(obj['file']).relative_to(folder)): obj for obj in objects}


def digits(predicted, kind: str, count: int) -> np.ndarray:
  found = [predicted[f'{kind}/{i:04d}.{"png" if kind == "png" else "jpg"}'] for i in range(count)]
  assert all(0 <= o['digit'] <= 9 and 0.1 <= o['probability'] <= 1 for o in found)
  return np.array([o['digit'] for o in found])


@pytest.mark.parametrize('backend, said', [
    ('cpu', 'this machine ran out of memory classifying (RESOURCE_EXHAUSTED: Out of memory '
            'allocating 4096 bytes.); free memory (close other programs), or use a device with '
            'more memory'),
    ('gpu', 'the GPU ran out of memory classifying (RESOURCE_EXHAUSTED: Out of memory allocating '
            '4096 bytes.); classify on the CPU (JAX_PLATFORMS=cpu; the run sets the batch), or '
            'use a device with more memory')])
def test_a_device_out_of_memory_as_predict_classifies_names_a_fix_it_has(monkeypatch, backend,
                                                                        said):
  """predict.py takes no eval_batch_size (the run's config sets its batch): the CPU is its way."""
  def out_of_memory(*_, **__):
    raise jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 4096 bytes.')

  monkeypatch.setattr(evaluation, '_predict', out_of_memory)
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  plan = resolve(make_config(), one_device=True)
  assert line_of(lambda: evaluation.probabilities(plan, types.SimpleNamespace(state=None),
                                                  np.zeros((3, 784), np.uint8))) == said


# predict.py made to receive a SIGTERM as it exits, once it has said every image's digit.
STOPPED_AFTER = signalled_in('predict.py', 'sys', 'exit')


@pytest.mark.slow  # A fresh process that restores the run: 3-4 s.
def test_a_signal_once_every_digit_is_printed_ends_it_saying_nothing_more(quick_run, tmp_path):
  """Not 'stopped; rerun the same command to classify the images': they are."""
  png, one = tmp_path / 'one.png', np.zeros((28, 28), np.uint8)
  one[4:24, 13:16] = 255
  Image.fromarray(one).save(png)
  stopped = subprocess.run([sys.executable, '-c', STOPPED_AFTER, f'--workdir={quick_run[0]}',
                            str(png)], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert stopped.returncode == 128 + 15, stopped.stderr
  assert stopped.stderr == f'classified 1 image with the checkpoint of epoch 3 in {quick_run[0]}\n'
  assert stopped.stdout.startswith(f'{png}  ')


def test_a_thread_the_machine_will_not_start_as_a_run_is_read_is_one_line(quick_run, monkeypatch):
  """predict.py and export.py read the run so: orbax lists its checkpoints in threads,
  which a machine short of memory or at its limit of processes refuses (`ulimit -v 1500000`)."""
  def refused(thread):
    raise RuntimeError(THREAD_REFUSED)

  workdir, _ = quick_run
  monkeypatch.setattr(threading.Thread, 'start', refused)
  stopped = line_of(lambda: evaluation.restore_run(RunDirectory(workdir)))
  monkeypatch.undo()
  assert stopped.startswith(
      "this machine would not start another thread (can't start new thread): it is short of memory")


@pytest.mark.slow
def test_eval_images_saved_as_png_get_the_trainers_own_predictions(quick_run, predicted):
  workdir, _ = quick_run
  plan, restored = evaluation.restore_run(RunDirectory(workdir))
  _, examples = run_config(workdir)
  # The trainer's forward pass on its own eval arrays, as its pictures and evaluation use it.
  trainer = evaluation.probabilities(plan, restored, examples.images).argmax(axis=1)
  assert np.array_equal(digits(predicted, 'png', SAME_COUNT), trainer[:SAME_COUNT])
  # ...which is its evaluation: the same count right as the run's last recorded epoch.
  final = read_metrics(workdir)[-1]
  assert int(np.sum(trainer == examples.labels)) == round(final['eval_accuracy'] * len(examples))


@pytest.mark.slow
def test_photographed_digits_are_classified_as_well_as_the_originals(quick_run, predicted):
  _, examples = run_config(quick_run[0])
  right = digits(predicted, 'photos', PHOTO_COUNT) == examples.labels[:PHOTO_COUNT]
  assert right.mean() >= 0.95, f'{right.sum()} of {PHOTO_COUNT} right'


def image_tags(workdir) -> dict[str, list[tuple[int, int, int]]]:
  """TensorBoard's own reading of the run directory: image tag -> (step, width, height)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(str(workdir))
  events.Reload()
  return {tag: [(i.step, i.width, i.height) for i in events.Images(tag)]
          for tag in events.Tags()['images']}


def assert_pictures(workdir, wrong: int, epoch: int, curves: bool = False) -> None:
  """Both PNG files (and a training run's curves), of the sizes their content decides, and the
  same images in TensorBoard."""
  sizes = {'mistakes': pictures.mistakes_size(wrong), 'confusion': pictures.CONFUSION_SIZE}
  if curves:
    records = read_metrics(workdir)
    assert len(records) == epoch
    sizes['curves'] = pictures.curves_size(records)
  for name, size in sizes.items():
    with Image.open(workdir / f'{name}.png') as image:
      assert (image.format, image.size, image.mode) == ('PNG', size, 'RGB')
  assert image_tags(workdir) == {name: [(epoch, *size)] for name, size in sizes.items()}


@pytest.mark.slow
def test_a_run_and_an_eval_only_draw_their_mistakes_and_confusion_matrix(quick_run, tmp_path):
  workdir, stdout = quick_run
  config, examples = run_config(workdir)
  final = read_metrics(workdir)[-1]
  wrong = round((1 - final['eval_accuracy']) * len(examples))
  assert wrong > 0
  assert_pictures(workdir, wrong, config.num_epochs, curves=True)
  assert 'eval accuracy per digit: 0 ' in stdout
  drawn = {name: (workdir / f'{name}.png').read_bytes() for name in ('mistakes', 'confusion')}

  copy = tmp_path / 'run'  # eval_only on a copy without the run's pictures and events.
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns('*.png', 'events.*'))
  config.eval_only = True
  record = evaluation.evaluate_checkpoint(resolve(config), RunDirectory(copy))
  assert_pictures(copy, wrong, config.num_epochs)
  assert {name: (copy / f'{name}.png').read_bytes() for name in drawn} == drawn
  assert [json.loads(line) for line in (copy / EVAL_FILE).read_text().splitlines()] == [record]
  counts = np.bincount(examples.labels, minlength=10)
  right = np.array(record['eval_accuracy_per_digit']) * counts
  np.testing.assert_allclose(right, np.round(right), atol=1e-6)
  assert round(right.sum()) == len(examples) - wrong


def test_the_confusion_matrix_counts_each_example_once_by_true_and_predicted_digit():
  labels, predicted = np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 0, 2])
  matrix = pictures.confusion_matrix(labels, predicted)
  assert matrix.sum() == 6
  assert (matrix[0, 0], matrix[0, 1], matrix[2, 0], matrix[2, 2]) == (1, 1, 1, 2)
  assert pictures.per_digit_accuracy(matrix) == [0.5, 1.0, 2 / 3, *[None] * 7]
  assert pictures.per_digit_text(matrix) == (
      '0 50.0%  1 100.0%  2 66.7%  3 n/a  4 n/a  5 n/a  6 n/a  7 n/a  8 n/a  9 n/a')


def at(pixels: np.ndarray, axes, x: float, y: float) -> np.ndarray:
  """The picture's RGB where a point of the axes' data lands."""
  column, row = axes.transData.transform((x, y))
  return pixels[int(len(pixels) - row), int(column)].astype(int)


def test_the_mistakes_picture_shows_each_wrong_image_labelled_true_as_predicted():
  images = np.arange(6 * 784).reshape(6, 784).astype(np.uint8)
  labels, predicted = np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 0, 2])
  figure = pictures.mistakes_figure(images, labels, predicted, 'mistakes on test')
  pixels = pictures.render(figure)
  assert pixels.shape == (*pictures.mistakes_size(2)[::-1], 3)
  [title] = figure.texts
  assert title.get_text() == (
      'mistakes on test\n2 of 6 wrong; each labelled "true digit as predicted digit"')
  [axes] = figure.axes
  assert [t.get_text() for t in axes.texts] == ['0 as 1', '2 as 0']
  [mosaic] = axes.get_images()
  tiles = np.asarray(mosaic.get_array())
  for text, index in zip(axes.texts, (1, 4)):  # Each wrong image as it is, its label under it.
    x, y = text.get_position()
    left, top = round(x - 13.5), round(y - 28.5)
    assert np.array_equal(tiles[top:top + 28, left:left + 28], images[index].reshape(28, 28))
    assert np.array_equal(at(pixels, axes, left + 3, top + 5), [images[index][5 * 28 + 3]] * 3)
  many = np.zeros(150, np.int64)
  figure = pictures.mistakes_figure(np.zeros((150, 784), np.uint8), many, many + 1, 'mistakes')
  shown = figure.texts[0].get_text().splitlines()[1]
  assert shown.startswith('150 of 150 wrong, the first 100 shown')
  assert len(figure.axes[0].texts) == pictures.MAX_MISTAKES
  assert pictures.draw_mistakes(images, labels, labels, 'none').shape == (
      *pictures.mistakes_size(0)[::-1], 3)


def test_the_confusion_picture_counts_right_in_blue_wrong_in_red_and_none_in_white():
  labels, predicted = np.array([0, 0, 1, 2, 2, 2]), np.array([0, 1, 1, 2, 0, 2])
  matrix = pictures.confusion_matrix(labels, predicted)
  figure = pictures.confusion_figure(matrix, 'confusion matrix on test')
  pixels = pictures.render(figure)
  assert pixels.shape == (*pictures.CONFUSION_SIZE[::-1], 3)
  assert figure.texts[0].get_text() == (
      'confusion matrix on test\nrows: true digit, columns: predicted digit')
  [axes] = figure.axes
  counts = {tuple(map(round, t.get_position())): t.get_text() for t in axes.texts}
  assert counts == {(col, row): str(matrix[row, col]) for row, col in np.ndindex(10, 10)}
  assert [t.get_text() for t in axes.get_xticklabels()] == [str(d) for d in range(10)]
  assert [t.get_text() for t in axes.get_yticklabels()] == [str(d) for d in range(10)]
  for (row, col), count in np.ndenumerate(matrix):
    red, _, blue = at(pixels, axes, col - 0.3, row - 0.3)  # Beside the count, in the cell.
    if row == col and count:
      assert blue > red + 40, (row, col)
    elif count:
      assert red > blue + 40, (row, col)
    else:
      assert red == blue == 255, (row, col)
  shares = pictures.confusion_shares(matrix)  # Right: of the row; wrong: of the worst mistake.
  np.testing.assert_allclose(np.diag(shares)[:3], np.sqrt([1 / 2, 1, 2 / 3]))
  assert shares[0, 1] == shares[2, 0] == 1


def flip_each_checkpoint(folder) -> None:
  """One flipped byte in every checkpoint's largest state file: each then fails its fingerprint, or
  (where the byte breaks a compressed chunk) no longer decodes; damage either way."""
  for state in folder.glob('[0-9]*/state'):
    largest = max((p for p in state.rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0x01
    largest.write_bytes(bytes(data))


def save_a_scan_with_a_nan(path) -> None:
  """A float TIFF of a digit (as measuring tools write them) where one pixel holds no value."""
  scan = np.zeros((40, 40), np.float32)
  scan[8:32, 18:22], scan[0, 0] = 1.0, np.nan
  Image.fromarray(scan, 'F').save(path)


# Each mistake: how it is made in a folder (given the quick run, if it needs one), what predict.py
# is then given, what its line says.
BAD_INPUTS = {
    'not an image': (lambda f, run: (f / 'digit.png').write_text('not a picture'),
                     '{f}/digit.png', 'is not an image Pillow can read'),
    'missing file': (lambda f, run: None, '{f}/seven.png', 'seven.png does not exist'),
    'pattern without a match': (lambda f, run: None, '{f}/*.jpeg', 'no file matches '),
    'empty path': (lambda f, run: None, '', "an empty path ('') names no file"),
    'a pipe': (lambda f, run: os.mkfifo(f / 'pipe.png'), '{f}/pipe.png',
               'is neither a file nor a folder'),
    'blank picture': (lambda f, run: Image.new('L', (90, 60), 'white').save(f / 'blank.jpg'),
                      '{f}/blank.jpg', 'no digit found'),
    'empty folder': (lambda f, run: (f / 'empty').mkdir(), '{f}/empty', 'holds no image files'),
    'no checkpoints': (lambda f, run: (f / 'run').mkdir(), '{png}', 'no checkpoint in'),
    'run is a file': (lambda f, run: (f / 'run').write_text('x'), '{png}',
                      'is a file; pass a --workdir that names a folder'),
    'huge picture': (lambda f, run: Image.new('1', (12000, 12000)).save(f / 'huge.png'),
                     '{f}/huge.png',
                     'is too large a picture to read (Image size (144000000 pixels)'),
    'NaN pixels': (lambda f, run: save_a_scan_with_a_nan(f / 'scan.tiff'), '{f}/scan.tiff',
                   'scan.tiff: 1 of its 1600 pixels are NaN or infinite; pass a picture whose '
                   'pixels are all numbers'),
    'damaged checkpoints only': (
        lambda f, run: flip_each_checkpoint(shutil.copytree(run(), f / 'run')), '{png}',
        'can be restored'),
}


def snapshot(folder) -> dict[str, str]:
  return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(folder.rglob('*')) if p.is_file()}


@pytest.mark.parametrize('case', [pytest.param(case, marks=pytest.mark.slow) if 'damaged' in case
                                  else case for case in BAD_INPUTS])
def test_bad_input_ends_in_one_line_and_writes_nothing(case, request, tmp_path):
  make, image, expected = BAD_INPUTS[case]
  make(tmp_path, lambda: request.getfixturevalue('quick_run')[0])
  png, one = tmp_path / 'one.png', np.zeros((28, 28), np.uint8)
  one[4:24, 13:16] = 255
  Image.fromarray(one).save(png)
  before = snapshot(tmp_path)
  out = run_train(f'--workdir={tmp_path / "run"}', image.format(f=tmp_path, png=png),
                  script='predict.py')
  assert out.returncode != 0 and out.stdout == ''
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and expected in lines[0], out.stderr
  assert snapshot(tmp_path) == before


def test_files_without_a_digit_are_said_each_and_the_others_still_classified(quick_run, tmp_path):
  workdir, _ = quick_run
  shutil.copytree(ROOT / 'docs' / 'digits', tmp_path, dirs_exist_ok=True)
  (tmp_path / 'notes.png').write_text('not a picture')
  Image.new('L', (90, 60), 'white').save(tmp_path / 'blank.jpg')
  out = run_train(f'--workdir={workdir}', '--json', str(tmp_path), script='predict.py')
  assert out.returncode == 1
  digits = {pathlib.Path(json.loads(line)['file']).name: json.loads(line)['digit']
            for line in out.stdout.splitlines()}
  assert digits == {'test-8003-enlarged.jpg': 7, 'test-8017-enlarged.jpg': 9, 'typed-3.png': 3,
                    'typed-6.png': 6}
  lines = out.stderr.strip().splitlines()
  assert lines[:2] == [
      f'error: {tmp_path}/blank.jpg: no digit found: the picture is blank or too faint (contrast 0 '
      'of 255 grey levels); pass a picture of one dark digit on a light page, or the reverse',
      f'error: {tmp_path}/notes.png is not an image Pillow can read; pass PNG, JPEG or another '
      'picture format']
  assert lines[2].startswith('classified 4 images with the checkpoint of epoch 3 in ')
  assert lines[2].endswith('; left out 2 that could not be read, each said above')
  assert len(lines) == 3


def test_when_no_file_holds_a_digit_each_is_said_before_any_run_is_read(tmp_path):
  for name in ('a.png', 'b.png'):
    (tmp_path / name).write_text('not a picture')
  out = run_train(f'--workdir={tmp_path / "nowhere"}', str(tmp_path), script='predict.py')
  assert out.returncode == 1 and out.stdout == ''
  assert out.stderr.strip().splitlines() == [
      f'error: {tmp_path / name} is not an image Pillow can read; pass PNG, JPEG or another '
      'picture format' for name in ('a.png', 'b.png')]


def test_a_photographed_digit_is_made_the_way_mnist_made_its_own(mnist_dir):
  examples = load_split(make_config().data, 'test[:20]')
  rng, alike = np.random.default_rng(1), []
  for original in examples.images:
    made = digit_images.to_mnist(photograph(original, rng)).astype(float)
    rows, cols = np.flatnonzero(made.any(axis=1)), np.flatnonzero(made.any(axis=0))
    # The ink's box scaled to 20 pixels on its longer side, its centre of mass at MNIST's centre.
    assert max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1 == 20
    assert np.allclose(digit_images.centre_of_mass(made), 14, atol=0.5)
    assert made.max() == 255
    alike.append(np.corrcoef(made.ravel(), original.astype(float))[0, 1])
    assert np.array_equal(digit_images.to_mnist(Image.fromarray(original.reshape(28, 28))),
                          original.reshape(28, 28))  # An MNIST image is taken as it is.
  assert min(alike) > 0.6 and np.median(alike) > 0.9  # Back close to the original, pixel by pixel.
  drawing = Image.new('RGBA', (200, 120), (0, 0, 0, 0))  # Black ink on a transparent page.
  drawing.paste((0, 0, 0, 255), (90, 10, 110, 110))
  made = digit_images.to_mnist(drawing)
  assert made[4:24, 12:16].min() > 200 and made.sum() == made[4:24, 12:16].sum()


def test_a_closed_standard_output_is_one_line_not_classifications_dropped(quick_run):
  """`python predict.py ... >&-`: Python starts with sys.stdout None, and print() dropped every
  classification while the command said it classified the images and exited 0."""
  out = subprocess.run(['sh', '-c', 'exec "$@" >&-', 'sh', sys.executable, 'predict.py',
                        f'--workdir={quick_run[0]}', 'docs/digits'], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1, out.stderr
  assert lines[0].startswith('error: standard output is closed (>&-)'), lines[0]
