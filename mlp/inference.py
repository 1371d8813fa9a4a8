"""The trained model as a classifier of MNIST's own uint8 pixels: the forward pass of every
prediction, in evaluation's batches (mlp/passes.py) or whole, for serving."""

import jax

from mlp import batches
from mlp import steps


def logits(state: steps.TrainState, images: jax.Array) -> jax.Array:
  """Logits [N, 10] of uint8 images [N, 28, 28] or [N, 784] (stacked members: their ensemble's),
  normalized as `batches.gather` does for evaluation: the one forward pass of predictions."""
  return steps.ensemble_logits(state, batches.standardize(batches.to_unit(images)))


def classify(state: steps.TrainState, images: jax.Array) -> jax.Array:
  """float32 class probabilities [N, 10] of uint8 images, any N, the whole batch in one pass: for
  members stacked [M], their mean (the ensemble's)."""
  return jax.nn.softmax(logits(state, images), axis=-1)
