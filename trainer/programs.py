"""A config's programs on its devices, compiled once: the device mesh, the recipe as mlp/ takes it,
the keys, and each pass (mlp/passes.py) compiled over the mesh by jit, shard_map or pmap, over data
resident there."""

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from data.mnist import Examples
from errors import ConfigError, During
from mlp import augment, batches, optim, passes, randomness, steps
from mlp.model import MLP
from trainer import sweeps

AXIS = 'data'  # The mesh axis that batches are split over and gradients averaged over.


def choose_mode(config: ml_collections.ConfigDict, device_count: int, process_count: int) -> str:
  """'jit', 'mesh' or 'pmap' for the config on this many devices and processes, or a UserError."""
  wanted, mode = config.num_devices, config.parallel
  if wanted and wanted != device_count:
    raise ConfigError('num_devices', f'must match the {device_count} '
                      f'device{"s" if device_count > 1 else ""} present', wanted, '0')
  if mode == 'auto':
    mode = 'mesh' if device_count > 1 else 'jit'
  if mode in ('jit', 'pmap') and process_count > 1:
    raise ConfigError('parallel', f'must be mesh (or auto) in a run of {process_count} processes'
                      f'{" (pmap runs in one)" if mode == "pmap" else ""}', mode, 'mesh')
  if mode == 'jit' and wanted > 1:
    raise ConfigError('parallel', 'must be mesh or pmap (or auto) to train on '
                      f'num_devices={wanted}', mode, 'mesh')
  if mode != 'jit':
    for name in ('batch_size', 'eval_batch_size'):
      if config[name] % device_count:
        multiple = -(-config[name] // device_count) * device_count
        raise ConfigError(name, f'must divide evenly over {device_count} devices', config[name],
                          str(multiple))
  return mode


def mode_and_mesh(config: ml_collections.ConfigDict) -> tuple[str, Mesh]:
  """The config's mode ('jit', 'mesh' or 'pmap') and mesh here; a UserError when the config and the
  devices disagree."""
  mode = choose_mode(config, jax.device_count(), jax.process_count())
  return mode, make_mesh(mode)


def make_mesh(mode: str) -> Mesh:
  """The `data` axis over every device of every process; one device for jit."""
  devices = jax.devices()[:1] if mode == 'jit' else jax.devices()
  # Auto axes, as Mesh's own default: the epochs are written for them, not for explicit sharding.
  return jax.make_mesh((len(devices),), (AXIS,), (AxisType.Auto,), devices=devices)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Host or single-device values as global arrays, one full copy on every device of the mesh."""
  sharding = NamedSharding(mesh, P())

  def to_mesh(leaf):
    if jax.dtypes.issubdtype(getattr(leaf, 'dtype', None), jax.dtypes.prng_key):
      return jax.random.wrap_key_data(to_mesh(jax.random.key_data(leaf)))
    # A Python number (the fresh step) takes JAX's dtype for it: int32, not NumPy's int64.
    host = np.asarray(leaf)
    host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype), copy=False)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(to_mesh, tree)


def _compile(per_device: Callable, mesh: Mesh, mode: str, args: tuple, donate: bool) -> Callable:
  """The per-device function as one compiled program for the whole mesh: replicated in and out."""
  donated = (0,) if donate else ()
  if mode == 'pmap':  # Maps over a device index; the arguments go whole to every device.
    mapped = jax.pmap(lambda _, first, rest: per_device(first, *rest), AXIS,
                      in_axes=(0, None, None), out_axes=None, devices=list(mesh.devices.flat),
                      donate_argnums=(1,) if donate else ())  # `first`: the state.
    index = jax.device_put(np.arange(mesh.size), NamedSharding(mesh, P(AXIS)))
    compiled = mapped.lower(index, args[0], args[1:]).compile()
    return lambda first, *rest: compiled(index, first, rest)
  if mode == 'mesh':
    # check_vma=False keeps pmap's meaning of the per-device code: jax.grad of replicated params
    # is each device's own gradient, which train_step averages with pmean. (With varying-axis
    # checks, grad would already sum over devices, and the pmean would leave Adam's moments 8x.)
    per_device = jax.shard_map(per_device, mesh=mesh, in_specs=P(), out_specs=P(),
                               check_vma=False)
  return jax.jit(per_device, donate_argnums=donated).lower(*args).compile()


def epoch_spec(config: ml_collections.ConfigDict, axis: str | None) -> passes.EpochSpec:
  """The one map from a config to how an epoch trains: its batches, augmentation and loss."""
  return passes.EpochSpec(
      config.batch_size, config.data.max_shift, augment.Distortion(**config.data.distort), axis,
      sweeps.per_member(config, 'label_smoothing') or config.label_smoothing,
      sweeps.per_member(config, 'model.dropout_rate'))


class Recipe(NamedTuple):
  """The config's recipe as the plain values mlp/ takes: mlp/ knows nothing of configs."""
  model: Callable[..., MLP]  # Builds the model, given its nnx.Rngs.
  schedule: optax.Schedule  # A sweep's of the learning rate: each member's rate, stacked.
  optimizer: optax.GradientTransformation
  # In a sweep of the optimizer's values: each member's (mlp/optim.py's INJECTED), by name.
  injected: tuple[tuple[str, tuple[float, ...]], ...] = ()


def recipe_of(config: ml_collections.ConfigDict, steps_per_epoch: int) -> Recipe:
  """The one map from a config to the model, the learning-rate schedule and the optimizer."""
  total = max(config.num_epochs * steps_per_epoch, 1)
  warmup = min(int(round(config.warmup_epochs * steps_per_epoch)), total - 1)
  model = functools.partial(MLP, tuple(config.model.hidden_sizes),
                            dropout_rate=config.model.dropout_rate, dtype=config.dtype)
  if not set(optim.INJECTED) & set(sweeps.swept(config)):
    schedule = optim.learning_rate_schedule(config.learning_rate, config.schedule, warmup, total)
    return Recipe(model, schedule, optim.make_optimizer(config.optimizer, schedule,
                                                          config.weight_decay, config.momentum))
  unit = optim.learning_rate_schedule(1.0, config.schedule, warmup, total)
  members = sweeps.members(config)
  injected = tuple((name, tuple(float(sweeps.value_of(config, member, name))
                                for member in members)) for name in optim.INJECTED)
  peaks = jnp.asarray(dict(injected)['learning_rate'], jnp.float32)
  return Recipe(model, lambda count: peaks * unit(count),
                optim.make_injected_optimizer(config.optimizer, unit, config.momentum), injected)


def create_state(recipe: Recipe, key: jax.Array) -> steps.TrainState:
  """Step 0 of the recipe: the model initialized from `key`, and its optimizer's state; from keys
  stacked [M], M members' states stacked."""
  create = functools.partial(steps.create_train_state, recipe.model, recipe.optimizer)
  if key.ndim == 0:
    return create(key)
  states = jax.vmap(create)(key)
  if not recipe.injected:
    return states
  return dataclasses.replace(states, opt_state=optim.with_injected(states.opt_state,
                                                                   dict(recipe.injected)))


def keys_of(config: ml_collections.ConfigDict) -> tuple[jax.Array, jax.Array]:
  """The run's init and run keys: its seed's, or, of members, each one's seed's, stacked."""
  if not sweeps.stacked(config):
    return randomness.run_keys(config.seed)
  seeds = np.array([member.seed for member in sweeps.members(config)], np.uint32)
  return randomness.member_keys(jnp.asarray(seeds))


def member_count(config: ml_collections.ConfigDict) -> int:
  """How many models a run stacks side by side: 0 for one model alone."""
  return len(sweeps.members(config)) if sweeps.stacked(config) else 0


def state_template(recipe: Recipe, mesh: Mesh, members: int = 0) -> steps.TrainState:
  """The recipe's state (of `members` stacked, member_count's) as shapes, dtypes and replicated
  sharding on the mesh, computed without creating it (jax.eval_shape): what a fresh state fills, a
  checkpoint restores into and the programs compile for (their optimizer is the recipe's)."""
  keys = jax.random.split(jax.random.key(0), members) if members else jax.random.key(0)
  abstract = jax.eval_shape(functools.partial(create_state, recipe), keys)
  sharding = NamedSharding(mesh, P())
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


def figures(sums: dict[str, Any]) -> dict[str, Any]:
  """Host metric sums as loss and accuracy; of members ([M] sums), the members' means, and each
  member's in `loss_by_member` and `accuracy_by_member`."""
  if np.ndim(sums['count']) == 0:
    return steps.summarize(sums)
  each = [steps.summarize({k: v[m] for k, v in sums.items()}) for m in range(len(sums['count']))]
  losses, accuracies = [e['loss'] for e in each], [e['accuracy'] for e in each]
  return {'loss': sum(losses) / len(losses), 'accuracy': sum(accuracies) / len(accuracies),
          'loss_by_member': losses, 'accuracy_by_member': accuracies}


@dataclasses.dataclass(frozen=True)
class Programs:
  """A config's compiled passes on its devices, built once by `compile_programs`, global arrays in
  and out, replicated; no state: an epoch consumes (donates) the state it starts from."""
  mesh: Mesh
  recipe: Recipe
  init_key: jax.Array  # Initializes a fresh model (members: one key each, stacked).
  run_key: jax.Array  # On the mesh: drives every epoch's order, dropout and shifts (each member's).
  train_data: passes.Data | None  # None when only evaluating.
  eval_data: passes.Data
  steps_per_epoch: int  # Training steps per epoch; 0 when only evaluating.
  template: steps.TrainState  # The state's shapes, dtypes and sharding: what restores into.
  train_program: Callable[..., tuple[Any, Any]] | None  # (state, data, run_key, epoch) -> ...
  eval_program: Callable[..., Any]  # (state, data) -> sums
  placement: str  # For the log: how and where the epochs run.
  compile_seconds: float

  @During('training')  # The parameters and optimizer state of every member.
  def fresh_state(self) -> steps.TrainState:
    """Step 0 of the run, on the mesh."""
    # One compiled program, its result born replicated on the mesh (eager init takes seconds).
    create = jax.jit(functools.partial(create_state, self.recipe),
                     out_shardings=NamedSharding(self.mesh, P()))
    return create(self.init_key)

  @During('training')
  def train_epoch(self, state: steps.TrainState,
                  number: int) -> tuple[steps.TrainState, dict[str, Any]]:
    """Epoch `number` from `state` (which it consumes); the new state and its host metrics (of
    members, their means and each one's: `figures`)."""
    assert self.train_program is not None and self.train_data is not None, 'built to evaluate'
    with jax.transfer_guard_host_to_device('allow'):  # The epoch's one transfer, asked for.
      number_on_mesh = replicate(np.int32(number), self.mesh)
    state, sums = self.train_program(state, self.train_data, self.run_key, number_on_mesh)
    return state, figures(jax.device_get(sums))

  @During('evaluating')
  def evaluate(self, state: steps.TrainState) -> dict[str, Any]:
    """The eval split's mean loss and accuracy for `state`; of members, also each one's and their
    ensemble's (`ensemble_loss`, `ensemble_accuracy`)."""
    sums = jax.device_get(self.eval_program(state, self.eval_data))
    if isinstance(sums, dict):
      return figures(sums)
    members, ensemble = sums
    together = steps.summarize(ensemble)
    return {**figures(members), **{f'ensemble_{k}': v for k, v in together.items()}}

  def learning_rate(self, epoch: int) -> float | list[float]:
    """The rate of the epoch's last update, whose optimizer count was the number of updates
    before; in a sweep of it, each member's."""
    return np.asarray(self.recipe.schedule(epoch * self.steps_per_epoch - 1)).tolist()


def compile_programs(config: ml_collections.ConfigDict, train: Examples | None,
                     eval_examples: Examples, where: tuple[str, Mesh] | None = None) -> Programs:
  """The config's passes on its devices (`where`: its mode and mesh, if known): keys, data on the
  mesh, the programs compiled ahead (so that epochs time training alone); without `train`, the
  evaluation alone."""
  start = time.perf_counter()
  mode, mesh = where or mode_and_mesh(config)
  steps_per_epoch = batches.whole_batches(len(train), config.batch_size) if train is not None else 0
  recipe, (init_key, run_key) = recipe_of(config, steps_per_epoch or 1), keys_of(config)
  run_key, template = replicate(run_key, mesh), state_template(recipe, mesh,
                                                               member_count(config))
  on_mesh = lambda examples: replicate((examples.images, examples.labels), mesh)
  train_data, eval_data = on_mesh(train) if train is not None else None, on_mesh(eval_examples)
  axis = None if mode == 'jit' else AXIS
  members = sweeps.stacked(config)  # Members side by side, or one model.
  with jax.default_matmul_precision(config.matmul_precision):  # Fixed when the programs compile.
    train_program = None
    if train_data is not None:
      number = jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P()))
      with During('training'):  # A GPU's compiler tries kernels in device memory.
        train_program = _compile(functools.partial(
            passes.train_members if members else passes.train_epoch,
            spec=epoch_spec(config, axis)), mesh, mode, (template, train_data, run_key, number),
                                 donate=True)
    with During('evaluating'):
      eval_program = _compile(functools.partial(
          passes.evaluate_members if members else passes.evaluate,
          batch_size=config.eval_batch_size, axis_name=axis), mesh, mode, (template, eval_data),
                              donate=False)
  return Programs(mesh, recipe, init_key, run_key, train_data,
                  eval_data, steps_per_epoch, template, train_program, eval_program,
                  _placement(config, mode, mesh), time.perf_counter() - start)


def _members_said(config: ml_collections.ConfigDict) -> str:
  """Which members: their seeds, and in a sweep its fields' values."""
  seeds = (f'seeds {config.seed} to {config.seed + config.num_models - 1}'
           if config.num_models > 1 else f'seed {config.seed}')
  fields = sweeps.swept(config)
  said = '; '.join(f'{name} {", ".join(f"{value:g}" for value in values)}'
                   for name, values in fields.items())
  return f'{said}; each with {seeds}' if fields else seeds


def _placement(config: ml_collections.ConfigDict, mode: str, mesh: Mesh) -> str:
  """How and where the epochs run, for the log."""
  across = f' in {jax.process_count()} processes' if jax.process_count() > 1 else ''
  per_device = f', {config.batch_size // mesh.size} per device per step' if mode != 'jit' else ''
  members = '' if not sweeps.stacked(config) else (
      f'; {len(sweeps.members(config))} models side by side ({_members_said(config)})')
  return (f'{mode} on {mesh.size} {jax.default_backend()} device{"s" if mesh.size > 1 else ""}'
          f'{across}{per_device}{members}')


