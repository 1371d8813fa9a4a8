"""The export formats of one classifier: uint8 images [N, 28, 28] in, float32 probabilities [N, 10]
out, any N, the parameters inside. StableHLO by `jax.export` needs JAX alone to run; the SavedModel,
by jax2tf, TensorFlow alone (jax2tf wraps a `jax.export` lowering of it in one TensorFlow op)."""

import functools
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from errors import UserError
from native_logs import import_tensorflow_quietly, native_stderr_muted
from mlp import inference
from mlp import steps
from serving.folder import FILES, MANIFEST, SAVED_MODEL, STABLEHLO

PLATFORMS = ('cpu', 'cuda', 'tpu')  # Lowered for each: the files serve on any of them.
INPUT, OUTPUT, SIGNATURE = 'images', 'probabilities', 'serving_default'
IMAGE_SHAPE, NUM_CLASSES = (28, 28), 10
SYMBOLIC_INPUT = f'(N, {", ".join(map(str, IMAGE_SHAPE))})'  # jax2tf's spelling of [N, 28, 28].
TENSORFLOW_EXTRA = 'pip install -r requirements/tfds.txt'

Classify = Callable[[jax.Array], jax.Array]


def require_tensorflow() -> None:
  """Imports TensorFlow now, or raises the UserError naming the extra that installs it."""
  try:
    import_tensorflow_quietly()
  except ImportError as error:
    raise UserError(f'--formats={SAVED_MODEL} needs TensorFlow ({error}), an extra that `make '
                    f'train` leaves out: {TENSORFLOW_EXTRA} (TensorFlow has wheels for Python 3.11 '
                    f'to 3.13), or pass --formats={STABLEHLO}, which needs JAX alone') from error


def write_stablehlo(classify: Classify, path: str) -> None:
  """jax.export's serialized StableHLO, for `jax.export.deserialize(data).call(images)`."""
  (batch,) = jax.export.symbolic_shape('N')
  exported = jax.export.export(jax.jit(classify), platforms=PLATFORMS)(
      jax.ShapeDtypeStruct((batch, *IMAGE_SHAPE), jnp.uint8))
  with open(path, 'wb') as f:
    f.write(exported.serialize())


def write_saved_model(classify: Classify, path: str) -> None:
  """A TensorFlow SavedModel whose serving_default signature maps `images` to `probabilities`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top; the extra, for this format only
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top; imports TensorFlow
  converted = jax2tf.convert(classify, polymorphic_shapes=[SYMBOLIC_INPUT], with_gradient=False,
                             native_serialization_platforms=PLATFORMS)
  serve = tf.function(lambda images: {OUTPUT: converted(images)}, autograph=False,
                      input_signature=[tf.TensorSpec((None, *IMAGE_SHAPE), tf.uint8, name=INPUT)])
  module = tf.Module()
  module.serve = serve  # The signature takes the function itself: one trace serves both.
  try:
    tf.saved_model.save(module, path, signatures={SIGNATURE: serve})
  except tf.errors.OpError as error:  # Its file errors read 'PATH; No space left on device'.
    raise OSError(error.message.rsplit('; ', 1)[-1]) from error  # OutFolder words the line.
  check_tensorflow_runs(path)


def check_tensorflow_runs(path: str) -> None:
  """Runs the written SavedModel once: TensorFlow reads only the StableHLO of JAX releases it
  knows (TensorFlow 2.21 cannot read JAX 0.12's), and a user learns it here, not when serving."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top; the extra, for this format only
  serve = tf.saved_model.load(path).signatures[SIGNATURE]
  try:
    with native_stderr_muted():  # TensorFlow logs the failure below at length: it is said once.
      serve(**{INPUT: tf.zeros((1, *IMAGE_SHAPE), tf.uint8)})
  except tf.errors.InvalidArgumentError as error:
    if 'deserialize' not in error.message:
      raise
    raise UserError(
        f'this TensorFlow ({tf.__version__}) cannot run the program this JAX ({jax.__version__}) '
        f'writes, so no SavedModel was written; pass --formats={STABLEHLO}, or export with the '
        'Python 3.11 set-up (make train PYTHON=python3.11), whose JAX it reads') from None


WRITERS = {STABLEHLO: write_stablehlo, SAVED_MODEL: write_saved_model}


def size(path: str) -> int:
  """Bytes of a file, or of every file under a folder."""
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(folder, name))
             for folder, _, names in os.walk(path) for name in names)


def write(state: steps.TrainState, precision: str, formats: list[str], folder: str,
          about: dict[str, Any]) -> dict[str, int]:
  """Each format's file in `folder`, then the manifest (with `about`); returns each file's bytes.

  `precision`: the run's matmul_precision, lowered into the program as evaluation runs it.
  """
  classify = functools.partial(inference.classify, state)
  with jax.default_matmul_precision(precision):
    for name in formats:
      WRITERS[name](classify, os.path.join(folder, FILES[name]))
  manifest = {**about, 'files': {name: FILES[name] for name in formats},
              'input': {'name': INPUT, 'dtype': 'uint8', 'shape': ['N', *IMAGE_SHAPE]},
              'output': {'name': OUTPUT, 'dtype': 'float32', 'shape': ['N', NUM_CLASSES]},
              'signature': SIGNATURE, 'platforms': list(PLATFORMS), 'jax': jax.__version__}
  with open(os.path.join(folder, MANIFEST), 'w', encoding='utf-8') as f:
    json.dump(manifest, f, indent=1)
  return {FILES[name]: size(os.path.join(folder, FILES[name])) for name in formats}
