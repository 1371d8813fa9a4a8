"""The export formats of one classifier: uint8 images [N, 28, 28] in, float32 probabilities [N, 10]
out, any N, the parameters inside. StableHLO by `jax.export` needs JAX alone to run; the SavedModel
TensorFlow alone, and the ONNX model an ONNX runtime alone: those two are built from the parameters
in their own ops (serving/layers.py), so they run whatever JAX wrote them."""

import functools
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from errors import ExtraMissing
from native_logs import TENSORFLOW_EXTRA, import_tensorflow_quietly
from mlp import inference
from mlp import steps
from serving import layers
from serving.folder import FILES, MANIFEST, ONNX, SAVED_MODEL, STABLEHLO

PLATFORMS = ('cpu', 'cuda', 'tpu')  # The StableHLO is lowered for each: it serves on any of them.
INPUT, OUTPUT, SIGNATURE = 'images', 'probabilities', 'serving_default'
Versions = dict[str, Any]  # The libraries (and format versions) that wrote a file.


def import_onnx() -> None:
  """Imports onnx now (ImportError where the extra is not installed)."""
  import onnx  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import; the extra's


# Each format that needs an extra: how to import it, and the extra that installs it.
EXTRAS = {SAVED_MODEL: (import_tensorflow_quietly, 'TensorFlow', TENSORFLOW_EXTRA),
          ONNX: (import_onnx, 'onnx', 'pip install -r requirements/onnx.txt')}


def require_extras(formats: list[str]) -> None:
  """Imports each asked format's library now, or raises ExtraMissing naming the extra that
  installs it: before the checkpoint is read."""
  for name in formats:
    if name in EXTRAS:
      load, library, install = EXTRAS[name]
      try:
        load()
      except ImportError as error:
        raise ExtraMissing(f'--formats={name}', library, install,
                           f'pass --formats={STABLEHLO}, which needs JAX alone') from error


def write_stablehlo(state: steps.TrainState, path: str) -> Versions:
  """jax.export's serialized StableHLO, for `jax.export.deserialize(data).call(images)`."""
  (batch,) = jax.export.symbolic_shape('N')
  exported = jax.export.export(jax.jit(functools.partial(inference.classify, state)),
                               platforms=PLATFORMS)(
      jax.ShapeDtypeStruct((batch, *layers.IMAGE_SHAPE), jnp.uint8))
  with open(path, 'wb') as f:
    f.write(exported.serialize())
  return {'jax': jax.__version__, 'calling_convention_version': exported.calling_convention_version}


def write_saved_model(state: steps.TrainState, path: str) -> Versions:
  """A TensorFlow SavedModel whose serving_default signature maps `images` to `probabilities`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top; the extra, for this format only
  from serving import tensorflow_graph  # pylint: disable=g-import-not-at-top; imports TensorFlow
  tensorflow_graph.save(layers.of_state(state, SAVED_MODEL), path, (INPUT, OUTPUT, SIGNATURE))
  return {'tensorflow': tf.__version__}


def write_onnx(state: steps.TrainState, path: str) -> Versions:
  """An ONNX model of standard operators, `images` in and `probabilities` out."""
  import onnx  # pylint: disable=g-import-not-at-top; the extra, for this format only
  from serving import onnx_graph  # pylint: disable=g-import-not-at-top; imports onnx
  model = onnx_graph.model(layers.of_state(state, ONNX), (INPUT, OUTPUT),
                           'MNIST class probabilities of uint8 images, by export.py')
  onnx.save_model(model, path)
  return {'onnx': onnx.__version__, 'opset': onnx_graph.OPSET,
          'ir_version': onnx_graph.IR_VERSION}


WRITERS: dict[str, Callable[[steps.TrainState, str], Versions]] = {
    STABLEHLO: write_stablehlo, SAVED_MODEL: write_saved_model, ONNX: write_onnx}


def size(path: str) -> int:
  """Bytes of a file, or of every file under a folder."""
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(folder, name))
             for folder, _, names in os.walk(path) for name in names)


def write(state: steps.TrainState, precision: str, formats: list[str], folder: str,
          about: dict[str, Any]) -> dict[str, int]:
  """Each format's file in `folder`, then the manifest (with `about`, and the versions of the
  libraries that wrote each file, which bound how long it loads); returns each file's bytes.

  `precision`: the run's matmul_precision, lowered into the StableHLO as evaluation runs it.
  """
  with jax.default_matmul_precision(precision):
    written_by = {FILES[name]: WRITERS[name](state, os.path.join(folder, FILES[name]))
                  for name in formats}
  manifest = {**about, 'files': {name: FILES[name] for name in formats},
              'input': {'name': INPUT, 'dtype': 'uint8', 'shape': ['N', *layers.IMAGE_SHAPE]},
              'output': {'name': OUTPUT, 'dtype': 'float32', 'shape': ['N', layers.NUM_CLASSES]},
              'signature': SIGNATURE, 'platforms': list(PLATFORMS), 'written_by': written_by}
  with open(os.path.join(folder, MANIFEST), 'w', encoding='utf-8') as f:
    json.dump(manifest, f, indent=1)
  return {FILES[name]: size(os.path.join(folder, FILES[name])) for name in formats}
