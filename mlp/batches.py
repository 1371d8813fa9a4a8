"""The on-device input pipeline: each epoch's order, each device's share of it, batch gathering."""

from typing import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

# Per-pixel statistics of the MNIST training set, to centre the inputs.
PIXEL_MEAN, PIXEL_STD = 0.1307, 0.3081


def epoch_permutation(seed_key: jax.Array, epoch: jax.Array, num_examples: int) -> jax.Array:
  """One epoch's training order: a function of (seed, epoch) only, so any epoch replays exactly."""
  return jax.random.permutation(jax.random.fold_in(seed_key, epoch), num_examples)


def whole_batches(num_examples: int, batch_size: int) -> int:
  """Batches of batch_size in num_examples, the remainder dropped: a training epoch's steps."""
  return num_examples // batch_size


def shard_steps(order: jax.Array, batch_size: int, num_shards: int,
                shard: jax.Array | int) -> jax.Array:
  """This shard's example indices per step, [steps, batch_size // num_shards]; drops the remainder.

  The global batch of step s is order[s * batch_size:(s + 1) * batch_size], split into num_shards
  equal consecutive pieces; shard k takes piece k, so any device count sees the same global batches.
  """
  steps = whole_batches(order.shape[0], batch_size)
  per_shard = batch_size // num_shards
  table = order[:steps * batch_size].reshape(steps, num_shards, per_shard)
  return jnp.take(table, shard, axis=1)


def eval_steps(num_examples: int, batch_size: int, num_shards: int,
               shard: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Indices and validity mask to score every example once: the last batch padded and masked."""
  steps = -(-num_examples // batch_size)
  positions = jnp.arange(steps * batch_size)
  mask = positions < num_examples
  indices = jnp.minimum(positions, num_examples - 1)
  return (shard_steps(indices, batch_size, num_shards, shard),
          shard_steps(mask, batch_size, num_shards, shard))


def to_unit(images: jax.Array) -> jax.Array:
  """uint8 pixels as float32 in [0, 1]."""
  return images.astype(jnp.float32) / 255.0


def standardize(pixels: jax.Array) -> jax.Array:
  """[0, 1] pixels centred and scaled by MNIST's statistics: what the model takes."""
  return (pixels - PIXEL_MEAN) / PIXEL_STD


def gather(images: ArrayLike, labels: ArrayLike, indices: jax.Array,
           augment: Callable[[jax.Array], jax.Array] | None = None) -> dict[str, jax.Array]:
  """A batch of normalized float32 images [B, 784] and int32 labels [B] from resident uint8 data.

  `augment`, when given, transforms the batch's [0, 1] pixels before they are standardized.
  """
  pixels = to_unit(jnp.take(images, indices, axis=0))
  if augment is not None:
    pixels = augment(pixels)
  return {'image': standardize(pixels), 'label': jnp.take(labels, indices, axis=0)}
