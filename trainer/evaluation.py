"""Evaluating a saved run: `eval_only`, a rerun of a finished run, and a run as a classifier."""

import dataclasses

import jax
import ml_collections
import numpy as np

from errors import During, UserError
from mlp import passes, steps
from trainer import checkpoints, config_fields, pictures, reporting, sweeps
from trainer.host import backend
from trainer.checkpoints import Restored
from trainer.host.boundary import Host
from trainer.programs import member_count
from trainer.run import Run, open_run, open_saved
from trainer.host.run_dir import RunDirectory

_predict = jax.jit(passes.predict, static_argnames='batch_size')  # Compiled per shape and batch.


def predict_logits(state: steps.TrainState, images: jax.Array | np.ndarray,
                   config: ml_collections.ConfigDict) -> np.ndarray:
  """Class logits [N, 10] of uint8 images [N, 784] on the host, as the evaluation makes them."""
  with jax.default_matmul_precision(config.matmul_precision):
    return np.asarray(jax.device_get(_predict(state, images, batch_size=config.eval_batch_size)))


def ensemble_of(config: ml_collections.ConfigDict) -> str:
  """Words for what classifies when a run trains several models: their ensemble; '' for one."""
  count = member_count(config)
  return f', ensemble of {count} models (mean probabilities)' if count > 1 else ''


@During('evaluating')
def draw_and_score_digits(run: Run, state: steps.TrainState, epoch: int) -> list[float | None]:
  """The eval split's accuracy per digit; its mistakes and confusion matrix drawn for the user."""
  images, labels = run.eval.images, run.eval.labels  # The host's copy: none comes back.
  predicted = predict_logits(state, run.programs.eval_data[0], run.config).argmax(axis=1)
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
  evaluated = run.programs.evaluate(restored.state)
  per_digit = draw_and_score_digits(run, restored.state, restored.epoch)
  return run.reporter.evaluation_record(restored.epoch, evaluated, per_digit)


def _no_checkpoint(run_dir: RunDirectory, what_to_do: str) -> UserError:
  """The one line for a run directory that holds no checkpoint to use."""
  return UserError(f'no checkpoint in {run_dir}{what_to_do}')


def evaluate_checkpoint(config: ml_collections.ConfigDict, run_dir: RunDirectory,
                        host: Host | None = None) -> dict:
  """Scores the newest good checkpoint on the eval split without training (`eval_only`)."""
  missing = _no_checkpoint(run_dir, ' to evaluate; train first (the same command without '
                           '--config.eval_only=True) or pass the run\'s --workdir')
  run_dir.check_usable()
  if not run_dir.exists():
    raise missing
  # Evaluating only: a live run's files stay as they are.
  with open_run(config, run_dir, host or Host(), evaluate_only=True) as run:
    restored = run.restore()
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
  run.reporter.draw_curves()  # Redrawn: a run resumed from an older code may lack it.
  recorded = run.reporter.recorded(restored.epoch)
  if recorded:
    record = reporting.evaluated_again(recorded, evaluated)
    run.reporter.log(reporting.format_line(record, restored.epoch, 0))
    return record
  run.reporter.evaluation(evaluated)
  return evaluated


def restore_run(run_dir: RunDirectory, host: Host | None = None
                ) -> tuple[ml_collections.ConfigDict, Restored]:
  """The run's config and its newest checkpoint that restores and verifies, on one device; the
  damaged ones passed over said through `host`'s warnings.

  Raises UserError when `run_dir` holds no checkpoint, or only damaged ones.
  """
  missing = _no_checkpoint(run_dir, '; pass the --workdir of a trained run, or train one first: '
                           f'python train.py --config=configs/quick.py --workdir={run_dir}')
  run_dir.check_usable()
  found = checkpoints.saved_config(run_dir)
  if found is None:
    raise missing
  config = config_fields.config_from_flat(found[1])
  with open_saved(config, run_dir, host or Host()) as saved:
    restored = saved.restore()
  if restored is None:
    raise missing
  return config, restored


def classifier(run_dir: RunDirectory, host: Host,
               member: int | None) -> tuple[ml_collections.ConfigDict, Restored, str]:
  """What predict.py and export.py classify with: the run's config, its newest good checkpoint on
  one device (the CPU beside a TPU's training will do), the member chosen (choose_member's), and
  words that say which."""
  backend.start(cpu_will_do=True)
  config, restored = restore_run(run_dir, host)
  return config, *choose_member(config, restored, run_dir, member)


def choose_member(config: ml_collections.ConfigDict, restored: Restored, run_dir: RunDirectory,
                  member: int | None) -> tuple[Restored, str]:
  """What classifies, and words that say which: the run's model, its members' ensemble, or one
  member: `member`, or where none is given, a sweep's best on the eval split (metrics.jsonl's)."""
  count = member_count(config)
  if member is None and not sweeps.swept(config):
    return restored, ensemble_of(config)
  if not count:
    raise UserError(f'--member={member}: the run in {run_dir} trains one model alone; leave '
                    '--member out')
  why = ''
  if member is None:
    member, why = _best_member(run_dir, restored.epoch, config), (
        f', the best on {config.data.eval_split}')
  if not 0 <= member < count:
    raise UserError(f'--member={member}: the run in {run_dir} has members 0 to {count - 1}; pass '
                    'one of those')
  state = jax.tree.map(lambda leaf: leaf[member], restored.state)
  said = sweeps.label(sweeps.members(config)[member].as_dict())
  return dataclasses.replace(restored, state=state), f', member {member} ({said}){why}'


def _best_member(run_dir: RunDirectory, epoch: int, config: ml_collections.ConfigDict) -> int:
  """The member of the best eval accuracy in metrics.jsonl's record of `epoch`."""
  recorded = [r for r in reporting.read_records(run_dir) if r.get('epoch') == epoch
              and 'eval_accuracy_by_member' in r]
  if not recorded:
    raise UserError(f'{run_dir.file(reporting.METRICS_FILE)} holds no record of epoch {epoch} '
                    f'that names its best member; pass --member=K (0 to '
                    f'{member_count(config) - 1}) to choose one')
  return reporting.ranked(recorded[-1])[0]


@During('classifying')
def probabilities(config: ml_collections.ConfigDict, restored: Restored,
                  images: np.ndarray) -> np.ndarray:
  """float32 [N, 10] class probabilities of uint8 images [N, 784], by evaluation's forward pass."""
  logits = predict_logits(restored.state, images, config)
  return np.asarray(jax.nn.softmax(logits, axis=-1))
