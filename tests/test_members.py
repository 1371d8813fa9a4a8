"""num_models: several MLPs trained side by side by vmap, each as a run of its own seed, and their
ensemble in every evaluation."""

import contextlib
import io
import json
import shutil

import jax
import numpy as np
import pytest

from data.mnist import load_split
from errors import UserError
from tests.conftest import (EVAL_COUNT, ROOT, Recorder, assert_same_numbers, make_config,
                            member_records, read_metrics, run_train, without_timings)
from trainer import evaluation, loop
from trainer.checkpoints import Checkpoints
from trainer.host.run_dir import RunDirectory
from trainer.plan import resolve
from trainer.programs import state_template

# Small and quick, with everything random on that a member must draw as its own seed's run would:
# initialization, batch order, dropout, shifts and every distortion (configs/best.py's kinds, each
# its own draw). The 2x64 model and seed 1 are tests/parallel_probe.py's, whose tolerance
# (tests/conftest.py's assert_same_numbers) holds here.
TRAIN_COUNT = 1024
DISTORTIONS = dict(rotation=10.0, scale=0.15, shear=8.0, translate=2.0, elastic_alpha=34.0,
                   elastic_sigma=6.0)
SETTINGS = dict(num_epochs=2, checkpoint_min_seconds=0, model__hidden_sizes=(64, 64),
                model__dropout_rate=0.2, data__train_split=f'train[:{TRAIN_COUNT}]',
                data__max_shift=1, seed=1,
                **{f'data__distort__{name}': value for name, value in DISTORTIONS.items()})
MEMBERS = 3


