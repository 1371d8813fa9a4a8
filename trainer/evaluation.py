"""Evaluating a saved run: `eval_only`, a rerun of a finished run, and a run as a classifier."""

import dataclasses

import jax
import numpy as np

from configs import default
from errors import During, UserError
from mlp import passes, steps
from trainer import checkpoints, config_fields, pictures, reporting
from trainer.checkpoints import Restored
from trainer.host import backend
from trainer.host.boundary import Host
from trainer.members import label
from trainer.plan import Plan, resolve
from trainer.programs import to_host
from trainer.run import Run, open_run, open_saved
from trainer.host.run_dir import RunDirectory

_predict = jax.jit(passes.predict, static_argnames='batch_size')  # Compiled per shape and batch.


def predict_logits(state: steps.TrainState, images: jax.Array | np.ndarray,
                   plan: Plan) -> np.ndarray:
  """Class logits [N, 10] of uint8 images [N, 784] on the host, as the evaluation makes them."""
  with jax.default_matmul_precision(plan.precision):
    return np.asarray(to_host(_predict(state, images, batch_size=plan.eval_batch_size)))


def ensemble_of(plan: Plan) -> str:
  """Words for what classifies when a run trains several models: their ensemble; '' for one."""
  count = len(plan.members)
  return f', ensemble of {count} models (mean probabilities)' if count > 1 else ''


@During('evaluating')
def draw_and_score_digits(run: Run, state: steps.TrainState, epoch: int) -> list[float | None]:
  """The eval split's accuracy per digit; its mistakes and confusion matrix drawn for the user."""
  images, labels = run.eval.images, run.eval.labels  # The host's copy: none comes back.
  predicted = predict_logits(state, run.programs.eval_data[0], run.plan).argmax(axis=1)
  matrix = pictures.confusion_matrix(labels, predicted)
  where = f'{run.plan.data.eval_split}, checkpoint of epoch {epoch}{ensemble_of(run.plan)}'
  run.reporter.pictures({
      'mistakes': pictures.draw_mistakes(images, labels, predicted, f'mistakes on {where}'),
      'confusion': pictures.draw_confusion(matrix, f'confusion matrix on {where}')}, epoch)
  run.reporter.log(f'eval accuracy per digit{ensemble_of(run.plan)}: '
                   f'{pictures.per_digit_text(matrix)}; drew its mistakes.png and confusion.png')
  return pictures.per_digit_accuracy(matrix)


def _score(run: Run, restored: Restored) -> dict:
  """The eval split's metrics of a restored state, as a record for eval.jsonl; draws pictures."""
  evaluated = run.programs.evaluate(restored.state)
  per_digit = draw_and_score_digits(run, restored.state, restored.epoch)
  return run.reporter.evaluation_record(restored.epoch, evaluated, per_digit)


def evaluate_checkpoint(plan: Plan, run_dir: RunDirectory,
                        host: Host | None = None) -> dict:
  """Scores the newest good checkpoint on the eval split without training (`eval_only`)."""
  missing = UserError(f'no checkpoint in {run_dir} to evaluate; train first (the same command '
                      'without --config.eval_only=True) or pass the run\'s --workdir')
  run_dir.check_usable()
  if not run_dir.exists():
    raise missing
  # Evaluating only: a live run's files stay as they are.
  with open_run(plan, run_dir, host or Host(), evaluate_only=True) as run:
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
                   f'is {run.plan.num_epochs} (raise --config.num_epochs to train on); final '
                   'metrics:')
  evaluated = _score(run, restored)
  run.reporter.draw_curves()  # Redrawn: a run resumed from an older code may lack it.
  if recorded := run.reporter.recorded(restored.epoch):
    record = reporting.evaluated_again(recorded, evaluated)
    run.reporter.log(reporting.format_line(record, restored.epoch, 0))
    return record
  run.reporter.evaluation(evaluated)
  return evaluated


def restore_run(run_dir: RunDirectory, host: Host | None = None) -> tuple[Plan, Restored]:
  """The run's plan on one device and its newest checkpoint that restores and verifies there; the
  damaged ones passed over said through `host`'s warnings.

  Raises UserError when `run_dir` holds no checkpoint, or only damaged ones.
  """
  missing = UserError(f'no checkpoint in {run_dir}; pass the --workdir of a trained run, or train '
                      f'one first: python train.py --config=configs/quick.py --workdir={run_dir}')
  run_dir.check_usable()
  found = checkpoints.saved_config(run_dir)
  if found is None:
    raise missing
  # Fields newer than an older checkpoint say only how to run: the default's values serve.
  defaults = config_fields.flat_config(default.get_config())
  plan = resolve(config_fields.config_from_flat({**defaults, **found[1]}), one_device=True)
  with open_saved(plan, run_dir, host or Host()) as saved:
    restored = saved.restore()
  if restored is None:
    raise missing
  return plan, restored


def classifier(workdir: str, host: Host,
               member: int | None) -> tuple[RunDirectory, Plan, Restored, str]:
  """What predict.py and export.py classify with: the run directory `workdir` names, the run's
  plan, its newest good checkpoint on one device (the CPU beside a TPU's training will do), the
  member chosen (choose_member's), and words that say which."""
  run_dir = RunDirectory(workdir)
  backend.start(cpu_will_do=True)
  plan, restored = restore_run(run_dir, host)
  return run_dir, plan, *choose_member(plan, restored, run_dir, member)


def choose_member(plan: Plan, restored: Restored, run_dir: RunDirectory,
                  member: int | None) -> tuple[Restored, str]:
  """What classifies, and words that say which: the run's model, its members' ensemble, or one
  member: `member`, or where none is given, a sweep's best on the eval split (metrics.jsonl's)."""
  count = len(plan.members)
  if member is None and not plan.varied:
    return restored, ensemble_of(plan)
  if not count:
    raise UserError(f'--member={member}: the run in {run_dir} trains one model alone; leave '
                    '--member out')
  why = ''
  if member is None:
    member, why = _best_member(run_dir, restored.epoch, count), (
        f', the best on {plan.data.eval_split}')
  if not 0 <= member < count:
    raise UserError(f'--member={member}: the run in {run_dir} has members 0 to {count - 1}; pass '
                    'one of those')
  state = jax.tree.map(lambda leaf: leaf[member], restored.state)
  said = label(plan.members[member].as_dict())
  return dataclasses.replace(restored, state=state), f', member {member} ({said}){why}'


def _best_member(run_dir: RunDirectory, epoch: int, count: int) -> int:
  """The member of the best eval accuracy in metrics.jsonl's record of `epoch`."""
  recorded = [r for r in reporting.read_records(run_dir) if r.get('epoch') == epoch
              and 'eval_accuracy_by_member' in r]
  if not recorded:
    raise UserError(f'{run_dir.file(reporting.METRICS_FILE)} holds no record of epoch {epoch} '
                    f'that names its best member; pass --member=K (0 to '
                    f'{count - 1}) to choose one')
  return reporting.ranked(recorded[-1])[0]


@During('classifying')
def probabilities(plan: Plan, restored: Restored, images: np.ndarray) -> np.ndarray:
  """float32 [N, 10] class probabilities of uint8 images [N, 784], by evaluation's forward pass."""
  return np.asarray(jax.nn.softmax(predict_logits(restored.state, images, plan), axis=-1))
