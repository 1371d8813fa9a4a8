"""Each config field that changes the numbers reaches them: a field the trainer ignored fails here.

The trainer's own first step is checked against one computed here from the recipe's parts, and the
optimizer, schedule and model the config builds against their formulas, on tiny models and data.
"""

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from data.mnist import Examples, load_splits
from mlp import augment, batches, passes, randomness, steps
from mlp.model import MLP
from trainer.plan import epoch_spec, recipe_of, resolve
from trainer.programs import compile_programs
from tests.conftest import make_config

# A distortion with every range away from its default.
DISTORTED = dict(rotation=12.0, scale=0.1, shear=8.0, translate=1.5, elastic_alpha=20.0,
                 elastic_sigma=5.0)
# One step of plain SGD on one batch of 64 images, so the trainer's update is -learning_rate times
# a gradient this file computes by hand. Every field that shapes the step is away from its default
# (dropout too: off, where the default is 0.2), so a trainer that used the default instead of the
# config's value takes another step. The elastic field is left to the spec's test: it compiles
# slowly (a random field per image), and goes where the other ranges go.
RECIPE = dict(seed=3, num_epochs=1, batch_size=64, optimizer='sgd', learning_rate=0.5,
              schedule='constant', warmup_epochs=0, label_smoothing=0.1,
              model__hidden_sizes=(24, 16), model__dropout_rate=0.0, data__max_shift=2,
              data__train_split='test[:64]', data__eval_split='test[64:74]',
              **{f'data__distort__{name}': value for name, value in DISTORTED.items()
                 if not name.startswith('elastic')})
TOLERANCE = 1e-4  # Relative: rounding in other orders, far below what any of the fields changes.


@dataclasses.dataclass(frozen=True)
class FirstStep:
  """The trainer's first epoch, of one step: the states around it, its metrics, its images."""
  before: steps.TrainState
  after: steps.TrainState
  metrics: dict[str, float]
  train: Examples


@pytest.fixture(scope='module')
def first_step(mnist_dir) -> FirstStep:
  """Epoch 1 of RECIPE as the trainer compiles and runs it."""
  config = recipe()
  train, evaluation = load_splits(config.data, config.data.train_split, config.data.eval_split)
  epochs = compile_programs(resolve(config), train, evaluation)
  state = epochs.fresh_state()
  before = jax.device_get(state)  # The epoch consumes (donates) the state it starts from.
  after, metrics = epochs.train_epoch(state, 1)
  return FirstStep(before, jax.device_get(after), metrics, train)


def recipe() -> ml_collections.ConfigDict:
  return make_config(**RECIPE)


def first_batch(config: ml_collections.ConfigDict,
                train: Examples) -> tuple[steps.Batch, jax.Array]:
  """The first batch, augmented as the config says, and its dropout keys, from the seed."""
  distortion = augment.Distortion(**config.data.distort)
  run_key = randomness.run_keys(config.seed)[1]

  def make(images, labels):
    order, dropout_key = passes.epoch_plan(run_key, jnp.int32(1), len(labels), config.batch_size)
    augmented = augment.augmenter(run_key, jnp.int32(1), order[0], config.data.max_shift,
                                  distortion)
    batch = batches.gather(images, labels, order[0], augmented)
    return batch, randomness.example_keys(dropout_key, 0, order[0])

  return jax.jit(make)(train.images, train.labels)


def loss_function(config: ml_collections.ConfigDict) -> Callable[..., tuple[jax.Array, jax.Array]]:
  """The mean cross-entropy against `targets` of the MLP the config describes (its widths and
  dropout), each example with its dropout key; and the logits."""
  graphdef = nnx.split(nnx.eval_shape(lambda: MLP(
      tuple(config.model.hidden_sizes), dropout_rate=config.model.dropout_rate,
      rngs=nnx.Rngs(params=0))), nnx.Param)[0]

  def loss(params, images, keys, targets):
    model = nnx.merge(graphdef, params)
    logits = jax.vmap(lambda image, key: model(image[None], key)[0])(images, keys)
    return jnp.mean(optax.softmax_cross_entropy(logits, targets)), logits

  return loss


@dataclasses.dataclass(frozen=True)
class ByHand:
  """RECIPE's first step computed here: its batch, and for a label smoothing its update (and the
  batch's logits)."""
  batch: steps.Batch
  update: Callable[[float], tuple[nnx.State, jax.Array]]


@pytest.fixture(scope='module')
def by_hand(first_step) -> ByHand:
  """The update is -learning_rate times the gradient of the mean cross-entropy against
  optax.smooth_labels targets, on the config's first batch."""
  config = recipe()
  batch, keys = first_batch(config, first_step.train)
  gradient = jax.jit(jax.grad(loss_function(config), has_aux=True))

  def update(smoothing: float) -> tuple[nnx.State, jax.Array]:
    targets = optax.smooth_labels(jax.nn.one_hot(batch['label'], 10), smoothing)
    grads, logits = gradient(first_step.before.params, batch['image'], keys, targets)
    return jax.tree.map(lambda g: -config.learning_rate * g, grads), logits

  return ByHand(batch, update)


