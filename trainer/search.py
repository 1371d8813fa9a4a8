"""A search of the config's ranges, driven by Optuna (ask and tell): the loop over batches of
`side_by_side` trials, each batch's trials the members of one program, a trial the pruner stops
dropped from the program at its epoch's end (the survivors' state sliced, their program compiled
again); the study in a storage that every launch naming it joins. Optuna is imported here alone,
when a search starts."""

import contextlib
import dataclasses
import importlib.util
import math
import os
import signal
import threading
import types
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding

from configs import default
from data.mnist import Examples, load_splits
from errors import ExtraMissing, UserError, error_reason
from mlp import optim, steps
from trainer import config_rules, pictures, reporting, trials as trials_lib
from trainer.checkpoints import Checkpoints
from trainer.config_fields import flat_config, with_values
from trainer.host.boundary import Host
from trainer.host.exits import this_command
from trainer.host.run_dir import RunDirectory
from trainer.host.run_lock import RunLock
from trainer.members import Member
from trainer.plan import Plan, resolve
from trainer.programs import Programs, compile_programs, state_spec, state_template

STUDY_FILE = 'study.db'  # The default storage: SQLite, in the run directory.
JOURNAL = 'journal:'  # --search_storage=journal:PATH: Optuna's journal file at PATH.
POSTGRESQL = 'postgresql'  # A URL's scheme that names no driver: psycopg2's, the extra's.
# A running trial's heartbeat (RDB storages): recorded every HEARTBEAT_S seconds; a trial without
# one for GRACE_S is failed by the next launch that asks, and asked again.
HEARTBEAT_S, GRACE_S = 10, 60
# Launches that open a new database at once each make its tables, and those that lose the race fail
# on a duplicate (Optuna's issue 1092) once the winner's tables are there: opened again, they find
# them. Two steps can collide (the tables, then the schema's version), so three attempts suffice.
MAKING_ATTEMPTS = 3
# What a launch may change in a study it joins: how it runs, and how many trials the study holds.
# num_epochs and the eval split stay: every trial's value is an accuracy after as many epochs on
# one split.
STUDY_FREE_FIELDS = (config_rules.FREE_FIELDS - {'num_epochs', 'data.eval_split'}) | {
    'search.trials', 'search.side_by_side'}
SAMPLERS_NEEDING = {'gp': 'torch'}  # A sampler's library that the search extra leaves out.
# Each trial that ends leaves a run directory of its own, trials/NUMBER in the search's, named in
# the trial's user attribute RUN_DIRECTORY; STUDY_NAME_FILE names the study whose trials they are.
TRIALS, RUN_DIRECTORY = 'trials', 'run_directory'
STUDY_NAME_FILE = f'{TRIALS}/study.txt'


def import_optuna() -> types.ModuleType:
  """Optuna, its own lines quiet (the search says what it does), or ExtraMissing naming the
  extra that installs it."""
  try:
    import optuna  # pylint: disable=g-import-not-at-top; the search extra, for a search alone
  except ImportError as error:
    raise ExtraMissing('--config.search', 'Optuna', 'pip install -r requirements/search.txt',
                       'train the config alone with --config.search.trials=0') from error
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


@contextlib.contextmanager
def _quiet(optuna: types.ModuleType) -> Iterator[None]:
  """Optuna's warnings of its experimental heartbeat, and of heartbeats with ask-and-tell (which
  this module records itself), silenced while entered."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings('ignore', message='Heartbeat of storage')
    yield


def storage_url(flag: str | None, run_dir: RunDirectory) -> str:
  """The study's storage: --search_storage, or a SQLite file in the (local) run directory."""
  if flag:
    return flag
  if run_dir.remote:
    raise UserError(f'a search keeps its study in {STUDY_FILE} in a local run directory, and '
                    f'{run_dir} is in a bucket; pass --search_storage=URL (PostgreSQL) or '
                    '--search_storage=journal:PATH on a shared filesystem')
  return f'sqlite:///{run_dir.file(STUDY_FILE)}'


def with_driver(url: str) -> str:
  """A PostgreSQL URL without a driver through psycopg2, the search extra's (SQLAlchemy 2.1's
  default is psycopg 3)."""
  scheme, colon, rest = url.partition(':')
  return f'{POSTGRESQL}+psycopg2:{rest}' if colon and scheme == POSTGRESQL else url


