"""Evaluating a saved run: `eval_only`, and a rerun of a run that has already finished."""

import os

import ml_collections
from jax.sharding import Mesh

from data.mnist import Examples, load_split
from errors import UserError
from trainer import processes
from trainer.checkpoints import Checkpoints, Restored
from trainer.reporting import Reporter, format_line
from trainer.run_setup import make_mesh, set_up_run, state_template


def _score(config: ml_collections.ConfigDict, mesh: Mesh, restored: Restored,
           examples: Examples) -> dict:
  """The eval split's metrics of a restored state, as a record for eval.jsonl."""
  metrics = set_up_run(config, mesh, None, examples, restored.state).evaluate(restored.state)
  return {'epoch': restored.epoch, 'eval_split': config.data.eval_split,
          'eval_loss': metrics['loss'], 'eval_accuracy': metrics['accuracy']}


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Scores the newest good checkpoint on the eval split without training (`eval_only`)."""
  missing = UserError(f'no checkpoint in {os.path.abspath(workdir)} to evaluate; train first (the '
                      'same command without --config.eval_only=True) or pass the run\'s --workdir')
  if not os.path.isdir(workdir):
    raise missing
  mesh = make_mesh(config)
  examples = load_split(config.data, config.data.eval_split)
  reporter = Reporter(workdir, config.num_epochs, enabled=processes.is_primary())
  # read_only: leaves a live run's files be.
  with Checkpoints(workdir, config, read_only=True) as checkpoints, reporter:
    restored = checkpoints.restore(state_template(config, mesh, steps_per_epoch=1))
    if restored is None:
      raise missing
    for epoch, why in restored.damaged:
      reporter.warn(f'passed over the checkpoint of epoch {epoch}: {why}')
    record = _score(config, mesh, restored, examples)
    reporter.evaluation(record)
  return record


def report_finished(config: ml_collections.ConfigDict, mesh: Mesh, restored: Restored,
                    examples: Examples, reporter: Reporter) -> dict:
  """A rerun of a finished run: its final metrics again, evaluated now on this run's eval split.

  The training figures come from metrics.jsonl; without that record, the evaluation stands alone.
  """
  reporter.log(f'nothing to train: the checkpoint is at epoch {restored.epoch} and num_epochs is '
               f'{config.num_epochs} (raise --config.num_epochs to train on); final metrics:')
  evaluated = _score(config, mesh, restored, examples)
  recorded = reporter.recorded(restored.epoch)
  if recorded:
    record = {**recorded, 'eval_loss': evaluated['eval_loss'],
              'eval_accuracy': evaluated['eval_accuracy']}
    reporter.log(format_line(record, restored.epoch, 0))
    return record
  reporter.evaluation(evaluated)
  return evaluated
