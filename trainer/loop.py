"""The training loop, `train_and_evaluate(plan, run_dir)`: the library entry behind train.py. It
restores or starts the planned run, trains and evaluates each epoch, reports and saves it, and
stops at an epoch's end when a signal asks (a preemptible machine gets a SIGTERM shortly before it
goes away)."""

import math
from typing import Any

import numpy as np

from errors import Stopped, UserError
from trainer import evaluation, reporting
from trainer.checkpoints import Restored
from trainer.config_fields import config_from_flat
from trainer.host.boundary import Host
from trainer.plan import Plan, recipe_of
from trainer.run import Run, open_run
from trainer.host.run_dir import RunDirectory


def train_and_evaluate(plan: Plan, run_dir: RunDirectory,
                       host: Host | None = None) -> dict[str, Any]:
  """Trains for `plan.num_epochs` epochs, evaluating after each; returns the last epoch's record.

  Continues from the newest good checkpoint in `run_dir`; saves one every `checkpoint_every_epochs`
  once `checkpoint_min_seconds` have passed since the last, and at the end. A stop that `host`
  hears (a signal) saves the epoch and raises Stopped. A finished run is evaluated and reported
  again.
  """
  with open_run(plan, run_dir, host or Host()) as run:
    restored = run.restore()
    start = restored.epoch if restored else 0
    if restored:
      _report_resume(run, restored)
    run.reporter.start(start)
    if restored and start >= plan.num_epochs:  # num_epochs >= 1: restored.
      return evaluation.report_finished(run, restored)
    state = restored.state if restored else run.programs.fresh_state()
    run.reporter.log(reporting.start_line(run.programs, len(run.eval)))
    record: dict[str, Any] = {}
    for epoch in range(start + 1, plan.num_epochs + 1):
      with run.reporter.traced(epoch):
        state, figures = run.programs.run_epoch(state, epoch)
      record = run.reporter.epoch_record(figures)
      stop = _end_epoch(run, record)
      run.checkpoints.save(epoch, state, force=bool(stop) or epoch == plan.num_epochs)
      if stop and epoch < plan.num_epochs:  # Once saved; a save that failed says so instead.
        run.checkpoints.wait(stopped=f'{stop} after epoch {epoch}')
        raise Stopped(stop, epoch, run.run_dir.name)
    # The last save complete before the run says it is saved; its failure (a full disk) said first,
    # with the checkpoint the run resumes from, not behind a picture that could not be written.
    run.checkpoints.wait()
    evaluation.draw_and_score_digits(run, state, plan.num_epochs)
    run.reporter.draw_curves()
    run.reporter.finished(record, run.checkpoints.save_pauses)
    return record


def _end_epoch(run: Run, record: dict[str, Any]) -> str | None:
  """Checks the epoch before it is recorded; the signal stopping the run, if any process got one."""
  _check_finite(record, run.checkpoints.kept_epochs())
  # Not JAX's reached_preemption_sync_point: it hears no Ctrl-C, and is off in one-process runs.
  assert run.lock is not None, 'a training run holds its lock'
  stop, lock_lost = run.host.agree_at_epoch_end(run.lock.lost())
  # A lock another run took over stops the run first: that run explains this one's failing save.
  run.lock.check(lock_lost)
  run.checkpoints.check()  # A background save that failed stops the run here.
  run.reporter.write(record)  # Before the save: a checkpoint never runs ahead of metrics.jsonl.
  return stop


def _check_finite(record: dict[str, Any], saved_epochs: list[int]) -> None:
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
  saved, plan = config_from_flat(restored.config), run.plan
  # The saved config's own schedule (only num_epochs may differ: its members are the plan's).
  schedule = recipe_of(saved, plan.members, plan.steps_per_epoch).schedule
  # The restored epoch's last update (metrics'), of members that set their own the first one's.
  rates = [np.ravel(schedule(restored.epoch * plan.steps_per_epoch - 1))[0],
           np.ravel(run.programs.learning_rate(restored.epoch))[0]]
  if rates[0] == rates[1] or restored.epoch >= plan.num_epochs:
    return ''
  return (f'; num_epochs {saved.num_epochs} -> {plan.num_epochs} stretches the learning-rate '
          f'schedule: epoch {restored.epoch} ended at a rate of {rates[0]:.3g}, which the new '
          f'schedule puts at {rates[1]:.3g}, and training goes on from there')
