"""What a run is, built once: where its epochs run (a device mesh, and the per-device epoch
compiled over it by jit, shard_map or pmap), its recipe as mlp/ takes it, its compiled epochs over
data resident on the devices, and its run directory's lock, reporter and checkpoints."""

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from data.mnist import Examples, load_splits
from errors import ConfigError
from mlp import augment, batches, epoch, optim, steps
from mlp.model import MLP
from trainer import processes
from trainer.checkpoints import Checkpoints
from trainer.reporting import Reporter
from trainer.run_dir import STALE_AFTER_S, RunDirectory, RunLock

AXIS = 'data'  # The mesh axis that batches are split over and gradients averaged over.


def choose_mode(config: ml_collections.ConfigDict, device_count: int, process_count: int) -> str:
  """'jit', 'mesh' or 'pmap' for the config on this many devices and processes, or a UserError."""
  wanted, mode = config.num_devices, config.parallel
  if wanted and wanted != device_count:
    raise ConfigError('num_devices', f'must match the {device_count} '
                      f'device{"s" if device_count > 1 else ""} present', wanted, '0')
  if mode == 'auto':
    mode = 'mesh' if device_count > 1 else 'jit'
  if mode == 'jit' and process_count > 1:
    raise ConfigError('parallel', f'must be mesh (or auto) in a run of {process_count} processes',
                      mode, 'mesh')
  if mode == 'jit' and wanted > 1:
    raise ConfigError('parallel', 'must be mesh or pmap (or auto) to train on '
                      f'num_devices={wanted}', mode, 'mesh')
  if mode == 'pmap' and process_count > 1:
    raise ConfigError('parallel', f'must be mesh (or auto) in a run of {process_count} processes '
                      '(pmap runs in one)', mode, 'mesh')
  if mode != 'jit':
    for name in ('batch_size', 'eval_batch_size'):
      if config[name] % device_count:
        multiple = -(-config[name] // device_count) * device_count
        raise ConfigError(name, f'must divide evenly over {device_count} devices', config[name],
                          str(multiple))
  return mode


class Placement(NamedTuple):
  """Where a config's epochs run: its parallel mode, chosen once, and the mesh for it."""
  mode: str  # 'jit', 'mesh' or 'pmap'.
  mesh: Mesh


def place(config: ml_collections.ConfigDict) -> Placement:
  """The config's mode and mesh here; a UserError when the config and the devices disagree."""
  mode = choose_mode(config, jax.device_count(), jax.process_count())
  return Placement(mode, make_mesh(mode))


def make_mesh(mode: str) -> Mesh:
  """The `data` axis over every device of every process; one device for jit."""
  devices = jax.devices()[:1] if mode == 'jit' else jax.devices()
  # Auto axes, as Mesh's own default: the epochs are written for them, not for explicit sharding.
  return jax.make_mesh((len(devices),), (AXIS,), (AxisType.Auto,), devices=devices)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Host or single-device values as global arrays, one full copy on every device of the mesh."""
  sharding = NamedSharding(mesh, P())

  def place(leaf):
    if jax.dtypes.issubdtype(getattr(leaf, 'dtype', None), jax.dtypes.prng_key):
      return jax.random.wrap_key_data(place(jax.random.key_data(leaf)))
    # A Python number (the fresh step) takes JAX's dtype for it: int32, not NumPy's int64.
    host = np.asarray(leaf)
    host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype), copy=False)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(place, tree)


@dataclasses.dataclass(frozen=True)
class EpochPrograms:
  """An epoch's training and evaluation, compiled for the mesh, taking and giving global arrays."""
  train: Callable[..., tuple[Any, Any]] | None  # (state, data, seed_key, epoch) -> (state, sums)
  evaluate: Callable[..., Any]  # (state, data) -> sums
  placement: str  # For the log: how and where the epochs run.


def _compile(per_device: Callable, mesh: Mesh, mode: str, args: tuple, donate: bool) -> Callable:
  """The per-device function as one compiled program for the whole mesh: replicated in and out."""
  donated = (0,) if donate else ()
  if mode == 'pmap':  # Maps over a device index; the arguments go whole to every device.
    mapped = jax.pmap(lambda _, args: per_device(*args), AXIS, in_axes=(0, None), out_axes=None,
                      devices=list(mesh.devices.flat))
    index = jax.device_put(np.arange(mesh.size), NamedSharding(mesh, P(AXIS)))
    compiled = mapped.lower(index, args).compile()
    return lambda *args: compiled(index, args)
  if mode == 'mesh':
    # check_vma=False keeps pmap's meaning of the per-device code: jax.grad of replicated params
    # is each device's own gradient, which train_step averages with pmean. (With varying-axis
    # checks, grad would already sum over devices, and the pmean would leave Adam's moments 8x.)
    per_device = jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P(),
                               check_vma=False)
  return jax.jit(per_device, donate_argnums=donated).lower(*args).compile()


