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

from command import STOP_SIGNALS
from errors import UserError
from mlp import steps
from trainer import evaluation, processes, reporting
from trainer.checkpoints import Restored
from trainer.config_rules import config_from_flat
from trainer.run import Run, learning, open_run
from trainer.run_dir import RunDirectory
from trainer.run_lock import STALE_AFTER_S


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
  with open_run(config, run_dir, lock_stale_after) as run:
    restored = run.checkpoints.restore(run.epochs.template)
    start_epoch = restored.epoch if restored else 0
    if restored:
      _report_resume(run, restored)
    run.reporter.start(start_epoch)
    if restored and start_epoch >= config.num_epochs:  # num_epochs >= 1: restored.
      return evaluation.report_finished(run, restored)
    state = restored.state if restored else run.epochs.fresh_state()
    _report_start(run)
    record = dict[str, float]()
    for epoch in range(start_epoch + 1, config.num_epochs + 1):
      with run.reporter.traced(epoch, wanted=epoch == config.profile_epoch):
        state, record = _train_and_evaluate_epoch(run, state, epoch)
      stop = _end_epoch(run, record, should_stop())
      run.checkpoints.save(epoch, state, force=bool(stop) or epoch == config.num_epochs)
      if stop and epoch < config.num_epochs:
        _wait_for_save(run, stop, epoch)
    # The last save complete before the run says it is saved; its failure (a full disk) said first,
    # with the checkpoint the run resumes from, not behind a picture that could not be written.
    run.checkpoints.wait()
    evaluation.draw_and_score_digits(run, state, config.num_epochs)
    if config.num_models > 1:
      run.reporter.log(reporting.members_summary(record, config.seed))
    _report_saved(run)
    return record


def _report_start(run: Run) -> None:
  """Says what trains, where and how."""
  config, epochs = run.config, run.epochs
  assert epochs.train_data is not None, 'a training run'
  run.reporter.log(
      f'training on {len(epochs.train_data[1]):,} images ({config.data.train_split}), evaluating '
      f'on {len(run.eval):,} ({config.data.eval_split}); {epochs.steps_per_epoch} steps of '
      f'{config.batch_size} per epoch in {config.dtype}, matmul precision '
      f'{config.matmul_precision}, {epochs.placement}; '
      f'compiled in {epochs.compile_seconds:.1f}s')


def _end_epoch(run: Run, record: dict[str, float], signal_name: str | None) -> str | None:
  """Checks the epoch before it is recorded; the signal stopping the run, if any process got one."""
  _check_finite(record, run.checkpoints.kept_epochs())
  # Not JAX's reached_preemption_sync_point: it hears no Ctrl-C, and is off in one-process runs.
  assert run.lock is not None, 'a training run holds its lock'
  stop, lock_lost = processes.agree_at_epoch_end(signal_name, run.lock.lost())
  # A lock another run took over stops the run first: that run explains this one's failing save.
  run.lock.check(lock_lost)
  run.checkpoints.check()  # A background save that failed stops the run here.
  run.reporter.write(record)  # Before the save: a checkpoint never runs ahead of metrics.jsonl.
  return stop


def _report_saved(run: Run) -> None:
  """Says where the last checkpoint is, and how long saves held training up."""
  pauses = sorted(run.checkpoints.save_pauses)
  run.reporter.log(f'saved the checkpoint of epoch {run.config.num_epochs} in {run.run_dir} '
                   f'(training paused a median {1000 * pauses[len(pauses) // 2]:.0f} ms per save; '
                   'orbax writes in the background)')


def _wait_for_save(run: Run, stop: str, epoch: int) -> None:
  """Raises Preempted once the epoch's checkpoint is saved; a save that failed says so instead."""
  try:
    run.checkpoints.wait()
  except UserError as error:
    raise UserError(f'stopped by {stop} after epoch {epoch}, but its checkpoint was not saved: '
                    f'{error}') from error
  raise Preempted(stop, epoch, run.run_dir.name)


def _train_and_evaluate_epoch(run: Run, state: steps.TrainState,
                              epoch: int) -> tuple[steps.TrainState, dict[str, float]]:
  """Trains one epoch and evaluates the result: the new state and the epoch's record."""
  start, epochs = time.perf_counter(), run.epochs
  state, train_metrics = epochs.train_epoch(state, epoch)
  train_seconds = time.perf_counter() - start
  eval_metrics = epochs.evaluate(state)
  return state, {
      'epoch': epoch,
      **{f'train_{name}': value for name, value in train_metrics.items()},
      **{f'eval_{name}': value for name, value in eval_metrics.items()},
      'epoch_seconds': time.perf_counter() - start,
      'train_images_per_second': epochs.steps_per_epoch * run.config.batch_size / train_seconds,
      'learning_rate': epochs.learning_rate(epoch),
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


def _report_resume(run: Run, restored: Restored) -> None:
  """Says where the run continues from, and how far the learning rate jumps if it does."""
  run.reporter.log(f'resumed from epoch {restored.epoch} (checkpoint restored and verified in '
                   f'{1000 * restored.seconds:.0f} ms){_schedule_change(run, restored)}')


def _schedule_change(run: Run, restored: Restored) -> str:
  """The learning rate's jump where a new num_epochs stretches the schedule; '' if it does not."""
  saved, config, epochs = config_from_flat(restored.config), run.config, run.epochs
  schedule = learning(saved, epochs.steps_per_epoch).schedule  # The saved config's own.
  rates = [float(schedule(restored.epoch * epochs.steps_per_epoch - 1)),
           epochs.learning_rate(restored.epoch)]  # The restored epoch's last update (metrics').
  if rates[0] == rates[1] or restored.epoch >= config.num_epochs:
    return ''
  return (f'; num_epochs {saved.num_epochs} -> {config.num_epochs} stretches the learning-rate '
          f'schedule: epoch {restored.epoch} ended at a rate of {rates[0]:.3g}, which the new '
          f'schedule puts at {rates[1]:.3g}, and training goes on from there')
