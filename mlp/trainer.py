"""The training loop: `train_and_evaluate(config, workdir)`, the library entry behind train.py."""

import math
import os
import time
from collections.abc import Callable

import jax
import ml_collections

from data.mnist import Examples, load_split
from mlp import config_checks
from mlp import distributed
from mlp import parallel
from mlp import steps
from mlp.checkpoint import Checkpoints, Restored
from mlp.errors import UserError
from mlp.preemption import Preempted
from mlp.reporting import Reporter, format_line, read_records, record_evaluation, warn


def _primary() -> bool:
  """Only process 0 of a multi-process run writes files and logs; every process computes."""
  return jax.process_index() == 0


def _prepare_workdir(workdir: str) -> None:
  """The run directory, created and writable, or one line saying why not (process 0 writes it)."""
  if not _primary():
    return
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as error:
    raise UserError(f'cannot create the run directory {workdir} ({error.strerror}); pass a '
                    '--workdir that can be written to') from error
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise UserError(f'the run directory {workdir} is not writable; pass a --workdir that can be '
                    'written to')


def _restore(config: ml_collections.ConfigDict, executor: parallel.Executor,
             checkpoints: Checkpoints, steps_per_epoch: int
             ) -> tuple[steps.TrainState, jax.Array, Restored | None]:
  """The device state and run key to start from: the newest good checkpoint's, or fresh ones."""
  distributed.check_same_checkpoints(max(checkpoints.epochs(), default=0))
  init_key, run_key = steps.run_keys(config.seed)
  state = executor.put_state(steps.create_train_state(config, init_key, steps_per_epoch))
  # The device round trip gives the template its saved types (the fresh step is a Python int).
  restored = checkpoints.restore(executor.get_state(state), run_key)
  if restored is None:
    return state, run_key, None
  return executor.put_state(restored.state), restored.rng, restored


