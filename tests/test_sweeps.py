"""Sweeps: members that differ by their hyperparameters, trained side by side in one program, each
as a separate run with its values would train; their results, curves and the tools that use them."""

import contextlib
import io
import json
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from tests.conftest import (ROOT, Recorder, assert_same_numbers, line_of, make_config,
                            member_records, read_metrics, run_train)
from tests.test_members import SETTINGS, TRAIN_COUNT, train
from tests.test_trainer import tensorboard_view
from trainer.plan import resolve
from trainer import evaluation, loop
from trainer.host.run_dir import RunDirectory

# A value of each sweepable field unlike the default's, beside one more: member 1 trains with the
# second value and seed 1, as the separate run of that value does.
SWEPT = {'learning_rate': (1e-3, 3e-3), 'weight_decay': (1e-4, 0.05),
         'label_smoothing': (0.0, 0.1), 'model.dropout_rate': (0.2, 0.35)}


def sweep_of(field: str, values: tuple[float, ...]) -> dict:
  """make_config's overrides that sweep `field` over `values`."""
  return {f'sweep__{field.replace(".", "__")}': values}


@pytest.fixture(scope='module')
def sweep_run(tmp_path_factory, mnist_dir):
  """A sweep of two learning rates, two seeds each, scored on the validation split."""
  workdir = tmp_path_factory.mktemp('sweep')
  printed = train(workdir, num_models=2, data__eval_split='train[50000:52000]',
                  **sweep_of('learning_rate', (1e-3, 3e-3)))
  return workdir, printed


# learning_rate in the fast tests, every field in the slow ones.
@pytest.mark.parametrize('field', [field if field == 'learning_rate' else
                                   pytest.param(field, marks=pytest.mark.slow) for field in SWEPT])
def test_a_member_trains_as_a_separate_run_with_its_value_would(field, tmp_path):
  values = SWEPT[field]
  train(tmp_path / 'sweep', **sweep_of(field, values))
  train(tmp_path / 'alone', **{field.replace('.', '__'): values[1]})
  records = read_metrics(tmp_path / 'sweep')
  assert records[-1]['members'] == [{field: values[0], 'seed': 1}, {field: values[1], 'seed': 1}]
  losses = records[-1]['eval_loss_by_member']
  assert losses[0] != losses[1]  # Two recipes, not one trained twice.
  assert_same_numbers(member_records(records, 1), read_metrics(tmp_path / 'alone'),
                      train_count=TRAIN_COUNT)


@pytest.mark.slow
def test_quick_s_members_end_near_their_separate_runs(tmp_path, mnist_dir):
  """configs/quick.py's 512-512 MLP, 2 epochs of 60,000 images: a member's rounding differs from
  its separate run's (XLA folds a constant learning rate into its schedule's arithmetic, not a
  member's), and 468 steps grow that as they grow a seed member's; docs/sweeps.md measures both.
  The last epoch within the spread measured there."""
  quick = dict(num_epochs=2, batch_size=256, data__eval_split='test[:1000]')
  train_quick = lambda folder, **more: loop.train_and_evaluate(
      resolve(make_config(**quick, data__train_split='train', **more)),
      RunDirectory(tmp_path / folder))
  train_quick('sweep', **sweep_of('learning_rate', (1e-3, 2e-3)))
  train_quick('alone', learning_rate=2e-3)
  ours = member_records(read_metrics(tmp_path / 'sweep'), 1)[-1]
  alone = read_metrics(tmp_path / 'alone')[-1]
  for name in ('train_loss', 'eval_loss'):
    assert ours[name] == pytest.approx(alone[name], rel=3e-2), (name, ours, alone)
  assert abs(ours['eval_accuracy'] - alone['eval_accuracy']) * 1000 <= 8 + 1e-9