def open_storage(optuna: types.ModuleType, url: str) -> Any:
  """The storage the URL names, opened (its tables made where new): an RDB with heartbeats, or a
  journal file; one that cannot be opened is the UserError naming it."""
  import sqlalchemy.exc  # pylint: disable=g-import-not-at-top; Optuna's, loaded with it
  try:
    with _quiet(optuna):
      if url.startswith(JOURNAL):
        return optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(url.removeprefix(JOURNAL)))
      return _rdb_storage(optuna, url)
  except (sqlalchemy.exc.SQLAlchemyError, OSError) as error:  # Not there to use, or no such URL.
    raise UserError(f'cannot open the study storage --search_storage={url} '
                    f'({type(error).__name__}: {error_reason(error)}); pass a PostgreSQL URL '
                    '(postgresql://USER:PASSWORD@HOST/DATABASE) whose server runs, or a '
                    'sqlite:///PATH or journal:PATH in a folder that exists, then rerun') from error


def _rdb_storage(optuna: types.ModuleType, url: str) -> Any:
  """The RDB storage, its running trials' heartbeats recorded and a stale one's values queued
  again; opened again where its tables collided with another launch's (MAKING_ATTEMPTS)."""
  import sqlalchemy.exc  # pylint: disable=g-import-not-at-top; Optuna's, loaded with it
  def opened() -> Any:
    return optuna.storages.RDBStorage(
        with_driver(url), heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback())
  for _ in range(MAKING_ATTEMPTS - 1):
    try:
      return opened()
    except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
      pass  # Another launch made them first: they are there now.
  return opened()  # A table or key that stays wrong is the storage's error.


def study_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config a study keeps (flat): every field a launch that joins it must share."""
  return {name: value for name, value in flat_config(config).items()
          if name not in STUDY_FREE_FIELDS}


def check_study(storage: Any, name: str, wanted: dict[str, Any], url: str) -> None:
  """Refuses to join a study that searches with another config, naming the fields that differ."""
  found = [study for study in storage.get_all_studies() if study.study_name == name]
  kept = found[0].user_attrs.get('config') if found else None
  if kept is None:  # No study yet, or one another launch has just made, its config not yet kept.
    return
  differ = config_rules.config_mismatches(kept, wanted)
  if differ:
    raise UserError(f'the study {name} in {url} searches with '
                    f'{config_rules.named_values(kept, differ)}, and this launch has '
                    f'{config_rules.named_values(wanted, differ)}; pass the study\'s values to '
                    'join it, or --search_study=NAME to start a study of your own')


def sampler_of(optuna: types.ModuleType, config: ml_collections.ConfigDict, seed: int) -> Any:
  """The sampler the config names: TPE (its pending trials counted as a poor value, so a batch's
  asks spread out), a Gaussian process, or random."""
  needed = SAMPLERS_NEEDING.get(config.search.sampler)
  if needed and importlib.util.find_spec(needed) is None:
    raise UserError(f'search.sampler={config.search.sampler} needs {needed}, which the search '
                    f'extra leaves out: pip install {needed}, or pass --config.search.sampler=tpe')
  with _quiet(optuna):
    return {'tpe': lambda: optuna.samplers.TPESampler(seed=seed, constant_liar=True),
            'gp': lambda: optuna.samplers.GPSampler(seed=seed),
            'random': lambda: optuna.samplers.RandomSampler(seed=seed)}[config.search.sampler]()


def pruner_of(optuna: types.ModuleType, config: ml_collections.ConfigDict) -> Any:
  """The pruner the config names, by epoch: Hyperband over 1 to num_epochs epochs, the median
  rule, or none."""
  return {'hyperband': lambda: optuna.pruners.HyperbandPruner(
              min_resource=1, max_resource=config.num_epochs),
          'median': optuna.pruners.MedianPruner,
          'none': optuna.pruners.NopPruner}[config.search.pruner]()


class Heartbeat:
  """Records the running trials' heartbeats from a thread of its own while entered (RDB storages;
  a journal has none), so that a launch killed mid-epoch leaves them stale for another launch to
  fail and ask again; a failure to record is raised at the next epoch's end, by `check`."""

  def __init__(self, storage: Any, study_name: str, numbers: list[int]):
    self._storage = storage
    self._error: Exception | None = None
    self._beats = hasattr(storage, 'record_heartbeat') and storage.get_heartbeat_interval()
    study_id = storage.get_study_id_from_name(study_name)
    self._ids = [storage.get_trial_id_from_study_id_trial_number(study_id, n) for n in numbers]
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, name='trial-heartbeat', daemon=True)

  def keep(self, numbers: list[int], all_numbers: list[int]) -> None:
    """From now on beats for the trials `numbers` of those it was made for (`all_numbers`)."""
    self._ids = [self._ids[all_numbers.index(n)] for n in numbers]

  def _beat(self) -> None:
    import sqlalchemy.exc  # pylint: disable=g-import-not-at-top; an RDB storage's, loaded
    while not self._stop.wait(HEARTBEAT_S):
      try:
        for trial_id in list(self._ids):
          self._storage.record_heartbeat(trial_id)
      except sqlalchemy.exc.SQLAlchemyError as error:  # Raised on the main thread, by check().
        self._error = error
        return

  def __enter__(self) -> 'Heartbeat':
    if self._beats:
      for trial_id in self._ids:  # At once: a trial with no heartbeat is never stale.
        self._storage.record_heartbeat(trial_id)
      self._thread.start()
    return self

  def check(self) -> None:
    """Raises, as the user's line, what stopped the heartbeat's thread, if anything did."""
    if self._error is not None:
      raise UserError(f'the study storage stopped answering the trials\' heartbeat '
                      f'({type(self._error).__name__}: {error_reason(self._error)}); the running '
                      f'trials go stale, and the same command trains them again once the storage '
                      'answers') from self._error

  def __exit__(self, *exc_info: Any) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()


