"""One training run per run directory: a second run stops at once; a killed holder blocks nothing."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from errors import UserError
from tests.conftest import ROOT, override_flags, run_train
from trainer.reporting import METRICS_FILE
from trainer.run_lock import LOCK_FILE, RunLock

HOLD = ('import sys, time; from trainer.run_lock import RunLock\n'
        'with RunLock(sys.argv[1]):\n  print("held", flush=True); time.sleep(600)')


def test_a_second_holder_is_refused_with_the_first_ones_host_and_pid(tmp_path):
  with RunLock(str(tmp_path)):
    with pytest.raises(UserError) as error:
      with RunLock(str(tmp_path)):
        pass
  assert f'host {socket.gethostname()}, pid {os.getpid()}' in str(error.value)
  assert f'the run directory {tmp_path} is in use by a training run' in str(error.value)
  assert (tmp_path / LOCK_FILE).read_text() == ''  # Released on exit, naming nobody,
  with RunLock(str(tmp_path)):  # and the next holder is welcome.
    assert (tmp_path / LOCK_FILE).read_text() == (
        f'host {socket.gethostname()}, pid {os.getpid()}\n')


def test_a_process_that_takes_no_lock_stops_when_the_one_that_takes_it_is_refused(tmp_path):
  votes = []

  def everyone(ok: bool) -> bool:  # The collective, as process 1 sees it when process 0 is refused.
    votes.append(ok)
    return False

  with pytest.raises(UserError, match=f'process 0 found the run directory {tmp_path} in use by '
                                      'another training run'):
    with RunLock(str(tmp_path), enabled=False, everyone=everyone):
      pass
  assert votes == [True] and not (tmp_path / LOCK_FILE).exists()


def test_a_lock_whose_holder_was_killed_never_blocks(tmp_path):
  holder = subprocess.Popen([sys.executable, '-c', HOLD, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'held'
    with pytest.raises(UserError, match=f'pid {holder.pid}'):
      with RunLock(str(tmp_path)):
        pass
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with RunLock(str(tmp_path)):
    pass


@pytest.mark.slow
def test_a_second_run_on_one_workdir_stops_at_once_and_the_first_finishes(tmp_path, mnist_dir):
  args = ['--config=configs/default.py', f'--workdir={tmp_path}',
          *override_flags(num_epochs=6, data__train_split='train[:2000]')]
  first = subprocess.Popen([sys.executable, 'train.py', *args], cwd=ROOT, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    deadline = time.monotonic() + 120
    while not (tmp_path / METRICS_FILE).exists():  # The first run is training.
      assert time.monotonic() < deadline and first.poll() is None
      time.sleep(0.1)
    first.send_signal(signal.SIGSTOP)  # Alive and holding the run directory, however fast it is.
    start = time.monotonic()
    try:
      second = run_train(*args)
    finally:
      first.send_signal(signal.SIGCONT)
    assert time.monotonic() - start < 30
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f'error: the run directory {tmp_path} is in use by a training run (host '
        f'{socket.gethostname()}, pid {first.pid}); wait for it to end or stop it, or pass '
        'another --workdir']
    assert first.wait(timeout=300) == 0, first.stderr.read()
  finally:
    first.kill()
  epochs = [int(line.split('"epoch": ')[1].split(',')[0])
            for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
  assert epochs == list(range(1, 7))  # The second run added none.
