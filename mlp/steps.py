"""Pure step functions over an explicit train state: easy to jit, pmap or scan."""

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from mlp.model import MLP

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
TrainState = train_state.TrainState


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
  """The two keys a run derives from its seed: one initializes the model, one drives every epoch."""
  init_key, run_key = jax.random.split(jax.random.key(seed))
  return init_key, run_key


def create_train_state(model: MLP, tx: optax.GradientTransformation, rng: jax.Array) -> TrainState:
  """Initial parameters from `rng`, and the optimizer's state for them: step 0 of a run."""
  params = model.init(rng, jnp.zeros((1, 784), jnp.float32))['params']
  return TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def batch_metrics(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> Metrics:
  """Sums (not means) of loss and correct predictions, so batches and devices add up exactly."""
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = jnp.argmax(logits, axis=-1) == labels
  if mask is None:
    mask = jnp.ones_like(labels, dtype=bool)
  return {'loss': jnp.sum(jnp.where(mask, losses, 0.0)),
          'correct': jnp.sum(correct & mask, dtype=jnp.int32),
          'count': jnp.sum(mask, dtype=jnp.int32)}


def train_step(state: TrainState, batch: Batch, dropout_keys: jax.Array,
               axis_name: str | None = None) -> tuple[TrainState, Metrics]:
  """One optimizer update on the batch's mean loss; gradients are averaged over `axis_name`.

  `dropout_keys` holds one key per example: an example's masks do not depend on its batch or device.
  """

  def loss_fn(params):
    # Mapped over examples so each draws from its own key; the matmuls stay whole-batch products.
    apply = lambda image, key: state.apply_fn({'params': params}, image[None], train=True,
                                              rngs={'dropout': key})[0]
    logits = jax.vmap(apply)(batch['image'], dropout_keys)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'])
    return jnp.mean(losses), logits

  grads, logits = jax.grad(loss_fn, has_aux=True)(state.params)
  if axis_name is not None:
    grads = jax.lax.pmean(grads, axis_name)
  with jax.named_scope('optimizer'):  # Labels the update's ops in profiles and XLA dumps.
    state = state.apply_gradients(grads=grads)
  return state, batch_metrics(logits, batch['label'])


def predict_step(state: TrainState, images: jax.Array) -> jax.Array:
  """Class logits of normalized images, as evaluation computes them (no dropout)."""
  return state.apply_fn({'params': state.params}, images, train=False)


def eval_step(state: TrainState, batch: Batch, mask: jax.Array) -> Metrics:
  """Metric sums over the batch's valid (unpadded) examples."""
  return batch_metrics(predict_step(state, batch['image']), batch['label'], mask)


def summarize(sums: dict[str, float]) -> dict[str, float]:
  """Mean loss and accuracy from metric sums."""
  count = max(int(sums['count']), 1)
  return {'loss': float(sums['loss']) / count, 'accuracy': int(sums['correct']) / count}


