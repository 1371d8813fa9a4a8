"""Pure step functions over an explicit train state: easy to jit, pmap or scan."""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from mlp.model import MLP

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


class Hyper(NamedTuple):
  """A step's hyperparameters outside the optimizer: numbers fixed when the step compiles, or, for
  the members of a sweep, each member's own, traced."""
  label_smoothing: float | jax.Array = 0.0  # The share of each label's mass spread over the ten.
  dropout_rate: jax.Array | None = None  # None: the model's own rate.


class TrainState(nnx.TrainState):
  """NNX's functional form of a model in training (flax's own nnx.TrainState): arrays to jit, scan,
  shard and checkpoint, and the model rebuilt from them.

  The step count, parameters and optimizer state are the pytree; how to rebuild the model from its
  parameters (the graphdef) and the optimizer are static.
  """

  def model(self, params: nnx.State | None = None) -> MLP:
    """The model with these parameters (or `params`), merged inside the traced function."""
    return nnx.merge(self.graphdef, self.params if params is None else params)


def create_train_state(make_model: Callable[..., MLP], tx: optax.GradientTransformation,
                       rng: jax.Array) -> TrainState:
  """Initial parameters from `rng`, and the optimizer's state for them: step 0 of a run."""
  graphdef, params = nnx.split(make_model(rngs=nnx.Rngs(params=rng)), nnx.Param)
  return TrainState.create(graphdef, params=params, tx=tx)


def batch_metrics(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> Metrics:
  """Sums (not means) of loss and correct predictions, so batches and devices add up exactly."""
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = jnp.argmax(logits, axis=-1) == labels
  if mask is None:
    mask = jnp.ones_like(labels, dtype=bool)
  return {'loss': jnp.sum(jnp.where(mask, losses, 0.0)),
          'correct': jnp.sum(correct & mask, dtype=jnp.int32),
          'count': jnp.sum(mask, dtype=jnp.int32)}


def smoothed_losses(logits: jax.Array, labels: jax.Array,
                    smoothing: float | jax.Array) -> jax.Array:
  """Cross-entropy against labels keeping 1 - `smoothing` of their mass, the rest spread evenly."""
  if isinstance(smoothing, (int, float)) and not smoothing:  # The integer-label form: the same
    # bits as before smoothing was a choice.
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), smoothing)
  return optax.softmax_cross_entropy(logits, targets)


def train_step(state: TrainState, batch: Batch, dropout_keys: jax.Array,
               axis_name: str | None = None,
               hyper: Hyper = Hyper()) -> tuple[TrainState, Metrics]:
  """One optimizer update on the batch's mean loss; gradients are averaged over `axis_name`.

  `dropout_keys` holds one key per example: an example's masks do not depend on its batch or device.
  Metrics report the plain cross-entropy, whatever the smoothing.
  """

  def loss_fn(params):
    model = state.model(params)
    # Mapped over examples so each draws from its own key; the matmuls stay whole-batch products.
    logits = jax.vmap(lambda image, key: model(image[None], key, hyper.dropout_rate)[0])(
        batch['image'], dropout_keys)
    return jnp.mean(smoothed_losses(logits, batch['label'], hyper.label_smoothing)), logits

  grads, logits = jax.grad(loss_fn, has_aux=True)(state.params)
  if axis_name is not None:
    grads = jax.lax.pmean(grads, axis_name)
  with jax.named_scope('optimizer'):  # Labels the update's ops in profiles and XLA dumps.
    state = state.apply_gradients(grads=grads)
  return state, batch_metrics(logits, batch['label'])


def predict_step(state: TrainState, images: jax.Array) -> jax.Array:
  """Class logits of normalized images, as evaluation computes them (no dropout)."""
  return state.model()(images)


def ensemble_logits(state: TrainState, images: jax.Array,
                    member_axis: str | None = None) -> jax.Array:
  """A lone model's logits; for members stacked [M] (a vector step), the log of their mean class
  probabilities: the ensemble's, which softmax and argmax read as they read logits. With the
  members split over `member_axis`, the mean of every shard's."""
  if state.step.ndim == 0:
    return predict_step(state, images)
  members = jax.vmap(predict_step, in_axes=(0, None))(state, images)
  if member_axis is None:
    return jnp.log(jnp.mean(jax.nn.softmax(members, axis=-1), axis=0))
  total = jax.lax.psum(jnp.sum(jax.nn.softmax(members, axis=-1), axis=0), member_axis)
  return jnp.log(total / (members.shape[0] * jax.lax.axis_size(member_axis)))


def eval_step(state: TrainState, batch: Batch, mask: jax.Array) -> Metrics:
  """Metric sums over the batch's valid (unpadded) examples."""
  return batch_metrics(predict_step(state, batch['image']), batch['label'], mask)


def summarize(sums: dict[str, float]) -> dict[str, float]:
  """Mean loss and accuracy from metric sums."""
  count = max(int(sums['count']), 1)
  return {'loss': float(sums['loss']) / count, 'accuracy': int(sums['correct']) / count}