def test_a_sweep_s_records_and_tensorboard_name_each_member_by_its_values(sweep_run):
  records = read_metrics(sweep_run[0])
  members = [{'learning_rate': rate, 'seed': seed} for rate in (1e-3, 3e-3) for seed in (1, 2)]
  assert all(record['members'] == members for record in records)
  assert records[-1]['learning_rate'][0] < records[-1]['learning_rate'][2]  # Each member's own.
  scalars, _ = tensorboard_view(sweep_run[0])
  for k, member in enumerate(members):
    tag = f'eval/accuracy_by_member/learning_rate={member["learning_rate"]:g} seed={member["seed"]}'
    assert scalars[tag, 2] == pytest.approx(records[-1]['eval_accuracy_by_member'][k])


def test_the_epoch_line_names_the_best_and_the_end_ranks_the_members(sweep_run):
  workdir, printed = sweep_run
  final = read_metrics(workdir)[-1]
  each = final['eval_accuracy_by_member']
  best = int(np.argmax(each))
  member = final['members'][best]
  named = f'learning_rate={member["learning_rate"]:g} seed={member["seed"]}'
  epoch_lines = [line for line in printed.splitlines() if line.startswith('epoch 2/2')]
  assert f'; best {named}; ensemble ' in epoch_lines[0]
  table = printed[printed.index('members by eval accuracy'):].splitlines()
  shown = [float(re.match(r'\s*([\d.]+)%', line).group(1)) for line in table[1:5]]
  assert shown == sorted(shown, reverse=True)
  assert shown[0] == pytest.approx(100 * max(each), abs=0.005)
  said = next(line for line in table if line.startswith('best: '))
  assert said.startswith(f'best: member {best}, {named}; trains alone with: ')
  assert f'--config.learning_rate={member["learning_rate"]!r}' in said
  assert '--config.sweep' not in said and f'--workdir={workdir}-member{best}' in said


def test_a_sweep_scored_on_the_test_set_warns_that_its_choice_has_no_honest_test_score(tmp_path,
                                                                                      mnist_dir):
  host = Recorder()
  with contextlib.redirect_stdout(io.StringIO()):
    loop.train_and_evaluate(resolve(make_config(num_epochs=1, data__train_split='train[:1024]',
                                        data__eval_split='test[:500]', model__hidden_sizes=(32,),
                                        **sweep_of('learning_rate', (1e-3, 2e-3)))),
                            RunDirectory(tmp_path), host)
  assert host.warnings == [
      'the members were scored on the test set (test[:500]): a recipe chosen there has no honest '
      'test score; choose on the validation split (--config=FILE:validation), then score the '
      'chosen recipe on test']


@pytest.mark.slow  # A run resumed for an epoch more.
def test_curves_are_drawn_and_redrawn_when_the_run_goes_on(sweep_run, tmp_path):
  workdir = shutil.copytree(sweep_run[0], tmp_path / 'run')
  before = (workdir / 'curves.png').read_bytes()
  assert Image.open(workdir / 'curves.png').size[0] > 1000
  train(workdir, num_models=2, data__eval_split='train[50000:52000]', num_epochs=3,
        **sweep_of('learning_rate', (1e-3, 3e-3)))
  assert len(read_metrics(workdir)) == 3
  assert (workdir / 'curves.png').read_bytes() != before  # Three epochs now.


def test_a_resume_with_other_sweep_values_is_refused_naming_them(sweep_run, tmp_path):
  workdir = shutil.copytree(sweep_run[0], tmp_path / 'run')
  said = line_of(lambda: train(workdir, num_models=2, data__eval_split='train[50000:52000]',
                               **sweep_of('learning_rate', (1e-3, 5e-3))))
  assert said.startswith(f'the checkpoint of epoch 2 in {workdir} was saved with '
                         'sweep.learning_rate=(0.001, 0.003), but this run has '
                         'sweep.learning_rate=(0.001, 0.005); ')


