"""Evaluating a saved run: `eval_only`, and a rerun of a run that has already finished."""

import jax
import ml_collections
import numpy as np

from data.mnist import Examples, load_split
from errors import UserError
from mlp import steps
from trainer import pictures, processes
from trainer.checkpoints import Checkpoints, Restored
from trainer.reporting import Reporter, format_line
from trainer.devices import Placement
from trainer.run_setup import RunSetup, place, predict_logits, set_up_run, state_template
from trainer.storage import RunDirectory


def review(config: ml_collections.ConfigDict, run: RunSetup, state: steps.TrainState, epoch: int,
           reporter: Reporter) -> list[float]:
  """The eval split's accuracy per digit; its mistakes and confusion matrix drawn for the user."""
  images, labels = (np.asarray(jax.device_get(array)) for array in run.eval_data)
  predicted = predict_logits(state, run.eval_data[0], config).argmax(axis=1)
  matrix = pictures.confusion_matrix(labels, predicted)
  where = f'{config.data.eval_split}, checkpoint of epoch {epoch}'
  reporter.pictures({
      'mistakes': pictures.draw_mistakes(images, labels, predicted, f'mistakes on {where}'),
      'confusion': pictures.draw_confusion(matrix, f'confusion matrix on {where}')}, epoch)
  per_digit = pictures.per_digit_accuracy(matrix)
  shares = '  '.join(f'{digit} {100 * share:.1f}%' for digit, share in enumerate(per_digit))
  reporter.log(f'eval accuracy per digit: {shares}; drew its mistakes.png and confusion.png')
  return per_digit


def _score(config: ml_collections.ConfigDict, placement: Placement, restored: Restored,
           examples: Examples, reporter: Reporter) -> dict:
  """The eval split's metrics of a restored state, as a record for eval.jsonl; draws pictures."""
  run, state = set_up_run(config, placement, None, examples, restored.state)
  metrics = run.evaluate(state)
  return {'epoch': restored.epoch, 'eval_split': config.data.eval_split,
          'eval_loss': metrics['loss'], 'eval_accuracy': metrics['accuracy'],
          'eval_accuracy_per_digit': review(config, run, state, restored.epoch, reporter)}


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Scores the newest good checkpoint on the eval split without training (`eval_only`)."""
  run_dir = RunDirectory(workdir)
  missing = UserError(f'no checkpoint in {run_dir} to evaluate; train first (the same command '
                      'without --config.eval_only=True) or pass the run\'s --workdir')
  if not run_dir.exists():
    raise missing
  placement = place(config)
  examples = load_split(config.data, config.data.eval_split)
  reporter = Reporter(run_dir, config.num_epochs, enabled=processes.is_primary())
  # read_only: leaves a live run's files be.
  with Checkpoints(run_dir.name, config, read_only=True) as checkpoints, reporter:
    restored = checkpoints.restore(state_template(config, placement.mesh, steps_per_epoch=1))
    if restored is None:
      raise missing
    for epoch, why in restored.damaged:
      reporter.warn(f'passed over the checkpoint of epoch {epoch}: {why}')
    record = _score(config, placement, restored, examples, reporter)
    reporter.evaluation(record)
  return record


def report_finished(config: ml_collections.ConfigDict, placement: Placement, restored: Restored,
                    examples: Examples, reporter: Reporter) -> dict:
  """A rerun of a finished run: its final metrics again, evaluated now on this run's eval split.

  The training figures come from metrics.jsonl; without that record, the evaluation stands alone.
  """
  reporter.log(f'nothing to train: the checkpoint is at epoch {restored.epoch} and num_epochs is '
               f'{config.num_epochs} (raise --config.num_epochs to train on); final metrics:')
  evaluated = _score(config, placement, restored, examples, reporter)
  recorded = reporter.recorded(restored.epoch)
  if recorded:
    record = {**recorded, 'eval_loss': evaluated['eval_loss'],
              'eval_accuracy': evaluated['eval_accuracy']}
    reporter.log(format_line(record, restored.epoch, 0))
    return record
  reporter.evaluation(evaluated)
  return evaluated