@dataclasses.dataclass
class Search:
  """A launch's share of a study: what every batch reads."""
  optuna: types.ModuleType
  config: ml_collections.ConfigDict
  study: Any
  host: Host
  run_dir: RunDirectory
  lock: RunLock | None = None  # Held while the search trains.
  examples: tuple[Examples, ...] = ()  # The train and eval splits, once there is work.

  def say(self, line: str) -> None:
    self.host.say(line)

  def counted(self) -> dict[str, int]:
    """The study's trials by state's name."""
    counts: dict[str, int] = {}
    for trial in self.study.get_trials(deepcopy=False):
      counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
    return counts

  def to_ask(self) -> int:
    """How many trials this launch asks next: up to side_by_side, until the study holds `trials`
    that are not failed (complete, pruned, or running in any launch; waiting ones are asked).
    Trials whose heartbeat went stale (a launch killed) are failed first, and queued again."""
    with _quiet(self.optuna):
      self.optuna.storages.fail_stale_trials(self.study)
    counts = self.counted()
    held = sum(counts.get(state, 0) for state in ('COMPLETE', 'PRUNED', 'RUNNING'))
    return max(0, min(self.config.search.side_by_side, self.config.search.trials - held))


def search(config: ml_collections.ConfigDict, run_dir: RunDirectory, host: Host,
           storage_flag: str | None, study_name: str | None) -> None:
  """Runs the config's search in `run_dir`: joins (or opens) its study, then trains batches of
  the trials it asks until the study holds search.trials trials; ends with the table of trials
  and the best one's command."""
  optuna = import_optuna()
  if jax.process_count() > 1:
    raise UserError('a search runs in one process for now; launch it without --coordinator_address'
                    ', --num_processes, --process_id or --distributed')
  check_placement(config)
  url = storage_url(storage_flag, run_dir)
  name = study_name or os.path.basename(run_dir.name.rstrip('/'))
  check_trials_folder(run_dir, name)
  if not storage_flag:  # The default storage's file is in the run directory.
    run_dir.make()
  storage = open_storage(optuna, url)
  check_study(storage, name, study_config(config), url)
  run_dir.make()
  with RunLock(run_dir, host) as lock:
    found = Search(optuna, config, _study(optuna, storage, name, config, run_dir), host, run_dir,
                   lock)
    if not found.to_ask():
      found.say(_nothing_to_train(found, name, url))
    else:
      found.examples = load_splits(config.data, config.data.train_split, config.data.eval_split)
      RunDirectory(run_dir.file(TRIALS)).make()
      run_dir.write(STUDY_NAME_FILE, name)
    while asked := found.to_ask():
      with _quiet(optuna):
        batch = [found.study.ask() for _ in range(asked)]
      _train_batch(found, batch, storage)
    _report_end(found)


