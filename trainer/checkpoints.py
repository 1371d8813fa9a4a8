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
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from errors import CheckpointUnreadable, SaveFailed, UserError, causes, clipped, first_cause
from library_errors import (ASYNCIO_LOOP_CLOSED, ORBAX_NO_STEP_METADATA, ORBAX_STEP_GONE,
                            ORBAX_TREE_MISMATCH, TENSORSTORE_DAMAGE_STATUS)
from mlp import steps
from trainer import config_rules
from trainer.host.boundary import Host
from trainer.host.run_dir import RunDirectory
from trainer.plan import Checkpointing, Plan
from trainer.programs import gathers, to_host

STATE, META = 'state', 'meta'
META_NAME = 'metadata'  # JsonCheckpointHandler's file name, which older checkpoints have.
META_FILE = f'{META}/{META_NAME}'
DAMAGED_PREFIX = 'damaged-epoch-'
MODEL_API = 'flax.nnx'  # Written with each checkpoint: the state's layout is that of an NNX model.
LAST_LINEN_COMMIT = '0c632b5'  # The app's last commit with the Linen model (its last best.py).
OTHER_CODE = 'resume it with the code that saved it, or pass a new --workdir to start another run'
STATE_FILE = f'{STATE}/{ocp.path.format_utils.PYTREE_METADATA_FILE}'  # Every state has it.


@dataclasses.dataclass(frozen=True)
class Restored:
  """A verified checkpoint: the state to go on from, on the template's devices, and what was passed
  over."""
  epoch: int
  state: steps.TrainState
  config: dict[str, Any]  # The flat config it was saved with.
  damaged: tuple[tuple[int, str], ...]  # (epoch, why) of each newer checkpoint that failed.
  seconds: float
  moved: tuple[str, ...] = ()  # Where the damaged ones were set aside; none when only reading.

  def warnings(self) -> list[str]:
    """The one wording of the damage a restore met: a line for each newer checkpoint passed over."""
    if self.moved:
      return [f'the checkpoint of epoch {epoch} is damaged: {why}; moved it to {path} and fell '
              f'back to epoch {self.epoch}' for (epoch, why), path in zip(self.damaged, self.moved)]
    return [f'passed over the checkpoint of epoch {epoch}: {why}' for epoch, why in self.damaged]


def saved_tree(state: steps.TrainState, rng_data: Any) -> dict[str, Any]:
  """What a checkpoint holds: the data order a function of (seed, epoch), nothing else is needed."""
  return {'step': state.step, 'params': state.params, 'opt_state': state.opt_state,
          'rng': rng_data}  # The run key's data, which a restore checks against the seed's.


def fingerprint(tree: Any) -> str:
  """SHA-256 over every leaf's path, dtype, shape and bytes: any changed value changes it.

  The paths are JAX's of the NNX state (`['params']['hidden'][0]['kernel'].value`): a Flax release
  that flattened its Variables otherwise would make intact checkpoints read as damaged.
  """
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
  host_tree: Any  # None on the processes other than 0, which write no JSON.


class _MetaHandler(ocp.JsonCheckpointHandler):
  """Writes a checkpoint's JSON in orbax's background commit, hashing the state there.

  So a save holds training up only for copies to the host, not for a SHA-256 of the whole state
  (orbax's `custom_metadata` and JsonCheckpointHandler take the fields as given: the hash would
  come first, in the pause; docs/checkpoints.md measures it).
  """

  def __init__(self, primary: bool):
    super().__init__()
    self._primary = primary

  async def async_save(self, directory: epath.Path, item: Any = None,
                       args: Any = None) -> list[ocp.future.Future]:
    del item  # Orbax passes _MetaSave as `args`.
    return [ocp.future.CommitFutureAwaitingContractedSignals(
        self._write(directory / META_NAME, args), name='meta_save')]

  async def _write(self, path: epath.Path, meta: _MetaSave) -> None:
    """Process 0 writes the JSON, as JsonCheckpointHandler would, once the hash is done."""
    if not self._primary:
      return
    fields = {**meta.fields, 'fingerprint': await asyncio.to_thread(fingerprint, meta.host_tree)}
    try:
      await asyncio.to_thread(path.write_text, json.dumps(fields))
    except OSError as error:  # A failed write() does not name the file: the report must.
      raise OSError(error.errno, error.strerror, str(path)) from error


