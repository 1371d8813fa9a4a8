"""One place that builds a run: its mesh, keys, state, resident data and compiled epoch programs."""

import dataclasses

import jax
import numpy as np
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from data.mnist import Examples
from mlp import batches, epoch, steps
from trainer import devices

DeviceData = tuple[jax.Array, jax.Array]  # A split's uint8 images and int32 labels, on every device.


@dataclasses.dataclass(frozen=True)
class RunSetup:
  """What training and evaluation compute with; every array is global, replicated over the mesh.

  It holds no state: an epoch consumes (donates) the state it starts from.
  """
  mesh: Mesh
  run_key: jax.Array  # Drives every epoch's order, dropout and shifts.
  train_data: DeviceData | None  # None when only evaluating.
  eval_data: DeviceData
  programs: devices.EpochPrograms
  steps_per_epoch: int  # Training steps per epoch; 0 when only evaluating.

  def train_epoch(self, state: steps.TrainState,
                  epoch: int) -> tuple[steps.TrainState, dict[str, float]]:
    """One epoch from `state` (which it consumes); the new state and the epoch's host metrics."""
    assert self.programs.train is not None and self.train_data is not None, 'built to evaluate only'
    state, sums = self.programs.train(state, *self.train_data, self.run_key, np.int32(epoch))
    return state, steps.summarize(jax.device_get(sums))

  def evaluate(self, state: steps.TrainState) -> dict[str, float]:
    """The eval split's mean loss and accuracy for `state`."""
    return steps.summarize(jax.device_get(self.programs.evaluate(state, *self.eval_data)))


def place(config: ml_collections.ConfigDict) -> devices.Placement:
  """The config's mode and mesh on this machine, or a UserError when the config and devices disagree."""
  mode = devices.choose_mode(config, jax.device_count(), jax.process_count())
  return devices.Placement(mode, devices.make_mesh(mode))


def make_mesh(config: ml_collections.ConfigDict) -> Mesh:
  """The config's mesh on this machine (the state's template needs no more), or a UserError."""
  return place(config).mesh


def state_template(config: ml_collections.ConfigDict, mesh: Mesh,
                   steps_per_epoch: int) -> steps.TrainState:
  """The state's shapes, dtypes and replicated sharding, computed without creating it."""
  abstract = jax.eval_shape(lambda key: steps.create_train_state(config, key, steps_per_epoch),
                            jax.random.key(0))
  sharding = NamedSharding(mesh, P())
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


def set_up_run(config: ml_collections.ConfigDict, placement: devices.Placement,
               train: Examples | None, evaluation: Examples,
               state: steps.TrainState | None = None) -> tuple[RunSetup, steps.TrainState]:
  """Keys, data on the devices and the epoch programs compiled; and the state to start from (a
  fresh one unless given), on the mesh."""
  mesh = placement.mesh
  init_key, run_key = steps.run_keys(config.seed)
  steps_per_epoch = batches.whole_batches(len(train), config.batch_size) if train is not None else 0
  if state is None:
    # One compiled program, its result born replicated on the mesh (eager init takes seconds).
    create = lambda key: steps.create_train_state(config, key, steps_per_epoch or 1)
    state = jax.jit(create, out_shardings=NamedSharding(mesh, P()))(init_key)
  run_key = devices.replicate(run_key, mesh)
  on_mesh = lambda examples: devices.replicate((examples.images, examples.labels), mesh)
  train_data = on_mesh(train) if train is not None else None
  eval_data = on_mesh(evaluation)
  programs = devices.compile_epochs(config, placement, state, run_key, train_data, eval_data)
  return RunSetup(mesh, run_key, train_data, eval_data, programs, steps_per_epoch), state


_predict = jax.jit(epoch.predict, static_argnames='batch_size')  # Compiled once per shape and batch.


def predict_logits(state: steps.TrainState, images: jax.Array | np.ndarray,
                   config: ml_collections.ConfigDict) -> np.ndarray:
  """Class logits [N, 10] of uint8 images [N, 784] on the host, as the run's evaluation makes them."""
  with jax.default_matmul_precision(config.matmul_precision):
    return np.asarray(jax.device_get(_predict(state, images, batch_size=config.eval_batch_size)))
