"""The classifier as plain arrays and one description of its arithmetic, which the formats built
from the parameters (the SavedModel's TensorFlow ops, ONNX's operators) each spell in their own
ops: so neither depends on the JAX that wrote it, and both compute as mlp/model.py's MLP does."""

import dataclasses
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from errors import UserError
from mlp import batches
from mlp import steps
from mlp.model import MLP

T = TypeVar('T')  # A tensor of the format being built: a TensorFlow tensor, an ONNX value's name.
PIXEL_RANGE = 255.0  # uint8 pixels to [0, 1], as batches.to_unit scales them.
# What every format takes and gives: uint8 images [N, 28, 28], class probabilities [N, 10].
IMAGE_SHAPE, NUM_CLASSES = (28, 28), 10


@dataclasses.dataclass(frozen=True)
class Layers(Generic[T]):
  """The dense layers' parameters in order, the last giving logits: kernels [in, out] and biases
  [out], or, for members, kernels [M, in, out] and biases [M, 1, out] (their batch broadcast)."""
  kernels: Sequence[T]
  biases: Sequence[T]
  members: bool  # Stacked members: the classifier is the mean of their class probabilities.
  bfloat16: bool  # The run computes in bfloat16: its activations and matmuls are rounded to it.


class Ops(Protocol[T]):
  """The operations the classifier needs, in one format's vocabulary."""

  def flatten(self, images: T) -> T: ...  # uint8 [N, 28, 28] -> float32 [N, 784]
  def subtract(self, x: T, value: float) -> T: ...
  def divide(self, x: T, value: float) -> T: ...
  def matmul(self, x: T, kernel: T) -> T: ...
  def add(self, x: T, bias: T) -> T: ...
  def relu(self, x: T) -> T: ...
  def to_bfloat16(self, x: T) -> T: ...  # float32 rounded to bfloat16's values, kept float32.
  def softmax(self, x: T) -> T: ...  # Over the last axis.
  def mean_of_members(self, x: T) -> T: ...  # Over the first axis, which goes.


def of_state(state: steps.TrainState, form: str) -> Layers[np.ndarray]:
  """The run's layers as float32 numpy arrays (rounded to bfloat16 where the run rounds them);
  UserError for a model whose parameters are more than the MLP's dense layers."""
  model = state.model()
  dense = [*model.hidden, model.out] if isinstance(model, MLP) else []
  found = [layer.bias for layer in dense]
  if not dense or None in found or len(jax.tree.leaves(state.params)) != 2 * len(dense):
    raise UserError(f'--formats={form} builds the MLP of mlp/model.py from its dense layers, and '
                    'this run\'s model has other parameters; pass --formats=stablehlo, which '
                    'exports any model')
  members = state.step.ndim > 0
  bfloat16 = model.compute_dtype == jnp.bfloat16

  def array(value: Any) -> np.ndarray:
    value = jnp.asarray(value, jnp.float32)
    return np.asarray((value.astype(jnp.bfloat16) if bfloat16 else value).astype(jnp.float32))

  kernels = [array(layer.kernel[...]) for layer in dense]
  biases = [array(bias[...])[:, None, :] if members else array(bias[...])
            for bias in found if bias is not None]
  return Layers(kernels, biases, members, bfloat16)


def probabilities(ops: Ops[T], layers: Layers[T], images: T) -> T:
  """Class probabilities [N, 10] of uint8 images [N, 28, 28]: mlp/inference.py's classify."""
  rounded = ops.to_bfloat16 if layers.bfloat16 else (lambda x: x)
  x = ops.divide(ops.subtract(ops.divide(ops.flatten(images), PIXEL_RANGE), batches.PIXEL_MEAN),
                 batches.PIXEL_STD)
  last = len(layers.kernels) - 1
  for index, (kernel, bias) in enumerate(zip(layers.kernels, layers.biases)):
    x = rounded(ops.add(rounded(ops.matmul(rounded(x), kernel)), bias))
    x = x if index == last else ops.relu(x)
  x = ops.softmax(x)  # Of float32 logits, as the model casts them.
  return ops.mean_of_members(x) if layers.members else x
