"""The training loop, `train_and_evaluate(config, run_dir)`, the library entry behind train.py, and
the signals that stop it at an epoch boundary: a preemptible machine (a TPU VM, a spot instance)
gets a SIGTERM shortly before it goes away."""

import math
import signal
import time
import types
from collections.abc import Callable
from typing import Any

import ml_collections

from errors import UserError
from mlp import steps
from trainer import evaluation, processes
from trainer import run as run_lib
from trainer.checkpoints import Restored
from trainer.config_rules import config_from_flat
from trainer.run_dir import STALE_AFTER_S, RunDirectory

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """Raised once a signal-stopped run's checkpoint is on disk; train.py adds how to resume."""

  def __init__(self, signal_name: str, epoch: int, directory: str):
    super().__init__(f'stopped by {signal_name} after epoch {epoch}, whose checkpoint is saved in '
                     f'{directory}')
    self.exit_status = 128 + signal.Signals[signal_name].value  # The shell's status for the signal.


def _raise_interrupt() -> None:
  raise KeyboardInterrupt


class StopRequest:
  """While entered, records the first SIGTERM or SIGINT instead of dying; call it to poll.

  A second Ctrl-C calls `interrupt` at once (by default it raises KeyboardInterrupt, as usual).
  """

  def __init__(self, interrupt: Callable[[], None] = _raise_interrupt) -> None:
    self.signal_name: str | None = None
    self._interrupt = interrupt
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> 'StopRequest':
    for signum in STOP_SIGNALS:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def __call__(self) -> str | None:
    """The name of the signal that asked to stop, or None."""
    return self.signal_name

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    if self.signal_name is None:
      self.signal_name = signal.Signals(signum).name
    elif signum == signal.SIGINT:
      self._interrupt()


def train_and_evaluate(config: ml_collections.ConfigDict, run_dir: RunDirectory,
                       should_stop: Callable[[], str | None] = lambda: None,
                       lock_stale_after: float = STALE_AFTER_S) -> dict[str, float]:
  """Trains for `config.num_epochs` epochs, evaluating after each; returns the last epoch's record.

  Continues from the newest good checkpoint in `run_dir`; saves one every `checkpoint_every_epochs`
  once `checkpoint_min_seconds` have passed since the last, and at the end. `should_stop` is asked
  after each epoch: a signal name from it saves a checkpoint and raises Preempted. A finished run
  is evaluated and reported again. `run_dir` may be in a bucket, whose run lock another run takes
  over after `lock_stale_after` silent seconds.
  """
  with run_lib.open_run(config, run_dir, should_stop, lock_stale_after) as run:
    restored = run.checkpoints.restore(run.template())
    if restored:
      _report_resume(run, restored)
    start_epoch = restored.epoch if restored else 0
    run.reporter.start(start_epoch)
    if restored and start_epoch >= config.num_epochs:  # num_epochs >= 1: restored.
      return evaluation.report_finished(run, restored)
    return _train(run, restored.state if restored else None, start_epoch)


def _compile(run: run_lib.Run,
             state: steps.TrainState | None) -> tuple[run_lib.Epochs, steps.TrainState]:
  """The run's epochs compiled, and the state to start from; says what trains, where and how."""
  config, start = run.config, time.perf_counter()
  epochs, state = run_lib.compile_epochs(config, run.placement, run.train, run.eval, state)
  assert run.train is not None, 'a training run'
  run.reporter.log(
      f'training on {len(run.train):,} images ({config.data.train_split}), evaluating on '
      f'{len(run.eval):,} ({config.data.eval_split}); {run.steps_per_epoch} steps of '
      f'{config.batch_size} per epoch in {config.dtype}, matmul precision '
      f'{config.matmul_precision}, {epochs.programs.placement}; '
      f'compiled in {time.perf_counter() - start:.1f}s')
  return epochs, state


