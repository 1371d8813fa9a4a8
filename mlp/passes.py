"""Passes over a split as one compiled program each: `lax.scan` of the step over batches gathered
on device (a training epoch), of scoring (an evaluation), of the forward pass (predictions)."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from mlp import augment
from mlp import batches
from mlp import inference
from mlp import randomness
from mlp import steps


Data = tuple[jax.Array, jax.Array]  # A split's uint8 images [N, 784] and int32 labels [N].


# Per member of a sweep, a value each: tuples in a spec, traced scalars within a member's epoch.
PerMember = tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class EpochSpec:
  """How an epoch trains, fixed when it compiles: its batches, augmentation and device axis; and
  the loss's and dropout's hyperparameters, of members of a sweep one each (tuples)."""
  batch_size: int  # Global: device k of n takes piece k of every batch.
  max_shift: int = 0  # Pixels each way; 0: off.
  distortion: augment.Distortion = augment.Distortion()
  axis_name: str | None = None  # The mapped axis under shard_map or pmap; None on one device.
  label_smoothing: float | PerMember | jax.Array = 0.0  # The share of each label's mass spread.
  dropout_rate: PerMember | jax.Array | None = None  # None: the model's own rate.
  # The mapped axis the members are split over (each device holds a shard of them); None: all.
  member_axis: str | None = None

  def per_member(self) -> dict[str, jax.Array]:
    """The fields that members set each their own, as arrays [M]; split over `member_axis`, this
    device's shard of them."""
    return {name: member_shard(jnp.asarray(value, jnp.float32), self.member_axis)
            for name, value in (('label_smoothing', self.label_smoothing),
                                ('dropout_rate', self.dropout_rate)) if isinstance(value, tuple)}


def member_shard(values: jax.Array, member_axis: str | None) -> jax.Array:
  """This device's shard of values [M] of every member, along `member_axis`; all of them on None."""
  if member_axis is None:
    return values
  size = values.shape[0] // jax.lax.axis_size(member_axis)
  return jax.lax.dynamic_slice_in_dim(values, jax.lax.axis_index(member_axis) * size, size)


def _shard(axis_name: str | None) -> tuple[jax.Array, int]:
  """This device's index along the data axis, and the axis size: (0, 1) outside any mapping."""
  if axis_name is None:
    return jnp.int32(0), 1
  return jax.lax.axis_index(axis_name), jax.lax.axis_size(axis_name)


def _total(sums: steps.Metrics, axis_name: str | None) -> steps.Metrics:
  sums = jax.tree.map(lambda x: jnp.sum(x, axis=0), sums)
  return jax.lax.psum(sums, axis_name) if axis_name is not None else sums


def epoch_plan(seed_key: jax.Array, epoch: jax.Array, num_examples: int, batch_size: int,
               shard: tuple[jax.Array | int, int] = (0, 1)) -> tuple[jax.Array, jax.Array]:
  """An epoch's randomness, (this shard's example indices per step, dropout key), from the seed.

  `shard` is (this shard, the number of shards). Any loop that follows the plan with `train_batch`
  trains exactly as `train_epoch` does.
  """
  order_key = jax.random.fold_in(seed_key, randomness.ORDER)
  dropout_key = jax.random.fold_in(seed_key, randomness.DROPOUT)
  order = batches.epoch_permutation(order_key, epoch, num_examples)
  return batches.shard_steps(order, batch_size, shard[1], shard[0]), dropout_key


def train_batch(state: steps.TrainState, batch: steps.Batch, indices: jax.Array,
                dropout_key: jax.Array,
                spec: EpochSpec) -> tuple[steps.TrainState, steps.Metrics]:
  """One step on the examples `indices` names, whose masks follow (key, global step, example): any
  number of devices and processes draws the same masks."""
  assert not isinstance(spec.label_smoothing, tuple) and not isinstance(spec.dropout_rate, tuple), (
      "a member's values: train_members picks them")
  return steps.train_step(state, batch, randomness.example_keys(dropout_key, state.step, indices),
                          spec.axis_name, steps.Hyper(spec.label_smoothing, spec.dropout_rate))


