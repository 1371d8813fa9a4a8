"""Classifies MNIST test digits with an export of export.py, using none of this project's code: a
template for serving it, and the check the tests run in a fresh process. Needs numpy and JAX
(StableHLO) or TensorFlow (the SavedModel), nothing else:

  python -I serving/load_export.py DIR --format=stablehlo --batch_sizes=1,37 [--save=OUT.npz]

Prints one JSON line: the format, its inputs and outputs, the seconds to load it and those of the
first call of each batch size (compiling included). --save keeps each batch's probabilities. A
mistake (a folder without that export, a framework not installed, a file that cannot be read or
written) ends in one line on stderr and exit status 1, or 2 for the flags.
"""

import argparse
import gzip
import json
import os
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

TEST_IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, 'data', 'mnist',
                           't10k-images-idx3-ubyte.gz')  # MNIST's test images, as published.
Classify = Callable[[np.ndarray], np.ndarray]
FILES = {'stablehlo': 'model.jax_export', 'savedmodel': 'saved_model'}  # In export.py's --out.
NEEDS = {'stablehlo': 'jax', 'savedmodel': 'tensorflow'}  # The one framework each format needs.
IMAGES_MAGIC = 2051  # An IDX file of unsigned bytes in three dimensions.


def fail(message: str, status: int = 1) -> NoReturn:
  """Ends the program in one line on stderr: a caller's mistake needs no traceback."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(status)


class OneLineParser(argparse.ArgumentParser):
  """argparse, whose mistakes (an unknown format, say) end in one line too, with the usage."""

  def error(self, message: str) -> NoReturn:
    fail(f'{message}; {" ".join(self.format_usage().split())}', 2)


def batch_sizes(text: str) -> list[int]:
  """--batch_sizes: comma-separated counts of images, each at least 1."""
  sizes = [int(n) for n in text.split(',') if n.strip().isdigit()]
  if len(sizes) != len(text.split(',')) or min(sizes) < 1:
    raise argparse.ArgumentTypeError(f'{text!r} is not counts of 1 or more, e.g. 1,37')
  return sizes


def read_idx_images(path: str) -> np.ndarray:
  """uint8 [N, 28, 28] from an IDX image file, gzipped or not: MNIST's own format."""
  try:
    with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as error:  # Missing, unreadable, a .gz cut or damaged.
    fail(f'cannot read --images={path} ({getattr(error, "strerror", None) or error}); pass an '
         "IDX file of 28x28 images, such as MNIST's t10k-images-idx3-ubyte.gz")
  magic, count, rows, cols = (int.from_bytes(data[i:i + 4], 'big') for i in (0, 4, 8, 12))
  if magic != IMAGES_MAGIC or (rows, cols) != (28, 28) or len(data) < 16 + count * rows * cols:
    fail(f"--images={path} is not a whole IDX file of 28x28 images; pass one, such as MNIST's "
         't10k-images-idx3-ubyte.gz')
  return np.frombuffer(data, np.uint8, count * rows * cols, 16).reshape(count, rows, cols)


def check_folder(folder: str, form: str) -> None:
  """The folder must hold export.py's file of this format; a line naming the fix if not."""
  if not os.path.isdir(folder):
    fail(f'{folder} is not a folder; pass the --out folder that export.py wrote')
  if not os.path.exists(os.path.join(folder, FILES[form])):
    held = [name for name, file in FILES.items() if os.path.exists(os.path.join(folder, file))]
    fail(f'{folder} holds no {form} export ({FILES[form]}); '
         + (f'pass --format={held[0]}, the format it holds' if held else 'pass the --out folder '
            f'of export.py, or export this format: export.py --formats={form}'))


def load_stablehlo(folder: str) -> tuple[Classify, str]:
  """The StableHLO export, by JAX alone; and what it takes and gives."""
  from jax import export  # pylint: disable=g-import-not-at-top; only this format needs JAX
  with open(os.path.join(folder, FILES['stablehlo']), 'rb') as f:
    exported = export.deserialize(bytearray(f.read()))
  return (lambda images: np.asarray(exported.call(images)),
          f'{exported.in_avals} -> {exported.out_avals}')


def load_saved_model(folder: str) -> tuple[Classify, str]:
  """The SavedModel's serving_default signature, by TensorFlow alone; what it takes and gives."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top; only this format needs TensorFlow
  saved = tf.saved_model.load(os.path.join(folder, FILES['savedmodel']))
  serve = saved.signatures['serving_default']
  return (lambda images: serve(images=tf.constant(images))['probabilities'].numpy(),
          f'{serve.structured_input_signature[1]} -> {serve.structured_outputs}')


LOADERS = {'stablehlo': load_stablehlo, 'savedmodel': load_saved_model}


def load(folder: str, form: str) -> tuple[Classify, str]:
  """The export's classifier and spec; one line where the folder or the framework is missing."""
  check_folder(folder, form)
  try:
    return LOADERS[form](folder)
  except ImportError as error:
    package = missing_package(error) or NEEDS[form]
    other = next(name for name in LOADERS if name != form)
    fail(f'--format={form} needs {package} ({error}); install it (pip install {package}), or '
         f'pass --format={other} where that export is there')
  except Exception as error:  # pylint: disable=broad-except; unreadable, cut short, or too new
    reason = ' '.join(str(error).split()[:30]) or type(error).__name__
    fail(f'cannot load the {form} export in {folder} ({reason}); export it again with export.py, '
         f'with the {NEEDS[form]} this loader runs')


def missing_package(error: ImportError) -> str | None:
  """The module whose absence an ImportError comes from (jax.export's own 'Please install
  flatbuffers' names it only in its words), by the ModuleNotFoundError it was raised from."""
  cause: BaseException | None = error
  while cause is not None:
    if isinstance(cause, ModuleNotFoundError) and cause.name:
      return cause.name.split('.')[0]
    cause = cause.__cause__ or cause.__context__
  return None


def main() -> None:
  parser = OneLineParser(description=' '.join(__doc__.split('\n\n')[0].split()).rstrip(':') + '.')
  parser.add_argument('folder', help="export.py's --out")
  parser.add_argument('--format', choices=LOADERS, default='stablehlo')
  parser.add_argument('--images', default=TEST_IMAGES, help='an IDX file of 28x28 images')
  parser.add_argument('--batch_sizes', default='1,37', type=batch_sizes,
                      help='comma-separated: the first N images')
  parser.add_argument('--save', help='an .npz file for the probabilities of each batch size')
  args = parser.parse_args()
  images = read_idx_images(args.images)
  start = time.perf_counter()
  classify, spec = load(args.folder, args.format)
  record = {'format': args.format, 'spec': spec, 'load_s': time.perf_counter() - start}
  results: dict[str, Any] = {}
  for size in args.batch_sizes:
    start = time.perf_counter()
    results[f'batch{size}'] = classify(images[:size])
    record[f'first_call_s_batch{size}'] = time.perf_counter() - start
  if args.save:
    try:
      np.savez(args.save, **results)
    except OSError as error:
      fail(f'cannot write --save={args.save} ({error.strerror or error}); pass a path in a folder '
           'that is there and takes new files')
  print(json.dumps(record))


if __name__ == '__main__':
  main()
