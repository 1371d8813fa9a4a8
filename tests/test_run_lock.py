"""One training run per run directory: a second stops at once; a killed holder blocks nothing."""

import logging
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from errors import During, UserError
from tests.conftest import (CLOUD_SETTINGS, ROOT, UNREACHABLE, Recorder, line_of,
                            offline_credentials, override_flags, read_metrics, run_train)
from trainer.host import cloud_storage
from trainer.host.boundary import Host
from trainer.reporting import METRICS_FILE
from trainer.host.run_dir import RunDirectory
from trainer.host.run_lock import LOCK_FILE, RunLock, this_machine

HOLD = ('import sys, time; from trainer.host.run_dir import RunDirectory\n'
        'from trainer.host.run_lock import RunLock\n'
        'with RunLock(RunDirectory(sys.argv[1],\n'
        '                          lock_stale_after=float((sys.argv[2:] or [120])[0]))):\n'
        '  print("held", flush=True); time.sleep(600)')


def test_a_second_holder_is_refused_with_the_first_ones_host_and_pid(tmp_path):
  with RunLock(RunDirectory(tmp_path)):
    with pytest.raises(UserError) as error:
      with RunLock(RunDirectory(tmp_path)):
        pass
  assert f'host {socket.gethostname()}, pid {os.getpid()}' in str(error.value)
  assert f'the run directory {tmp_path} is in use by a training run' in str(error.value)
  assert (tmp_path / LOCK_FILE).read_text() == ''  # Released on exit, naming nobody,
  with RunLock(RunDirectory(tmp_path)):  # and the next holder is welcome.
    assert (tmp_path / LOCK_FILE).read_text() == (
        f'host {socket.gethostname()}, pid {os.getpid()}\n')


def test_a_lock_that_cannot_be_opened_is_one_line_and_is_left_in_place(tmp_path):
  (tmp_path / LOCK_FILE).mkdir()  # A folder where the lock file goes.
  with pytest.raises(UserError, match=re.escape(
      f'cannot open the run lock {tmp_path / LOCK_FILE} (Is a directory); move it out of the run '
      'directory, then rerun the same command')):
    with RunLock(RunDirectory(tmp_path)):
      pass
  assert (tmp_path / LOCK_FILE).is_dir()


def test_a_lock_file_of_bytes_that_are_no_text_names_them_and_never_stops_a_run(tmp_path):
  """Its text only names a holder: garbage there is shown as it is, and the flock decides."""
  garbage, shown = b'\xff\xfe', r'\xff\xfe'
  (tmp_path / LOCK_FILE).write_bytes(garbage)  # A lock nobody holds.
  warnings = []
  with RunLock(RunDirectory(tmp_path), Recorder(warnings.append)):
    assert (tmp_path / LOCK_FILE).read_text().startswith('host ')
  assert warnings == [f'took over the run directory {tmp_path} from a run that ended without '
                      f'releasing its lock ({shown}; that process is gone)']
  holder = hold(tmp_path)
  try:
    with open(tmp_path / LOCK_FILE, 'r+b') as lock:  # The text of a lock another process holds.
      lock.write(garbage)
      lock.truncate()
    with pytest.raises(UserError, match=re.escape(f'is in use by a training run ({shown}); wait')):
      with RunLock(RunDirectory(tmp_path)):
        pass
  finally:
    kill(holder)


def test_a_process_that_takes_no_lock_stops_when_the_one_that_takes_it_is_refused(tmp_path):
  votes = []

  class Process1(Host):
    """Process 1 of a run, whose collective says process 0 was refused."""

    def __init__(self) -> None:
      super().__init__()
      self.primary = False

    def on_every_process(self, ok: bool) -> bool:
      votes.append(ok)
      return False

  with pytest.raises(UserError, match=f'process 0 found the run directory {tmp_path} in use by '
                                      'another training run'):
    with RunLock(RunDirectory(tmp_path), Process1()):
      pass
  assert votes == [True] and not (tmp_path / LOCK_FILE).exists()


def test_a_full_disk_when_the_lock_is_taken_is_one_line_and_holds_nothing(tiny_disk):
  workdir = tiny_disk / 'run'
  workdir.mkdir()
  with pytest.raises(OSError), open(tiny_disk / 'filler', 'wb') as filler:
    filler.write(bytes(4 << 20))  # Twice the disk.
  assert line_of(lambda: held(RunLock(RunDirectory(workdir)))) == (
      f'cannot write {workdir / LOCK_FILE} (No space left on device); free space or restore '
      'access there, then rerun the same command')
  (tiny_disk / 'filler').unlink()
  with RunLock(RunDirectory(workdir)):  # Nothing was left holding it.
    assert (workdir / LOCK_FILE).read_text().startswith('host ')


