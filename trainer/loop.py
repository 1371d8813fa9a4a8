"""The training loop: `train_and_evaluate(config, workdir)`, the library entry behind train.py."""

import math
import time
from collections.abc import Callable

import ml_collections

from data.mnist import Examples, load_splits
from errors import UserError
from mlp import batches, optim, steps
from trainer import evaluation
from trainer import processes
from trainer.checkpoints import Checkpoints, Restored, config_from_flat
from trainer.preemption import Preempted
from trainer.reporting import Reporter
from trainer.run_lock import STALE_AFTER_S, RunLock
from trainer.storage import RunDirectory
from trainer.devices import Placement
from trainer.run_setup import RunSetup, place, set_up_run, state_template


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       should_stop: Callable[[], str | None] = lambda: None,
                       lock_stale_after: float = STALE_AFTER_S) -> dict[str, float]:
  """Trains for `config.num_epochs` epochs, evaluating after each; returns the last epoch's record.

  Continues from the newest good checkpoint in `workdir`; saves one every `checkpoint_every_epochs`
  and at the end. `should_stop` is asked after each epoch: a signal name from it saves a checkpoint
  and raises Preempted. A finished run is evaluated and reported again. `workdir` may be a
  `gs://BUCKET/PATH`, whose run lock another run takes over after `lock_stale_after` silent seconds.
  """
  placement = place(config)  # Checks the devices against the config before any work.
  train, examples = load_splits(config.data, config.data.train_split, config.data.eval_split)
  run_dir = RunDirectory(workdir)
  reporter = Reporter(run_dir, config.num_epochs, enabled=processes.is_primary())
  # Before orbax tidies the folder. Process 0 takes it; a refusal stops every process.
  with RunLock(run_dir.name, enabled=processes.is_primary(), everyone=processes.everyone,
               stale_after=lock_stale_after, warn=reporter.warn) as lock:
    processes.check_shared_directory(run_dir)
    with Checkpoints(run_dir.name, config) as checkpoints, reporter:  # Exit: every save is done.
      return _resume(config, train, examples, placement, checkpoints, reporter, should_stop,
                     lock)


def _resume(config: ml_collections.ConfigDict, train: Examples, examples: Examples,
            placement: Placement, checkpoints: Checkpoints, reporter: Reporter,
            should_stop: Callable[[], str | None], lock: RunLock) -> dict[str, float]:
  """Continues from the newest good checkpoint, or starts; a finished run is reported again."""
  steps_per_epoch = batches.whole_batches(len(train), config.batch_size)
  restored = checkpoints.restore(state_template(config, placement.mesh, steps_per_epoch))
  if restored:
    _report_resume(config, restored, checkpoints, reporter, steps_per_epoch)
  start_epoch = restored.epoch if restored else 0
  reporter.start(start_epoch)
  if restored and start_epoch >= config.num_epochs:  # num_epochs >= 1: restored.
    return evaluation.report_finished(config, placement, restored, examples, reporter)
  compile_start = time.perf_counter()
  run, state = set_up_run(config, placement, train, examples,
                          restored.state if restored else None)
  reporter.log(f'training on {len(train):,} images ({config.data.train_split}), evaluating on '
               f'{len(examples):,} ({config.data.eval_split}); {steps_per_epoch} steps of '
               f'{config.batch_size} per epoch in {config.dtype}, matmul precision '
               f'{config.matmul_precision}, {run.programs.placement}; '
               f'compiled in {time.perf_counter() - compile_start:.1f}s')
  return _train(config, run, state, checkpoints, reporter, lock, start_epoch, should_stop)


