"""Writes a small export in export.py's layout, model.jax_export and export.json, with the JAX that
runs this, so that the tests can load files of other JAX releases than theirs:

  python tests/exports/write.py tests/exports/jax-$(python -c 'import jax; print(jax.__version__)')

Its classifier: softmax(row means of pixels / 255 @ WEIGHTS), any batch N, uint8 images [N, 28, 28]
in and float32 probabilities [N, 10] out, as export.py's. Needs JAX and flatbuffers alone. The
folders here were written on 2026-11-28 by the two stacks of `make` (JAX 0.10.2, 0.12.0.1) and by
JAX 0.8.1 (2025-11), in an environment of its own: python3.11 -m venv /tmp/jax081 &&
/tmp/jax081/bin/pip install jax==0.8.1 flatbuffers.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

WEIGHTS = np.linspace(-1, 1, 28 * 10, dtype=np.float32).reshape(28, 10)


def classify(images: jax.Array) -> jax.Array:
  """Class probabilities of uint8 images: a function any release of JAX exports alike."""
  rows = jnp.mean(images.astype(jnp.float32) / 255.0, axis=2)
  return jax.nn.softmax(rows @ WEIGHTS, axis=-1)


def main(folder: str) -> None:
  (batch,) = jax.export.symbolic_shape('N')
  exported = jax.export.export(jax.jit(classify), platforms=('cpu',))(
      jax.ShapeDtypeStruct((batch, 28, 28), jnp.uint8))
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, 'model.jax_export'), 'wb') as f:
    f.write(exported.serialize())
  with open(os.path.join(folder, 'export.json'), 'w', encoding='utf-8') as f:
    json.dump({'files': {'stablehlo': 'model.jax_export'},
               'input': {'name': 'images', 'dtype': 'uint8', 'shape': ['N', 28, 28]},
               'output': {'name': 'probabilities', 'dtype': 'float32', 'shape': ['N', 10]},
               'platforms': ['cpu'], 'written_by': {'model.jax_export': {
                   'jax': jax.__version__,
                   'calling_convention_version': exported.calling_convention_version}}},
              f, indent=1)


if __name__ == '__main__':
  main(sys.argv[1])