def _handlers(primary: bool) -> ocp.handlers.DefaultCheckpointHandlerRegistry:
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
  for args in (ocp.args.PyTreeSave, ocp.args.PyTreeRestore):
    registry.add(STATE, args, state)
  registry.add(META, _MetaSave, _MetaHandler(primary))
  return registry


@dataclasses.dataclass
class _DueAndPaced(ocp.checkpoint_managers.SaveDecisionPolicy):
  """Every `epochs` epochs, once `seconds` have passed since the last save and it is written: the
  AND of two orbax policies (its AnySavePolicy is their OR). The continuous one decides on process
  0's clock and tells the others; it is asked only when the epoch is due, which all agree on."""
  epochs: int
  seconds: float

  def should_save(self, step: Any, previous_steps: Any, *, context: Any) -> bool:
    paced = ocp.checkpoint_managers.ContinuousCheckpointingPolicy(
        minimum_interval_secs=self.seconds)  # Any number of seconds: it makes a timedelta.
    return all(policy.should_save(step, previous_steps, context=context) for policy in (
        ocp.checkpoint_managers.FixedIntervalPolicy(self.epochs), paced))


def _options(saving: Checkpointing, read_only: bool) -> ocp.CheckpointManagerOptions:
  """When to save (orbax asks the policy) and which checkpoints to keep. read_only: no folder made,
  no half-written save cleaned up (it may be a live run's), no pacing (an older checkpoint's config
  lacks checkpoint_min_seconds). (Orbax's own read_only warns on every use: nothing here saves.)"""
  # 0 s: every due epoch, even one that ends while the last save is written (which orbax's
  # continuous policy would pass over).
  due = ocp.checkpoint_managers.FixedIntervalPolicy(saving.every_epochs)
  if not read_only and saving.min_seconds > 0:
    due = _DueAndPaced(saving.every_epochs, saving.min_seconds)
  # LatestN sees orbax's checkpoints only: set_aside renames damaged ones out of its sight. Orbax's
  # default step folders ('3', ...), which RunDirectory.checkpoint_epochs() lists.
  return ocp.CheckpointManagerOptions(
      create=not read_only, cleanup_tmp_directories=not read_only,
      enable_async_checkpointing=True, enable_background_delete=not read_only,
      save_decision_policy=due,
      preservation_policy=ocp.checkpoint_managers.LatestN(saving.keep))


def _why(error: BaseException) -> str:
  return f'{type(error).__name__}: {clipped(str(error))}'


class _Damaged(Exception):
  """Damage to a checkpoint that can be named (the message says what): it is set aside."""


class MalformedMetadata(ValueError):
  """A checkpoint's metadata that parses, but holds no fingerprint or no config of fields."""


def named_damage(error: BaseException) -> str | None:
  """What is wrong with a checkpoint's files, when `error` says so; None for any other failure.

  A missing file, a folder where a file belongs or the reverse, metadata that is not JSON (or not
  text, or lacks the fingerprint or config), or tensorstore's not-found, data-loss and out-of-range
  (a file cut short) statuses and chunks that no longer decode. An I/O error, memory, anything
  else: None.
  """
  damage = first_cause(error, lambda cause: isinstance(cause, (
      FileNotFoundError, IsADirectoryError, NotADirectoryError, json.JSONDecodeError,
      UnicodeDecodeError, MalformedMetadata)) or bool(TENSORSTORE_DAMAGE_STATUS.search(str(cause))))
  return _why(damage) if damage else None


