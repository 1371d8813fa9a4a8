"""A search driven by Optuna: its trials trained as members of one program, each as the separate
run of its values would train, and each saved as that run saves; pruning that stops a trial's
training; what the search reports (the table, curves.png, the best trial's run directory);
members across devices; the study's storage (SQLite in the run directory, a journal file shared by
launches); every bad input one line."""

import contextlib
import io
import math
import sys

import numpy as np
import optuna
import pytest
from PIL import Image

from data.mnist import load_split
from tests.conftest import (EVAL_COUNT, Recorder, assert_same_numbers, line_of, make_config,
                            member_records, on_devices, override_flags, read_metrics, run_train)
from tests.test_members import SETTINGS, TRAIN_COUNT, train
from trainer import (checkpoints, config_fields, config_file, config_rules, evaluation, pictures,
                     reporting, search, trials as trials_lib)
from trainer.host.run_dir import RunDirectory

# Two trials of two fields, two epochs of the members' small settings (every random draw on).
SEARCHED = dict(search__learning_rate=(1e-3, 1e-2), search__model__dropout_rate=(0.1, 0.4),
                search__trials=2, search__side_by_side=2)


def run_search(workdir, storage: str | None = None, study: str | None = None,
               host: Recorder | None = None, **overrides) -> str:
  """Searches the members' settings with the overrides in `workdir`; returns what it printed."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    search.search(make_config(**{**SETTINGS, **SEARCHED, **overrides}), RunDirectory(workdir),
                  host or Recorder(), storage, study)
  return printed.getvalue()


def study_of(workdir, name: str | None = None, storage: str | None = None) -> optuna.Study:
  return optuna.load_study(study_name=name or workdir.name,
                           storage=storage or f'sqlite:///{workdir / search.STUDY_FILE}')


# The pruned search's: four trials of the learning rate in one program.
PRUNED = dict(search__trials=4, search__side_by_side=4, search__model__dropout_rate=())


@pytest.fixture(scope='module')
def pruned_search(tmp_path_factory, mnist_dir):
  """Four trials in one program under Hyperband: the second trial of a rung that scores below
  the best before it is pruned after epoch 1. Its folder is named `pruned` alone: a search in
  another folder of that name asks the same trials."""
  workdir = tmp_path_factory.mktemp('pruned', numbered=False)
  return workdir, run_search(workdir, **PRUNED)


def classified(workdir) -> tuple[np.ndarray, int]:
  """The eval split's class probabilities by the run in `workdir`, as predict.py classifies
  them, and the epoch of the checkpoint that did."""
  _, plan, restored, _ = evaluation.classifier(str(workdir), Recorder(), None)
  examples = load_split(plan.data, plan.data.eval_split)
  return evaluation.probabilities(plan, restored, examples.images), restored.epoch


@pytest.mark.slow  # A search and a separate run: about 40 s on 2 busy cores.
def test_a_trial_s_member_trains_as_the_separate_run_of_its_values(tmp_path, monkeypatch):
  records: list[dict] = []
  epoch_record = reporting.Reporter.epoch_record
  monkeypatch.setattr(reporting.Reporter, 'epoch_record',
                      lambda self, *args: records.append(epoch_record(self, *args)) or records[-1])
  run_search(tmp_path / 'search', search__pruner='none')
  searched = list(records)  # The search's epochs, not the separate run's.
  trials = study_of(tmp_path / 'search').trials
  assert searched[-1]['members'] == [{**each.params, 'seed': SETTINGS['seed']} for each in trials]
  trial = trials[1]
  train(tmp_path / 'alone', learning_rate=trial.params['learning_rate'],
        model__dropout_rate=trial.params['model.dropout_rate'])
  assert_same_numbers(member_records(searched, 1), read_metrics(tmp_path / 'alone'),
                      train_count=TRAIN_COUNT)
  assert list(trial.intermediate_values.values()) == [
      record['eval_accuracy_by_member'][1] for record in searched]
  assert trial.value == searched[-1]['eval_accuracy_by_member'][1]
  # Its run directory classifies as the separate run does, to the members' tolerance.
  (ours, epoch), (theirs, _) = classified(tmp_path / 'search' / 'trials' / '1'), classified(
      tmp_path / 'alone')
  assert epoch == 2 and np.abs(ours - theirs).max() < 1e-4
  assert np.sum(ours.argmax(axis=1) != theirs.argmax(axis=1)) <= 1
  out = run_train(f'--workdir={tmp_path}/search/trials/1', f'--out={tmp_path}/export',
                  script='export.py')
  assert out.returncode == 0, out.stderr
  assert out.stderr.startswith(f'exported the checkpoint of epoch 2 in {tmp_path}/search/trials/1')


def test_a_pruned_trial_trains_no_more_and_its_program_is_rebuilt_without_it(pruned_search):
  workdir, printed = pruned_search
  trials = study_of(workdir).trials
  pruned = [trial for trial in trials if trial.state == optuna.trial.TrialState.PRUNED]
  assert pruned and all(list(trial.intermediate_values) == [1] for trial in pruned)
  assert f'pruned after epoch 1: trials {pruned[0].number} (' in printed
  last = [line for line in printed.splitlines() if line.startswith('epoch 2/2')][0]
  assert f'(mean of {4 - len(pruned)} models' in last


def test_the_study_holds_the_trials_asked_for_and_the_end_names_the_best(pruned_search):
  workdir, printed = pruned_search
  trials = study_of(workdir).trials
  assert len(trials) == 4 and {trial.state.name for trial in trials} <= {'COMPLETE', 'PRUNED'}
  best = max((t for t in trials if t.state.name == 'COMPLETE'), key=lambda t: t.value)
  table = printed[printed.index('trials by eval accuracy'):].splitlines()
  assert table[2].split()[:3] == [str(best.number), 'COMPLETE', f'{100 * best.value:.2f}%']
  rows = {int(line.split()[0]): line.split()[1:4] for line in table[2:6]}  # Each trial's state,
  # value (a pruned one's: its last epoch's) and epochs trained.
  last = {trial.number: trial.intermediate_values[max(trial.intermediate_values)]
          for trial in trials}
  assert rows == {trial.number: [trial.state.name, f'{100 * last[trial.number]:.2f}%',
                                 f'{len(trial.intermediate_values)}/2'] for trial in trials}
  said = table[-1]
  its_run = workdir / 'trials' / str(best.number)
  assert said.startswith(f'best: trial {best.number}, eval accuracy {100 * best.value:.2f}%, '
                         f'learning_rate={best.params["learning_rate"]:g}; saved in {its_run} '
                         f'(predict.py and export.py take --workdir={its_run}); trains alone '
                         'with: ')
  assert f'--config.learning_rate={best.params["learning_rate"]!r}' in said
  assert '--config.search' not in said and said.endswith(f' --workdir={its_run}')


def test_a_search_rerun_after_its_last_trial_says_so_and_trains_nothing(pruned_search):
  workdir, before = pruned_search
  printed = run_search(workdir, **PRUNED)
  assert printed.splitlines()[0] == (f'the study {workdir.name} in sqlite:///{workdir}/study.db '
                                     'already holds its 4 trials; nothing to train')
  # The table and the best, as the search ended: no epoch trained, no trial asked.
  assert printed.splitlines()[1:] == before[before.index('trials by eval'):].splitlines()
  assert len(study_of(workdir).trials) == 4


def test_each_trial_that_ends_leaves_the_run_directory_of_its_values(pruned_search):
  """A trial's own folder holds the checkpoint of its epochs, saved with the config of its values
  and no search: the printed command resumes it, predict.py and export.py read it."""
  workdir = pruned_search[0]
  trials = study_of(workdir).trials
  assert sorted(path.name for path in (workdir / 'trials').iterdir()) == sorted(
      [*(str(trial.number) for trial in trials), 'study.txt'])
  for trial in trials:
    its_run = RunDirectory(workdir / 'trials' / str(trial.number))
    epochs = len(trial.intermediate_values)
    assert its_run.checkpoint_epochs() == [epochs]
    assert trial.user_attrs == {search.RUN_DIRECTORY: its_run.name}
    epoch, saved = checkpoints.saved_config(its_run)
    assert epoch == epochs and saved == config_fields.flat_config(
        make_config(**SETTINGS, learning_rate=trial.params['learning_rate']))
    # It classifies the eval split as the trial's member scored it, to the members' tolerance.
    probabilities, _ = classified(its_run.name)
    examples = load_split(make_config().data, make_config().data.eval_split)
    right = np.mean(probabilities.argmax(axis=1) == examples.labels)
    assert abs(right - trial.intermediate_values[epochs]) * EVAL_COUNT <= 1 + 1e-9


def test_curves_png_draws_a_line_per_trial_each_pruned_one_ending_in_a_cross(pruned_search):
  workdir, printed = pruned_search
  trials = study_of(workdir).trials
  assert f"drew the trials' eval accuracy by epoch in {workdir}/curves.png" in printed
  with Image.open(workdir / 'curves.png') as picture:
    assert picture.size == pictures.TRIALS_SIZE
  drawn = trials_lib.curves(trials)
  (axes,) = pictures.trials_figure(drawn, 2, 'trials').axes
  lines = [line for line in axes.get_lines() if line.get_marker() == 'o']
  crosses = [line for line in axes.get_lines() if line.get_marker() == 'x']
  by_trial = {trial.number: [100 * trial.intermediate_values[e] for e in sorted(
      trial.intermediate_values)] for trial in trials}
  assert [list(line.get_ydata()) for line in lines] == [by_trial[n] for n in sorted(by_trial)]
  pruned = sorted(t.number for t in trials if t.state.name == 'PRUNED')
  assert [(list(line.get_xdata()), list(line.get_ydata())) for line in crosses] == [
      ([1], [by_trial[n][0]]) for n in pruned]  # Each where the pruner stopped it.
  assert [text.get_text() for text in axes.texts] == [str(n) for n in sorted(by_trial)]


def test_a_launch_into_the_run_directory_of_another_study_is_refused(pruned_search, tmp_path):
  workdir = pruned_search[0]
  said = line_of(lambda: run_search(workdir, study='another', **PRUNED))
  assert said == (f'the run directory {workdir} keeps the trials of the study pruned in trials/, '
                  'and this launch joins the study another, whose trial numbers would meet '
                  'theirs; pass another --workdir for it')


@pytest.mark.parametrize('models, shards', [(8, 4), (4, 4), (6, 2), (3, 1), (2, 2)])
def test_a_program_of_models_that_member_shards_does_not_divide_trains_over_fewer(models,
                                                                                  shards):
  config = make_config(member_shards=4)
  placed, found = search.batch_config(config, models)
  assert found == placed.member_shards == shards and (placed is config) == (shards == 4)


@pytest.mark.slow  # A search on 8 simulated devices: about 30 s.
def test_a_search_spreads_its_members_over_the_devices_pruned_or_not(pruned_search, tmp_path):
  """member_shards=4 on 8 devices: 4 trials one per shard, and once some are pruned, the survivors
  over the most shards that divide them, said in the log; the numbers of the search on one
  device (the same trials: a folder of the same name)."""
  workdir = tmp_path / pruned_search[0].name
  out = run_train('--config=configs/default.py', *override_flags(**{**SETTINGS, **SEARCHED,
                                                                   **PRUNED}),
                  '--config.member_shards=4', f'--workdir={workdir}', env=on_devices(8))
  assert out.returncode == 0, out.stderr
  assert '4 models side by side' in out.stdout and '1 per device (member_shards=4)' in out.stdout
  one_device, spread = study_of(pruned_search[0]).trials, study_of(workdir).trials
  assert [t.params for t in spread] == [t.params for t in one_device]
  assert [t.state for t in spread] == [t.state for t in one_device]
  for ours, theirs in zip(spread, one_device):
    assert all(abs(a - b) * EVAL_COUNT <= 1 + 1e-9 for a, b in zip(
        ours.intermediate_values.values(), theirs.intermediate_values.values()))
  survivors = sum(t.state.name == 'COMPLETE' for t in spread)
  if 4 % survivors:
    assert (f'member_shards=4 does not divide the {survivors} models of trials ') in out.stdout
    assert f'they train over {math.gcd(4, survivors)} member shard' in out.stdout
  assert (workdir / 'trials' / str(spread[0].number)).is_dir()


@pytest.mark.slow  # Two launches: about 20 s.
def test_launches_with_their_own_run_directories_share_a_study_in_a_journal_file(tmp_path,
                                                                                mnist_dir):
  storage = f'journal:{tmp_path / "study.log"}'
  run_search(tmp_path / 'first', storage, 'shared', search__trials=1)
  printed = run_search(tmp_path / 'second', storage, 'shared', search__trials=2)
  assert printed.startswith('trials 1: ')
  study = optuna.load_study(study_name='shared', storage=optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(str(tmp_path / 'study.log'))))
  assert [trial.number for trial in study.trials] == [0, 1]
  assert {trial.state.name for trial in study.trials} <= {'COMPLETE', 'PRUNED'}
  assert (tmp_path / 'first' / 'run.lock').exists() and (tmp_path / 'second').is_dir()


@pytest.mark.slow  # A batch stopped, then trained again: about 30 s.
def test_a_search_stopped_by_a_signal_trains_its_trials_again_with_their_values(tmp_path,
                                                                               mnist_dir):
  workdir = tmp_path / 'run'
  said = line_of(lambda: run_search(workdir, host=Recorder(stop_after=1), search__pruner='none'))
  assert said.startswith('stopped by SIGTERM after epoch 1; trials 0, 1 were told failed and are '
                         'queued to train again from their start: the same command goes on with '
                         'the study: ')
  stopped = study_of(workdir).trials
  assert [trial.state.name for trial in stopped] == ['FAIL', 'FAIL', 'WAITING', 'WAITING']
  printed = run_search(workdir, search__pruner='none')
  assert printed.startswith('trials 2, 3: ')
  again = study_of(workdir).trials[2:]
  assert [trial.params for trial in again] == [trial.params for trial in stopped[:2]]
  assert [trial.intermediate_values[1] for trial in again] == [
      trial.intermediate_values[1] for trial in stopped[:2]]  # The same first epoch, bit for bit.
  assert {trial.state.name for trial in again} == {'COMPLETE'}


# --- Bad input: one line each, nothing written -----------------------------------------------

@pytest.mark.parametrize('overrides, said', [
    (dict(search__learning_rate=(1e-2, 1e-4)),
     'search.learning_rate must run from low to high, (low, high), got (0.01, 0.0001); pass '
     '--config.search.learning_rate="(0.0001, 0.01)"'),
    (dict(search__weight_decay=(0.0, 0.1)),
     'search.weight_decay is searched on a log scale, which cannot reach 0.0: its low end must be '
     'above 0, got (0.0, 0.1); pass --config.search.weight_decay="(0.001, 0.1)"'),
    (dict(search__label_smoothing=(0.0, 1.5)),
     'search.label_smoothing must lie within the values of label_smoothing, each a number in '
     '[0, 1), got (0.0, 1.5); pass --config.search.label_smoothing="(0, 0.2)"'),
    (dict(search__trials=0),
     'search.trials must be at least 1 to search the ranges given (search.learning_rate, '
     'search.model.dropout_rate), got 0; pass --config.search.trials=32'),
    (dict(search__learning_rate=(), search__model__dropout_rate=()),
     'search.trials=2 asks for a search, and no range is given to search; give one, e.g. '
     '--config.search.learning_rate="(1e-4, 1e-2)", or pass --config.search.trials=0'),
    (dict(sweep__learning_rate=(1e-3, 2e-3)),
     'a sweep and a search cannot share a run: the sweep trains the values given '
     '(sweep.learning_rate), the search the values Optuna asks for; give each its own run '
     '(--config.search.trials=0, or --config.sweep.FIELD="()")'),
], ids=['upside down', 'log through zero', 'outside its field', 'ranges without trials',
        'trials without a range', 'a sweep beside it'])
def test_a_search_that_cannot_work_is_one_line_before_any_work(overrides, said):
  assert line_of(lambda: config_rules.validate(make_config(**{**SEARCHED, **overrides}))) == said


def test_a_shaping_field_in_the_space_is_refused_as_a_sweep_s_is():
  assert config_file.override_problem(make_config(), [('search.batch_size', '(128, 256)')]) == (
      'batch_size cannot vary inside one program: a search varies learning_rate, weight_decay, '
      'label_smoothing, model.dropout_rate; give each value of batch_size its own search '
      '(--config.batch_size=VALUE --workdir=...)')
  assert config_file.override_problem(make_config(), [('search.trails', '3')]) == (
      "the config has no field 'search.trails'; did you mean 'search.trials'?")


def test_a_storage_that_cannot_be_reached_is_one_line_and_nothing_is_written(tmp_path):
  said = line_of(lambda: run_search(tmp_path / 'run', 'postgresql://user:password@127.0.0.1:1/db'))
  assert said.startswith('cannot open the study storage --search_storage=postgresql://user:'
                         'password@127.0.0.1:1/db (OperationalError: ') and 'refused' in said
  said = line_of(lambda: run_search(tmp_path / 'run', f'journal:{tmp_path}/no/such/study.log'))
  assert said.startswith(f'cannot open the study storage --search_storage=journal:{tmp_path}/no/')
  assert not (tmp_path / 'run').exists()


def test_a_launch_of_another_config_is_refused_naming_the_fields(pruned_search):
  workdir = pruned_search[0]
  files = {path: path.read_bytes() for path in workdir.rglob('*') if path.is_file()}
  said = line_of(lambda: run_search(workdir, **PRUNED, seed=2))
  assert said == (f'the study {workdir.name} in sqlite:///{workdir}/study.db searches with seed=1, '
                  'and this launch has seed=2; pass the study\'s values to join it, or '
                  '--search_study=NAME to start a study of your own')
  assert {path: path.read_bytes() for path in workdir.rglob('*') if path.is_file()} == files


def test_a_study_that_a_launch_started_at_once_is_still_making_is_joined(tmp_path):
  """Launches started together: the first has made the study and not yet kept its config when
  the next checks it, which joins it; once kept, a launch of another config is refused."""
  url = f'sqlite:///{tmp_path / "study.db"}'
  storage = search.open_storage(optuna, url)
  made = optuna.create_study(storage=storage, study_name='new')
  wanted = search.study_config(make_config(**{**SETTINGS, **SEARCHED}))
  search.check_study(storage, 'new', wanted, url)
  made.set_user_attr('config', {**wanted, 'seed': 2})
  assert line_of(lambda: search.check_study(storage, 'new', wanted, url)).startswith(
      f'the study new in {url} searches with seed=2, and this launch has seed=1; ')


def test_a_search_without_its_extra_is_one_line_naming_it(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'optuna', None)
  said = line_of(lambda: run_search(tmp_path / 'run'))
  assert said == ('--config.search needs Optuna (import of optuna halted; None in sys.modules), '
                  'an extra that `make train` leaves out: pip install -r requirements/search.txt, '
                  'or train the config alone with --config.search.trials=0')
  assert not (tmp_path / 'run').exists()


def test_a_study_storage_that_stops_answering_mid_batch_is_one_line(tmp_path, monkeypatch):
  """The database gone while a batch trains (its server stopped, the network down): the line says
  what the rerun does, not a traceback."""
  import sqlalchemy.exc  # pylint: disable=g-import-not-at-top; Optuna's, loaded with it

  def gone(*_, **__):
    raise sqlalchemy.exc.OperationalError('UPDATE trials', {}, ConnectionError('server closed '
                                                                               'the connection'))
  monkeypatch.setattr(optuna.trial.Trial, 'report', gone)
  said = line_of(lambda: run_search(tmp_path / 'run'))
  assert said.startswith('the study storage stopped answering (OperationalError: ')
  assert said.endswith('the running trials go stale, and the same command trains them again '
                       'once the storage answers')
