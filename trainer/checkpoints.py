"""Orbax checkpoints of everything that decides the rest of a run, verified on the way back in.

Orbax keeps no checksum: a flipped byte restores "successfully" as a wrong tensor, and a truncated
or missing file makes a restore fail with no fallback. So each checkpoint carries a fingerprint of
its state, checked after every restore, and the newest checkpoint that restores and verifies wins.
"""

import asyncio
import contextlib
import dataclasses
import functools
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from mlp import steps
from mlp.augment import Distortion
from errors import ClosedOnExit, UserError, write_failed
from trainer import processes

STATE, META = 'state', 'meta'
# Config fields a resumed run may change: how long to train (num_epochs also stretches a cosine
# schedule), how to run and evaluate, where the data lives. The rest decide the trained numbers;
# data.source among them, as TFDS stores MNIST's examples in another order than the IDX files.
FREE_FIELDS = frozenset({
    'num_epochs', 'eval_batch_size', 'eval_only', 'checkpoint_every_epochs',
    'max_checkpoints_to_keep', 'parallel', 'num_devices', 'profile_epoch', 'data.dir',
    'data.tfds_data_dir', 'data.eval_split'})
# Fields newer than some checkpoints, with the value those checkpoints were trained with.
DEFAULTS_OF_NEWER_FIELDS = {'dtype': 'float32', **{f'data.distort.{name}': value for name, value in
                                                   dataclasses.asdict(Distortion()).items()}}
DAMAGED_PREFIX = 'damaged-epoch-'
# Files every complete checkpoint holds; one missing is damage.
REQUIRED_FILES = (os.path.join(META, 'metadata'), os.path.join(STATE, '_METADATA'))
# Tensorstore's statuses (as orbax passes them on) for bytes that are missing, cut short or wrong.
_DAMAGE_STATUS = re.compile(r'^(NOT_FOUND|DATA_LOSS|OUT_OF_RANGE):|Truncated \S+ stream', re.M)
# Orbax's words for a saved tree that differs from the one asked for.
_STRUCTURE_ERROR = re.compile(
    r'tree structures do not match|pytree structure|not compatible with the stored shape')
TMP_SUFFIX = '.orbax-checkpoint-tmp'  # Orbax's folders of saves not yet complete.


@dataclasses.dataclass(frozen=True)
class Restored:
  """A verified checkpoint: the state to continue from, on the template's devices, and what was passed over."""
  epoch: int
  state: steps.TrainState
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


@dataclasses.dataclass(frozen=True)
class _Meta:
  """A checkpoint's JSON fields, less the fingerprint of `host_tree`, added in orbax's commit."""
  fields: dict[str, Any]
  host_tree: Any


class _MetaHandler(ocp.JsonCheckpointHandler):
  """Writes a checkpoint's JSON in orbax's background commit, hashing the state there.

  So a save holds training up only for copies to the host, not for a SHA-256 of the whole state.
  """

  async def _save_fn(self, x, directory):
    if isinstance(x, _Meta):
      x = {**x.fields, 'fingerprint': await asyncio.to_thread(fingerprint, x.host_tree)}
    await super()._save_fn(x, directory)


@ocp.args.register_with_handler(_MetaHandler, for_save=True)
@dataclasses.dataclass
class _MetaSave(ocp.args.CheckpointArgs):
  item: _Meta


@ocp.args.register_with_handler(_MetaHandler, for_restore=True)
@dataclasses.dataclass
class _MetaRestore(ocp.args.JsonRestore):
  pass


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
        or _DAMAGE_STATUS.search(str(cause))):
      return _why(cause)
  return None


def _from_abandoned_read(unraisable: Any) -> bool:
  """Leftovers of a failed orbax read: its other array reads, finishing into a closed event loop."""
  code = getattr(unraisable.object, 'cr_code', None)
  return ((isinstance(unraisable.exc_value, RuntimeError)
           and str(unraisable.exc_value) == 'Event loop is closed')
          or (code is not None and f'{os.sep}orbax{os.sep}' in code.co_filename))


def _orbax_task_report(record: logging.LogRecord) -> bool:
  """False for asyncio's reports of orbax's abandoned tasks and futures (never retrieved, or at shutdown)."""
  # A failed write's future may hold only tensorstore's error, which names orbax's folders.
  frames = traceback.extract_tb(record.exc_info[2]) if record.exc_info else []
  return not ('orbax' in record.getMessage()
              or any(f'{os.sep}orbax{os.sep}' in frame.filename for frame in frames))


def _orbax_error(record: logging.LogRecord) -> bool:
  """False for orbax's own error logs: the failure they report reaches the user as one line."""
  return not (record.levelno >= logging.ERROR and f'{os.sep}orbax{os.sep}' in record.pathname)


@functools.cache
def _write_each_array_whole() -> None:
  """One replica writes each replicated array, instead of orbax's default on CPUs and TPUs of
  splitting the write among the replicas: that slices every array on the devices first, which held
  training up 2-10x longer on 8 devices than on one, for a state of megabytes with nothing to gain.
  """
  absl_logger = logging.getLogger('absl')  # Orbax warns of any override, even one meant.
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)
  finally:
    absl_logger.setLevel(level)


