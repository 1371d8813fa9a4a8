"""A run directory in a Cloud Storage bucket, as a Cloud TPU user keeps it (it outlives a preempted
VM): train, kill -9, resume exactly, evaluate and classify from it; one run at a time; one line for
a missing bucket or missing credentials. On a local emulator (tests/conftest.py's gcs_emulator)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import (CLOUD_SETTINGS, ROOT, UNREACHABLE, offline_credentials,
                            override_flags, read_metrics, run_train, without_timings)
from tests.test_trainer import as_scalars, tensorboard_view

pytestmark = pytest.mark.slow

# Every epoch saved (checkpoint_min_seconds=0): the kill below counts on epoch 2's checkpoint.
SMALL = dict(num_epochs=4, data__train_split='train[:2000]', data__eval_split='test[:500]',
             checkpoint_min_seconds=0)


def blob(url: str):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  bucket, _, name = url[len('gs://'):].partition('/')
  return storage.Client().bucket(bucket).blob(name)


def records(workdir: str, name: str = 'metrics.jsonl') -> list[dict]:
  found = blob(f'{workdir}/{name}')
  return ([json.loads(line) for line in found.download_as_text().splitlines()]
          if found.exists() else [])


def names(workdir: str) -> set[str]:
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  bucket, _, prefix = workdir[len('gs://'):].partition('/')
  return {b.name[len(prefix) + 1:]
          for b in storage.Client().list_blobs(bucket, prefix=prefix + '/')}


def launch(*args: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, 'train.py', *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(condition, process: subprocess.Popen, timeout: float = 240) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    assert process.poll() is None, process.stderr.read()
    assert time.monotonic() < deadline
    time.sleep(0.2)


def test_killed_on_cloud_storage_it_resumes_exactly_and_predict_and_eval_only_read_it(
    bucket, tmp_path, mnist_dir):
  args = ['--config=configs/default.py', *override_flags(**{**SMALL, 'num_epochs': 6})]
  assert run_train(*args, f'--workdir={tmp_path / "local"}').returncode == 0
  workdir = f'{bucket}/run'
  first = launch(*args, f'--workdir={workdir}')
  try:
    # Epoch 4 recorded: epoch 3's save has begun, so epoch 2's is complete (orbax saves in turn).
    wait_for(lambda: len(records(workdir)) >= 4, first)
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  resumed = run_train(*args, f'--workdir={workdir}')  # Takes over the killed run's lock at once.
  assert resumed.returncode == 0, resumed.stderr
  assert 'resumed from epoch' in resumed.stdout
  assert without_timings(records(workdir)) == without_timings(read_metrics(tmp_path / 'local'))
  written = names(workdir)
  assert {'mistakes.png', 'confusion.png', 'curves.png', 'run.lock'} <= written
  read = tmp_path / 'events'  # TensorBoard's reader shows each epoch once, as in metrics.jsonl:
  read.mkdir()  # the killed run's events object, and the resumed run's that purges its last ones.
  for name in (n for n in written if n.startswith('events.out.tfevents')):
    blob(f'{workdir}/{name}').download_to_filename(read / name)
  scalars, images = tensorboard_view(read)
  assert scalars == pytest.approx(as_scalars(records(workdir)))
  assert {tag: [step for step, _ in drawn] for tag, drawn in images.items()} == {
      'mistakes': [6], 'confusion': [6], 'curves': [6]}
  assert blob(f'{workdir}/run.lock').download_as_text() == ''  # Released at the end.

  evaluated = run_train(*args, f'--workdir={workdir}', '--config.eval_only=True')
  assert evaluated.returncode == 0, evaluated.stderr
  [record] = records(workdir, 'eval.jsonl')
  assert record['eval_accuracy'] == records(workdir)[-1]['eval_accuracy']
  predicted = run_train(f'--workdir={workdir}', str(ROOT / 'docs' / 'digits'), script='predict.py')
  assert predicted.returncode == 0, predicted.stderr
  assert len(predicted.stdout.splitlines()) == 4
  assert f'with the checkpoint of epoch 6 in {workdir}' in predicted.stderr


def test_one_run_at_a_time_and_a_killed_owners_lock_is_taken_over_at_once(bucket, mnist_dir):
  """A killed run on this machine certainly writes no more: its lock does not wait to go stale (a
  lock of another machine does: tests/test_run_lock.py)."""
  workdir = f'{bucket}/run'

  def args(epochs: int) -> list[str]:
    return ['--config=configs/default.py', f'--workdir={workdir}',
            *override_flags(**{**SMALL, 'num_epochs': epochs})]

  first = launch(*args(300))
  try:
    wait_for(lambda: len(records(workdir)) >= 1, first)
    second = run_train(*args(300))
    assert first.poll() is None  # The owner was alive all along.
    assert second.returncode == 1
    [line] = second.stderr.strip().splitlines()
    assert line.startswith(f'error: the run directory {workdir} is in use by a training run (host ')
    assert f'pid {first.pid}; its lock was refreshed' in line
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  epochs = len(records(workdir)) + 1
  third = run_train(*args(epochs))
  assert third.returncode == 0, third.stderr
  assert (f'warning: took over the run directory {workdir} from a run that ended without releasing '
          f'its lock (host {socket.gethostname()}, pid {first.pid}; that process is gone)'
          ) in third.stderr
  assert [r['epoch'] for r in records(workdir)] == list(range(1, epochs + 1))


def test_a_missing_bucket_ends_in_one_line_and_writes_nothing(gcs_emulator, mnist_dir):
  out = run_train('--config=configs/quick.py', '--workdir=gs://no-such-bucket/run')
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [
      'error: the bucket gs://no-such-bucket of --workdir=gs://no-such-bucket/run does not exist; '
      'create it (gcloud storage buckets create gs://no-such-bucket --location=REGION) or pass '
      'another --workdir']


# Each command that reads a run directory, as a user runs it (tmp_path's `out` is export.py's).
COMMANDS = {'train': ['train.py', '--config=configs/quick.py'],
            'eval_only': ['train.py', '--config=configs/quick.py', '--config.eval_only=True'],
            'predict': ['predict.py', str(ROOT / 'docs' / 'digits')],
            'export': ['export.py', '--out={tmp_path}/out']}


def run_command(command: str, workdir: str, tmp_path, env: dict[str, str],
                *python: str) -> subprocess.CompletedProcess:
  """One of COMMANDS on `workdir` in the environment `env` alone (`python`: python's options)."""
  script, *args = COMMANDS[command]
  return subprocess.run([sys.executable, *python, script, f'--workdir={workdir}',
                         *(arg.format(tmp_path=tmp_path) for arg in args)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize('command', COMMANDS)
def test_no_credentials_end_in_one_line(command, tmp_path, mnist_dir):
  """predict.py and export.py said it as train.py does only once they read through their own
  client first: before, gcsfs logged its retries, then tracebacks, then 'no checkpoint'."""
  env = {name: value for name, value in os.environ.items() if name not in CLOUD_SETTINGS}
  env['GOOGLE_APPLICATION_CREDENTIALS'] = str(tmp_path / 'no-such-key.json')
  out = run_command(command, 'gs://some-bucket/run', tmp_path, env)
  assert out.returncode == 1
  assert out.stderr.splitlines() == [
      'error: no Google Cloud credentials to reach gs://some-bucket (DefaultCredentialsError); on '
      'a Cloud TPU or GCE VM they come with its service account; elsewhere run `gcloud auth '
      'application-default login` or set GOOGLE_APPLICATION_CREDENTIALS']
  assert not (tmp_path / 'out').exists()


# Runs a command with the first touch of a bucket giving up after a second, not REACH_TIMEOUT_S.
REACH_IN_A_SECOND = ('-c', 'import runpy, sys; from trainer.host import cloud_storage; '
                     'cloud_storage.REACH_TIMEOUT_S = 1.0; sys.argv = sys.argv[1:]; '
                     'runpy.run_path(sys.argv[0], run_name="__main__")')


@pytest.mark.parametrize('command, project', [('train', None), ('eval_only', 'p'),
                                              ('predict', 'p'), ('export', None)])
def test_a_machine_cut_off_from_cloud_storage_is_one_line(command, project, tmp_path, mnist_dir):
  """With credentials, and a project or none (`gcloud auth application-default login` alone sets
  none; a bucket's objects need none). Before, train.py ended in 6 tracebacks after 2 minutes, or
  without a project at once in another ('Project was not passed')."""
  env = {name: value for name, value in os.environ.items() if name not in CLOUD_SETTINGS}
  env.update(offline_credentials(tmp_path, project), EPATH_USE_TF='false')
  out = run_command(command, 'gs://b/run', tmp_path, env, *REACH_IN_A_SECOND)
  assert out.returncode == 1
  assert out.stderr.splitlines() == [f'error: {UNREACHABLE}']
  assert not (tmp_path / 'out').exists()


def test_sigterm_saves_and_resumes_and_a_damaged_checkpoint_is_passed_over(bucket, mnist_dir):
  workdir = f'{bucket}/run'
  args = ['--config=configs/default.py', f'--workdir={workdir}', *override_flags(**SMALL)]
  first = launch(*args)
  try:
    wait_for(lambda: len(records(workdir)) >= 1, first)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=120)
  finally:
    first.kill()
    first.wait()
  assert first.returncode == 143, stderr
  assert 'resume with:' in stderr
  stopped_at = len(records(workdir))  # Its epochs are all saved: SIGTERM saves the last one.
  resumed = run_train(*args)
  assert resumed.returncode == 0, resumed.stderr
  assert f'resumed from epoch {stopped_at}' in resumed.stdout  # Not a run started afresh.
  assert [r['epoch'] for r in records(workdir)] == [1, 2, 3, 4]

  blob(f'{workdir}/4/state/_METADATA').delete()  # The newest checkpoint loses a file.
  evaluated = run_train(*args, '--config.eval_only=True')
  assert evaluated.returncode == 0, evaluated.stderr
  assert 'passed over the checkpoint of epoch 4' in evaluated.stderr
  assert [r['epoch'] for r in records(workdir, 'eval.jsonl')] == [3]