def train(workdir, **overrides) -> str:
  """Trains the settings with the overrides in `workdir`; returns what the run printed."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    loop.train_and_evaluate(resolve(make_config(**{**SETTINGS, **overrides})),
                            RunDirectory(workdir))
  return printed.getvalue()


@pytest.fixture(scope='module')
def members_run(tmp_path_factory, mnist_dir):
  """A run of three members: its folder and what it printed."""
  workdir = tmp_path_factory.mktemp('members')
  return workdir, train(workdir, num_models=MEMBERS)


# Member 2 in the fast tests (its initialization and every epoch's keys from seed + 2), every member
# in the slow ones.
@pytest.mark.parametrize('k', [pytest.param(0, marks=pytest.mark.slow),
                               pytest.param(1, marks=pytest.mark.slow), 2])
def test_each_member_trains_as_a_separate_run_of_its_seed(members_run, k, tmp_path):
  records = read_metrics(members_run[0])
  train(tmp_path, seed=SETTINGS['seed'] + k)
  assert_same_numbers(member_records(records, k), read_metrics(tmp_path), train_count=TRAIN_COUNT)
  losses = records[-1]['eval_loss_by_member']
  assert len(set(losses)) == MEMBERS  # Three models, not one trained three times.
  assert records[-1]['eval_loss'] == pytest.approx(sum(losses) / MEMBERS, rel=1e-12)


def test_the_ensemble_is_the_members_mean_probabilities(members_run):
  workdir = members_run[0]
  plan, restored = evaluation.restore_run(RunDirectory(workdir))
  assert restored.state.step.shape == (MEMBERS,)  # Every member saved, each with its step.
  examples = load_split(plan.data, plan.data.eval_split)
  each = [jax.nn.softmax(evaluation.predict_logits(jax.tree.map(lambda x, k=k: x[k],
                                                                restored.state),
                                                   examples.images, plan), axis=1)
          for k in range(MEMBERS)]
  mean = np.mean(each, axis=0)
  served = evaluation.probabilities(plan, restored, examples.images)  # What predict.py shows.
  np.testing.assert_allclose(served, mean, atol=1e-6)
  right = int(np.sum(mean.argmax(axis=1) == examples.labels))
  recorded = read_metrics(workdir)[-1]['eval_ensemble_accuracy']
  assert abs(right - recorded * EVAL_COUNT) <= 1
  assert right / EVAL_COUNT > max(read_metrics(workdir)[-1]['eval_accuracy_by_member']) - 0.01


def test_each_epoch_line_and_tensorboard_give_the_members_and_their_ensemble(members_run):
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  workdir, printed = members_run
  records = read_metrics(workdir)
  lines = [line for line in printed.splitlines() if line.startswith('epoch ')]
  assert len(lines) == len(records) == 2
  for line, r in zip(lines, records):
    each = r['eval_accuracy_by_member']
    assert (f'acc {100 * r["eval_accuracy"]:6.2f}% (mean of 3 models, {100 * min(each):.2f}-'
            f'{100 * max(each):.2f}%; ensemble {100 * r["eval_ensemble_accuracy"]:.2f}%)') in line
  assert '3 models side by side (seeds 1 to 3)' in printed
  last = records[-1]['eval_ensemble_accuracy']
  assert f'their ensemble (mean probabilities) {100 * last:.2f}%' in printed
  assert 'ensemble of 3 models (mean probabilities)' in printed  # The pictures say so.
  events = event_accumulator.EventAccumulator(str(workdir))
  events.Reload()
  for tag, name in (('eval/accuracy_by_member/2', 'eval_accuracy_by_member'),
                    ('train/loss_by_member/0', 'train_loss_by_member')):
    values = [event.value for event in events.Scalars(tag)]
    np.testing.assert_allclose(values, [r[name][int(tag[-1])] for r in records], rtol=1e-6)
  values = [event.value for event in events.Scalars('eval/ensemble_accuracy')]
  np.testing.assert_allclose(values, [r['eval_ensemble_accuracy'] for r in records], rtol=1e-6)


def test_a_damaged_newest_checkpoint_of_members_falls_back_and_resumes_exactly(members_run,
                                                                               tmp_path):
  workdir = shutil.copytree(members_run[0], tmp_path / 'run')
  data = max((p for p in (workdir / '2' / 'state').rglob('*') if p.is_file()),
             key=lambda p: p.stat().st_size)
  damaged = bytearray(data.read_bytes())
  damaged[len(damaged) // 2] ^= 0x01
  data.write_bytes(bytes(damaged))
  printed = train(workdir, num_models=MEMBERS)
  assert 'resumed from epoch 1' in printed
  assert without_timings(read_metrics(workdir)) == without_timings(read_metrics(members_run[0]))


def test_a_resume_with_another_number_of_models_is_refused_in_one_line(members_run):
  workdir = members_run[0]
  other = make_config(**SETTINGS, num_models=2)
  with Checkpoints(RunDirectory(workdir), resolve(other, one_device=True), Recorder(pytest.fail),
                   read_only=True) as saved:
    with pytest.raises(UserError) as error:
      saved.restore(state_template(resolve(other, one_device=True)))
  message = str(error.value)
  assert message.startswith(f'the checkpoint of epoch 2 in {workdir} was saved with num_models=3, '
                            'but this run has num_models=2; ') and '\n' not in message


def test_eval_only_scores_the_ensemble_and_says_so(members_run, tmp_path):
  workdir = shutil.copytree(members_run[0], tmp_path / 'run')
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    record = evaluation.evaluate_checkpoint(resolve(make_config(**SETTINGS, num_models=MEMBERS,
                                                       eval_only=True)), RunDirectory(workdir))
  final = read_metrics(members_run[0])[-1]
  for name in ('eval_accuracy', 'eval_ensemble_accuracy', 'eval_loss_by_member'):
    assert record[name] == final[name], name
  assert f'ensemble {100 * final["eval_ensemble_accuracy"]:.2f}%' in printed.getvalue()
  assert 'eval accuracy per digit, ensemble of 3 models (mean probabilities)' in printed.getvalue()


def test_export_and_predict_serve_the_ensemble_and_say_so(members_run, tmp_path):
  workdir, out = members_run[0], tmp_path / 'model'
  exported = run_train(f'--workdir={workdir}', f'--out={out}', script='export.py')
  assert exported.returncode == 0, exported.stderr
  assert 'ensemble of 3 models (mean probabilities)' in exported.stderr.strip().splitlines()[-1]
  assert json.loads((out / 'export.json').read_text())['models'] == MEMBERS
  program = jax.export.deserialize(bytearray((out / 'model.jax_export').read_bytes()))
  plan, restored = evaluation.restore_run(RunDirectory(workdir))
  images = load_split(plan.data, 'test[:37]').images
  np.testing.assert_allclose(program.call(images.reshape(-1, 28, 28)),
                             evaluation.probabilities(plan, restored, images), atol=1e-5)
  predicted = run_train(f'--workdir={workdir}', str(ROOT / 'docs' / 'digits' / 'typed-3.png'),
                        script='predict.py')
  assert predicted.returncode == 0, predicted.stderr
  assert predicted.stderr.strip().splitlines()[-1].endswith(
      f'in {workdir}, ensemble of 3 models (mean probabilities)')