def test_a_lock_file_removed_by_hand_is_taken_again_saying_so(tmp_path):
  warnings = []
  with RunLock(RunDirectory(tmp_path), Recorder(warnings.append)) as lock:
    (tmp_path / LOCK_FILE).unlink()
    assert not lock.lost()
    assert warnings == [f'the run lock {tmp_path / LOCK_FILE} was removed while this run held it; '
                        'this run took it again (leave run.lock in place while a run uses its '
                        'directory)']
    assert (tmp_path / LOCK_FILE).read_text() == f'host {socket.gethostname()}, pid {os.getpid()}\n'
    with pytest.raises(UserError, match='is in use by a training run'):  # Held again.
      with RunLock(RunDirectory(tmp_path)):
        pass
    assert not lock.lost() and len(warnings) == 1
  assert (tmp_path / LOCK_FILE).read_text() == ''


def test_a_lock_file_copied_back_by_hand_is_this_runs_own_and_taken_again(tmp_path):
  """An editor's save, a backup restored: a new file, with this run's own text in it."""
  warnings = []
  with RunLock(RunDirectory(tmp_path), Recorder(warnings.append)) as lock:
    text = (tmp_path / LOCK_FILE).read_text()
    (tmp_path / LOCK_FILE).unlink()
    (tmp_path / LOCK_FILE).write_text(text)
    assert not lock.lost()
    assert warnings == [f'the run lock {tmp_path / LOCK_FILE} was removed while this run held it; '
                        'this run took it again (leave run.lock in place while a run uses its '
                        'directory)']
  assert (tmp_path / LOCK_FILE).read_text() == ''


def test_a_run_whose_removed_lock_another_run_took_stops_and_leaves_that_lock(tmp_path):
  with RunLock(RunDirectory(tmp_path)) as first:
    (tmp_path / LOCK_FILE).unlink()
    with RunLock(RunDirectory(tmp_path)) as second:  # A newcomer finds no lock: the run is its.
      with pytest.raises(UserError) as error:
        first.check()
      assert str(error.value) == TAKEN_AFTER_REMOVAL.format(tmp_path)
      second.check()
      first.release()
      assert (tmp_path / LOCK_FILE).read_text().startswith('host ')  # Still the newcomer's.


def test_a_run_whose_removed_lock_a_killed_run_left_stops_and_leaves_that_lock(tmp_path):
  """That run may have saved checkpoints past this one's before it was killed: not taken again."""
  with RunLock(RunDirectory(tmp_path)) as first:
    (tmp_path / LOCK_FILE).unlink()
    holder = hold(tmp_path)  # A newcomer finds no lock, takes it, and is killed.
    kill(holder)
    left = (tmp_path / LOCK_FILE).read_text()
    assert f'pid {holder.pid}' in left
    with pytest.raises(UserError) as error:
      first.check()
    assert str(error.value) == TAKEN_AFTER_REMOVAL.format(tmp_path)
    first.release()
  assert (tmp_path / LOCK_FILE).read_text() == left


TAKEN_AFTER_REMOVAL = (
    'another training run took the run directory {} after its run lock was removed by hand; this '
    'run stops without writing more: once that run has ended, the same command resumes from the '
    'newest checkpoint there, if any (leave run.lock in place while a run uses its directory)')