def check_placement(config: ml_collections.ConfigDict) -> None:
  """A batch's placement on the devices here (mode, mesh, member_shards over its side_by_side
  trials' models), checked before anything is written: a UserError where they cannot hold it."""
  count = min(config.search.side_by_side, config.search.trials) * config.num_models
  resolve(config, [Member(config.seed, {})] * count)


def check_trials_folder(run_dir: RunDirectory, name: str) -> None:
  """Refuses a run directory whose trials/ holds another study's trials: trial numbers would meet
  (a study of another name in the same study.db, say)."""
  kept = run_dir.read_bytes(STUDY_NAME_FILE)
  if kept is not None and (other := kept.decode('utf-8', 'replace')) != name:
    raise UserError(f'the run directory {run_dir} keeps the trials of the study {other} in '
                    f'{TRIALS}/, and this launch joins the study {name}, whose trial numbers '
                    'would meet theirs; pass another --workdir for it')


def trial_config(config: ml_collections.ConfigDict,
                 values: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config of a trial's separate run: the search's with the trial's values, its search
  fields the default's (no search), its models over as many member shards as they divide."""
  off = {name: value for name, value in flat_config(default.get_config()).items()
         if name.startswith('search.')}
  return with_values(config, {**off, **values,
                              'member_shards': shards_for(config, config.num_models)})


def shards_for(config: ml_collections.ConfigDict, count: int) -> int:
  """The member shards of a program of `count` models: the most of config.member_shards that
  divide them."""
  return math.gcd(config.member_shards, count)


def batch_config(config: ml_collections.ConfigDict,
                 count: int) -> tuple[ml_collections.ConfigDict, int]:
  """The config a program of `count` models trains with, and its member shards: the search's, its
  member_shards lowered to the most that divide the models where they do not (a last batch of
  fewer trials, the survivors of a pruning)."""
  shards = shards_for(config, count)
  if shards == config.member_shards:
    return config, shards
  return with_values(config, {'member_shards': shards}), shards


def _nothing_to_train(found: Search, name: str, url: str) -> str:
  """A launch's line when the study holds its trials already: finished, or some still running."""
  said = f'the study {name} in {url} already holds its {found.config.search.trials} trials'
  running = found.counted().get('RUNNING', 0)
  if not running:
    return f'{said}; nothing to train'
  return (f'{said}, {running} of them running: in another launch, or in one that was killed '
          f'(in an RDB storage their heartbeat stops, and {GRACE_S} s later a launch trains them '
          'again); nothing to train now')


def _study(optuna: types.ModuleType, storage: Any, name: str, config: ml_collections.ConfigDict,
           run_dir: RunDirectory) -> Any:
  """The study, created with the config it searches where new; its sampler seeded by the config's
  seed, the trials the study holds and the run directory's name, so that launches that join at
  once ask different trials, and a launch again in a folder of that name asks the same."""
  found = [study for study in storage.get_all_studies() if study.study_name == name]
  held = storage.get_n_trials(storage.get_study_id_from_name(name)) if found else 0
  folder = os.path.basename(run_dir.name.rstrip('/'))
  seed = int(np.random.SeedSequence([config.seed, held, zlib.crc32(folder.encode())])
             .generate_state(1)[0])
  with _quiet(optuna):
    study = optuna.create_study(storage=storage, study_name=name, direction='maximize',
                                sampler=sampler_of(optuna, config, seed),
                                pruner=pruner_of(optuna, config), load_if_exists=True)
  if 'config' not in study.user_attrs:  # New, or made by a launch that has not kept it yet.
    study.set_user_attr('config', study_config(config))
  return study


def members_of(config: ml_collections.ConfigDict, batch: list[Any]) -> list[Member]:
  """Each trial's values (Optuna's suggestions over the config's ranges), times num_models seeds:
  trial k's members are k * num_models to (k + 1) * num_models - 1."""
  members: list[Member] = []
  for trial in batch:
    values = {name: trial.suggest_float(name, low, high, log=name in config_rules.LOG_SCALED)
              for name, (low, high) in config_rules.searched(config).items()}
    members.extend(Member(config.seed + k, values) for k in range(config.num_models))
  return members


class SearchStopped(UserError):
  """A search that a signal stopped at an epoch's end: its running trials told failed and asked
  again, with the same values, by the next launch."""

  def __init__(self, signal_name: str, epoch: int, numbers: list[int]):
    super().__init__(f'stopped by {signal_name} after epoch {epoch}; trials {_listed(numbers)} '
                     'were told failed and are queued to train again from their start: the same '
                     f'command goes on with the study: {this_command()}')
    self.exit_status = 128 + signal.Signals[signal_name].value


def _listed(numbers: list[int]) -> str:
  return ', '.join(str(number) for number in numbers)


def taken(state: steps.TrainState, index: int | np.ndarray, plan: Plan,
          template: steps.TrainState) -> steps.TrainState:
  """The members `index` of a stacked state (an int: one, its member axis gone), as `plan`'s
  programs take them: on its mesh, laid as its state lies (one small program, no host round
  trip), in `template`'s tree (whose optimizer is its recipe's)."""
  take = jax.jit(lambda tree: jax.tree.map(lambda leaf: leaf[index], tree),
                 out_shardings=NamedSharding(plan.mesh, state_spec(plan)))
  return jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(take(state)))