def train_epoch(state: steps.TrainState, data: Data, seed_key: jax.Array, epoch: jax.Array,
                spec: EpochSpec) -> tuple[steps.TrainState, steps.Metrics]:
  """Trains on one epoch of the resident data; returns the new state and the epoch's metric sums.

  Per device: with `spec.axis_name` (under shard_map or pmap), device k of n takes piece k of every
  global batch, gradients are averaged and metric sums added over the axis.
  """
  images, labels = data
  step_indices, dropout_key = epoch_plan(seed_key, epoch, images.shape[0], spec.batch_size,
                                         _shard(spec.axis_name))

  def body(state, indices):
    augmented = augment.augmenter(seed_key, epoch, indices, spec.max_shift, spec.distortion)
    batch = batches.gather(images, labels, indices, augmented)
    return train_batch(state, batch, indices, dropout_key, spec)

  state, sums = jax.lax.scan(body, state, step_indices)
  return state, _total(sums, spec.axis_name)


def train_members(states: steps.TrainState, data: Data, seed_keys: jax.Array, epoch: jax.Array,
                  spec: EpochSpec) -> tuple[steps.TrainState, steps.Metrics]:
  """`train_epoch` of members whose states and seed keys are stacked [M], side by side by vmap over
  the one copy of the data: member k trains as a run of its key (and, in a sweep, of its values of
  the spec's tuples) alone would; sums come [M]."""
  per_member = spec.per_member()
  if not per_member:
    one = functools.partial(train_epoch, spec=spec)
    return jax.vmap(one, in_axes=(0, None, 0, None))(states, data, seed_keys, epoch)

  def member(state, seed_key, values):
    return train_epoch(state, data, seed_key, epoch, dataclasses.replace(spec, **values))
  return jax.vmap(member)(states, seed_keys, per_member)


def _score_all(data: Data, batch_size: int, axis_name: str | None,
               score: Callable[[steps.Batch, jax.Array], Any]) -> Any:
  """`score(batch, mask)`'s sums over each example exactly once: the last batch padded, masked."""
  images, labels = data
  shard, num_shards = _shard(axis_name)
  indices, masks = batches.eval_steps(images.shape[0], batch_size, num_shards, shard)

  def body(_, step):
    step_indices, mask = step
    return None, score(batches.gather(images, labels, step_indices), mask)

  _, sums = jax.lax.scan(body, None, (indices, masks))
  return _total(sums, axis_name)


def evaluate(state: steps.TrainState, data: Data, *, batch_size: int,
             axis_name: str | None = None) -> steps.Metrics:
  """Scores every example exactly once (the last batch padded and masked); returns metric sums."""
  return _score_all(data, batch_size, axis_name,
                    lambda batch, mask: steps.eval_step(state, batch, mask))


def evaluate_members(states: steps.TrainState, data: Data, *, batch_size: int,
                     axis_name: str | None = None,
                     member_axis: str | None = None) -> tuple[steps.Metrics, steps.Metrics]:
  """Metric sums of members stacked [M], each member's [M], and of their ensemble (the mean of
  their class probabilities), over the same batches as `evaluate`; split over `member_axis`, this
  device's members' sums, and the ensemble of all."""
  def score(batch, mask):
    members = jax.vmap(steps.eval_step, in_axes=(0, None, None))(states, batch, mask)
    ensemble = steps.batch_metrics(steps.ensemble_logits(states, batch['image'], member_axis),
                                   batch['label'], mask)
    return members, ensemble

  return _score_all(data, batch_size, axis_name, score)


def predict(state: steps.TrainState, images: jax.Array, *, batch_size: int) -> jax.Array:
  """Every example's logits [N, 10] (of stacked members, their ensemble's: `ensemble_logits`),
  computed in the same batches as `evaluate` scores them."""
  indices, _ = batches.eval_steps(images.shape[0], batch_size, 1, jnp.int32(0))

  def body(_, step_indices):
    return None, inference.logits(state, jnp.take(images, step_indices, axis=0))

  _, logits = jax.lax.scan(body, None, indices)
  return logits.reshape(-1, logits.shape[-1])[:images.shape[0]]