def _mute_orbax_noise() -> None:
  """Silences orbax's own reports of failures that reach the user as one line (warning or error).

  When one array of a restore fails, orbax abandons the others; they end in an event loop already
  closed, and Python reports each as an ignored exception or an unretrieved task, sometimes while
  the failure is still unwinding. So this is in place before any restore is tried.
  """
  if not getattr(sys.unraisablehook, 'mutes_orbax', False):
    previous = sys.unraisablehook

    def hook(unraisable):
      if not _from_abandoned_read(unraisable):
        previous(unraisable)

    hook.mutes_orbax = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
  absl_logger = logging.getLogger('absl')  # Orbax logs each failed write, with its traceback.
  if _orbax_error not in absl_logger.filters:
    absl_logger.addFilter(_orbax_error)
  asyncio_logger = logging.getLogger('asyncio')
  if _orbax_task_report not in asyncio_logger.filters:
    asyncio_logger.addFilter(_orbax_task_report)


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
  directory = os.path.abspath(directory)
  if not os.path.isdir(directory):
    return None
  _mute_orbax_noise()
  options = ocp.CheckpointManagerOptions(create=False, cleanup_tmp_directories=False)
  damaged: list[tuple[int, str]] = []
  with contextlib.closing(ocp.CheckpointManager(directory, item_names=(STATE, META),
                                                options=options)) as manager:
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
    self.directory = os.path.abspath(directory)
    self.save_pauses: list[float] = []  # Seconds each save held training up (the copy to host).
    self._read_only = read_only
    self._config = flat_config(config)
    _mute_orbax_noise()
    _write_each_array_whole()
    # read_only: no folder created, no half-written save cleaned up (it may be a live run's).
    # (Orbax's own read_only option warns on every use, so it is left off: nothing here saves.)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.max_checkpoints_to_keep, create=not read_only,
        cleanup_tmp_directories=not read_only, enable_async_checkpointing=True)
    self._manager = ocp.CheckpointManager(self.directory, item_names=(STATE, META), options=options)

  def epochs(self) -> list[int]:
    """The epochs with a complete checkpoint, oldest first."""
    return sorted(self._manager.all_steps())

  def save(self, epoch: int, state: steps.TrainState, rng: jax.Array) -> None:
    """Starts writing `state` (global arrays) as epoch `epoch`; returns before the disk is done."""
    start = time.perf_counter()
    tree = saved_tree(state, jax.random.key_data(rng))
    # A copy of our own: the next epoch takes over the state's device buffers.
    host_tree = jax.tree.map(np.array, jax.device_get(tree))
    meta = _Meta({'epoch': epoch, 'config': self._config}, host_tree)
    with self._writing():  # Orbax raises a failed background write at the next save.
      self._manager.save(epoch, force=True, args=ocp.args.Composite(
          **{STATE: ocp.args.StandardSave(tree), META: _MetaSave(meta)}))
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
    except (OSError, ValueError) as error:  # Orbax wraps the OS error in a ValueError.
      self._remove_unfinished()
      raise write_failed(self.directory, error, saved=bool(self.epochs())) from error

  def _remove_unfinished(self) -> None:
    """Deletes the folders of saves that failed: their space back, no half checkpoint left."""
    if not self._read_only and processes.is_primary():
      for path in glob.glob(os.path.join(glob.escape(self.directory), f'*{TMP_SUFFIX}*')):
        shutil.rmtree(path, ignore_errors=True)

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
        tree = self._restore_verified(epoch, target)
      except _Damaged as damage:
        damaged.append((epoch, str(damage)))
        continue
      state = template.replace(step=tree['step'], params=tree['params'],
                               opt_state=tree['opt_state'])
      return Restored(epoch, state, tuple(damaged), time.perf_counter() - start)
    _none_restores(self.directory, damaged)
    return None

  def _restore_verified(self, epoch: int, target: dict[str, Any]) -> dict[str, Any]:
    """Epoch `epoch`'s saved tree, checked against its config and fingerprint; raises _Damaged."""
    self._check_files(epoch)
    meta = self._read(epoch, META, _MetaRestore(), 'metadata')
    if not (isinstance(meta, dict) and {'fingerprint', 'config'} <= meta.keys()):
      raise _Damaged('its metadata lacks the fingerprint or the config')
    self._check_config(meta['config'], epoch)
    tree = self._read(epoch, STATE, ocp.args.StandardRestore(target), 'state')
    if fingerprint(jax.device_get(tree)) != meta['fingerprint']:
      raise _Damaged('its state differs from the fingerprint saved with it')
    return tree

  def _check_files(self, epoch: int) -> None:
    """Raises _Damaged when a file every checkpoint has is missing (os.path.exists hides EIO)."""
    for name in REQUIRED_FILES:
      try:
        os.stat(os.path.join(self.directory, str(epoch), name))
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
      damage = named_damage(error)
      if damage:
        raise _Damaged(f'its {what} cannot be read ({damage})') from error
      if _STRUCTURE_ERROR.search(str(error)):
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
      target = os.path.join(self.directory, f'{DAMAGED_PREFIX}{epoch}')
      suffix = 1
      while os.path.exists(target):
        suffix += 1
        target = os.path.join(self.directory, f'{DAMAGED_PREFIX}{epoch}.{suffix}')
      if processes.is_primary():
        os.rename(os.path.join(self.directory, str(epoch)), target)
      moved.append(target)
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
      with self._writing():
        self._manager.close()

  def _check_config(self, saved: dict[str, Any], epoch: int) -> None:
    names = config_mismatches(saved, self._config)
    if names:
      then = ', '.join(f'{name}={_show(saved.get(name))}' for name in names)
      now = ', '.join(f'{name}={_show(self._config.get(name))}' for name in names)
      raise UserError(f'the checkpoint of epoch {epoch} in {self.directory} was saved with {then}, '
                      f'but this run has {now}; rerun with the checkpoint\'s values to resume it, '
                      'or pass a new --workdir to start another run')
