"""A search's study on a real PostgreSQL server, which the tests start on 127.0.0.1: launches that
open a new database at once all join it; two launches of train.py on one study at once, one killed
with -9 mid-batch and run again, leave every trial complete, pruned or failed and retried, none
trained twice, and the best trial's command trains its member's numbers. Skipped where no server is
installed, unless SEARCH_TEST_POSTGRES=required (CI)."""

import concurrent.futures
import glob
import os
import pathlib
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import optuna
import pytest

from tests.conftest import EVAL_COUNT, ROOT, override_flags, read_metrics
from tests.test_members import SETTINGS
from tests.test_search import SEARCHED
from trainer import search

USER, STUDY = 'search', 'shared'
SERVER_PROGRAMS = ('initdb', 'pg_ctl', 'createdb')
TRIALS = 6  # Two launches, two trials side by side: three batches, one of them killed and retried.
ARGS = ['--config=configs/default.py',
        *override_flags(**{**SETTINGS, **SEARCHED, 'search__trials': TRIALS})]
BATCH = re.compile(r'trials ([\d, ]+): training on ')  # A batch's first line: it trains.


def unavailable(reason: str) -> NoReturn:
  """Skips the test for a reason of the machine's; fails it where CI requires the server."""
  if os.environ.get('SEARCH_TEST_POSTGRES') == 'required':
    pytest.fail(f'{reason}, and SEARCH_TEST_POSTGRES=required')
  pytest.skip(reason)


def server_programs() -> pathlib.Path:
  """The folder of PostgreSQL's initdb, pg_ctl and createdb: the PATH's pg_ctl's (its link
  followed), or the newest of Debian's, which are off the PATH."""
  on_path = shutil.which('pg_ctl')
  debian = sorted((pathlib.Path(folder) for folder in glob.glob('/usr/lib/postgresql/*/bin')),
                  key=lambda folder: int(folder.parent.name) if folder.parent.name.isdigit() else 0,
                  reverse=True)
  for folder in [*([pathlib.Path(on_path).resolve().parent] if on_path else []), *debian]:
    if all(os.access(folder / name, os.X_OK) for name in SERVER_PROGRAMS):
      return folder
  unavailable('no PostgreSQL server on this machine (initdb, pg_ctl and createdb, on the PATH or '
              'in /usr/lib/postgresql/VERSION/bin): apt-get install postgresql')


def as_server_user() -> list[str]:
  """The prefix that runs a server program: none for an ordinary user; as root, which the server
  refuses, runuser to the postgres user."""
  if os.geteuid() != 0:
    return []
  try:
    pwd.getpwnam('postgres')
  except KeyError:
    unavailable('the PostgreSQL server refuses to run as root, and this machine has no postgres '
                'user to run it as')
  if not shutil.which('runuser'):
    unavailable('the PostgreSQL server refuses to run as root, and runuser is missing to run it as '
                'the postgres user')
  return ['runuser', '-u', 'postgres', '--']


def free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


def run_or_fail(command: list, home: pathlib.Path) -> None:
  done = subprocess.run([str(part) for part in command], cwd=home, capture_output=True, text=True,
                        timeout=120, check=False)
  if done.returncode != 0:
    log = home / 'server.log'
    pytest.fail(f'{command[0]} failed: {done.stdout}{done.stderr}'
                f'{log.read_text() if log.exists() else ""}')


@pytest.fixture(scope='module')
def postgres() -> Iterator[Callable[[str], str]]:
  """A PostgreSQL server of the module's own on 127.0.0.1 (its files and socket in a temporary
  folder, removed at the end): `postgres(name)` makes a database, and gives its URL
  `postgresql://USER@127.0.0.1:PORT/NAME`."""
  programs, prefix = server_programs(), as_server_user()
  home = pathlib.Path(tempfile.mkdtemp(prefix='search-test-postgres-'))
  data, port = home / 'data', free_port()

  def database(name: str) -> str:
    run_or_fail([programs / 'createdb', '-h', '127.0.0.1', '-p', port, '-U', USER, name], home)
    return f'postgresql://{USER}@127.0.0.1:{port}/{name}'
  try:
    if prefix:
      shutil.chown(home, 'postgres')
    run_or_fail([*prefix, programs / 'initdb', '-D', data, '-U', USER, '--auth=trust',
                 '-E', 'UTF8', '--no-sync'], home)
    run_or_fail([*prefix, programs / 'pg_ctl', 'start', '-D', data, '-l', home / 'server.log',
                 '-w', '-t', '60', '-o', f'-c listen_addresses=127.0.0.1 -c port={port} '
                 f'-c unix_socket_directories={home} -c fsync=off'], home)
    yield database
  finally:
    if (data / 'postmaster.pid').exists():
      subprocess.run([*prefix, str(programs / 'pg_ctl'), 'stop', '-D', str(data), '-m',
                      'immediate'], cwd=home, capture_output=True, timeout=60, check=False)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres) -> str:
  """A new database of the module's server, for one test."""
  return postgres('studies')


@pytest.fixture
def launch(postgres_url, tmp_path) -> Iterator[Callable[[str, str], subprocess.Popen]]:
  """`launch(workdir, log)`: train.py's search of ARGS in tmp_path/workdir, joining STUDY on the
  server, its lines to tmp_path/log.log (.err); none outlives the test."""
  launched: list[subprocess.Popen] = []

  def start(workdir: str, log: str) -> subprocess.Popen:
    with open(tmp_path / f'{log}.log', 'w') as out, open(tmp_path / f'{log}.err', 'w') as err:
      launched.append(subprocess.Popen(
          [sys.executable, 'train.py', *ARGS, f'--search_storage={postgres_url}',
           f'--search_study={STUDY}', f'--workdir={tmp_path / workdir}'], cwd=ROOT, stdout=out,
          stderr=err, env={**os.environ, 'PYTHONUNBUFFERED': '1'}))
    return launched[-1]
  yield start
  for process in launched:
    process.kill()
    process.wait()