class _OrbaxReports(logging.Filter):
  """Mutes the reports of a Checkpoints' failures, each of which reaches the user as one line.

  Orbax logs each failed write or read (with its traceback) in the thread that meets it. When one
  array's write or read fails, orbax abandons the others: they end in an event loop already closed,
  and Python reports each as an ignored exception or an unretrieved task, until the process ends.
  """

  def __init__(self, directory: str):
    super().__init__()
    self._directory = directory
    self._folder = os.path.join(directory, '')  # Not another folder whose name starts the same.
    for name in ('absl', 'asyncio'):
      logging.getLogger(name).addFilter(self)
    self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._hook

  def _names_folder(self, error: BaseException | None) -> bool:
    return any(self._folder in str(cause) for cause in causes(error))

  def filter(self, record: logging.LogRecord) -> bool:
    """False for an error report of orbax (absl's logger) or asyncio naming these checkpoints, for
    orbax's warning of a folder without its step metadata (a damaged checkpoint, said as one), and
    for its warning that an old checkpoint to delete is gone already (removed by hand)."""
    message = record.getMessage()
    if ORBAX_NO_STEP_METADATA in message and self._folder in message:
      return False
    gone = ORBAX_STEP_GONE.search(message)
    if gone and gone.group(1) == self._directory:
      return False
    return not (record.levelno >= logging.ERROR and (
        self._folder in message
        or self._names_folder(record.exc_info[1] if record.exc_info else None)))

  def _hook(self, unraisable: Any) -> None:
    """sys.unraisablehook: passes on every report but those of orbax's abandoned work."""
    error = unraisable.exc_value
    if not (self._names_folder(error)
            or (isinstance(error, RuntimeError) and str(error) == ASYNCIO_LOOP_CLOSED)):
      self._previous_hook(unraisable)

  def close(self, abandoned: bool) -> None:
    """Stops muting, unless a failed read or write left orbax work behind that may still report."""
    if abandoned:
      return
    if sys.unraisablehook == self._hook:
      sys.unraisablehook = self._previous_hook
    for name in ('absl', 'asyncio'):
      logging.getLogger(name).removeFilter(self)


def _read_meta(run_dir: RunDirectory, epoch: int) -> dict[str, Any]:
  """A checkpoint's JSON, read as JsonCheckpointHandler would; its config as trained, with the
  fields newer than it: the one reader of checkpoint metadata."""
  with run_dir.during('reading', f'{epoch}/{META_FILE}'):  # A bucket's answer: no damage.
    meta = json.loads(run_dir.path(f'{epoch}/{META_FILE}').read_text())
  if not (isinstance(meta, dict) and isinstance(meta.get('fingerprint'), str)
          and isinstance(meta.get('config'), dict) and meta['config']):
    raise MalformedMetadata('it holds no fingerprint, or no config of fields')
  return {**meta, 'config': config_rules.as_trained(meta['config'])}


def _read(directory: str, epoch: int, what: str, read: Callable[[], Any]) -> Any:
  """`read()` of a part of a checkpoint, its failure classified once: damage that can be named
  raises _Damaged (the checkpoint is passed over); a state of another structure, the user's line;
  anything else (no permission, an I/O error, a bucket's answer) CheckpointUnreadable: every
  checkpoint stays in place."""
  try:
    return read()
  except Exception as error:  # pylint: disable=broad-except; sorted below, none set aside blindly
    if damage := named_damage(error):
      raise _Damaged(f'its {what} cannot be read ({damage})') from error
    if ORBAX_TREE_MISMATCH.search(str(error)):
      raise UserError(f'the checkpoint of epoch {epoch} in {directory} holds a state whose '
                      f'structure does not fit this code ({_why(error)}); {OTHER_CODE}') from error
    raise CheckpointUnreadable(directory, epoch) from error


def _none_restores(directory: str, damaged: list[tuple[int, str]]) -> None:
  """Raises the user's line when checkpoints exist but every one of them is damaged."""
  if damaged:
    reasons = '; '.join(f'epoch {epoch}: {why}' for epoch, why in damaged)
    raise UserError(f'no checkpoint in {directory} can be restored ({reasons}); copy good '
                    'ones back from a backup, or move the numbered folders away to start over')


