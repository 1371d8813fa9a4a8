"""The SavedModel: the classifier in TensorFlow's own ops, its parameters TensorFlow variables.

Not jax2tf's one XlaCallModule op: TensorFlow runs only the StableHLO of the JAX releases it was
built beside, and TensorFlow 2.21 cannot run JAX 0.12's with a symbolic batch (docs/export.md).
Ops such as MatMul and Softmax run in any TensorFlow, TF Serving and converter of recent years.
"""

import dataclasses
import re

import numpy as np
import tensorflow as tf

from native_logs import native_stderr_muted
from serving import layers as layers_lib


class TensorFlowOps:
  """layers_lib.Ops in TensorFlow."""

  def flatten(self, images: tf.Tensor) -> tf.Tensor:
    return tf.reshape(tf.cast(images, tf.float32), (-1, int(np.prod(layers_lib.IMAGE_SHAPE))))

  def subtract(self, x: tf.Tensor, value: float) -> tf.Tensor:
    return x - tf.constant(value, tf.float32)

  def divide(self, x: tf.Tensor, value: float) -> tf.Tensor:
    return x / tf.constant(value, tf.float32)

  def matmul(self, x: tf.Tensor, kernel: tf.Tensor) -> tf.Tensor:
    return tf.linalg.matmul(x, kernel)  # [N, in] by [M, in, out]: broadcast to [M, N, out].

  def add(self, x: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    return x + bias

  def relu(self, x: tf.Tensor) -> tf.Tensor:
    return tf.nn.relu(x)

  def to_bfloat16(self, x: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.cast(x, tf.bfloat16), tf.float32)

  def softmax(self, x: tf.Tensor) -> tf.Tensor:
    return tf.nn.softmax(x, axis=-1)

  def mean_of_members(self, x: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(x, axis=0)


def save(layers: layers_lib.Layers[np.ndarray], path: str, names: tuple[str, str, str]) -> None:
  """A SavedModel at `path` whose signature `names[2]` maps `names[0]` (uint8 images [N, 28, 28])
  to `names[1]` (float32 probabilities [N, 10])."""
  image_name, output_name, signature = names
  module = tf.Module()
  module.kernels = [tf.Variable(k, trainable=False, name='kernel') for k in layers.kernels]
  module.biases = [tf.Variable(b, trainable=False, name='bias') for b in layers.biases]
  held = dataclasses.replace(layers, kernels=module.kernels, biases=module.biases)
  serve = tf.function(
      lambda images: {output_name: layers_lib.probabilities(TensorFlowOps(), held, images)},
      autograph=False,
      input_signature=[tf.TensorSpec((None, *layers_lib.IMAGE_SHAPE), tf.uint8, name=image_name)])
  module.serve = serve  # The signature takes the function itself: one trace serves both.
  try:
    with native_stderr_muted():  # Its C++ logs a failed write of the variables at length.
      tf.saved_model.save(module, path, signatures={signature: serve})
  except tf.errors.OpError as error:  # 'PATH; No space left on device', then ' [Op:SaveV2]'.
    reason = re.sub(r' \[Op:\w+\]$', '', error.message.rsplit('; ', 1)[-1])
    raise OSError(reason) from error  # OutFolder words the line.
