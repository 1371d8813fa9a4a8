"""Orbax checkpoints of everything that decides the rest of a run, verified on the way back in.

Orbax keeps no checksum: a flipped byte restores "successfully" as a wrong tensor, and a truncated
or missing file makes a restore fail with no fallback. So each checkpoint carries a fingerprint of
its state, checked after every restore, and the newest checkpoint that restores and verifies wins.
"""

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from mlp import steps
from mlp.augment import Distortion
from errors import ASYNCIO_LOOP_CLOSED, ORBAX_TREE_MISMATCH, TENSORSTORE_DAMAGE_STATUS
from errors import ClosedOnExit, UserError, write_failed
from trainer import processes
from trainer.storage import RunDirectory

STATE, META = 'state', 'meta'
META_FILE = 'metadata'  # JsonCheckpointHandler's default file name, which restores read.
# Config fields a resumed run may change: how long to train (num_epochs also stretches the
# learning-rate schedule), how to run and evaluate, where the data lives. The rest decide the
# trained numbers; data.source among them, as TFDS stores MNIST's examples in another order.
FREE_FIELDS = frozenset({
    'num_epochs', 'eval_batch_size', 'eval_only', 'checkpoint_every_epochs',
    'max_checkpoints_to_keep', 'parallel', 'num_devices', 'profile_epoch', 'data.dir',
    'data.tfds_data_dir', 'data.eval_split'})
# Fields newer than some checkpoints, with the value those checkpoints were trained with.
DEFAULTS_OF_NEWER_FIELDS = {'dtype': 'float32', **{f'data.distort.{name}': value for name, value in
                                                   dataclasses.asdict(Distortion()).items()}}
DAMAGED_PREFIX = 'damaged-epoch-'
NAME_FORMAT = ocp.path.step.standard_name_format()  # Orbax's default step folders: '3', ...
# Files every complete checkpoint holds; one missing is damage.
REQUIRED_FILES = (os.path.join(META, META_FILE),
                  os.path.join(STATE, ocp.path.format_utils.PYTREE_METADATA_FILE))


@dataclasses.dataclass(frozen=True)
class Restored:
  """A verified checkpoint: the state to continue from, on the template's devices, and what was passed over."""
  epoch: int
  state: steps.TrainState
  config: dict[str, Any]  # The flat config it was saved with.
  damaged: tuple[tuple[int, str], ...]  # (epoch, why) of each newer checkpoint that failed.
  seconds: float


def saved_tree(state: steps.TrainState, rng_data: Any) -> dict[str, Any]:
  """What a checkpoint holds: with the data order a function of (seed, epoch), nothing else is needed."""
  return {'step': state.step, 'params': state.params, 'opt_state': state.opt_state,
          'rng': rng_data}