def _newest_config(run_dir: RunDirectory) -> tuple[tuple[int, dict[str, Any]] | None,
                                                   list[tuple[int, str]]]:
  """The newest checkpoint whose metadata reads and the flat config it was saved with (None if
  none reads), and (epoch, why) of each newer one whose metadata is damaged."""
  damaged: list[tuple[int, str]] = []
  for epoch in reversed(run_dir.checkpoint_epochs()):
    try:
      meta = _read(run_dir.name, epoch, 'metadata', lambda: _read_meta(run_dir, epoch))
    except _Damaged as damage:
      damaged.append((epoch, str(damage)))
      continue
    return (epoch, meta['config']), damaged
  return None, damaged


def saved_config(run_dir: RunDirectory) -> tuple[int, dict[str, Any]] | None:
  """The newest checkpoint whose metadata reads, and the flat config it was saved with: what the
  run trained. None when `run_dir` holds no checkpoint; UserError when none of them can be read."""
  found, damaged = _newest_config(run_dir)
  if found is None:
    _none_restores(run_dir.name, damaged)
  return found


def readable_config(run_dir: RunDirectory) -> tuple[int, dict[str, Any]] | None:
  """The newest checkpoint whose metadata reads and its flat config, read before the data loads
  and anything compiles; damage is left to Checkpoints.restore."""
  return _newest_config(run_dir)[0]


