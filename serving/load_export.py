"""Classifies MNIST test digits with an export of export.py, using none of this project's code: a
template for serving it, and the check the tests run in a fresh process. Needs numpy and JAX
(StableHLO), TensorFlow (the SavedModel) or onnxruntime (ONNX), nothing else:

  python -I serving/load_export.py DIR --format=stablehlo --batch_sizes=1,37 [--save=OUT.npz]

Prints one JSON line: the format, its inputs and outputs, the seconds to load it and those of the
first call of each batch size (compiling included), and with --repeat=K the median of K more calls.
--save keeps each batch's probabilities. A mistake (a folder without that export, a framework not
installed, a file that cannot be read or written, or one written by a version of the framework that
this one cannot read, named with both versions) ends in one line on stderr and exit status 1, or 2
for the flags.
"""

import argparse
import contextlib
import gzip
import json
import os
import re
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

TEST_IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, 'data', 'mnist',
                           't10k-images-idx3-ubyte.gz')  # MNIST's test images, as published.
Classify = Callable[[np.ndarray], np.ndarray]
# In export.py's --out: each format's file, and the one framework that runs it.
FILES = {'stablehlo': 'model.jax_export', 'savedmodel': 'saved_model', 'onnx': 'model.onnx'}
NEEDS = {'stablehlo': 'jax', 'savedmodel': 'tensorflow', 'onnx': 'onnxruntime'}
MANIFEST = 'export.json'  # Says which versions of which libraries wrote each file.
IMAGES_MAGIC = 2051  # An IDX file of unsigned bytes in three dimensions.


def fail(message: str, status: int = 1) -> NoReturn:
  """Ends the program in one line on stderr: a caller's mistake needs no traceback."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(status)


class Refused(Exception):
  """A mistake met while the frameworks' logs are muted: main says it, in one line, after."""


class NativeLogsMuted:
  """Keeps the frameworks' C++ logs off stderr while entered (TensorFlow's notes at import, MLIR's
  diagnostics of a program it cannot read): they write to file descriptor 2, and a failure is said
  in one line."""

  def __enter__(self) -> None:
    sys.stderr.flush()
    self._kept, self._devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(self._devnull, 2)

  def __exit__(self, *exc_info: Any) -> None:
    sys.stderr.flush()
    os.dup2(self._kept, 2)
    os.close(self._kept)
    os.close(self._devnull)


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


def load_onnx(folder: str) -> tuple[Classify, str]:
  """The ONNX model, by onnxruntime alone on the CPU; and what it takes and gives."""
  import onnxruntime  # pylint: disable=g-import-not-at-top; only this format needs onnxruntime
  session = onnxruntime.InferenceSession(os.path.join(folder, FILES['onnx']),
                                         providers=['CPUExecutionProvider'])
  (given,), (taken,) = session.get_inputs(), session.get_outputs()
  return (lambda images: session.run([taken.name], {given.name: images})[0],
          f'{given.name}: {given.type} {given.shape} -> {taken.name}: {taken.type} {taken.shape}')


LOADERS = {'stablehlo': load_stablehlo, 'savedmodel': load_saved_model, 'onnx': load_onnx}


def load_and_run(images: np.ndarray,
                 args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
  """The export loaded, and each batch size's probabilities (load_s, call times and the spec in
  the record); Refused where the framework is missing, or cannot read the file or run its
  program (compiled at the first call)."""
  try:
    start = time.perf_counter()
    classify, spec = LOADERS[args.format](args.folder)
    record = {'format': args.format, 'spec': spec, 'load_s': time.perf_counter() - start}
    return record, classify_batches(classify, images, args, record)
  except ImportError as error:
    package = missing_package(error) or NEEDS[args.format]
    raise Refused(f'--format={args.format} needs {package} ({error}); install it (pip install '
                  f'{package}), or pass another --format that the folder holds') from error
  except Exception as error:  # pylint: disable=broad-except; unreadable, cut short, or too new
    raise Refused(cannot_run(args.folder, args.format, error)) from error


def written_by(folder: str, form: str) -> dict[str, Any]:
  """The versions that wrote the format's file, as export.json says ({} where it does not)."""
  manifest: Any = {}
  with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, MANIFEST),
                                                      encoding='utf-8') as f:
    manifest = json.load(f)
  if not isinstance(manifest, dict):
    return {}
  old = {'jax': manifest['jax']} if form == 'stablehlo' and 'jax' in manifest else {}
  return manifest.get('written_by', {}).get(FILES[form], old)  # Exports before 2026-11: 'jax'.