def _programs(config: ml_collections.ConfigDict, placement: Placement, state: Any,
              train_inputs: tuple[epoch.Data, jax.Array] | None,
              eval_data: epoch.Data) -> EpochPrograms:
  """The epoch programs for these arguments (`train_inputs`: the data and the run key),
  compiled ahead so that epochs time training alone."""
  mode, mesh = placement
  axis = None if mode == 'jit' else AXIS
  train = None
  with jax.default_matmul_precision(config.matmul_precision):  # Fixed when the programs compile.
    if train_inputs is not None:
      spec = epoch_spec(config, axis)
      train = _compile(functools.partial(epoch.train_epoch, spec=spec), mesh, mode,
                       (state, *train_inputs, np.int32(0)), donate=True)
    evaluate = _compile(functools.partial(epoch.evaluate, batch_size=config.eval_batch_size,
                                          axis_name=axis), mesh, mode, (state, eval_data),
                        donate=False)
  across = f' in {jax.process_count()} processes' if jax.process_count() > 1 else ''
  per_device = f', {config.batch_size // mesh.size} per device per step' if mode != 'jit' else ''
  return EpochPrograms(train, evaluate, f'{mode} on {mesh.size} {jax.default_backend()} '
                       f'device{"s" if mesh.size > 1 else ""}{across}{per_device}')


def epoch_spec(config: ml_collections.ConfigDict, axis: str | None) -> epoch.EpochSpec:
  """The one map from a config to how an epoch trains: its batches, augmentation and loss."""
  return epoch.EpochSpec(config.batch_size, config.data.max_shift,
                         augment.Distortion(**config.data.distort), axis, config.label_smoothing)


class Learning(NamedTuple):
  """The config's recipe as the plain values mlp/ takes: mlp/ knows nothing of configs."""
  model: Callable[..., MLP]  # Builds the model, given its nnx.Rngs.
  schedule: optax.Schedule
  optimizer: optax.GradientTransformation


def learning(config: ml_collections.ConfigDict, steps_per_epoch: int) -> Learning:
  """The one map from a config to the model, the learning-rate schedule and the optimizer."""
  total = max(config.num_epochs * steps_per_epoch, 1)
  warmup = min(int(round(config.warmup_epochs * steps_per_epoch)), total - 1)
  schedule = optim.learning_rate_schedule(config.learning_rate, config.schedule, warmup, total)
  model = functools.partial(MLP, tuple(config.model.hidden_sizes),
                            dropout_rate=config.model.dropout_rate, dtype=config.dtype)
  return Learning(model, schedule, optim.make_optimizer(config.optimizer, schedule,
                                                        config.weight_decay, config.momentum))


def create_state(config: ml_collections.ConfigDict, key: jax.Array,
                  steps_per_epoch: int) -> steps.TrainState:
  model, _, optimizer = learning(config, steps_per_epoch)
  return steps.create_train_state(model, optimizer, key)


def state_template(config: ml_collections.ConfigDict, mesh: Mesh,
                   steps_per_epoch: int) -> steps.TrainState:
  """The state's shapes, dtypes and replicated sharding, computed without creating it."""
  abstract = jax.eval_shape(lambda key: create_state(config, key, steps_per_epoch),
                            jax.random.key(0))
  sharding = NamedSharding(mesh, P())
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


