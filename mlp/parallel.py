"""How the epoch functions run on the hardware: one place that knows about devices and placement."""

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
DeviceData = tuple[jax.Array, jax.Array]


class JitExecutor:
  """Runs each epoch as one jitted program on the default device."""
  num_shards = 1

  def __init__(self, config: ml_collections.ConfigDict):
    self._train = jax.jit(functools.partial(epoch_lib.train_epoch, batch_size=config.batch_size,
                                            max_shift=config.data.max_shift), donate_argnums=0)
    self._eval = jax.jit(functools.partial(epoch_lib.evaluate, batch_size=config.eval_batch_size))

  def compile(self, state: steps.TrainState, train_data: DeviceData, eval_data: DeviceData,
              seed_key: jax.Array) -> None:
    """Compiles both programs ahead of time, so epoch timings measure training alone."""
    self._train = self._train.lower(state, *train_data, seed_key, jnp.int32(0)).compile()
    self._eval = self._eval.lower(state, *eval_data).compile()

  def put_state(self, state: steps.TrainState) -> steps.TrainState:
    return jax.device_put(state)

  def get_state(self, state: steps.TrainState) -> steps.TrainState:
    """One host copy of the state, for saving or inspection."""
    return jax.device_get(state)

  def put_data(self, examples: Examples) -> DeviceData:
    return jax.device_put(examples.images), jax.device_put(examples.labels)

  def train_epoch(self, state: steps.TrainState, data: DeviceData, seed_key: jax.Array,
                  epoch: int) -> tuple[steps.TrainState, Any]:
    return self._train(state, *data, seed_key, jnp.int32(epoch))

  def evaluate(self, state: steps.TrainState, data: DeviceData) -> Any:
    return self._eval(state, *data)

  def metrics(self, sums: Any) -> dict[str, float]:
    """Host means of device metric sums; blocks until the device has produced them."""
    return steps.summarize(jax.tree.map(np.asarray, jax.device_get(sums)))


def make_executor(config: ml_collections.ConfigDict) -> JitExecutor:
  """The executor the config's `parallel` mode asks for on this machine."""
  if config.parallel not in PARALLEL_MODES:
    raise UserError(f'unknown parallel mode {config.parallel!r}; use one of '
                    f'{", ".join(PARALLEL_MODES)}')
  if config.parallel == 'pmap':
    raise UserError('parallel=pmap is not available in this version; use --config.parallel=jit')
  return JitExecutor(config)