def gap(step: FirstStep, expected: nnx.State) -> float:
  """The largest difference of the trainer's update from `expected`, relative to its largest."""
  pairs = list(zip(jax.tree.leaves(step.after.params), jax.tree.leaves(step.before.params),
                   jax.tree.leaves(expected), strict=True))
  return max(float(np.max(np.abs(after - before - e))) for after, before, e in pairs) / max(
      float(np.max(np.abs(e))) for *_, e in pairs)


def test_label_smoothing_reaches_the_loss_and_gradients_of_the_trainers_step(first_step, by_hand):
  smoothed, logits = by_hand.update(0.1)
  assert gap(first_step, smoothed) < TOLERANCE
  assert gap(first_step, by_hand.update(0.0)[0]) > 100 * TOLERANCE
  # What the step reports is the plain cross-entropy of its batch, whatever the smoothing.
  plain = optax.softmax_cross_entropy_with_integer_labels(logits, by_hand.batch['label'])
  assert first_step.metrics['loss'] == pytest.approx(float(jnp.mean(plain)), rel=1e-5)


def test_the_trainers_step_takes_the_configs_widths_dropout_images_and_seed(first_step, by_hand):
  """The update by hand uses the config's widths, dropout, augmentation and the seed's keys: a
  trainer that ignored any of them takes another step."""
  assert gap(first_step, by_hand.update(0.1)[0]) < TOLERANCE
  shapes = [x.shape for x in jax.tree.leaves(first_step.before.params) if x.ndim == 2]
  assert shapes == [(784, 24), (24, 16), (16, 10)]
  assert int(first_step.after.step) == 1  # A batch of 64: one step over the 64 images.


def test_the_epoch_spec_carries_each_field_that_shapes_an_epoch():
  defaults = dataclasses.asdict(augment.Distortion())
  assert all(value != defaults[name] for name, value in DISTORTED.items())
  config = make_config(batch_size=64, label_smoothing=0.1, data__max_shift=2,
                       **{f'data__distort__{name}': value for name, value in DISTORTED.items()})
  assert epoch_spec(config, (), 'data') == passes.EpochSpec(64, 2, augment.Distortion(**DISTORTED),
                                                       'data', 0.1)


# Every optimizer setting away from its default; the updates of params P for gradients G.
OPTIMIZER = dict(learning_rate=0.1, momentum=0.5, weight_decay=0.2, schedule='constant',
                 warmup_epochs=0)
P, G = np.array([1.0, -2.0, 3.0], np.float32), np.array([0.5, 0.25, -1.0], np.float32)
FIRST_UPDATES = {  # By their formulas: weight decay is AdamW's alone.
    'sgd': -0.1 * G,
    'momentum': -0.1 * (1 + 0.5) * G,  # Nesterov: the gradient plus the momentum of its trace.
    'adam': -0.1 * np.sign(G),  # Both moments are the gradient's after one step.
    'adamw': -0.1 * (np.sign(G) + 0.2 * P),
}


@pytest.mark.parametrize('name', sorted(FIRST_UPDATES))
def test_each_optimizer_takes_its_first_step_with_the_configs_settings(name):
  tx = recipe_of(make_config(optimizer=name, **OPTIMIZER), (), steps_per_epoch=10).optimizer
  update, _ = jax.jit(tx.update)(G, tx.init(P), P)
  # 1e-4: Adam's bias correction, 1 - 0.999 in float32.
  np.testing.assert_allclose(update, FIRST_UPDATES[name], rtol=1e-4)


def expected_rate(step: int, schedule: str, warmup: int, total: int) -> float:
  """0.1 peak: linear warmup from 0, then constant or a cosine to 0 at the last step."""
  if step < warmup:
    return 0.1 * step / warmup
  if schedule == 'constant':
    return 0.1
  return 0.1 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


@pytest.mark.parametrize('schedule, warmup_epochs', [('cosine', 1.5), ('constant', 2.0),
                                                     ('cosine', 0.0)])
def test_the_learning_rate_follows_the_configs_peak_warmup_schedule_and_length(schedule,
                                                                               warmup_epochs):
  config = make_config(learning_rate=0.1, schedule=schedule, warmup_epochs=warmup_epochs,
                       num_epochs=4)
  rates = jax.jit(recipe_of(config, (), steps_per_epoch=10).schedule)(jnp.arange(41))
  expected = [expected_rate(s, schedule, round(10 * warmup_epochs), 40) for s in range(41)]
  np.testing.assert_allclose(rates, expected, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize('dtype, computed', [('float32', jnp.float32), ('bfloat16', jnp.bfloat16)])
def test_the_configs_dtype_is_what_the_models_matmuls_compute_in(dtype, computed):
  make_model = recipe_of(make_config(dtype=dtype, model__hidden_sizes=(32,)), (), 1).model
  graphdef, params = nnx.split(nnx.eval_shape(lambda: make_model(rngs=nnx.Rngs(params=0))),
                               nnx.Param)
  jaxpr = jax.make_jaxpr(lambda p: nnx.merge(graphdef, p)(jnp.ones((2, 784))))(params)
  dots = [e.outvars[0].aval.dtype for e in jaxpr.eqns if e.primitive.name == 'dot_general']
  assert dots == [computed, computed]
  assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
