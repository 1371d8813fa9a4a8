"""A run resolved once, from its config and the devices here: the mode and mesh, the members, the
recipe as mlp/ takes it, the epoch's spec, the keys and the figures a run reads. The programs, the
reporter, the evaluation and the checkpoints read the plan; the config stops here (and at what each
checkpoint saves)."""

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import AxisType, Mesh

from data.splits import parse_split
from errors import ConfigError
from mlp import augment, batches, optim, passes, randomness
from mlp.model import MLP
from trainer import config_fields
from trainer.members import Member, grid

AXIS = 'data'  # The mesh axis that batches are split over and gradients averaged over.
MEMBERS = 'members'  # The mesh axis that members are split over (member_shards > 1): no collective.


def choose_mode(config: ml_collections.ConfigDict, device_count: int, process_count: int,
                member_count: int = 0) -> str:
  """'jit', 'mesh' or 'pmap' for the config on this many devices and processes (and members), or a
  UserError."""
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
  shards = member_shards(config, mode, device_count, member_count)
  if mode != 'jit':
    over = device_count // shards  # The devices that split each batch: the `data` axis.
    whose = " (each member shard's)" if shards > 1 else ''
    for name in ('batch_size', 'eval_batch_size'):
      if config[name] % over:
        multiple = -(-config[name] // over) * over
        raise ConfigError(name, f'must divide evenly over {over} devices{whose}', config[name],
                          str(multiple))
  return mode


def member_shards(config: ml_collections.ConfigDict, mode: str, device_count: int,
                  member_count: int) -> int:
  """The size of the mesh's `members` axis, config.member_shards, where it can spread the members
  over the devices; a ConfigError where it cannot."""
  shards = config.member_shards
  if shards == 1:
    return 1
  if not member_count:
    raise ConfigError('member_shards', 'spreads the models of a run of several (num_models > 1 or '
                      'a sweep) over the devices, and this run trains one', shards, '1')
  fit = str(math.gcd(device_count, member_count))  # Divides both counts.
  if device_count % shards:
    raise ConfigError('member_shards', f'must divide the {device_count} '
                      f'device{"s" if device_count > 1 else ""} present', shards, fit)
  if member_count % shards:
    raise ConfigError('member_shards', f'must divide the {member_count} models of the run', shards,
                      fit)
  if mode != 'mesh':
    raise ConfigError('parallel', f'must be mesh (or auto) to spread the models over the devices '
                      f'(member_shards={shards})', mode, 'mesh')
  return shards


def make_mesh(mode: str, shards: int = 1) -> Mesh:
  """The `data` axis over every device of every process; one device for jit. Of `shards` > 1
  member shards, a `members` axis of that size beside it, `data` over the devices of each shard."""
  devices = jax.devices()[:1] if mode == 'jit' else jax.devices()
  # Auto axes, as Mesh's own default: the epochs are written for them, not for explicit sharding.
  if shards == 1:
    return jax.make_mesh((len(devices),), (AXIS,), (AxisType.Auto,), devices=devices)
  return jax.make_mesh((shards, len(devices) // shards), (MEMBERS, AXIS), (AxisType.Auto,) * 2,
                       devices=devices)


def axes_of(mode: str, mesh: Mesh) -> tuple[str | None, str | None]:
  """The mesh axes an epoch maps over: the one that splits the batches (None on one device), and
  the one that splits the members (None: every device holds them all). Members one shard per device
  leave no batch to split: no axis, and no collective in a step."""
  if MEMBERS not in mesh.axis_names:
    return None if mode == 'jit' else AXIS, None
  return AXIS if mesh.shape[AXIS] > 1 else None, MEMBERS


class Recipe(NamedTuple):
  """The recipe as the plain values mlp/ takes: mlp/ knows nothing of configs."""
  model: Callable[..., MLP]  # Builds the model, given its nnx.Rngs.
  schedule: optax.Schedule  # Of members that set their own learning rate: each one's, stacked.
  optimizer: optax.GradientTransformation
  # Of members that set their own optimizer values: each member's (mlp/optim.py's INJECTED).
  injected: tuple[tuple[str, tuple[float, ...]], ...] = ()


def own_values(config: ml_collections.ConfigDict, members: Sequence[Member],
               name: str) -> tuple[float, ...] | None:
  """Each member's value of a field, in the members' order; None where no member sets its own."""
  if not any(name in member.values for member in members):
    return None
  return tuple(float(member.values.get(name, config_fields.value_at(config, name)))
               for member in members)


def recipe_of(config: ml_collections.ConfigDict, members: Sequence[Member],
              steps_per_epoch: int) -> Recipe:
  """The one map from a config and its members to the model, the schedule and the optimizer."""
  total = max(config.num_epochs * steps_per_epoch, 1)
  warmup = min(int(round(config.warmup_epochs * steps_per_epoch)), total - 1)
  model = functools.partial(MLP, tuple(config.model.hidden_sizes),
                            dropout_rate=config.model.dropout_rate, dtype=config.dtype)
  if not any(own_values(config, members, name) for name in optim.INJECTED):
    schedule = optim.learning_rate_schedule(config.learning_rate, config.schedule, warmup, total)
    return Recipe(model, schedule, optim.make_optimizer(config.optimizer, schedule,
                                                          config.weight_decay, config.momentum))
  unit = optim.learning_rate_schedule(1.0, config.schedule, warmup, total)
  injected = tuple((name, own_values(config, members, name) or
                    (float(config[name]),) * len(members)) for name in optim.INJECTED)
  peaks = jnp.asarray(dict(injected)['learning_rate'], jnp.float32)
  return Recipe(model, lambda count: peaks * unit(count),
                optim.make_injected_optimizer(config.optimizer, unit, config.momentum), injected)


def epoch_spec(config: ml_collections.ConfigDict, members: Sequence[Member], axis: str | None,
               member_axis: str | None = None) -> passes.EpochSpec:
  """The one map from a config and its members to how an epoch trains: its batches, augmentation
  and loss, and the mesh axes that split the batches and the members."""
  return passes.EpochSpec(
      config.batch_size, config.data.max_shift, augment.Distortion(**config.data.distort), axis,
      own_values(config, members, 'label_smoothing') or config.label_smoothing,
      own_values(config, members, 'model.dropout_rate'), member_axis)


def keys_of(seed: int, members: Sequence[Member]) -> tuple[jax.Array, jax.Array]:
  """The run's init and run keys: its seed's, or, of members, each one's seed's, stacked."""
  if not members:
    return randomness.run_keys(seed)
  return randomness.member_keys(jnp.asarray(np.array([m.seed for m in members], np.uint32)))


class Checkpointing(NamedTuple):
  """When a run saves, and how many checkpoints it keeps."""
  every_epochs: int
  min_seconds: float
  keep: int


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything a run needs, resolved once by `resolve`: what every part of the run reads."""
  saved: dict[str, Any]  # The config's fields, flat: what each checkpoint saves, a resume compares.
  mode: str  # 'jit', 'mesh' or 'pmap'.
  mesh: Mesh
  members: tuple[Member, ...]  # Models side by side; none for one model alone.
  varied: tuple[str, ...]  # The fields the members set each their own: named in every record.
  steps_per_epoch: int
  recipe: Recipe
  spec: passes.EpochSpec
  keys: tuple[jax.Array, jax.Array]  # Init and run keys on the host (of members, stacked).
  num_epochs: int
  eval_batch_size: int
  precision: str  # The matmul precision the programs compile with.
  dtype: str
  seed: int
  profile_epoch: int
  data: ml_collections.ConfigDict  # As data/ takes it: the source, its folders, the splits.
  checkpointing: Checkpointing


def resolve(config: ml_collections.ConfigDict, members: Sequence[Member] | None = None,
            one_device: bool = False) -> Plan:
  """The plan of a checked config on the devices here (on one device, to classify with a run); its
  members `members`, or its sweep's grid. A UserError where the config and the devices disagree."""
  members = grid(config) if members is None else tuple(members)
  mode = 'jit' if one_device else choose_mode(config, jax.device_count(), jax.process_count(),
                                               len(members))
  mesh = make_mesh(mode, 1 if one_device else member_shards(config, mode, jax.device_count(),
                                                            len(members)))
  steps = batches.whole_batches(parse_split(config.data.train_split).size, config.batch_size)
  return Plan(
      config_fields.flat_config(config), mode, mesh, members,
      tuple(dict.fromkeys(name for member in members for name in member.values)), steps,
      recipe_of(config, members, steps),
      epoch_spec(config, members, *axes_of(mode, mesh)),
      keys_of(config.seed, members), config.num_epochs, config.eval_batch_size,
      config.matmul_precision, config.dtype, config.seed, config.profile_epoch, config.data,
      Checkpointing(config.checkpoint_every_epochs, config.checkpoint_min_seconds,
                    config.max_checkpoints_to_keep))