class Checkpoints:
  """A run directory's checkpoints, a folder per saved epoch: asynchronous saves, verified restores.

  Every process of a multi-process run must make the same calls: orbax coordinates the writes, and
  process 0 alone writes the files that are not orbax's.
  """

  def __init__(self, run_dir: RunDirectory, plan: Plan, host: Host, read_only: bool = False):
    self.directory = run_dir.name
    self.save_pauses: list[float] = []  # Seconds each save held training up (the copy to host).
    self._run_dir, self._read_only, self._host = run_dir, read_only, host
    self._config = plan.saved
    # The run's key (which a restore checks against the seed's), on the host.
    self._run_key = np.asarray(jax.random.key_data(plan.keys[1]))
    self._reports = _OrbaxReports(self.directory)  # Muting from here on: the manager reads too.
    self._failed = False  # A read or write failed: orbax's abandoned work may report later.
    threads = set(threading.enumerate())
    with contextlib.ExitStack() as on_failure:
      on_failure.callback(self._reports.close, abandoned=False)
      self._manager = ocp.CheckpointManager(self.directory,
                                            handler_registry=_handlers(host.primary),
                                            options=_options(plan.checkpointing, read_only))
      on_failure.pop_all()
    # Its clean-up of half-written saves runs in a thread that only a save waits for: a run that
    # stops before saving waits in close(), or the exit cuts it short with orbax's traceback.
    self._cleanup = [t for t in threading.enumerate() if t not in threads and not t.daemon]

  def kept_epochs(self) -> list[int]:
    """The epochs this run's manager keeps, oldest first: a save still being written counts (it
    completes before the run ends), a failed one does not; RunDirectory.checkpoint_epochs() lists
    the complete folders alone, where no manager is open."""
    return sorted(self._manager.all_steps())

  def save(self, epoch: int, state: steps.TrainState, force: bool) -> None:
    """Starts writing `state` (global arrays) as epoch `epoch` if orbax's policy says it is due, or
    if `force` (the last epoch, a signal); returns before the disk is done."""
    if not (force or self._manager.should_save(epoch)):
      return
    start = time.perf_counter()
    step: Any = state.step  # A global array: the run key goes where it is.
    rng = jax.make_array_from_callback(self._run_key.shape, step.sharding,
                                       lambda index: self._run_key[index])
    tree = saved_tree(state, rng)
    # A copy of our own, for process 0's hash: the next epoch takes over the state's buffers.
    # Every process joins where members split over processes are gathered; process 0 keeps it.
    host_tree = (jax.tree.map(np.array, to_host(tree)) if self._host.primary or gathers(tree) else
                 None)
    meta = _MetaSave({'epoch': epoch, 'config': self._config, 'model': MODEL_API},
                     host_tree if self._host.primary else None)
    with self._saving():  # Orbax raises a failed background write at the next save.
      self._manager.save(epoch, force=True, args=ocp.args.Composite(
          **{STATE: ocp.args.PyTreeSave(tree), META: meta}))
    self.save_pauses.append(time.perf_counter() - start)

  def check(self) -> None:
    """Raises SaveFailed if a background save has failed; does not wait for one in progress."""
    # Not check_for_errors(): it would take the error from orbax's finalize, which would then go
    # on to delete older checkpoints as if the failed save had succeeded.
    # Alone: in a multi-process run the processes could disagree on whether a save is in progress,
    # so a failure there surfaces at the next save, which all of them make together.
    if self._host.alone and not self._manager.is_saving_in_progress():
      self.wait()

  @contextlib.contextmanager
  def _saving(self, stopped: str = '') -> Iterator[None]:
    """A save that failed (orbax passes on tensorstore's ValueError) as SaveFailed, naming the
    checkpoints a rerun finds. The failed save's folders go: their space back, no half
    checkpoint."""
    try:
      yield
    except (OSError, ValueError) as error:
      self._failed = True
      if not self._read_only and self._host.primary:
        for path in ocp.path.step.all_temporary_paths(self._run_dir.path()):
          with contextlib.suppress(OSError):
            path.get().rmtree()
      raise SaveFailed(self.directory, self._on_disk(), stopped) from error

  def _on_disk(self) -> list[int]:
    """The complete checkpoints in the folder, else (it cannot be listed now) those orbax knows of,
    less a failed save's."""
    with contextlib.suppress(OSError):
      return self._run_dir.checkpoint_epochs()
    return self.kept_epochs()

  def restore(self, template: steps.TrainState) -> Restored | None:
    """The newest checkpoint that restores and matches its fingerprint; None when there is none.

    `template` gives the state's shapes, dtypes and shardings (jax.ShapeDtypeStruct leaves).
    Passes over only checkpoints whose damage can be named, and sets them aside unless reading
    only (each said as a warning, in Restored.warnings' words); raises UserError when the
    checkpoints come from another config or code, or when every one is damaged, and
    CheckpointUnreadable when one cannot be read for another reason (nothing is set aside).
    """
    start = time.perf_counter()
    self._host.check_same_checkpoints(max(self.kept_epochs(), default=0))  # Restored together.
    step: Any = template.step  # A ShapeDtypeStruct here.
    rng = jax.ShapeDtypeStruct(self._run_key.shape, self._run_key.dtype, sharding=step.sharding)
    target = saved_tree(template, rng)
    damaged: list[tuple[int, str]] = []
    stray = dict(self._run_dir.stray_epochs())  # Damage too: orbax would delete one, to save there.
    for epoch in sorted({*self.kept_epochs(), *stray}, reverse=True):
      found = stray.get(epoch) or self._restore_verified(epoch, target)
      if isinstance(found, str):
        self._failed = True  # Orbax may have left work behind on the damaged files.
        damaged.append((epoch, found))
        continue
      meta, tree = found
      state = dataclasses.replace(template, step=tree['step'], params=tree['params'],
                                  opt_state=tree['opt_state'])
      seconds = time.perf_counter() - start
      moved = () if self._read_only else tuple(self.set_aside([e for e, _ in damaged]))  # Barrier.
      restored = Restored(epoch, state, meta['config'], tuple(damaged), seconds, moved)
      for line in restored.warnings():  # The one place a restore's damage is said.
        self._host.warn(line)
      return restored
    _none_restores(self.directory, damaged)
    return None

  def _restore_verified(self, epoch: int,
                        target: dict[str, Any]) -> tuple[dict[str, Any], Any] | str:
    """Epoch `epoch`'s metadata and saved tree, checked against its config, fingerprint and seed;
    or why the checkpoint is damaged."""
    try:
      meta = _read(self.directory, epoch, 'metadata', lambda: _read_meta(self._run_dir, epoch))
      self._check_written_here(epoch, meta)
      # Orbax's own check for this file would take an I/O error for its absence: stat() tells.
      _read(self.directory, epoch, 'state', self._run_dir.path(f'{epoch}/{STATE_FILE}').stat)
      args = ocp.args.PyTreeRestore(item=target, restore_args=(
          ocp.checkpoint_utils.construct_restore_args(target)))
      tree = _read(self.directory, epoch, 'state', lambda: self._manager.restore(
          epoch, args=ocp.args.Composite(**{STATE: args}))[STATE])
    except _Damaged as damage:
      return str(damage)
    host = to_host(tree)
    if fingerprint(host) != meta['fingerprint']:
      return 'its state differs from the fingerprint saved with it'
    if not np.array_equal(host['rng'], self._run_key):  # Intact, so written by other code.
      raise UserError(f'the checkpoint of epoch {epoch} in {self.directory} holds the run key '
                      f'{host["rng"].tolist()}, but seed {self._config["seed"]} gives this code '
                      f'{self._run_key.tolist()}; {OTHER_CODE}')
    return meta, tree

  def _check_written_here(self, epoch: int, meta: dict[str, Any]) -> None:
    """A checkpoint of this model, trained with the numbers of this run's config."""
    if meta.get('model') != MODEL_API:  # Only checkpoints of the Linen model lack it.
      raise UserError(f'the checkpoint of epoch {epoch} in {self.directory} holds the parameters '
                      'of the Flax Linen model this app had until 2026-11, which its Flax NNX '
                      'model does not load; pass a new --workdir to train anew, or resume it with '
                      f'the app from before (git checkout {LAST_LINEN_COMMIT})')
    config_rules.check_resumable((epoch, meta['config']), self._config, self.directory)

  def set_aside(self, epochs: list[int]) -> list[str]:
    """Renames damaged checkpoints out of orbax's sight, kept for inspection; returns the new paths.

    Their epochs can then be saved again. Process 0 renames, the others wait for it.
    """
    moved = []
    for epoch in epochs:
      name, suffix = f'{DAMAGED_PREFIX}{epoch}', 1
      while self._run_dir.path(name).exists() or os.path.islink(self._run_dir.file(name)):
        suffix += 1
        name = f'{DAMAGED_PREFIX}{epoch}.{suffix}'
      if self._host.primary:
        self._run_dir.path(str(epoch)).rename(self._run_dir.path(name))
      moved.append(self._run_dir.file(name))
    if epochs:
      ocp.multihost.sync_global_processes('checkpoints_set_aside')
      self._manager.reload()
    return moved

  def wait(self, stopped: str = '') -> None:
    """Returns once every save started is complete on disk; `stopped`: the signal and epoch of a
    stop that waits for its checkpoint ('SIGTERM after epoch 2'), said where the save fails."""
    with self._saving(stopped):
      self._manager.wait_until_finished()

  def _close_manager(self) -> None:
    """Closes orbax's manager, which raises now a failed deletion of an old checkpoint (no more
    are deleted after it): every checkpoint is saved, so the user is warned of those left over.
    Then waits for orbax's clean-up thread."""
    kept = self.kept_epochs()
    try:
      with self._saving():
        self._manager.close()
    except SaveFailed as failed:
      left = [epoch for epoch in self._on_disk() if epoch not in kept]
      if not left or not isinstance(failed.__cause__, OSError):
        raise
      self._host.warn(f'could not delete old checkpoints in {self.directory} '
                      f'({failed.__cause__.strerror}): the checkpoints of epochs '
                      f'{", ".join(map(str, left))} are still there beyond max_checkpoints_to_keep='
                      f'{self._config["max_checkpoints_to_keep"]}; let this user delete them, or '
                      'remove them by hand (every checkpoint was saved)')
    for thread in self._cleanup:
      thread.join()

  def __enter__(self) -> 'Checkpoints':
    return self

  def __exit__(self, kind: Any, error: BaseException | None, trace: Any) -> None:
    """Closes; a failure to close never hides an error on its way out, and a lost peer's error
    leaves at once: a save in flight waits on that peer and never ends."""
    if error is None:
      self.close()
      return
    self._failed = True  # Orbax's abandoned reads and writes may still report: muted to the end.
    if not self._host.lost_a_peer(error):
      with contextlib.suppress(Exception):
        self.close()

  def close(self) -> None:
    """Waits for the saves (then orbax's background deletions), and stops muting its reports."""
    with contextlib.ExitStack() as closing:
      closing.callback(lambda: self._reports.close(abandoned=self._failed))
      closing.callback(self._close_manager)
      self.wait()
