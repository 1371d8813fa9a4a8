"""The ONNX model: the classifier in ONNX's standard operators (MatMul, Add, Relu, Softmax), built
with `onnx.helper` from the parameters, which it holds as initializers.

Opset 17 and IR version 8 (ONNX 1.12, 2022): what onnxruntime 1.13 and later read, in Python or
in the browser (onnxruntime-web), and other runtimes of opset 17. A symbolic batch `N` in and out.
"""

import itertools
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from serving import layers as layers_lib
from serving.layers import IMAGE_SHAPE, NUM_CLASSES

OPSET, IR_VERSION = 17, 8


class OnnxOps:
  """layers_lib.Ops as ONNX nodes: each takes and returns the names of values in the graph."""

  def __init__(self) -> None:
    self.nodes: list[onnx.NodeProto] = []
    self.initializers: list[onnx.TensorProto] = []
    self._names = (f'v{n}' for n in itertools.count())

  def node(self, op: str, *inputs: str, **attributes: Any) -> str:
    """Appends one node; returns the name of its output."""
    output = next(self._names)
    self.nodes.append(helper.make_node(op, list(inputs), [output], **attributes))
    return output

  def constant(self, value: np.ndarray | float) -> str:
    """An initializer holding `value` (float32, or int64 for shapes); returns its name."""
    name = next(self._names)
    array = np.asarray(value, np.int64 if np.asarray(value).dtype.kind == 'i' else np.float32)
    self.initializers.append(numpy_helper.from_array(array, name))
    return name

  def flatten(self, images: str) -> str:
    pixels = self.node('Cast', images, to=onnx.TensorProto.FLOAT)
    return self.node('Reshape', pixels, self.constant(np.array([-1, np.prod(IMAGE_SHAPE)])))

  def subtract(self, x: str, value: float) -> str:
    return self.node('Sub', x, self.constant(value))

  def divide(self, x: str, value: float) -> str:
    return self.node('Div', x, self.constant(value))

  def matmul(self, x: str, kernel: str) -> str:
    return self.node('MatMul', x, kernel)  # numpy's matmul: [N, in] by [M, in, out] broadcasts.

  def add(self, x: str, bias: str) -> str:
    return self.node('Add', x, bias)

  def relu(self, x: str) -> str:
    return self.node('Relu', x)

  def to_bfloat16(self, x: str) -> str:
    return self.node('Cast', self.node('Cast', x, to=onnx.TensorProto.BFLOAT16),
                     to=onnx.TensorProto.FLOAT)

  def softmax(self, x: str) -> str:
    return self.node('Softmax', x, axis=-1)

  def mean_of_members(self, x: str) -> str:
    return self.node('ReduceMean', x, axes=[0], keepdims=0)


def model(layers: layers_lib.Layers[np.ndarray], names: tuple[str, str],
          doc: str) -> onnx.ModelProto:
  """The model mapping `names[0]` (uint8 images [N, 28, 28]) to `names[1]` (float32 probabilities
  [N, 10]), checked by onnx.checker with its shape inference."""
  ops = OnnxOps()
  held = layers_lib.Layers([ops.constant(k) for k in layers.kernels],
                           [ops.constant(b) for b in layers.biases], layers.members,
                           layers.bfloat16)
  result = layers_lib.probabilities(ops, held, names[0])
  ops.nodes.append(helper.make_node('Identity', [result], [names[1]]))
  graph = helper.make_graph(
      ops.nodes, 'mnist_classifier',
      [helper.make_tensor_value_info(names[0], onnx.TensorProto.UINT8, ['N', *IMAGE_SHAPE])],
      [helper.make_tensor_value_info(names[1], onnx.TensorProto.FLOAT, ['N', NUM_CLASSES])],
      ops.initializers)
  built = helper.make_model(graph, opset_imports=[helper.make_opsetid('', OPSET)],
                            ir_version=IR_VERSION, producer_name='export.py', doc_string=doc)
  onnx.checker.check_model(built, full_check=True)
  return built