def trial_values(record: dict[str, Any], num_models: int) -> list[float]:
  """Each trial's value in an epoch's record: its members' mean eval accuracy."""
  each = record['eval_accuracy_by_member']
  return [float(np.mean(each[k:k + num_models])) for k in range(0, len(each), num_models)]


class _Batch:
  """A batch's trials in training: the live ones, their program and state."""

  def __init__(self, found: Search, trials: list[Any], heartbeat: Heartbeat):
    self.found, self.live, self.heartbeat = found, trials, heartbeat
    self.members = members_of(found.config, trials)
    self.seconds: list[float] = []
    self.programs, self.reporter = self._compiled()
    self.state = self.programs.fresh_state()

  def _compiled(self) -> tuple[Programs, reporting.Reporter]:
    config, shards = batch_config(self.found.config, len(self.members))
    if config is not self.found.config:
      numbers = _listed([trial.number for trial in self.live])
      self.found.say(f'member_shards={self.found.config.member_shards} does not divide the '
                     f'{len(self.members)} models of trials {numbers}: they train over {shards} '
                     f'member shard{"s" if shards > 1 else ""}')
    plan = resolve(config, self.members)
    return (compile_programs(plan, *self.found.examples),
            reporting.Reporter(self.found.run_dir, plan, self.found.host))

  def epoch(self, number: int) -> list[float]:
    """Trains and evaluates epoch `number`, says its line, and reports each live trial's value."""
    with self.reporter.traced(number):
      self.state, figures = self.programs.run_epoch(self.state, number)
    record = self.reporter.epoch_record(figures)
    plan = self.programs.plan
    self.seconds.append(record['epoch_seconds'])
    eta = (plan.num_epochs - number) * sum(self.seconds) / len(self.seconds)
    self.found.say(reporting.format_line(record, plan.num_epochs, eta))
    values = trial_values(record, self.found.config.num_models)
    for trial, value in zip(self.live, values):
      trial.report(value, number)
    return values

  def keep(self, k: int, epoch: int) -> None:
    """Saves live trial k's models as of `epoch` in a run directory of its own (TRIALS/NUMBER), as
    the separate run of its values saves them, and names the directory in the trial."""
    trial = self.live[k]
    run_dir = RunDirectory(self.found.run_dir.file(f'{TRIALS}/{trial.number}'),
                           self.found.run_dir.lock_stale_after)
    plan = resolve(trial_config(self.found.config, trial.params))
    per_trial = self.found.config.num_models
    index = np.arange(k * per_trial, (k + 1) * per_trial) if plan.members else k * per_trial
    state = self.state
    if self.programs.plan.recipe.injected:  # The trial's own optimizer takes its values as given.
      state = dataclasses.replace(state, opt_state=optim.plain_state(state.opt_state))
    run_dir.make()
    with Checkpoints(run_dir, plan, self.found.host) as checkpoints:
      checkpoints.save(epoch, taken(state, index, plan, state_template(plan)), force=True)
    trial.set_user_attr(RUN_DIRECTORY, run_dir.name)

  def prune(self, values: list[float], epoch: int) -> None:
    """Tells the trials the pruner stops pruned, and goes on with the survivors' members alone:
    their state sliced, their program compiled again."""
    stopped = [k for k, trial in enumerate(self.live) if trial.should_prune()]
    if not stopped:
      return
    for k in stopped:
      self.keep(k, epoch)
      self.found.study.tell(self.live[k], state=self.found.optuna.trial.TrialState.PRUNED)
    said = ', '.join(f'{self.live[k].number} ({100 * values[k]:.2f}%)' for k in stopped)
    kept = [k for k in range(len(self.live)) if k not in stopped]
    numbers = [trial.number for trial in self.live]
    self.live = [self.live[k] for k in kept]
    self.heartbeat.keep([trial.number for trial in self.live], numbers)
    if not self.live:
      self.found.say(f'pruned after epoch {epoch}: trials {said}; none of the batch goes on')
      return
    per_trial = self.found.config.num_models
    kept_members = [k * per_trial + m for k in kept for m in range(per_trial)]
    self.members = [self.members[m] for m in kept_members]
    self.programs, self.reporter = self._compiled()
    self.state = taken(self.state, np.asarray(kept_members), self.programs.plan,
                       self.programs.template)
    self.found.say(f'pruned after epoch {epoch}: trials {said}; trials '
                   f'{_listed([trial.number for trial in self.live])} go on, in a program of '
                   f'{len(self.members)} models compiled in {self.programs.compile_seconds:.1f}s')