def hold(workdir, stale_after: float = 120) -> subprocess.Popen:
  """Another process holding the run lock of `workdir` until killed."""
  holder = subprocess.Popen([sys.executable, '-c', HOLD, str(workdir), str(stale_after)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == 'held'
  return holder


def kill(holder: subprocess.Popen) -> None:
  holder.send_signal(signal.SIGKILL)
  holder.wait()


@pytest.mark.parametrize('where', ['folder', 'bucket'])
def test_a_lock_whose_holder_was_killed_is_taken_over_at_once_saying_so(where, tmp_path, request):
  """A live holder is never taken over; a killed one on this machine at once, on a bucket too."""
  workdir = f'{request.getfixturevalue("bucket")}/run' if where == 'bucket' else str(tmp_path)
  holder = hold(workdir)
  try:
    with pytest.raises(UserError, match=f'in use by a training run \\(host \\S+, pid {holder.pid}'):
      with RunLock(RunDirectory(workdir)):
        pass
  finally:
    kill(holder)
  warnings = []
  start = time.monotonic()
  with RunLock(RunDirectory(workdir), Recorder(warnings.append)):
    assert time.monotonic() - start < 10  # Not the 120 s a silent lock of another machine waits.
  assert warnings == [f'took over the run directory {workdir} from a run that ended without '
                      f'releasing its lock (host {socket.gethostname()}, pid {holder.pid}; that '
                      'process is gone)']
  with RunLock(RunDirectory(workdir), Recorder(warnings.append)):  # Released: nothing to say.
    pass
  assert len(warnings) == 1


@pytest.mark.slow
def test_a_second_run_on_one_workdir_stops_at_once_and_the_first_finishes(tmp_path, mnist_dir):
  args = short_run(tmp_path)
  first = start_train(args)
  try:
    wait_until(lambda: (tmp_path / METRICS_FILE).exists(), first)  # The first run is training.
    first.send_signal(signal.SIGSTOP)  # Alive and holding the run directory, however fast it is.
    start = time.monotonic()
    try:
      second = run_train(*args)
    finally:
      first.send_signal(signal.SIGCONT)
    assert time.monotonic() - start < 120  # Start-up under load, not the end of the first run.
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f'error: the run directory {tmp_path} is in use by a training run (host '
        f'{socket.gethostname()}, pid {first.pid}); wait for it to end or stop it, or pass '
        'another --workdir']
    assert first.wait(timeout=300) == 0, first.stderr.read()
  finally:
    first.kill()
  # The second run added none.
  assert [r['epoch'] for r in read_metrics(tmp_path)] == list(range(1, 7))


@pytest.mark.slow
def test_a_run_whose_lock_was_deleted_and_taken_by_a_second_run_stops_and_that_one_goes_on(
    tmp_path, mnist_dir):
  # A save every epoch, each waiting for the one before: epoch 1's is complete while many epochs
  # are still to run (with saves skipped, it might commit only at the last epoch's end).
  args = short_run(tmp_path, num_epochs=20, checkpoint_min_seconds=0)
  first = start_train(args)
  try:
    wait_until(lambda: (tmp_path / '1').is_dir(), first)  # Epoch 1 is saved.
    paused_between_saves(first, tmp_path)
    (tmp_path / LOCK_FILE).unlink()
    second = start_train(args)
    lock = tmp_path / LOCK_FILE
    wait_until(lambda: lock.exists() and f'pid {second.pid}' in lock.read_text(), second)
    first.send_signal(signal.SIGCONT)  # The lock is the second run's: the first sees so next.
    assert first.wait(timeout=120) == 1
    assert first.stderr.read().splitlines() == [f'error: {TAKEN_AFTER_REMOVAL.format(tmp_path)}']
    assert second.wait(timeout=300) == 0, second.stderr.read()
  finally:
    first.kill()
  # Each epoch recorded once.
  assert [r['epoch'] for r in read_metrics(tmp_path)] == list(range(1, 21))
  assert (tmp_path / LOCK_FILE).read_text() == ''  # Released by the run that went on.


def paused_between_saves(run: subprocess.Popen, workdir) -> None:
  """SIGSTOP where no save of the run is being written (no orbax temporary folder): a save that
  committed later could land beside the checkpoints of the run that comes next."""
  deadline = time.monotonic() + 60

  def stop() -> None:
    run.send_signal(signal.SIGSTOP)
    while not all_threads_stopped(run.pid):  # From then on none can make a folder.
      assert run.poll() is None and time.monotonic() < deadline
      time.sleep(0.001)
  stop()
  while list(workdir.glob('*.orbax-checkpoint-tmp*')):
    assert run.poll() is None and time.monotonic() < deadline, 'no moment between two saves'
    run.send_signal(signal.SIGCONT)
    time.sleep(0.02)
    stop()


def all_threads_stopped(pid: int) -> bool:
  """Whether every thread of the process is stopped, by the state /proc gives each."""
  states = []
  for stat in pathlib.Path(f'/proc/{pid}/task').glob('*/stat'):
    try:
      states.append(stat.read_text().rsplit(') ', 1)[1][0])
    except FileNotFoundError:  # A thread that ended meanwhile.
      pass
  return bool(states) and all(state == 'T' for state in states)


def short_run(workdir, **overrides) -> list[str]:
  """train.py's arguments for a run of a few seconds (6 epochs of 2,000 images)."""
  return ['--config=configs/default.py', f'--workdir={workdir}',
          *override_flags(**{'num_epochs': 6, 'data__train_split': 'train[:2000]', **overrides})]


def start_train(args: list[str]) -> subprocess.Popen:
  """train.py started in the background, its output kept."""
  return subprocess.Popen([sys.executable, 'train.py', *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_until(condition, process: subprocess.Popen | None = None, timeout: float = 120) -> None:
  """Polls `condition` (while `process` runs): a loaded machine takes its time."""
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline and (process is None or process.poll() is None)
    time.sleep(0.05)


def lock_text(url: str) -> str:
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  bucket, _, name = url[len('gs://'):].partition('/')
  return storage.Client().bucket(bucket).blob(f'{name}/{LOCK_FILE}').download_as_text()


def test_on_cloud_storage_one_run_wins_and_the_lock_is_emptied_at_the_end(bucket):
  workdir = f'{bucket}/run'
  with RunLock(RunDirectory(workdir)):
    assert lock_text(workdir) == (f'host {socket.gethostname()}, pid {os.getpid()}; machine '
                                  f'{this_machine()}; stale after 120 s\n')
    with pytest.raises(UserError, match=rf'the run directory {workdir} is in use by a training '
                                        rf'run \(host {socket.gethostname()}, pid {os.getpid()}; '
                                        r'its lock was refreshed \d+ s ago'):
      with RunLock(RunDirectory(workdir)):
        pass
  assert lock_text(workdir) == ''  # Released, naming nobody,
  with RunLock(RunDirectory(workdir)):  # and the next run is welcome.
    assert lock_text(workdir).startswith('host ')


def test_on_cloud_storage_the_owner_keeps_its_lock_fresh(bucket):
  workdir = f'{bucket}/run'
  # Refreshed every 0.5 s: stale only where a refresh came 1.5 s late (a loaded machine's stall).
  with RunLock(RunDirectory(workdir, lock_stale_after=2.0)):
    time.sleep(2.5)
    with pytest.raises(UserError, match='is in use by a training run'):
      with RunLock(RunDirectory(workdir, lock_stale_after=2.0)):
        pass


def test_on_cloud_storage_a_silent_lock_of_another_machine_is_taken_over_saying_so(bucket):
  """Whether a run on another machine is alive only its silence tells: after stale_after."""
  workdir = f'{bucket}/run'
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  storage.Client().bucket(bucket[len('gs://'):]).blob(f'run/{LOCK_FILE}').upload_from_string(
      'host elsewhere, pid 1; machine another; stale after 4 s\n')
  with pytest.raises(UserError, match='host elsewhere, pid 1; its lock was refreshed'):
    with RunLock(RunDirectory(workdir, lock_stale_after=4.0)):  # Not silent long enough yet.
      pass
  time.sleep(4.0)
  warnings = []
  with RunLock(RunDirectory(workdir, lock_stale_after=4.0), Recorder(warnings.append)) as lock:
    lock.check()
    assert lock_text(workdir).endswith(f'pid {os.getpid()}; machine {this_machine()}; stale after '
                                       '4 s\n')
  assert len(warnings) == 1 and '(host elsewhere, pid 1): killed, or its VM deleted' in warnings[0]
  assert 'stopped refreshing its lock' in warnings[0]


def test_on_cloud_storage_a_run_whose_lock_was_taken_over_stops(bucket):
  workdir = f'{bucket}/run'
  with RunLock(RunDirectory(workdir, lock_stale_after=0.8)) as first:
    time.sleep(0.1)
    # Another run takes the lock as if this one had been silent (its generation moved on).
    from google.cloud import storage  # pylint: disable=g-import-not-at-top
    blob = storage.Client().bucket(bucket[len('gs://'):]).blob(f'run/{LOCK_FILE}')
    blob.upload_from_string('host elsewhere, pid 1\n')
    wait_until(first.lost)  # A refresh finds a generation it did not write.
    with pytest.raises(UserError, match='another training run took over the run directory'):
      first.check()
  assert lock_text(workdir) == 'host elsewhere, pid 1\n'  # Not emptied: it is the other run's.


def test_on_cloud_storage_a_lock_removed_by_hand_is_taken_again_saying_so(bucket):
  workdir, warnings = f'{bucket}/run', []
  with RunLock(RunDirectory(workdir, lock_stale_after=0.8), Recorder(warnings.append)) as lock:
    from google.cloud import storage  # pylint: disable=g-import-not-at-top
    storage.Client().bucket(bucket[len('gs://'):]).blob(f'run/{LOCK_FILE}').delete()
    wait_until(lambda: warnings)  # A refresh finds it gone, and writes it anew.
    lock.check()
    assert lock_text(workdir).startswith(f'host {socket.gethostname()}, pid {os.getpid()}')
    assert warnings == [f'the run lock {workdir}/{LOCK_FILE} was removed while this run held it; '
                        'this run took it again (leave run.lock in place while a run uses its '
                        'directory)']
  assert lock_text(workdir) == ''


def held(lock: RunLock) -> None:
  with lock:
    pass


def on_the_bucket(error: BaseException, cause: BaseException | None = None) -> str:
  """The line for `error` (raised from `cause`) met where the run first reaches gs://b/run."""
  def reach() -> None:
    with During('reaching', 'gs://b/run'):
      raise error from cause
  return line_of(reach)


def test_a_missing_bucket_ends_in_one_line(gcs_emulator):
  assert line_of(lambda: held(RunLock(RunDirectory('gs://no-such-bucket/run')))).startswith(
      'the bucket gs://no-such-bucket of --workdir=gs://no-such-bucket/run does not exist; '
      'create it')


@pytest.mark.parametrize('error, expected', [
    ('Forbidden', 'no permission to use gs://b (403'),
    ('Unauthorized', 'no permission to use gs://b (401'),
    ('DefaultCredentialsError', 'no Google Cloud credentials to reach gs://b'),
    ('RefreshError', 'the Google Cloud credentials found could not be refreshed to reach gs://b '
                     '(refused): expired or revoked; on a Cloud TPU or GCE VM'),
])
def test_cloud_storage_refusals_end_in_one_line_naming_the_fix(error, expected):
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  raised = getattr(exceptions, error, None) or getattr(auth, error)
  said = on_the_bucket(raised('refused'))
  assert expected in said and '\n' not in said


def test_on_cloud_storage_a_newcomer_waits_as_long_as_the_owner_said(bucket):
  """An owner refreshing every 25 s is not taken for dead by a run that would wait only 1 s."""
  workdir = f'{bucket}/run'
  with RunLock(RunDirectory(workdir, lock_stale_after=100)):
    time.sleep(1.5)
    with pytest.raises(UserError, match='is taken over once silent for 100 s'):
      with RunLock(RunDirectory(workdir, lock_stale_after=1)):
        pass


def test_on_cloud_storage_a_lock_that_cannot_be_emptied_only_warns(bucket, monkeypatch):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  workdir, warnings = f'{bucket}/run', []

  def cut_off(*args, **kwargs):
    raise ConnectionError('the network is gone')

  with RunLock(RunDirectory(workdir), Recorder(warnings.append)):
    monkeypatch.setattr(storage.Blob, 'upload_from_string', cut_off)
  assert len(warnings) == 1 and 'could not release the run lock' in warnings[0]
  assert 'the next run takes it over once it is silent for 120 s' in warnings[0]


def test_on_cloud_storage_a_lock_of_bytes_that_are_no_text_waits_to_go_stale(bucket):
  """Whether it was a run's, only its silence tells: taken over once stale, named as it is."""
  workdir, warnings = f'{bucket}/run', []
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  storage.Client().bucket(bucket[len('gs://'):]).blob(f'run/{LOCK_FILE}').upload_from_string(
      b'\xff\xfe')
  with pytest.raises(UserError, match=re.escape(r'in use by a training run (\xff\xfe; its lock')):
    with RunLock(RunDirectory(workdir, lock_stale_after=2.0)):
      pass
  time.sleep(2.0)
  with RunLock(RunDirectory(workdir, lock_stale_after=2.0), Recorder(warnings.append)):
    assert lock_text(workdir).startswith(f'host {socket.gethostname()}, pid {os.getpid()}')
  [warning] = warnings
  assert 'stopped refreshing its lock' in warning and r'(\xff\xfe)' in warning


@pytest.mark.parametrize('project', [None, 'some-project'])
def test_cloud_storage_out_of_reach_is_one_line_with_or_without_a_project(
    project, tmp_path, monkeypatch, caplog):
  """Credentials but no network, as on a laptop offline, and no project set, as `gcloud auth
  application-default login` alone leaves a machine: a bucket's objects need none. The first touch
  of a bucket (train.py's, eval_only's, predict.py's, export.py's) gives up within a second here."""
  for name in CLOUD_SETTINGS:
    monkeypatch.delenv(name, raising=False)
  for name, value in offline_credentials(tmp_path, project).items():
    monkeypatch.setenv(name, value)
  monkeypatch.setattr(cloud_storage, 'REACH_TIMEOUT_S', 1.0)
  started = time.monotonic()
  assert line_of(RunDirectory('gs://b/run').make) == UNREACHABLE
  assert time.monotonic() - started < 20
  assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.mark.parametrize('answer', ['ServiceUnavailable', 'TooManyRequests', 'InternalServerError'])
@pytest.mark.parametrize('retried', [True, False], ids=['retries ran out', 'not retried'])
def test_cloud_storage_busy_or_failing_is_said_so_not_as_this_machine_s_network(answer, retried):
  """A 429 or 5xx is an answer: the network works, and waiting is the fix."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  last = getattr(exceptions, answer)('GET https://storage.googleapis.com/storage/v1/b/b/o: We '
                                     'encountered an internal error.\n<html>a proxy\'s page</html>')
  said = (on_the_bucket(exceptions.RetryError('Timeout of 30.0s exceeded', last), last) if retried
          else on_the_bucket(last))
  assert said == (
      f'Cloud Storage answered gs://b with {last.code} GET https://storage.googleapis.com/storage/'
      'v1/b/b/o: We encountered an internal error.'
      f'{" until the retries ran out" if retried else ""}: busy or failing for a while, not this '
      'machine; rerun the same command later (https://status.cloud.google.com)')


def test_cloud_storage_out_of_reach_is_said_as_this_machine_s_network():
  import requests  # pylint: disable=g-import-not-at-top
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  last = requests.ConnectionError('Max retries exceeded')
  last.__cause__ = ConnectionRefusedError(111, 'Connection refused')
  assert on_the_bucket(exceptions.RetryError('Timeout of 30.0s exceeded', last),
                       last) == UNREACHABLE


def test_credentials_not_refreshed_are_said_by_why_the_refresh_failed():
  """google-auth raises RefreshError for a metadata server out of reach (a VM's network) and for a
  token service failing for now, not only for credentials expired or revoked."""
  import requests  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  cut_off = requests.ConnectionError('Max retries exceeded')
  cut_off.__cause__ = ConnectionRefusedError(111, 'Connection refused')
  lines = []
  for raised, cause in ((auth.RefreshError('metadata server unreachable'), cut_off),
                        (auth.RefreshError('500 from the token service', retryable=True), None),
                        (auth.RefreshError('invalid_grant: Token has been expired or revoked.',
                                           {'error': 'invalid_grant'}), None)):
    lines.append(on_the_bucket(raised, cause))
  assert lines[0] == UNREACHABLE
  assert lines[1] == ('the Google Cloud credentials to reach gs://b could not be refreshed for now '
                      '(500 from the token service); rerun the same command later')
  assert lines[2].startswith('the Google Cloud credentials found could not be refreshed to reach '
                             'gs://b (invalid_grant: Token has been expired or revoked.): expired '
                             'or revoked; on a Cloud TPU or GCE VM')


@pytest.mark.parametrize('code, said', [
    (503, 'Cloud Storage answered Service Unavailable, 503 writing gs://b/run/metrics.jsonl, again '
          'after the retries: busy or failing for a while, not this machine; rerun the same '
          'command later (https://status.cloud.google.com)'),
    (401, 'Cloud Storage refused the credentials writing gs://b/run/metrics.jsonl (Invalid '
          'Credentials, 401); on a Cloud TPU or GCE VM')])
def test_a_bucket_answering_an_error_mid_run_is_one_line(monkeypatch, code, said):
  """gcsfs raises its HttpError, no OSError, once its retries are spent: it escaped every writer."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  from gcsfs.retry import HttpError  # pylint: disable=g-import-not-at-top
  message = {503: 'Service Unavailable', 401: 'Invalid Credentials'}[code]

  def answered(*_):
    raise HttpError({'code': code, 'message': message})

  monkeypatch.setattr(epath.Path, 'write_bytes', answered)
  monkeypatch.setattr(epath.Path, 'read_bytes', answered)
  workdir = RunDirectory('gs://b/run')
  assert line_of(lambda: workdir.write('metrics.jsonl', 'x')).startswith(said)
  assert line_of(lambda: workdir.read_bytes('metrics.jsonl')).startswith(
      said.replace('writing', 'reading'))
  monkeypatch.setattr(type(workdir.path()), 'is_dir', answered)  # gs://'s own class.
  assert line_of(workdir.checkpoint_epochs).startswith(
      said.replace('writing gs://b/run/metrics.jsonl', 'listing gs://b/run/'))