def _train(run: run_lib.Run, state: steps.TrainState | None,
           start_epoch: int) -> dict[str, float]:
  """Epochs after `start_epoch`: each recorded, then saved when due; a stop request saves, ends."""
  config, record = run.config, dict[str, float]()
  epochs, state = _compile(run, state)
  for epoch in range(start_epoch + 1, config.num_epochs + 1):
    with run.reporter.traced(epoch, wanted=epoch == config.profile_epoch):
      state, record = _run_epoch(run, epochs, state, epoch)
    _check_finite(record, run.checkpoints.epochs())
    run.checkpoints.check()  # A background save that failed stops the run here.
    assert run.lock is not None, 'a training run holds its lock'
    run.lock.check()  # So does a lock another run took over: this run must write no more.
    run.reporter.write(record)  # Before the save: a checkpoint never runs ahead of metrics.jsonl.
    # Not JAX's reached_preemption_sync_point: it hears no Ctrl-C, and is off in one-process runs.
    stop = processes.agree_to_stop(run.should_stop())
    run.checkpoints.save(epoch, state, force=bool(stop) or epoch == config.num_epochs)
    if stop and epoch < config.num_epochs:
      _wait_for_save(run, stop, epoch)
  # The last save complete before the run says it is saved, and its failure (a full disk) said
  # first, with the checkpoint the run resumes from, not behind a picture that could not be written.
  run.checkpoints.wait()
  evaluation.review(run, epochs, state, config.num_epochs)
  pauses = sorted(run.checkpoints.save_pauses)
  run.reporter.log(f'saved the checkpoint of epoch {config.num_epochs} in {run.run_dir} '
                   f'(training paused a median {1000 * pauses[len(pauses) // 2]:.0f} ms per save; '
                   'orbax writes in the background)')
  return record


def _wait_for_save(run: run_lib.Run, stop: str, epoch: int) -> None:
  """Raises Preempted once the epoch's checkpoint is saved; a save that failed says so instead."""
  try:
    run.checkpoints.wait()
  except UserError as error:
    raise UserError(f'stopped by {stop} after epoch {epoch}, but its checkpoint was not saved: '
                    f'{error}') from error
  raise Preempted(stop, epoch, run.run_dir.name)


def _run_epoch(run: run_lib.Run, epochs: run_lib.Epochs, state: steps.TrainState,
               epoch: int) -> tuple[steps.TrainState, dict[str, float]]:
  """Trains one epoch and evaluates the result: the new state and the epoch's record."""
  start = time.perf_counter()
  state, train_metrics = epochs.train_epoch(state, epoch)
  train_seconds = time.perf_counter() - start
  eval_metrics = epochs.evaluate(state)
  images = run.steps_per_epoch * run.config.batch_size
  return state, {
      'epoch': epoch,
      'train_loss': train_metrics['loss'],
      'train_accuracy': train_metrics['accuracy'],
      'eval_loss': eval_metrics['loss'],
      'eval_accuracy': eval_metrics['accuracy'],
      'epoch_seconds': time.perf_counter() - start,
      'train_images_per_second': images / train_seconds,
      # The rate of the epoch's last update, whose optimizer count was the number of updates before.
      'learning_rate': float(run.schedule(epoch * run.steps_per_epoch - 1)),
  }


def _check_finite(record: dict[str, float], saved_epochs: list[int]) -> None:
  """A diverged epoch stops the run before its state can be saved."""
  for name in ('train_loss', 'eval_loss'):
    if not math.isfinite(record[name]):
      if saved_epochs:  # Their config has the old learning rate: resuming them would refuse it.
        kept = f'newest checkpoint: epoch {saved_epochs[-1]}'
        fix = 'lower --config.learning_rate and train in a new --workdir'
      else:
        kept, fix = 'no checkpoint yet', 'lower --config.learning_rate and run again'
      raise UserError(f'the {name.replace("_", " ")} is {record[name]} in epoch {record["epoch"]}: '
                      f'training diverged, and that state was not saved ({kept}); {fix}')


def _report_resume(run: run_lib.Run, restored: Restored) -> None:
  """Says where the run continues from, and sets damaged newer checkpoints aside with a warning."""
  moved = run.checkpoints.set_aside([epoch for epoch, _ in restored.damaged])  # A barrier.
  for (epoch, why), path in zip(restored.damaged, moved):
    run.reporter.warn(f'the checkpoint of epoch {epoch} is damaged: {why}; moved it to {path} and '
                      f'fell back to epoch {restored.epoch}')
  run.reporter.log(f'resumed from epoch {restored.epoch} (checkpoint restored and verified in '
                   f'{1000 * restored.seconds:.0f} ms){_schedule_change(run, restored)}')


def _schedule_change(run: run_lib.Run, restored: Restored) -> str:
  """The learning rate's jump where a new num_epochs stretches the schedule; '' if it does not."""
  saved, config = config_from_flat(restored.config), run.config
  schedule = run_lib.learning(saved, run.steps_per_epoch).schedule
  step = restored.epoch * run.steps_per_epoch - 1  # The restored epoch's last update (metrics').
  rates = [float(schedule(step)), float(run.schedule(step))]
  if rates[0] == rates[1] or restored.epoch >= config.num_epochs:
    return ''
  return (f'; num_epochs {saved.num_epochs} -> {config.num_epochs} stretches the learning-rate '
          f'schedule: epoch {restored.epoch} ended at a rate of {rates[0]:.3g}, which the new '
          f'schedule puts at {rates[1]:.3g}, and training goes on from there')
