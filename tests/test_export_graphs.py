"""The SavedModel and ONNX graphs that export.py builds from a model's parameters compute what the
model computes: members' ensemble, bfloat16 runs and a model without hidden layers included."""

import functools
import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from errors import UserError
from mlp import inference
from mlp import steps
from mlp.model import MLP
from serving import layers
from tests.conftest import override_flags, run_train
from tests.test_export import export, load_in_a_fresh_python

HAS_TENSORFLOW = importlib.util.find_spec('tensorflow') is not None  # Not on Python 3.14 yet.
HAS_ONNX = all(importlib.util.find_spec(name) for name in ('onnx', 'onnxruntime'))
NAMES = ('images', 'probabilities', 'serving_default')
# (hidden sizes, dtype, members); the largest difference from JAX's probabilities allowed. The
# bfloat16 graphs round where the model rounds (1e-7 from it here), but another order of a sum can
# round a value to the next bfloat16, 2**-8 of it, and move the argmax of a near tie.
MODELS = {'one model': ((64, 32), 'float32', 1), 'three members': ((64, 32), 'float32', 3),
          'no hidden layer': ((), 'float32', 1), 'bfloat16': ((64, 32), 'bfloat16', 1),
          'bfloat16 members': ((48,), 'bfloat16', 2)}
TOLERANCE = {'float32': 1e-6, 'bfloat16': 1e-3}


def state_of(hidden: tuple[int, ...], dtype: str, members: int) -> steps.TrainState:
  """A model's initial state (members stacked [M], as a run of num_models > 1 keeps them)."""
  create = functools.partial(steps.create_train_state, functools.partial(MLP, hidden, dtype=dtype),
                             optax.sgd(0.1))
  key = jax.random.key(0)
  return create(key) if members == 1 else jax.vmap(create)(jax.random.split(key, members))


def images_and_expected(state: steps.TrainState) -> tuple[np.ndarray, np.ndarray]:
  """Random uint8 images [64, 28, 28] and the model's probabilities of them (mlp/inference.py)."""
  images = np.random.default_rng(1).integers(0, 256, (64, 28, 28), dtype=np.uint8)
  return images, np.asarray(inference.classify(state, jnp.asarray(images)))


def run_onnx(state: steps.TrainState, images: np.ndarray) -> np.ndarray:
  """The ONNX model of the state, checked, run by onnxruntime."""
  import onnxruntime  # pylint: disable=g-import-not-at-top
  from serving import onnx_graph  # pylint: disable=g-import-not-at-top
  model = onnx_graph.model(layers.of_state(state, 'onnx'), NAMES[:2], 'test')
  session = onnxruntime.InferenceSession(model.SerializeToString(),
                                         providers=['CPUExecutionProvider'])
  return session.run([NAMES[1]], {NAMES[0]: images})[0]