@pytest.mark.parametrize('flags, said', [
    (['--config.sweep.batch_size=(128, 256)'],
     'error: batch_size cannot vary inside one program: a sweep varies learning_rate, '
     'weight_decay, label_smoothing, model.dropout_rate; give each value of batch_size its own run '
     '(--config.batch_size=VALUE --workdir=...)'),
    (['--config.sweep.model.hidden_sizes=((64,), (128,))'],
     'error: model.hidden_sizes cannot vary inside one program: a sweep varies learning_rate, '),
    (['--config.sweep.learning_rate=(1e-3, -1.0)'],
     'error: sweep.learning_rate must be a tuple of values of learning_rate, each a finite number '
     '> 0, got (0.001, -1.0)'),
    (['--config.sweep.weight_decay=(0.0, 0.1)', '--config.optimizer=adam'],
     'error: sweep.weight_decay varies the weight decay of optimizer=adamw alone, and the '
     'optimizer is adam, got (0.0, 0.1); pass --config.sweep.weight_decay="()"'),
], ids=['batch_size', 'widths', 'a value its field refuses', 'weight decay without adamw'])
def test_a_sweep_that_cannot_train_is_one_line_before_any_work(flags, said, tmp_path):
  out = run_train('--config=configs/quick.py', f'--workdir={tmp_path / "run"}', *flags)
  assert out.returncode != 0 and out.stderr.startswith(said), out.stderr
  assert len(out.stderr.splitlines()) == 1 and not (tmp_path / 'run').exists()


@pytest.mark.slow  # Two fresh processes that restore the run: 3-4 s each.
def test_predict_and_export_use_the_best_member_or_the_one_asked_for(sweep_run, tmp_path):
  workdir = sweep_run[0]
  final = read_metrics(workdir)[-1]
  best = int(np.argmax(final['eval_accuracy_by_member']))
  named = (f'member {best} (learning_rate={final["members"][best]["learning_rate"]:g} '
           f'seed={final["members"][best]["seed"]}), the best on train[50000:52000]')
  out = run_train(f'--workdir={workdir}', str(ROOT / 'docs' / 'digits'), script='predict.py')
  assert out.returncode == 0 and out.stderr.strip().endswith(f'in {workdir}, {named}'), out.stderr
  asked = run_train(f'--workdir={workdir}', '--member=0', str(ROOT / 'docs' / 'digits'),
                    script='predict.py')
  assert asked.stderr.strip().endswith(f'in {workdir}, member 0 (learning_rate=0.001 seed=1)')
  assert asked.stdout != out.stdout or best == 0  # Another member's probabilities.
  exported = run_train(f'--workdir={workdir}', f'--out={tmp_path / "model"}', script='export.py')
  assert exported.returncode == 0, exported.stderr
  manifest = json.loads((tmp_path / 'model' / 'export.json').read_text())
  assert manifest['models'] == 1 and manifest['classifier'] == named
  refused = run_train(f'--workdir={workdir}', '--member=4', str(ROOT / 'docs' / 'digits'),
                      script='predict.py')
  assert refused.returncode == 1 and refused.stderr.strip() == (
      f'error: --member=4: the run in {workdir} has members 0 to 3; pass one of those')


def test_eval_only_scores_each_member(sweep_run, tmp_path):
  workdir = shutil.copytree(sweep_run[0], tmp_path / 'run')
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    evaluation.evaluate_checkpoint(resolve(make_config(**{
        **SETTINGS, 'num_models': 2, 'data__eval_split': 'train[50000:52000]', 'eval_only': True,
        **sweep_of('learning_rate', (1e-3, 3e-3))})), RunDirectory(workdir))
  printed = printed.getvalue()
  table = printed[printed.index('members by eval accuracy'):].splitlines()[1:5]
  final = read_metrics(workdir)[-1]
  assert sorted(float(re.match(r'\s*([\d.]+)%', line).group(1)) for line in table) == sorted(
      round(100 * each, 2) for each in final['eval_accuracy_by_member'])
  evaluated = json.loads((workdir / 'eval.jsonl').read_text().splitlines()[-1])
  assert evaluated['members'] == final['members']
  assert evaluated['eval_accuracy_by_member'] == final['eval_accuracy_by_member']