def version_key(version: str) -> tuple[int, ...]:
  """A release's numbers, to compare: 0.12.0.1 -> (0, 12, 0, 1)."""
  return tuple(int(n) for n in re.findall(r'\d+', version))


def cannot_run(folder: str, form: str, error: Exception) -> str:
  """The line for an export that this framework cannot load or run: with the versions of the one
  that wrote it and this one, and what to do, where a difference of versions explains it."""
  said = (f'cannot load the {form} export in {folder} '
          f'({" ".join(str(error).split()[:30]) or type(error).__name__})')
  library, writer = NEEDS[form], written_by(folder, form)
  here = getattr(sys.modules.get(library), '__version__', None)
  there = writer.get(library)
  if form == 'onnx' and writer:
    return (f'{said}: {FILES[form]} holds ONNX opset {writer.get("opset")} (IR version '
            f'{writer.get("ir_version")}), which onnxruntime {here} does not run; install a newer '
            'one (pip install -r requirements/onnx.txt), or export the run again')
  if not (isinstance(there, str) and here) or version_key(there) == version_key(here):
    return f'{said}; export it again with export.py, with the {library} this loader runs'
  if version_key(there) > version_key(here):
    return (f'{said}: {FILES[form]} was written by {library} {there}, newer than this {library} '
            f'{here}, which cannot read it; load it with {library} {there} or newer, or export '
            f'the run again with {library} {here}')
  return (f'{said}: {FILES[form]} was written by {library} {there}, older than this {library} '
          f'{here} reads (docs/export.md: how long each format loads); export the run again with '
          f'{library} {here}, or load it with {library} {there}')


def missing_package(error: ImportError) -> str | None:
  """The module whose absence an ImportError comes from (jax.export's own 'Please install
  flatbuffers' names it only in its words), by the ModuleNotFoundError it was raised from."""
  cause: BaseException | None = error
  while cause is not None:
    if isinstance(cause, ModuleNotFoundError) and cause.name:
      return cause.name.split('.')[0]
    cause = cause.__cause__ or cause.__context__
  return None


def classify_batches(classify: Classify, images: np.ndarray, args: argparse.Namespace,
                     record: dict[str, Any]) -> dict[str, Any]:
  """Each batch size's probabilities (of the first --count images, in batches of that size, or of
  one batch); the first call's seconds, and the median of --repeat more, in `record`."""
  results: dict[str, Any] = {}
  for size in args.batch_sizes:
    counted = images[:args.count or size]
    batches = [np.ascontiguousarray(counted[i:i + size]) for i in range(0, len(counted), size)]
    start = time.perf_counter()
    first = classify(batches[0])
    record[f'first_call_s_batch{size}'] = time.perf_counter() - start
    results[f'batch{size}'] = np.concatenate([first, *map(classify, batches[1:])])
    seconds = []
    for _ in range(args.repeat):
      start = time.perf_counter()
      classify(batches[0])
      seconds.append(time.perf_counter() - start)
    if seconds:
      record[f'median_s_batch{size}'] = statistics.median(seconds)
  return results


def main() -> None:
  parser = OneLineParser(description=' '.join(__doc__.split('\n\n')[0].split()).rstrip(':') + '.')
  parser.add_argument('folder', help="export.py's --out")
  parser.add_argument('--format', choices=LOADERS, default='stablehlo')
  parser.add_argument('--images', default=TEST_IMAGES, help='an IDX file of 28x28 images')
  parser.add_argument('--batch_sizes', default='1,37', type=batch_sizes,
                      help='comma-separated: the first N images')
  parser.add_argument('--count', type=int,
                      help='classify the first COUNT images in batches of each size')
  parser.add_argument('--repeat', default=0, type=int,
                      help='calls of each batch size after the first, timed: their median')
  parser.add_argument('--save', help='an .npz file for the probabilities of each batch size')
  args = parser.parse_args()
  images = read_idx_images(args.images)
  if not 0 < (args.count or 1) <= len(images) or args.repeat < 0:
    fail(f'--count must be 1 to {len(images)}, the images there, and --repeat 0 or more', 2)
  check_folder(args.folder, args.format)
  try:
    with NativeLogsMuted():
      record, results = load_and_run(images, args)
  except Refused as refusal:  # Said once the logs are let through again.
    fail(str(refusal))
  if args.save:
    try:
      np.savez(args.save, **results)
    except OSError as error:
      fail(f'cannot write --save={args.save} ({error.strerror or error}); pass a path in a folder '
           'that is there and takes new files')
  print(json.dumps(record))


if __name__ == '__main__':
  main()
