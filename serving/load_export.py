"""Classifies MNIST test digits with an export of export.py, using none of this project's code: a
template for serving it, and the check the tests run in a fresh process. Needs numpy and JAX
(StableHLO) or TensorFlow (the SavedModel), nothing else:

  python -I serving/load_export.py DIR --format=stablehlo --batch_sizes=1,37 [--save=OUT.npz]

Prints one JSON line: the format, its inputs and outputs, the seconds to load it and those of the
first call of each batch size (compiling included). --save keeps each batch's probabilities.
"""

import argparse
import gzip
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

TEST_IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, 'data', 'mnist',
                           't10k-images-idx3-ubyte.gz')  # MNIST's test images, as published.
Classify = Callable[[np.ndarray], np.ndarray]


def read_idx_images(path: str) -> np.ndarray:
  """uint8 [N, 28, 28] from an IDX image file, gzipped or not: MNIST's own format."""
  with (gzip.open if path.endswith('.gz') else open)(path, 'rb') as f:
    data = f.read()
  count, rows, cols = (int.from_bytes(data[i:i + 4], 'big') for i in (4, 8, 12))
  return np.frombuffer(data, np.uint8, offset=16).reshape(count, rows, cols)


def load_stablehlo(folder: str) -> tuple[Classify, str]:
  """The StableHLO export, by JAX alone; and what it takes and gives."""
  from jax import export  # pylint: disable=g-import-not-at-top; only this format needs JAX
  with open(os.path.join(folder, 'model.jax_export'), 'rb') as f:
    exported = export.deserialize(bytearray(f.read()))
  return (lambda images: np.asarray(exported.call(images)),
          f'{exported.in_avals} -> {exported.out_avals}')


def load_saved_model(folder: str) -> tuple[Classify, str]:
  """The SavedModel's serving_default signature, by TensorFlow alone; what it takes and gives."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top; only this format needs TensorFlow
  serve = tf.saved_model.load(os.path.join(folder, 'saved_model')).signatures['serving_default']
  return (lambda images: serve(images=tf.constant(images))['probabilities'].numpy(),
          f'{serve.structured_input_signature[1]} -> {serve.structured_outputs}')


LOADERS = {'stablehlo': load_stablehlo, 'savedmodel': load_saved_model}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('folder', help="export.py's --out")
  parser.add_argument('--format', choices=LOADERS, default='stablehlo')
  parser.add_argument('--images', default=TEST_IMAGES, help='an IDX file of 28x28 images')
  parser.add_argument('--batch_sizes', default='1,37', help='comma-separated: the first N images')
  parser.add_argument('--save', help='an .npz file for the probabilities of each batch size')
  args = parser.parse_args()
  images = read_idx_images(args.images)
  start = time.perf_counter()
  classify, spec = LOADERS[args.format](args.folder)
  record = {'format': args.format, 'spec': spec, 'load_s': time.perf_counter() - start}
  results: dict[str, Any] = {}
  for size in (int(n) for n in args.batch_sizes.split(',')):
    start = time.perf_counter()
    results[f'batch{size}'] = classify(images[:size])
    record[f'first_call_s_batch{size}'] = time.perf_counter() - start
  if args.save:
    np.savez(args.save, **results)
  print(json.dumps(record))


if __name__ == '__main__':
  main()