def fingerprint(tree: Any) -> str:
  """SHA-256 over every leaf's path, dtype, shape and bytes: any changed value changes it."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    array = np.ascontiguousarray(leaf)
    digest.update(f'{jax.tree_util.keystr(path)}|{array.dtype.str}|{array.shape};'.encode())
    digest.update(array.reshape(-1).view(np.uint8).data)  # The bytes of tobytes(), without a copy.
  return digest.hexdigest()


@dataclasses.dataclass
class _MetaSave(ocp.args.CheckpointArgs):
  """A checkpoint's JSON fields, less the fingerprint of `host_tree`, added in orbax's commit."""
  fields: dict[str, Any]
  host_tree: Any


class _MetaHandler(ocp.JsonCheckpointHandler):
  """Writes a checkpoint's JSON in orbax's background commit, hashing the state there.

  So a save holds training up only for copies to the host, not for a SHA-256 of the whole state.
  (JsonCheckpointHandler commits its item as given, so the hash would have to come first.)
  """

  async def async_save(self, directory: epath.Path, item: Any = None,
                       args: Any = None) -> list[ocp.future.Future]:
    del item  # Orbax passes _MetaSave as `args`.
    return [ocp.future.CommitFutureAwaitingContractedSignals(
        _write_meta(directory / META_FILE, args), name='meta_save')]


async def _write_meta(path: epath.Path, meta: _MetaSave) -> None:
  """Process 0 writes the JSON, as JsonCheckpointHandler would, once the hash is done."""
  fields = {**meta.fields, 'fingerprint': await asyncio.to_thread(fingerprint, meta.host_tree)}
  if processes.is_primary():
    try:
      await asyncio.to_thread(path.write_text, json.dumps(fields))
    except OSError as error:  # A failed write() does not name the file: the report must.
      raise OSError(error.errno, error.strerror, str(path)) from error


def _handlers() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  """The handlers of this app's CheckpointManagers (orbax's global registries stay as they are).

  One replica writes each replicated array, instead of orbax's default on CPUs and TPUs of
  splitting the write among the replicas: that slices every array on the devices first, which held
  training up 2-10x longer on 8 devices than on one, for a state of megabytes with nothing to gain.
  """
  types = ocp.type_handlers
  state = ocp.PyTreeCheckpointHandler(type_handler_registry=types.create_type_handler_registry(
      *((kind, types.get_type_handler(kind)) for kind in types.supported_types()),
      (jax.Array, types.ArrayHandler(use_replica_parallel=False))))
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  meta = _MetaHandler()
  for args in (ocp.args.PyTreeSave, ocp.args.PyTreeRestore):
    registry.add(STATE, args, state)
  for args in (_MetaSave, ocp.args.JsonRestore):
    registry.add(META, args, meta)
  return registry


def _manager(directory: str, **options: Any) -> ocp.CheckpointManager:
  """An orbax manager of `directory` with this app's handlers, whatever the options."""
  return ocp.CheckpointManager(directory, handler_registry=_handlers(),
                               options=ocp.CheckpointManagerOptions(step_name_format=NAME_FORMAT,
                                                                    **options))


def flat_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Dotted field names to JSON values, the form stored with each checkpoint."""

  def walk(tree: dict, prefix: str):
    for name, value in tree.items():
      if isinstance(value, dict):
        yield from walk(value, f'{prefix}{name}.')
      else:
        yield f'{prefix}{name}', value

  return json.loads(json.dumps(dict(walk(config.to_dict(), ''))))


def config_from_flat(flat: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config a checkpoint was saved with, rebuilt from its flat form (lists back to tuples)."""
  tree: dict[str, Any] = {}
  for name, value in flat.items():
    *parents, leaf = name.split('.')
    target = tree
    for parent in parents:
      target = target.setdefault(parent, {})
    target[leaf] = tuple(value) if isinstance(value, list) else value
  return ml_collections.ConfigDict(tree)


