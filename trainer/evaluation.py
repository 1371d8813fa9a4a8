"""Evaluating a saved run: `eval_only`, a rerun of a finished run, and a run as a classifier."""

from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from errors import UserError
from mlp import epoch as epoch_lib
from mlp import steps
from trainer import backend, checkpoints, config_rules, pictures, reporting
from trainer.checkpoints import Checkpoints, Restored
from trainer.run import Run, keys_of, make_mesh, open_run, state_template
from trainer.run_dir import RunDirectory

_predict = jax.jit(epoch_lib.predict, static_argnames='batch_size')  # Compiled per shape and batch.


def predict_logits(state: steps.TrainState, images: jax.Array | np.ndarray,
                   config: ml_collections.ConfigDict, doing: str = 'evaluating') -> np.ndarray:
  """Class logits [N, 10] of uint8 images [N, 784] on the host, as the evaluation makes them."""
  with (jax.default_matmul_precision(config.matmul_precision),
        backend.device_memory_for(doing)):
    return np.asarray(jax.device_get(_predict(state, images, batch_size=config.eval_batch_size)))


def ensemble_of(config: ml_collections.ConfigDict) -> str:
  """Words for what classifies when a run trains several models: their ensemble; '' for one."""
  if config.num_models == 1:
    return ''
  return f', ensemble of {config.num_models} models (mean probabilities)'


def draw_and_score_digits(run: Run, state: steps.TrainState, epoch: int) -> list[float | None]:
  """The eval split's accuracy per digit; its mistakes and confusion matrix drawn for the user."""
  images, labels = run.eval.images, run.eval.labels  # The host's copy: none comes back.
  predicted = predict_logits(state, run.epochs.eval_data[0], run.config).argmax(axis=1)
  matrix = pictures.confusion_matrix(labels, predicted)
  where = f'{run.config.data.eval_split}, checkpoint of epoch {epoch}{ensemble_of(run.config)}'
  run.reporter.pictures({
      'mistakes': pictures.draw_mistakes(images, labels, predicted, f'mistakes on {where}'),
      'confusion': pictures.draw_confusion(matrix, f'confusion matrix on {where}')}, epoch)
  run.reporter.log(f'eval accuracy per digit{ensemble_of(run.config)}: '
                   f'{pictures.per_digit_text(matrix)}; drew its mistakes.png and confusion.png')
  return pictures.per_digit_accuracy(matrix)


def _score(run: Run, restored: Restored) -> dict:
  """The eval split's metrics of a restored state, as a record for eval.jsonl; draws pictures."""
  metrics = run.epochs.evaluate(restored.state)
  return {'epoch': restored.epoch, 'eval_split': run.config.data.eval_split,
          **{f'eval_{name}': value for name, value in metrics.items()},
          'eval_accuracy_per_digit': draw_and_score_digits(run, restored.state, restored.epoch)}


def _no_checkpoint(run_dir: RunDirectory, what_to_do: str) -> UserError:
  """The one line for a run directory that holds no checkpoint to use."""
  return UserError(f'no checkpoint in {run_dir}{what_to_do}')


def evaluate_checkpoint(config: ml_collections.ConfigDict, run_dir: RunDirectory) -> dict:
  """Scores the newest good checkpoint on the eval split without training (`eval_only`)."""
  missing = _no_checkpoint(run_dir, ' to evaluate; train first (the same command without '
                           '--config.eval_only=True) or pass the run\'s --workdir')
  run_dir.check_usable()
  if not run_dir.exists():
    raise missing
  with open_run(config, run_dir, evaluate_only=True) as run:  # Leaves a live run's files be.
    restored = run.checkpoints.restore(run.epochs.template)
    if restored is None:
      raise missing
    record = _score(run, restored)
    run.reporter.evaluation(record)
  return record


def report_finished(run: Run, restored: Restored) -> dict:
  """A rerun of a finished run: its final metrics again, evaluated now on this run's eval split.

  The training figures come from metrics.jsonl; without that record, the evaluation stands alone.
  """
  run.reporter.log(f'nothing to train: the checkpoint is at epoch {restored.epoch} and num_epochs '
                   f'is {run.config.num_epochs} (raise --config.num_epochs to train on); final '
                   'metrics:')
  evaluated = _score(run, restored)
  recorded = run.reporter.recorded(restored.epoch)
  if recorded:
    record = {**recorded, **{name: value for name, value in evaluated.items()
                             if name in recorded and name.startswith('eval_')}}
    run.reporter.log(reporting.format_line(record, restored.epoch, 0))
    return record
  run.reporter.evaluation(evaluated)
  return evaluated


def restore_run(run_dir: RunDirectory, warn: Callable[[str], None] = reporting.warn
                ) -> tuple[ml_collections.ConfigDict, Restored]:
  """The run's config and its newest checkpoint that restores and verifies, on one device; the
  damaged ones passed over said through `warn`.

  Raises UserError when `run_dir` holds no checkpoint, or only damaged ones.
  """
  missing = _no_checkpoint(run_dir, '; pass the --workdir of a trained run, or train one first: '
                           f'python train.py --config=configs/quick.py --workdir={run_dir}')
  run_dir.check_usable()
  with backend.machine_limits_said():  # Orbax lists the checkpoints in threads, too.
    backend.start(cpu_will_do=True)  # One device reads a run: the CPU beside a TPU's training.
    flat = checkpoints.saved_config(run_dir)
    if flat is None:
      raise missing
    config = config_rules.config_from_flat(flat)
    config.parallel, config.num_devices = 'jit', 0  # One device here, whatever the run trained on.
    run_key = keys_of(config)[1]  # What the saved run key is checked against.
    with Checkpoints(run_dir, config, run_key, warn=warn, read_only=True) as saved:
      restored = saved.restore(state_template(config, make_mesh('jit')))
  if restored is None:
    raise missing
  return config, restored


def probabilities(config: ml_collections.ConfigDict, restored: Restored,
                  images: np.ndarray) -> np.ndarray:
  """float32 [N, 10] class probabilities of uint8 images [N, 784], by evaluation's forward pass."""
  logits = predict_logits(restored.state, images, config, 'classifying')
  return np.asarray(jax.nn.softmax(logits, axis=1))