def _train(config: ml_collections.ConfigDict, run: RunSetup, state: steps.TrainState,
           checkpoints: Checkpoints, reporter: Reporter, lock: RunLock, start_epoch: int,
           should_stop: Callable[[], str | None]) -> dict[str, float]:
  """Epochs after `start_epoch` from `state`: each recorded, then saved when due; a stop request
  saves and ends."""
  record = dict[str, float]()
  schedule = optim.learning_rate_schedule(config, run.steps_per_epoch)
  for epoch in range(start_epoch + 1, config.num_epochs + 1):
    with reporter.traced(epoch, wanted=epoch == config.profile_epoch):
      state, record = _run_epoch(run, state, epoch, config.batch_size)
    # The rate of the epoch's last update, whose optimizer count was the number of updates before.
    record['learning_rate'] = float(schedule(epoch * run.steps_per_epoch - 1))
    _check_finite(record, checkpoints.epochs())
    checkpoints.check()  # A background save that failed stops the run here.
    lock.check()  # So does a lock another run took over: this run must write no more.
    reporter.write(record)  # Before the save: a checkpoint never runs ahead of metrics.jsonl.
    # Not JAX's reached_preemption_sync_point: it hears no Ctrl-C, and is off in one-process runs.
    stop = processes.agree_to_stop(should_stop())
    if stop or epoch == config.num_epochs or epoch % config.checkpoint_every_epochs == 0:
      checkpoints.save(epoch, state, run.run_key)
    if stop and epoch < config.num_epochs:
      _wait_for_save(checkpoints, stop, epoch)
      raise Preempted(stop, epoch, checkpoints.directory)
  # The last save complete before the run says it is saved, and its failure (a full disk) said
  # first, with the checkpoint the run resumes from, not behind a picture that could not be written.
  checkpoints.wait()
  evaluation.review(config, run, state, config.num_epochs, reporter)
  pauses = sorted(checkpoints.save_pauses)
  reporter.log(f'saved the checkpoint of epoch {config.num_epochs} in {checkpoints.directory} '
               f'(training paused a median {1000 * pauses[len(pauses) // 2]:.0f} ms per save; '
               'orbax writes in the background)')
  return record


def _wait_for_save(checkpoints: Checkpoints, stop: str, epoch: int) -> None:
  """Preempted says the epoch's checkpoint is saved: a save that failed says so instead."""
  try:
    checkpoints.wait()
  except UserError as error:
    raise UserError(f'stopped by {stop} after epoch {epoch}, but its checkpoint was not saved: '
                    f'{error}') from error


def _run_epoch(run: RunSetup, state: steps.TrainState, epoch: int,
               batch_size: int) -> tuple[steps.TrainState, dict[str, float]]:
  """Trains one epoch and evaluates the result: the new state and the epoch's record."""
  start = time.perf_counter()
  state, train_metrics = run.train_epoch(state, epoch)
  train_seconds = time.perf_counter() - start
  eval_metrics = run.evaluate(state)
  images = run.steps_per_epoch * batch_size
  return state, {
      'epoch': epoch,
      'train_loss': train_metrics['loss'],
      'train_accuracy': train_metrics['accuracy'],
      'eval_loss': eval_metrics['loss'],
      'eval_accuracy': eval_metrics['accuracy'],
      'epoch_seconds': time.perf_counter() - start,
      'train_images_per_second': images / train_seconds,
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


def _report_resume(config: ml_collections.ConfigDict, restored: Restored, checkpoints: Checkpoints,
                   reporter: Reporter, steps_per_epoch: int) -> None:
  """Says where the run continues from, and sets damaged newer checkpoints aside with a warning."""
  moved = checkpoints.set_aside([epoch for epoch, _ in restored.damaged])  # Every process: a barrier.
  for (epoch, why), path in zip(restored.damaged, moved):
    reporter.warn(f'the checkpoint of epoch {epoch} is damaged: {why}; moved it to {path} and fell '
                  f'back to epoch {restored.epoch}')
  change = _schedule_change(config, restored, steps_per_epoch)
  reporter.log(f'resumed from epoch {restored.epoch} (checkpoint restored and verified in '
               f'{1000 * restored.seconds:.0f} ms){change}')


def _schedule_change(config: ml_collections.ConfigDict, restored: Restored,
                     steps_per_epoch: int) -> str:
  """The learning rate's jump where a new num_epochs stretches the schedule; '' if it does not."""
  saved = config_from_flat(restored.config)
  step = restored.epoch * steps_per_epoch - 1  # The restored epoch's last update, as in metrics.
  rates = [float(optim.learning_rate_schedule(c, steps_per_epoch)(step)) for c in (saved, config)]
  if rates[0] == rates[1] or restored.epoch >= config.num_epochs:
    return ''
  return (f'; num_epochs {saved.num_epochs} -> {config.num_epochs} stretches the learning-rate '
          f'schedule: epoch {restored.epoch} ended at a rate of {rates[0]:.3g}, which the new '
          f'schedule puts at {rates[1]:.3g}, and training goes on from there')
