"""The trained model as a classifier of MNIST's own pixels, for serving outside the trainer."""

import jax

from mlp import batches
from mlp import steps


def classify(state: steps.TrainState, images: jax.Array) -> jax.Array:
  """float32 class probabilities [N, 10] of uint8 images [N, 28, 28] or [N, 784], any N: for
  members stacked [M], their mean (the ensemble's).

  The whole batch in one forward pass, normalized as `batches.gather` does for evaluation.
  """
  pixels = batches.standardize(batches.to_unit(images))
  return jax.nn.softmax(steps.ensemble_logits(state, pixels), axis=-1)