def run_saved_model(state: steps.TrainState, images: np.ndarray, folder) -> np.ndarray:
  """The SavedModel of the state, saved and loaded again, run by TensorFlow."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from serving import tensorflow_graph  # pylint: disable=g-import-not-at-top
  tensorflow_graph.save(layers.of_state(state, 'savedmodel'), str(folder), NAMES)
  serve = tf.saved_model.load(str(folder)).signatures[NAMES[2]]
  return serve(**{NAMES[0]: tf.constant(images)})[NAMES[1]].numpy()


RUNNERS = {'onnx': (HAS_ONNX, lambda state, images, folder: run_onnx(state, images)),
           'savedmodel': (HAS_TENSORFLOW, run_saved_model)}


@pytest.mark.parametrize('form', RUNNERS)
@pytest.mark.parametrize('case', MODELS)
def test_each_graph_gives_the_models_probabilities(form, case, tmp_path):
  installed, run_graph = RUNNERS[form]
  if not installed:
    pytest.skip(f'the extra of --formats={form} is not installed here')
  hidden, dtype, members = MODELS[case]
  state = state_of(hidden, dtype, members)
  images, expected = images_and_expected(state)
  got = run_graph(state, images, tmp_path / 'saved_model')
  assert got.shape == (64, 10) and got.dtype == np.float32
  np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE[dtype])
  if dtype == 'float32':
    np.testing.assert_array_equal(got.argmax(axis=1), expected.argmax(axis=1))
  assert len(set(expected.argmax(axis=1))) > 1  # Not one class for all: the weights matter.


@pytest.mark.skipif(not HAS_ONNX, reason='the ONNX extra is not installed here')
def test_the_onnx_model_is_standard_operators_with_a_symbolic_batch():
  import onnx  # pylint: disable=g-import-not-at-top
  from serving import onnx_graph  # pylint: disable=g-import-not-at-top
  model = onnx_graph.model(layers.of_state(state_of((64, 32), 'float32', 3), 'onnx'), NAMES[:2],
                           'test')
  onnx.checker.check_model(model, full_check=True)
  assert (model.ir_version, [(o.domain, o.version) for o in model.opset_import]) == (8, [('', 17)])
  assert {node.op_type for node in model.graph.node} == {
      'Cast', 'Reshape', 'Div', 'Sub', 'MatMul', 'Add', 'Relu', 'Softmax', 'ReduceMean',
      'Identity'}
  (given,), (taken,) = model.graph.input, model.graph.output
  dims = lambda value: [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
  assert (given.name, given.type.tensor_type.elem_type, dims(given)) == (
      'images', onnx.TensorProto.UINT8, ['N', 28, 28])
  assert (taken.name, taken.type.tensor_type.elem_type, dims(taken)) == (
      'probabilities', onnx.TensorProto.FLOAT, ['N', 10])


def test_a_model_other_than_the_mlp_is_refused_rather_than_built_wrong():
  """A graph built from parameters holds only the layers it knows: another model would be exported
  wrong without a word."""
  state = steps.create_train_state(functools.partial(nnx.Linear, 784, 10), optax.sgd(0.1),
                                   jax.random.key(0))
  with pytest.raises(UserError, match=r'^--formats=onnx builds the MLP of mlp/model.py from its '
                     'dense layers, and this run\'s model has other parameters; pass '
                     '--formats=stablehlo, which exports any model$'):
    layers.of_state(state, 'onnx')


@pytest.mark.slow  # Trains 2 members, exports them and loads 3 formats in fresh processes: ~30 s.
@pytest.mark.skipif(not (HAS_ONNX and HAS_TENSORFLOW), reason='needs both extras')
def test_members_exported_in_every_format_agree_with_the_stablehlo(tmp_path):
  workdir, out = tmp_path / 'run', tmp_path / 'model'
  trained = run_train('--config=configs/quick.py', f'--workdir={workdir}', *override_flags(
      num_epochs=1, num_models=2, model__hidden_sizes='(64,)', data__train_split='train[:1000]',
      data__eval_split='test[:100]'))
  assert trained.returncode == 0, trained.stderr
  written = export(f'--workdir={workdir}', f'--out={out}', '--formats=stablehlo,savedmodel,onnx')
  assert written.returncode == 0, written.stderr
  assert json.loads((out / 'export.json').read_text())['models'] == 2
  probabilities = {}
  for form in ('stablehlo', 'savedmodel', 'onnx'):
    loaded = load_in_a_fresh_python(out, form, tmp_path, '--batch_sizes=1,37', '--count=200',
                                    f'--save={tmp_path / form}.npz')
    assert loaded.returncode == 0, loaded.stderr
    probabilities[form] = np.load(tmp_path / f'{form}.npz')['batch37']
  for form in ('savedmodel', 'onnx'):
    np.testing.assert_allclose(probabilities[form], probabilities['stablehlo'], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(probabilities[form].argmax(1),
                                  probabilities['stablehlo'].argmax(1))