def _run_epoch(executor: parallel.Executor, state: steps.TrainState, train_data, eval_data,
               run_key: jax.Array, epoch: int,
               images_per_epoch: int) -> tuple[steps.TrainState, dict[str, float]]:
  """Trains one epoch and evaluates the result: the new state and the epoch's record."""
  start = time.perf_counter()
  state, train_sums = executor.train_epoch(state, train_data, run_key, epoch)
  train_metrics = executor.metrics(train_sums)
  train_seconds = time.perf_counter() - start
  eval_metrics = executor.metrics(executor.evaluate(state, eval_data))
  return state, {
      'epoch': epoch,
      'train_loss': train_metrics['loss'],
      'train_accuracy': train_metrics['accuracy'],
      'eval_loss': eval_metrics['loss'],
      'eval_accuracy': eval_metrics['accuracy'],
      'epoch_seconds': time.perf_counter() - start,
      'train_images_per_second': images_per_epoch / train_seconds,
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


def _evaluation(config: ml_collections.ConfigDict, executor: parallel.Executor,
                state: steps.TrainState, eval_examples: Examples, epoch: int) -> dict[str, float]:
  """The eval split's metrics of a restored state, as a record for eval.jsonl."""
  metrics = executor.metrics(executor.evaluate(state, executor.put_data(eval_examples)))
  return {'epoch': epoch, 'eval_split': config.data.eval_split, 'eval_loss': metrics['loss'],
          'eval_accuracy': metrics['accuracy']}


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Scores the newest good checkpoint on the eval split without training (`eval_only`)."""
  missing = UserError(f'no checkpoint in {os.path.abspath(workdir)} to evaluate; train first (the '
                      'same command without --config.eval_only=True) or pass the run\'s --workdir')
  if not os.path.isdir(workdir):
    raise missing
  eval_examples = load_split(config.data, config.data.eval_split)
  executor = parallel.make_executor(config)
  with Checkpoints(workdir, config, read_only=True) as checkpoints:  # Leaves a live run's files be.
    state, _, restored = _restore(config, executor, checkpoints, steps_per_epoch=1)
  if restored is None:
    raise missing
  for epoch, why in restored.damaged:
    warn(f'passed over the checkpoint of epoch {epoch}: {why}')
  record = _evaluation(config, executor, state, eval_examples, restored.epoch)
  if _primary():
    record_evaluation(workdir, record)
  return record


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       should_stop: Callable[[], str | None] = lambda: None) -> dict[str, float]:
  """Trains for `config.num_epochs` epochs, evaluating after each; returns the last epoch's record.

  Continues from the newest good checkpoint in `workdir`; saves one every `checkpoint_every_epochs`
  and at the end. `should_stop` is asked after each epoch: a signal name from it saves a checkpoint
  and raises Preempted. With `eval_only`, evaluates the newest checkpoint instead.
  """
  config_checks.validate(config)
  if config.eval_only:
    return evaluate_checkpoint(config, workdir)
  executor = parallel.make_executor(config)  # Checks the devices against the config.
  train_examples = load_split(config.data, config.data.train_split)
  eval_examples = load_split(config.data, config.data.eval_split)

  steps_per_epoch = len(train_examples) // config.batch_size
  _prepare_workdir(workdir)
  with Checkpoints(workdir, config) as checkpoints:  # On exit, every save started is on disk.
    state, run_key, restored = _restore(config, executor, checkpoints, steps_per_epoch)
    start_epoch = restored.epoch if restored else 0
    reporter = Reporter(workdir, config.num_epochs, start_epoch=start_epoch, enabled=_primary())
    try:
      if restored:
        _report_resume(restored, checkpoints, reporter)
      if start_epoch >= config.num_epochs:
        return _report_finished(config, workdir, reporter, executor, state, eval_examples,
                                start_epoch)
      train_data = executor.put_data(train_examples)
      eval_data = executor.put_data(eval_examples)
      compile_start = time.perf_counter()
      executor.compile(state, train_data, eval_data, run_key)
      reporter.log(f'training on {len(train_examples):,} images ({config.data.train_split}), '
                   f'evaluating on {len(eval_examples):,} ({config.data.eval_split}); '
                   f'{steps_per_epoch} steps of {config.batch_size} per epoch, '
                   f'{executor.placement}; '
                   f'compiled in {time.perf_counter() - compile_start:.1f}s')
      record: dict[str, float] = {}
      for epoch in range(start_epoch + 1, config.num_epochs + 1):
        state, record = _run_epoch(executor, state, train_data, eval_data, run_key, epoch,
                                   steps_per_epoch * config.batch_size)
        _check_finite(record, checkpoints.epochs())
        reporter.write(record)  # Before the save: a checkpoint never runs ahead of metrics.jsonl.
        stop = distributed.agree_to_stop(should_stop())
        if stop or epoch == config.num_epochs or epoch % config.checkpoint_every_epochs == 0:
          checkpoints.save(epoch, executor.get_state(state), run_key)
        if stop and epoch < config.num_epochs:
          raise Preempted(stop, epoch, checkpoints.directory)
      pauses = sorted(checkpoints.save_pauses)
      reporter.log(f'saved the checkpoint of epoch {config.num_epochs} in {checkpoints.directory} '
                   f'(training paused a median {1000 * pauses[len(pauses) // 2]:.0f} ms per save; '
                   'orbax writes in the background)')
      return record
    finally:
      reporter.close()


def _report_resume(restored: Restored, checkpoints: Checkpoints, reporter: Reporter) -> None:
  """Says where the run continues from, and sets damaged newer checkpoints aside with a warning."""
  moved = checkpoints.set_aside([epoch for epoch, _ in restored.damaged])  # Every process: a barrier.
  for (epoch, why), path in zip(restored.damaged, moved):
    if _primary():
      warn(f'the checkpoint of epoch {epoch} is damaged: {why}; moved it to {path} and fell '
           f'back to epoch {restored.epoch}')
  reporter.log(f'resumed from epoch {restored.epoch} (checkpoint restored and verified in '
               f'{1000 * restored.seconds:.0f} ms)')


def _report_finished(config: ml_collections.ConfigDict, workdir: str, reporter: Reporter,
                     executor: parallel.Executor, state: steps.TrainState,
                     eval_examples: Examples, epoch: int) -> dict[str, float]:
  """A rerun of a finished run: its final metrics again, evaluated now on this run's eval split.

  Every process evaluates (a collective under pmap). The training figures come from metrics.jsonl
  when it has the epoch; the eval figures are always fresh, as data.eval_split may have changed.
  """
  reporter.log(f'nothing to train: the checkpoint is at epoch {epoch} and num_epochs is '
               f'{config.num_epochs} (raise --config.num_epochs to train on); final metrics:')
  evaluation = _evaluation(config, executor, state, eval_examples, epoch)
  recorded = [r for r in read_records(workdir) if r.get('epoch') == epoch] if _primary() else []
  if recorded:
    record = {**recorded[-1], 'eval_loss': evaluation['eval_loss'],
              'eval_accuracy': evaluation['eval_accuracy']}
    reporter.log(format_line(record, epoch, 0))
    return record
  if _primary():
    record_evaluation(workdir, evaluation)
  return evaluation