@dataclasses.dataclass(frozen=True)
class Epochs:
  """A run's compiled epochs over its data resident on the mesh; every array global, replicated.

  It holds no state: an epoch consumes (donates) the state it starts from.
  """
  mesh: Mesh
  run_key: jax.Array  # Drives every epoch's order, dropout and shifts.
  train_data: epoch.Data | None  # None when only evaluating.
  eval_data: epoch.Data
  programs: EpochPrograms
  steps_per_epoch: int  # Training steps per epoch; 0 when only evaluating.

  def train_epoch(self, state: steps.TrainState,
                  number: int) -> tuple[steps.TrainState, dict[str, float]]:
    """Epoch `number` from `state` (which it consumes); the new state and its host metrics."""
    assert self.programs.train is not None and self.train_data is not None, 'built to evaluate only'
    state, sums = self.programs.train(state, self.train_data, self.run_key, np.int32(number))
    return state, steps.summarize(jax.device_get(sums))

  def evaluate(self, state: steps.TrainState) -> dict[str, float]:
    """The eval split's mean loss and accuracy for `state`."""
    return steps.summarize(jax.device_get(self.programs.evaluate(state, self.eval_data)))


def compile_epochs(config: ml_collections.ConfigDict, placement: Placement, train: Examples | None,
                   evaluation: Examples,
                   state: steps.TrainState | None = None) -> tuple[Epochs, steps.TrainState]:
  """Keys, data on the devices and the epoch programs compiled; and the state to start from (a
  fresh one unless given), on the mesh."""
  mesh = placement.mesh
  init_key, run_key = steps.run_keys(config.seed)
  steps_per_epoch = batches.whole_batches(len(train), config.batch_size) if train is not None else 0
  if state is None:
    # One compiled program, its result born replicated on the mesh (eager init takes seconds).
    create = lambda key: create_state(config, key, steps_per_epoch or 1)
    state = jax.jit(create, out_shardings=NamedSharding(mesh, P()))(init_key)
  run_key = replicate(run_key, mesh)
  on_mesh = lambda examples: replicate((examples.images, examples.labels), mesh)
  train_data = on_mesh(train) if train is not None else None
  eval_data = on_mesh(evaluation)
  programs = _programs(config, placement, state,
                       None if train_data is None else (train_data, run_key), eval_data)
  return Epochs(mesh, run_key, train_data, eval_data, programs, steps_per_epoch), state


@dataclasses.dataclass(frozen=True)
class Run:
  """What a run is, built once by `open_run` and handed whole to the loop and the evaluation."""
  config: ml_collections.ConfigDict
  run_dir: RunDirectory
  placement: Placement
  train: Examples | None  # None when only evaluating.
  eval: Examples
  steps_per_epoch: int  # 0 when only evaluating.
  schedule: optax.Schedule  # The learning rate of each step.
  reporter: Reporter
  checkpoints: Checkpoints
  lock: RunLock | None  # None when only evaluating: a live run's files are only read.
  should_stop: Callable[[], str | None]  # A signal's name once one asked the run to stop.

  def template(self) -> steps.TrainState:
    """The state a checkpoint of this run restores into: shapes, dtypes, sharding."""
    return state_template(self.config, self.placement.mesh, self.steps_per_epoch or 1)


@contextlib.contextmanager
def open_run(config: ml_collections.ConfigDict, run_dir: RunDirectory,
             should_stop: Callable[[], str | None] = lambda: None,
             lock_stale_after: float = STALE_AFTER_S, evaluate_only: bool = False) -> Iterator[Run]:
  """The one place a run is built; on exit every save is complete and the lock released."""
  placement = place(config)  # Checks the devices against the config before any work.
  splits = [config.data.eval_split] if evaluate_only else [config.data.train_split,
                                                           config.data.eval_split]
  *train, examples = load_splits(config.data, *splits)
  reporter = Reporter(run_dir, config.num_epochs, enabled=processes.is_primary())
  steps_per_epoch = batches.whole_batches(len(train[0]), config.batch_size) if train else 0
  with contextlib.ExitStack() as stack:
    lock = None
    if not evaluate_only:  # Before orbax tidies the folder; a refusal stops every process.
      lock = stack.enter_context(run_dir.lock(
          enabled=processes.is_primary(), everyone=processes.everyone,
          stale_after=lock_stale_after, warn=reporter.warn))
      processes.check_shared_directory(run_dir)
    checkpoints = stack.enter_context(Checkpoints(run_dir, config, read_only=evaluate_only))
    yield Run(config, run_dir, placement, train[0] if train else None, examples, steps_per_epoch,
              learning(config, steps_per_epoch or 1).schedule, reporter, checkpoints, lock,
              should_stop)