def config_mismatches(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
  """The fields, other than FREE_FIELDS, whose values differ; absent fields count as different."""
  absent = object()
  saved = {**DEFAULTS_OF_NEWER_FIELDS, **saved}
  return [name for name in sorted((saved.keys() | current.keys()) - FREE_FIELDS)
          if saved.get(name, absent) != current.get(name, absent)]


def _show(value: Any) -> str:
  """A stored value as the user writes it in a flag: lists back to tuples."""
  return repr(tuple(value)) if isinstance(value, list) else repr(value)


def _why(error: BaseException) -> str:
  lines = str(error).strip().splitlines() or ['']
  return f'{type(error).__name__}: {lines[0][:160]}'


class _Damaged(Exception):
  """Damage to a checkpoint that can be named (the message says what): it is set aside."""


def _causes(error: BaseException | None) -> Iterator[BaseException]:
  """The error and the errors it was raised from, outermost first."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def named_damage(error: BaseException) -> str | None:
  """What is wrong with a checkpoint's files, when `error` says so; None for any other failure.

  A missing file, metadata that is not JSON, or tensorstore's not-found, data-loss and
  out-of-range (a file cut short) statuses. An I/O error, memory, anything else: None.
  """
  for cause in _causes(error):
    if (isinstance(cause, (FileNotFoundError, json.JSONDecodeError))
        or TENSORSTORE_DAMAGE_STATUS.search(str(cause))):
      return _why(cause)
  return None


class _OrbaxReports(logging.Filter):
  """Mutes the reports of a Checkpoints' failures, each of which reaches the user as one line.

  Orbax logs each failed write or read (with its traceback) in the thread that meets it. When one
  array's write or read fails, orbax abandons the others: they end in an event loop already closed,
  and Python reports each as an ignored exception or an unretrieved task, until the process ends.
  """

  def __init__(self, directory: str):
    super().__init__()
    self._folder = os.path.join(directory, '')  # Not another folder whose name starts the same.
    self._previous_hook = sys.unraisablehook

  def _names_folder(self, error: BaseException | None) -> bool:
    return any(self._folder in str(cause) for cause in _causes(error))

  def filter(self, record: logging.LogRecord) -> bool:
    """False for an error report of orbax (absl's logger) or asyncio naming these checkpoints."""
    return not (record.levelno >= logging.ERROR and (
        self._folder in record.getMessage()
        or self._names_folder(record.exc_info[1] if record.exc_info else None)))

  def _hook(self, unraisable: Any) -> None:
    """sys.unraisablehook: passes on every report but those of orbax's abandoned work."""
    error = unraisable.exc_value
    if not (self._names_folder(error)
            or (isinstance(error, RuntimeError) and str(error) == ASYNCIO_LOOP_CLOSED)):
      self._previous_hook(unraisable)

  def open(self) -> None:
    for name in ('absl', 'asyncio'):
      logging.getLogger(name).addFilter(self)
    self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._hook

  def close(self, abandoned: bool) -> None:
    """Stops muting, unless a failed read or write left orbax work behind that may still report."""
    if abandoned:
      return
    if sys.unraisablehook == self._hook:
      sys.unraisablehook = self._previous_hook
    for name in ('absl', 'asyncio'):
      logging.getLogger(name).removeFilter(self)


def _read_meta(manager: ocp.CheckpointManager, epoch: int,
               damaged: list[tuple[int, str]]) -> dict[str, Any] | None:
  """A checkpoint's fingerprint and config; None, the reason added to `damaged`, if unreadable."""
  try:
    meta = manager.restore(epoch, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
    if not isinstance(meta['config'], dict):
      raise TypeError(f'the saved config is a {type(meta["config"]).__name__}')
    return meta
  except Exception as error:  # pylint: disable=broad-except; any failure means "damaged"
    damaged.append((epoch, f'its metadata cannot be read ({_why(error)})'))
    return None


def _none_restores(directory: str, damaged: list[tuple[int, str]]) -> None:
  """Raises the user's line when checkpoints exist but every one of them is damaged."""
  if damaged:
    reasons = '; '.join(f'epoch {epoch}: {why}' for epoch, why in damaged)
    raise UserError(f'no checkpoint in {directory} can be restored ({reasons}); copy good '
                    'ones back from a backup, or move the numbered folders away to start over')


def saved_config(directory: str) -> dict[str, Any] | None:
  """The flat config saved with the newest checkpoint whose metadata reads: what the run trained.

  None when `directory` holds no checkpoint; UserError when none of them can be read.
  """
  run_dir = RunDirectory(directory)
  if not run_dir.exists():
    return None
  directory = run_dir.name
  damaged: list[tuple[int, str]] = []
  with contextlib.closing(_manager(directory, create=False,
                                   cleanup_tmp_directories=False)) as manager:
    for epoch in sorted(manager.all_steps(), reverse=True):
      meta = _read_meta(manager, epoch, damaged)
      if meta is not None:
        return {**DEFAULTS_OF_NEWER_FIELDS, **meta['config']}
  _none_restores(directory, damaged)
  return None


class Checkpoints(ClosedOnExit):
  """The run directory's checkpoints, one folder per saved epoch: asynchronous saves, verified restores.

  Every process of a multi-process run must make the same calls: orbax coordinates the writes.
  """

  def __init__(self, directory: str, config: ml_collections.ConfigDict, *, read_only: bool = False):
    self.directory = RunDirectory(directory).name
    self.save_pauses: list[float] = []  # Seconds each save held training up (the copy to host).
    self._read_only = read_only
    self._config = flat_config(config)
    # read_only: no folder created, no half-written save cleaned up (it may be a live run's).
    # (Orbax's own read_only option warns on every use, so it is left off: nothing here saves.)
    self._manager = _manager(
        self.directory, max_to_keep=config.max_checkpoints_to_keep, create=not read_only,
        cleanup_tmp_directories=not read_only, enable_async_checkpointing=True)
    self._reports = _OrbaxReports(self.directory)
    self._reports.open()
    self._failed = False  # A read or write failed: orbax's abandoned work may report later.

  def epochs(self) -> list[int]:
    """The epochs with a complete checkpoint, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, epoch: int, state: steps.TrainState, rng: jax.Array) -> None:
    """Starts writing `state` (global arrays) as epoch `epoch`; returns before the disk is done."""
    start = time.perf_counter()
    tree = saved_tree(state, jax.random.key_data(rng))
    # A copy of our own: the next epoch takes over the state's device buffers.
    host_tree = jax.tree.map(np.array, jax.device_get(tree))
    meta = _MetaSave({'epoch': epoch, 'config': self._config}, host_tree)
    with self._writing():  # Orbax raises a failed background write at the next save.
      self._manager.save(epoch, force=True, args=ocp.args.Composite(
          **{STATE: ocp.args.PyTreeSave(tree), META: meta}))
    self.save_pauses.append(time.perf_counter() - start)

  def check(self) -> None:
    """Raises UserError if a background save has failed; does not wait for one in progress."""
    # Not check_for_errors(): it would take the error from orbax's finalize, which would then go
    # on to delete older checkpoints as if the failed save had succeeded.
    # Alone: in a multi-process run the processes could disagree on whether a save is in progress,
    # so a failure there surfaces at the next save, which all of them make together.
    if jax.process_count() == 1 and not self._manager.is_saving_in_progress():
      self.wait()

  @contextlib.contextmanager
  def _writing(self) -> Iterator[None]:
    try:
      yield
    except (OSError, ValueError) as error:  # Orbax passes on tensorstore's ValueError.
      self._failed = True
      self._remove_unfinished()
      kept = self.epochs()  # Orbax has dropped the failed save's epoch.
      failed = str(write_failed(self.directory, error, saved=bool(kept)))
      raise UserError(f'{failed} (epoch {kept[-1]})' if kept else failed) from error

  def _remove_unfinished(self) -> None:
    """Deletes the folders of saves that failed: their space back, no half checkpoint left."""
    if not self._read_only and processes.is_primary():
      for path in ocp.path.step.all_temporary_paths(self.directory):
        with contextlib.suppress(OSError):
          path.get().rmtree()

  def restore(self, template: steps.TrainState) -> Restored | None:
    """The newest checkpoint that restores and matches its fingerprint; None when there is none.

    `template` gives the state's shapes, dtypes and shardings (jax.ShapeDtypeStruct leaves).
    Passes over (and reports) only checkpoints whose damage can be named; raises UserError when the
    checkpoints come from another config or code, when one cannot be read for another reason (a
    transient I/O error: nothing is set aside), or when every one is damaged.
    """
    start = time.perf_counter()
    processes.check_same_checkpoints(max(self.epochs(), default=0))  # Orbax restores together.
    key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    sharding = template.step.sharding  # type: ignore[union-attr]  # A ShapeDtypeStruct here.
    target = saved_tree(template, jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding))
    damaged: list[tuple[int, str]] = []
    for epoch in reversed(self.epochs()):
      try:
        meta, tree = self._restore_verified(epoch, target)
      except _Damaged as damage:
        damaged.append((epoch, str(damage)))
        continue
      state = template.replace(step=tree['step'], params=tree['params'],
                               opt_state=tree['opt_state'])
      return Restored(epoch, state, meta['config'], tuple(damaged), time.perf_counter() - start)
    _none_restores(self.directory, damaged)
    return None

  def _restore_verified(self, epoch: int, target: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Epoch `epoch`'s metadata and saved tree, checked against its config and fingerprint."""
    self._check_files(epoch)
    meta = self._read(epoch, META, ocp.args.JsonRestore(), 'metadata')
    if not (isinstance(meta, dict) and {'fingerprint', 'config'} <= meta.keys()):
      raise _Damaged('its metadata lacks the fingerprint or the config')
    self._check_config(meta['config'], epoch)
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    tree = self._read(epoch, STATE, ocp.args.PyTreeRestore(item=target, restore_args=restore_args), 'state')
    if fingerprint(jax.device_get(tree)) != meta['fingerprint']:
      raise _Damaged('its state differs from the fingerprint saved with it')
    return meta, tree

  def _check_files(self, epoch: int) -> None:
    """Raises _Damaged when a file every checkpoint has is missing (orbax's exists() hides EIO)."""
    for name in REQUIRED_FILES:
      try:
        (ocp.path.step.build_step_path(self.directory, NAME_FORMAT, epoch) / name).stat()
      except FileNotFoundError as error:
        part = 'metadata' if name.startswith(META) else 'state'
        raise _Damaged(f'its {part} cannot be read ({name} is missing)') from error
      except OSError as error:
        raise self._unreadable(epoch, error) from error

  def _read(self, epoch: int, item: str, args: Any, what: str) -> Any:
    """One item of a checkpoint; damage that can be named raises _Damaged, the rest UserError."""
    try:
      return self._manager.restore(epoch, args=ocp.args.Composite(**{item: args}))[item]
    except Exception as error:  # pylint: disable=broad-except; sorted below, none set aside blindly
      self._failed = True
      damage = named_damage(error)
      if damage:
        raise _Damaged(f'its {what} cannot be read ({damage})') from error
      if ORBAX_TREE_MISMATCH.search(str(error)):
        raise UserError(
            f'the checkpoint of epoch {epoch} in {self.directory} holds a state whose structure '
            f'does not fit this code ({_why(error)}); resume it with the code that saved it, or '
            'pass a new --workdir to start another run') from error
      raise self._unreadable(epoch, error) from error

  def _unreadable(self, epoch: int, error: BaseException) -> UserError:
    return UserError(f'cannot read the checkpoint of epoch {epoch} in {self.directory} '
                     f'({_why(error)}); every checkpoint was left in place: rerun the same command '
                     'once the storage reads again')

  def set_aside(self, epochs: list[int]) -> list[str]:
    """Renames damaged checkpoints out of orbax's sight, kept for inspection; returns the new paths.

    Their epochs can then be saved again. Process 0 renames, the others wait for it.
    """
    moved = []
    for epoch in epochs:
      target = epath.Path(self.directory) / f'{DAMAGED_PREFIX}{epoch}'
      suffix = 1
      while target.exists():
        suffix += 1
        target = epath.Path(self.directory) / f'{DAMAGED_PREFIX}{epoch}.{suffix}'
      if processes.is_primary():
        ocp.path.step.build_step_path(self.directory, NAME_FORMAT, epoch).rename(target)
      moved.append(str(target))
    if epochs:
      ocp.multihost.sync_global_processes('checkpoints_set_aside')
      self._manager.reload()
    return moved

  def wait(self) -> None:
    """Returns once every save started is complete on disk."""
    with self._writing():
      self._manager.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      try:
        with self._writing():
          self._manager.close()
      finally:
        self._reports.close(abandoned=self._failed)

  def _check_config(self, saved: dict[str, Any], epoch: int) -> None:
    names = config_mismatches(saved, self._config)
    if names:
      then = ', '.join(f'{name}={_show(saved.get(name))}' for name in names)
      now = ', '.join(f'{name}={_show(self._config.get(name))}' for name in names)
      raise UserError(f'the checkpoint of epoch {epoch} in {self.directory} was saved with {then}, '
                      f'but this run has {now}; rerun with the checkpoint\'s values to resume it, '
                      'or pass a new --workdir to start another run')