def batches(log: pathlib.Path) -> list[list[int]]:
  """The trials of each batch that a launch's log says it trained."""
  return [[int(number) for number in found.group(1).split(', ')]
          for found in map(BATCH.match, log.read_text().splitlines()) if found]


def kill_when_training(victim: subprocess.Popen, log: pathlib.Path,
                       other: subprocess.Popen) -> float:
  """kill -9 of `victim` once its log shows a batch training, both launches still running; when."""
  deadline = time.monotonic() + 240
  while not batches(log):
    if victim.poll() is not None or other.poll() is not None or time.monotonic() > deadline:
      pytest.fail(f'no batch trained in time, or a launch ended first: {log.read_text()}'
                  f'{log.with_suffix(".err").read_text()}')
    time.sleep(0.05)
  victim.kill()
  victim.wait()
  return time.monotonic()


def finished(process: subprocess.Popen, log: pathlib.Path) -> str:
  """The launch's log, once it has ended well: no line on stderr but warnings."""
  process.wait(timeout=300)
  errors = log.with_suffix('.err').read_text()
  assert process.returncode == 0, errors
  assert all(line.startswith('warning: ') for line in errors.splitlines()), errors
  return log.read_text()


def test_launches_that_open_a_new_database_at_once_all_join_it(postgres):
  """Each makes the database's tables, and all but one collide with the first's: each opens it."""
  url, launches = postgres('made_at_once'), 8
  barrier = threading.Barrier(launches)

  def opened(_) -> Any:
    barrier.wait()
    return search.open_storage(optuna, url)
  with concurrent.futures.ThreadPoolExecutor(launches) as pool:
    storages = list(pool.map(opened, range(launches)))
  assert [storage.get_all_studies() for storage in storages] == [[]] * launches


@pytest.mark.slow  # Two launches, a killed one's heartbeat's grace, its rerun: about 2.5 min.
def test_two_launches_share_a_postgresql_study_through_a_kill_9(launch, postgres_url, tmp_path,
                                                               mnist_dir):
  logs = {name: tmp_path / f'{name}.log' for name in ('a', 'b', 'a-again')}
  first, other = launch('a', 'a'), launch('b', 'b')
  killed = kill_when_training(first, logs['a'], other)
  study = optuna.load_study(study_name=STUDY, storage=search.with_driver(postgres_url))
  [killed_batch] = batches(logs['a'])
  assert {study.trials[n].state.name for n in killed_batch} == {'RUNNING'}  # Killed mid-batch.
  finished(other, logs['b'])
  # The killed launch's trials go stale GRACE_S after their last heartbeat (at the kill or
  # before): the next launch to ask fails them and trains their retries, the rerun (the same
  # command) or, on a slow machine, the other launch if it is still asking.
  time.sleep(max(0.0, killed + search.GRACE_S + 2 - time.monotonic()))
  printed = finished(launch('a', 'a-again'), logs['a-again'])

  trials = optuna.load_study(study_name=STUDY, storage=search.with_driver(postgres_url)).trials
  states = [trial.state.name for trial in trials]
  assert sum(state in ('COMPLETE', 'PRUNED') for state in states) == TRIALS, states
  assert set(states) <= {'COMPLETE', 'PRUNED', 'FAIL'}, states
  retried = {trial.system_attrs.get('failed_trial'): trial for trial in trials}
  for failed in (trial for trial in trials if trial.state.name == 'FAIL'):
    assert failed.number in killed_batch and failed.number in retried, failed.number
    assert retried[failed.number].params == failed.params
    assert retried[failed.number].state.name in ('COMPLETE', 'PRUNED')
  # Every trial trained in one batch of one launch: none twice, none lost (a retry is a trial of
  # its own).
  trained = [n for log in logs.values() for batch in batches(log) for n in batch]
  assert sorted(trained) == [trial.number for trial in trials], {
      name: batches(log) for name, log in logs.items()}
  assert_best_trains_alone(printed, trials, SETTINGS['num_epochs'], tmp_path / 'alone')


def assert_best_trains_alone(printed: str, trials: list, num_epochs: int,
                             workdir: pathlib.Path) -> None:
  """The command the search printed for its best trial trains, as a separate run in `workdir`
  (its own --workdir holds the trial's checkpoint, which it would resume), the numbers the study
  holds of that trial's member: its eval accuracy each epoch (the members' tolerance)."""
  best = max((trial for trial in trials if trial.state.name == 'COMPLETE'), key=lambda t: t.value)
  said = printed.splitlines()[-1]
  assert said.startswith(f'best: trial {best.number}, '), said
  command = shlex.split(said.split('; trains alone with: ', 1)[1])
  assert command[-1].startswith('--workdir='), command
  alone = subprocess.run([sys.executable, *command[1:-1], f'--workdir={workdir}'], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=False)
  assert alone.returncode == 0, alone.stderr
  records = read_metrics(workdir)
  assert [record['epoch'] for record in records] == list(best.intermediate_values) == [
      *range(1, num_epochs + 1)]
  for record, value in zip(records, best.intermediate_values.values()):
    assert abs(record['eval_accuracy'] - value) * EVAL_COUNT <= 1 + 1e-9, (record, value)
  assert best.value == best.intermediate_values[num_epochs]
