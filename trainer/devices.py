"""Where epochs run: one device mesh, and the per-device epoch compiled over it by jit, shard_map or pmap."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from errors import ConfigError
from mlp import augment
from mlp import epoch

AXIS = 'data'  # The mesh axis that batches are split over and gradients averaged over.
PARALLEL_MODES = ('auto', 'jit', 'mesh', 'pmap')
MATMUL_PRECISIONS = ('default', 'high', 'highest')  # jax.default_matmul_precision's names.


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
    raise ConfigError('parallel', f'must be mesh or pmap (or auto) to train on num_devices={wanted}',
                      mode, 'mesh')
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
    host = np.asarray(leaf, dtype=jax.dtypes.canonicalize_dtype(np.result_type(leaf)))
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(place, tree)


@dataclasses.dataclass(frozen=True)
class EpochPrograms:
  """An epoch's training and evaluation, compiled for the mesh; both take and return global arrays."""
  train: Callable[..., tuple[Any, Any]] | None  # (state, images, labels, seed_key, epoch) -> (state, sums)
  evaluate: Callable[..., Any]  # (state, images, labels) -> sums
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


def compile_epochs(config: ml_collections.ConfigDict, placement: Placement, state: Any,
                   seed_key: jax.Array, train_data: tuple | None,
                   eval_data: tuple) -> EpochPrograms:
  """The config's epoch programs for these arguments, compiled ahead so epochs time training alone."""
  mode, mesh = placement
  axis = None if mode == 'jit' else AXIS
  train = None
  with jax.default_matmul_precision(config.matmul_precision):  # Fixed when the programs compile.
    if train_data is not None:
      train = _compile(functools.partial(epoch.train_epoch, batch_size=config.batch_size,
                                         max_shift=config.data.max_shift,
                                         distortion=augment.Distortion(**config.data.distort),
                                         axis_name=axis),
                       mesh, mode, (state, *train_data, seed_key, np.int32(0)), donate=True)
    evaluate = _compile(functools.partial(epoch.evaluate, batch_size=config.eval_batch_size,
                                          axis_name=axis), mesh, mode, (state, *eval_data),
                        donate=False)
  processes = f' in {jax.process_count()} processes' if jax.process_count() > 1 else ''
  per_device = f', {config.batch_size // mesh.size} per device per step' if mode != 'jit' else ''
  return EpochPrograms(train, evaluate, f'{mode} on {mesh.size} {jax.default_backend()} '
                       f'device{"s" if mesh.size > 1 else ""}{processes}{per_device}')
