"""How the epoch functions run on the hardware: one place that knows about devices and placement."""

import abc
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from data.mnist import Examples
from mlp import epoch as epoch_lib
from mlp import steps
from mlp.errors import UserError

PARALLEL_MODES = ('auto', 'jit', 'pmap')
AXIS = 'devices'  # The pmap axis that gradients are averaged and metric sums added over.
DeviceData = tuple[jax.Array, jax.Array]


def _epoch_functions(config: ml_collections.ConfigDict, **shards) -> tuple[Any, Any]:
  """train_epoch and evaluate with the config's static settings bound, for jit or pmap to wrap."""
  return (functools.partial(epoch_lib.train_epoch, batch_size=config.batch_size,
                            max_shift=config.data.max_shift, **shards),
          functools.partial(epoch_lib.evaluate, batch_size=config.eval_batch_size, **shards))


class Executor(abc.ABC):
  """The trainer's one view of the hardware; state moves between host and devices only through it."""
  num_shards: int
  placement: str  # For the log: how and where the epochs run.
  _train: Any  # The compiled epoch programs, called alike whatever the placement.
  _eval: Any

  @abc.abstractmethod
  def compile(self, state: steps.TrainState, train_data: DeviceData, eval_data: DeviceData,
              seed_key: jax.Array) -> None:
    """Compiles both programs ahead of time, so epoch timings measure training alone."""

  @abc.abstractmethod
  def put_state(self, state: steps.TrainState) -> steps.TrainState:
    """A host (or single-device) state placed where the epochs run."""

  @abc.abstractmethod
  def get_state(self, state: steps.TrainState) -> steps.TrainState:
    """One host copy of the state, for saving or inspection."""

  @abc.abstractmethod
  def put_data(self, examples: Examples) -> DeviceData:
    """A split's images and labels, resident on the devices for the whole run."""

  def train_epoch(self, state: steps.TrainState, data: DeviceData, seed_key: jax.Array,
                  epoch: int) -> tuple[steps.TrainState, Any]:
    return self._train(state, *data, seed_key, jnp.int32(epoch))

  def evaluate(self, state: steps.TrainState, data: DeviceData) -> Any:
    return self._eval(state, *data)

  def metrics(self, sums: Any) -> dict[str, float]:
    """Host means of device metric sums; blocks until the device has produced them."""
    return steps.summarize(self.get_state(sums))


class JitExecutor(Executor):
  """Runs each epoch as one jitted program on the default device."""
  num_shards = 1

  def __init__(self, config: ml_collections.ConfigDict):
    train, evaluate = _epoch_functions(config)
    self._train = jax.jit(train, donate_argnums=0)
    self._eval = jax.jit(evaluate)
    self.placement = f'jit on 1 {jax.default_backend()} device'

  def compile(self, state: steps.TrainState, train_data: DeviceData, eval_data: DeviceData,
              seed_key: jax.Array) -> None:
    self._train = self._train.lower(state, *train_data, seed_key, jnp.int32(0)).compile()
    self._eval = self._eval.lower(state, *eval_data).compile()

  def put_state(self, state: steps.TrainState) -> steps.TrainState:
    return jax.device_put(state)

  def get_state(self, state: steps.TrainState) -> steps.TrainState:
    return jax.device_get(state)

  def put_data(self, examples: Examples) -> DeviceData:
    return jax.device_put(examples.images), jax.device_put(examples.labels)


class PmapExecutor(Executor):
  """Runs each epoch as one pmapped program on every local device; collectives span all processes.

  State and data are replicated on each device; the epoch's global batches are split over the
  `num_shards` devices of all processes (`lax.axis_index` is the global device index), so each
  process computes only its devices' share and every process sees the same numbers.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    self.num_shards = jax.device_count()
    devices = jax.local_devices()
    self._sharding = jax.NamedSharding(jax.sharding.Mesh(np.array(devices), (AXIS,)), jax.P(AXIS))
    train, evaluate = _epoch_functions(config, num_shards=self.num_shards, axis_name=AXIS)
    self._train = jax.pmap(train, AXIS, in_axes=(0, 0, 0, None, None), donate_argnums=0)
    self._eval = jax.pmap(evaluate, AXIS)
    processes = f' in {jax.process_count()} processes' if jax.process_count() > 1 else ''
    self.placement = (f'pmap over {self.num_shards} {jax.default_backend()} devices{processes}, '
                      f'{config.batch_size // self.num_shards} per device per step')

  def compile(self, state: steps.TrainState, train_data: DeviceData, eval_data: DeviceData,
              seed_key: jax.Array) -> None:
    """Compiles both programs ahead of time; pmap's cache serves them to the calls that follow.

    The compiled objects themselves are not kept: under several processes they take global
    arrays, while pmap takes each process's local ones.
    """
    self._train.lower(state, *train_data, seed_key, jnp.int32(0)).compile()
    self._eval.lower(state, *eval_data).compile()

  def put_state(self, state: steps.TrainState) -> steps.TrainState:
    """The state replicated on every local device: leaves gain a leading device axis."""
    return self._replicate(state)

  def get_state(self, state: steps.TrainState) -> steps.TrainState:
    """One host copy of the replicated state (device 0's), for saving or inspection."""
    # [0, ...] keeps a scalar leaf (the optimizer's step count) a 0-d array, as orbax requires.
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0))[0, ...], state)

  def put_data(self, examples: Examples) -> DeviceData:
    return self._replicate(examples.images), self._replicate(examples.labels)

  def _replicate(self, tree: Any) -> Any:
    def replicate(leaf):
      host = np.asarray(leaf)
      shape = (len(self._sharding.mesh.devices),) + host.shape
      return jax.make_array_from_callback(shape, self._sharding, lambda _: host[None])
    return jax.tree.map(replicate, tree)


def choose_mode(config: ml_collections.ConfigDict, device_count: int, process_count: int) -> str:
  """'jit' or 'pmap' for the config on this many devices and processes; UserError on a mismatch."""
  wanted = config.num_devices
  if wanted and wanted != device_count:
    raise UserError(f'the config asks for {wanted} devices (num_devices={wanted}) but '
                    f'{device_count} {"is" if device_count == 1 else "are"} present; run it where '
                    f'there are {wanted}, or pass --config.num_devices=0 to use the devices present')
  mode = config.parallel
  if mode == 'auto':
    mode = 'pmap' if device_count > 1 else 'jit'
  if mode == 'jit' and process_count > 1:
    raise UserError(f'parallel=jit trains on one device, but this run has {process_count} '
                    'processes; use --config.parallel=pmap (or auto)')
  if mode == 'jit' and wanted > 1:
    raise UserError(f'parallel=jit trains on one device, but the config asks for {wanted} '
                    '(num_devices); use --config.parallel=pmap (or auto)')
  if mode == 'pmap':
    for name in ('batch_size', 'eval_batch_size'):
      if config[name] % device_count:
        multiple = -(-config[name] // device_count) * device_count
        raise UserError(f'{name} {config[name]} does not divide evenly over {device_count} '
                        f'devices; pass --config.{name}={multiple} or another multiple of '
                        f'{device_count}')
  return mode


def make_executor(config: ml_collections.ConfigDict) -> Executor:
  """The executor the config's `parallel` mode asks for on this machine."""
  if config.parallel not in PARALLEL_MODES:
    raise UserError(f'unknown parallel mode {config.parallel!r}; use one of '
                    f'{", ".join(PARALLEL_MODES)}')
  if choose_mode(config, jax.device_count(), jax.process_count()) == 'pmap':
    return PmapExecutor(config)
  return JitExecutor(config)