def _train_batch(found: Search, trials: list[Any], storage: Any) -> None:
  """Trains a batch's trials side by side, epoch by epoch: each trial's value reported every
  epoch, those the pruner stops dropped, the rest told complete with the last epoch's value."""
  numbers = [trial.number for trial in trials]
  num_epochs = found.config.num_epochs
  with Heartbeat(storage, found.study.study_name, numbers) as heartbeat:
    batch = _Batch(found, trials, heartbeat)
    found.say(f'trials {_listed(numbers)}: '
              f'{reporting.start_line(batch.programs, len(found.examples[1]))}')
    for epoch in range(1, num_epochs + 1):
      values = batch.epoch(epoch)
      heartbeat.check()
      _end_epoch(found, batch.live, epoch)
      if epoch == num_epochs:
        for k, (trial, value) in enumerate(zip(batch.live, values)):
          batch.keep(k, epoch)
          found.study.tell(trial, value)
      else:
        batch.prune(values, epoch)
      if not batch.live:
        return


def _end_epoch(found: Search, live: list[Any], epoch: int) -> None:
  """A stop that a signal asked for, and a run lock another run took, stop the search here: the
  live trials told failed, and queued again with their values."""
  assert found.lock is not None, 'a search holds its run lock'
  stop, lock_lost = found.host.agree_at_epoch_end(found.lock.lost())
  if not (stop or lock_lost):
    return
  for trial in live:
    found.study.tell(trial, state=found.optuna.trial.TrialState.FAIL)
    found.study.enqueue_trial(trial.params)
  found.lock.check(lock_lost)
  assert stop is not None, 'a lock taken over raised above'
  raise SearchStopped(stop, epoch, [trial.number for trial in live])


def _report_end(found: Search) -> None:
  """The table of the study's trials, their curves.png, and the best one with its run directory
  and the command that trains it alone."""
  config = found.config
  trials = found.study.get_trials(deepcopy=False)
  for line in trials_lib.table(trials, config.num_epochs):
    found.say(line)
  complete = [trial for trial in trials if trial.state.name == 'COMPLETE']
  best = found.study.best_trial if complete else None
  drawn = trials_lib.curves(trials)
  if drawn:
    title = trials_lib.curves_title(drawn, config.data.eval_split, best)
    reporting.write_picture(found.run_dir, 'curves',
                            pictures.draw_trials(drawn, config.num_epochs, title))
    found.say(f"drew the trials' eval accuracy by epoch in {found.run_dir.file('curves.png')}")
  if best is None:
    return
  member = {**best.params, 'seed': config.seed,
            **({'num_models': config.num_models} if config.num_models > 1 else {}),
            **({'member_shards': shards_for(config, config.num_models)}
               if config.member_shards != 1 else {})}
  workdir = best.user_attrs.get(RUN_DIRECTORY, found.run_dir.file(f'{TRIALS}/{best.number}'))
  found.say(trials_lib.best_line(best, member, this_command(), workdir))
