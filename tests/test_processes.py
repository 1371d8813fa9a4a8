"""Several processes of one run: joining, the same numbers as one process, stopping together.

Each process runs train.py with its own simulated CPU device count, as a user would launch it.
"""

import errno
import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest


from tests.conftest import (ROOT, assert_fails_cleanly, assert_same_numbers, on_devices,
                            override_flags, read_metrics, run_train,
                            without_timings)
from tests.parallel_probe import SETTINGS
from tests.test_cloud_storage import names, records
from errors import UserError
from library_errors import JAX_ABORT
from trainer.host import peers
from trainer.host.peers import relay
from trainer.reporting import METRICS_FILE
from trainer.host.run_lock import LOCK_FILE

CONFIG = '--config=configs/default.py'


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def launch_two_processes(args: list[str], workdir_of, port: int = 0,
                         cwd=ROOT) -> list[subprocess.Popen]:
  """train.py as processes 0 and 1 of one run, 2 simulated CPU devices each, started in `cwd`."""
  address = f'--coordinator_address=127.0.0.1:{port or free_port()}'
  env = {**os.environ, **on_devices(2)}
  return [subprocess.Popen(
      [sys.executable, str(ROOT / 'train.py'), *args, f'--workdir={workdir_of(i)}', address,
       '--num_processes=2', f'--process_id={i}'],
      cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(2)]


def finish(processes: list[subprocess.Popen]) -> list[tuple[str, str]]:
  """Each process's (stdout, stderr), once all have ended; none outlives the test."""
  try:
    return [p.communicate(timeout=300) for p in processes]
  finally:
    for p in processes:
      p.kill()


ARGS = [CONFIG, *override_flags(**{**SETTINGS, 'num_epochs': 6, 'checkpoint_every_epochs': 2,
                                   'data__train_split': 'train[:2048]'})]


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, mnist_dir):
  """A two-process run of ARGS, never stopped: (its run directory, each process's stdout)."""
  shared = tmp_path_factory.mktemp('uninterrupted')
  processes = launch_two_processes(ARGS, lambda i: shared)
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]
  return shared, [out for out, _ in outputs]


@pytest.mark.slow
def test_two_processes_of_two_devices_match_one_process_of_four(uninterrupted, tmp_path):
  reference = run_train(*ARGS, f'--workdir={tmp_path / "one"}', env=on_devices(4))
  assert reference.returncode == 0, reference.stderr

  shared, (first, second) = uninterrupted
  assert_same_numbers(read_metrics(shared), read_metrics(tmp_path / 'one'), epochs=6,
                      train_count=2048)
  assert 'mesh on 4 cpu devices in 2 processes, 32 per device per step' in first
  assert sum(line.startswith('epoch ') for line in first.splitlines()) == 6
  assert '[Gloo]' not in first + second  # The log has only the run's lines.
  assert len(list(shared.glob('events.out.tfevents.*'))) == 1
  # Process 1 computed the same epochs but printed no log line.
  assert not [line for line in second.splitlines() if line.startswith(('epoch ', 'training'))]

  # Run directories local to each host: process 1 cannot see the one process 0 made. Both stop
  # with one line before any checkpoint is written (orbax writes one checkpoint together).
  processes = launch_two_processes(ARGS, lambda i: tmp_path / f'local{i}')
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [1, 1]
  for _, err in outputs:
    assert err.strip().splitlines()[-1].startswith(
        'error: process 1 cannot see the run directory that process 0 made')

  # Each host's own copy, one of them behind: process 0 would find epoch 6 and process 1
  # start afresh. Both stop with one line before restoring anything (orbax restores together).
  (tmp_path / 'behind').mkdir()
  processes = launch_two_processes(ARGS, lambda i: shared if i == 0 else tmp_path / 'behind')
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [1, 1]
  for _, err in outputs:
    assert err.strip().splitlines()[-1].startswith(
        'error: the processes see different checkpoints (newest epoch 6, 0 for processes 0, 1, ...')


def refuse_a_second_job(args: list[str], workdir, first: list[subprocess.Popen]) -> None:
  """A second two-process job on the running job's directory: both its processes stop at once."""
  for p in first:  # Paused, so it is sure to be running, however fast.
    p.send_signal(signal.SIGSTOP)
  try:
    second = launch_two_processes(args, lambda i: workdir)
    outputs = finish(second)
  finally:
    for p in first:
      p.send_signal(signal.SIGCONT)
  assert [p.returncode for p in second] == [1, 1]
  assert [err.strip().splitlines() for _, err in outputs] == [
      [f'error: the run directory {workdir} is in use by a training run (host '
       f'{socket.gethostname()}, pid {first[0].pid}); wait for it to end or stop it, or pass '
       'another --workdir'],
      [f'error: process 0 found the run directory {workdir} in use by another training run; '
       'wait for it to end or stop it, or pass another --workdir']]


@pytest.mark.slow
def test_a_second_job_is_refused_and_sigterm_to_one_process_stops_every_process_together(
    tmp_path, mnist_dir):
  epochs = 12
  args = [CONFIG, *override_flags(**{**SETTINGS, 'num_epochs': epochs,
                                                       'data__train_split': 'train[:2048]'})]
  workdir = tmp_path / 'run'
  processes = launch_two_processes(args, lambda i: workdir)
  metrics = workdir / METRICS_FILE
  deadline = time.monotonic() + 240
  while not (metrics.exists() and metrics.read_text().strip()):
    assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
    time.sleep(0.2)
  refuse_a_second_job(args, workdir, processes)
  processes[1].send_signal(signal.SIGTERM)  # A preempted host: the only one signalled.
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [143, 143], [err for _, err in outputs]
  stopped = len(read_metrics(workdir))
  assert stopped < epochs and (workdir / str(stopped)).is_dir()
  for _, err in outputs:
    assert f'stopped by SIGTERM after epoch {stopped}, whose checkpoint is saved' in err

  processes = launch_two_processes(args, lambda i: workdir)
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]
  assert f'resumed from epoch {stopped}' in outputs[0][0]
  assert [r['epoch'] for r in read_metrics(workdir)] == list(range(1, epochs + 1))


def kill_when(processes: list[subprocess.Popen], workdir, victim: int, moment: str) -> float:
  """kill -9 of process `victim` at `moment`; returns when.

  'at start-up': as soon as the run directory is locked, before any epoch. 'in training': in the
  epoch after a checkpoint newer than the launch's (saved every 2 epochs, so that epoch trains in
  collectives with no save waiting on a peer). 'during a save': while orbax writes a checkpoint
  (its temporary folder is there, the epoch's folder not yet).
  """
  at_launch, launched = newest_checkpoint(workdir), time.time()

  def saving(name: str, names: set[str]) -> bool:  # Not one a killed save left behind.
    return (name.endswith('.orbax-checkpoint-tmp') and name.split('.')[0] not in names and
            os.stat(workdir / name).st_mtime >= launched)

  def ready(names: set[str]) -> bool:
    if moment == 'at start-up':
      return 'run.lock' in names
    if moment == 'during a save':
      return any(saving(name, names) for name in names)
    newest = newest_checkpoint(workdir)
    return newest > at_launch and len(read_metrics(workdir)) > newest

  return kill_once(processes, victim,
                   lambda: ready(set(os.listdir(workdir)) if workdir.is_dir() else set()))


def kill_once(processes: list[subprocess.Popen], victim: int, ready, every: float = 0.002) -> float:
  """kill -9 of process `victim` as soon as `ready()` (asked `every` seconds), with every process
  still running; when."""
  deadline = time.monotonic() + 240
  while not ready():
    if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
      for p in processes:
        p.kill()
      pytest.fail(f'not ready in time or ended first: {[p.communicate()[1] for p in processes]}')
    time.sleep(every)
  processes[victim].kill()
  return time.monotonic()


def newest_checkpoint(workdir) -> int:
  names = os.listdir(workdir) if workdir.is_dir() else []
  return max((int(name) for name in names if name.isdigit()), default=0)


def lost_line(workdir, newest: int, survivor: subprocess.Popen) -> str:
  """The one line a survivor prints: where the run resumes, and this process's own command."""
  where, then = ((f'the newest checkpoint is epoch {newest}', 'resume from it') if newest else
                 ('no checkpoint was saved yet', 'start again'))
  return ('error: a process of the run was lost (it stopped, or its host or network went down); '
          f'{where} in {workdir}; to {then}, rerun the same command on every host, here: '
          f'{shlex.join(survivor.args)}')


def took_over(workdir, holder: str) -> str:
  """The warning of a run taking over the lock that a process gone from this machine left."""
  return (f'warning: took over the run directory {workdir} from a run that ended without releasing '
          f'its lock ({holder}; that process is gone)')


@pytest.mark.slow
def test_a_lost_process_stops_the_other_in_one_line_and_the_reruns_end_as_if_never_lost(
    uninterrupted, tmp_path):
  """Lost at start-up, in training and during a save, process 0 or 1: each time the survivor
  ends within seconds in one line (from its lifeline, a failed collective or JAX's abort, never a
  traceback or a stack dump), and the run, rerun after each, ends with the uninterrupted numbers.
  A killed process 0 leaves its name in the lock: the next run's process 0 says it took over."""
  left = ''  # Whom the lock names as the next run starts.
  for victim, moment in [(0, 'at start-up'), (1, 'in training'), (0, 'during a save'),
                         (0, 'in training')]:
    processes = launch_two_processes(ARGS, lambda i: tmp_path)
    killed = kill_when(processes, tmp_path, victim, moment)
    survivor = processes[1 - victim]
    _, stderr = survivor.communicate(timeout=60)
    assert survivor.returncode != 0 and time.monotonic() - killed < 30, (victim, moment)
    said = [took_over(tmp_path, left)] if left and survivor is processes[0] else []
    assert stderr.strip().splitlines() == [*said, lost_line(
        tmp_path, newest_checkpoint(tmp_path), survivor)], (victim, moment)
    processes[victim].communicate()
    left = (tmp_path / LOCK_FILE).read_text().strip()

  processes = launch_two_processes(ARGS, lambda i: tmp_path)
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]
  assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(uninterrupted[0]))


def complete_epochs(workdir: str) -> set[int]:
  """Epochs whose checkpoint orbax finished: renamed from its temporary folder on a disk, marked by
  its commit_success.txt in a bucket (which has no rename)."""
  if workdir.startswith('gs://'):
    return {int(name.split('/')[0]) for name in names(workdir)
            if re.fullmatch(r'\d+/commit_success\.txt', name)}
  return {int(name) for name in (os.listdir(workdir) if os.path.isdir(workdir) else [])
          if name.isdigit()}


@pytest.mark.slow
def test_a_lost_process_line_names_the_newest_checkpoint_of_a_relative_workdir(tmp_path, mnist_dir):
  """The survivor looks for checkpoints in the folder the run started from, and names it in full
  (a gs:// run directory: the bucket test below)."""
  named = str(tmp_path / 'run')
  settings = {**SETTINGS, 'num_epochs': 6, 'checkpoint_every_epochs': 3,
              'data__train_split': 'train[:2048]'}
  args = [f'--config={ROOT / "configs" / "default.py"}', *override_flags(**settings)]
  processes = launch_two_processes(args, lambda i: 'run',
                                   cwd=tmp_path)  # Not the project's root, where the relay runs.
  # Killed after the first checkpoint (epoch 3), before the last one starts (epoch 6).
  # Asked often: epoch 3's save may commit only as epoch 6's begins, shortly before the end.
  kill_once(processes, 0, lambda: bool(complete_epochs(named)), every=0.02)
  (_, _), (_, stderr) = finish(processes)
  assert processes[1].returncode != 0
  assert stderr.strip().splitlines() == [lost_line(named, max(complete_epochs(named)),
                                                   processes[1])]


def saving_after_a_checkpoint(workdir: str) -> bool:
  """Whether the bucket holds a complete checkpoint and a newer one lacking its commit marker."""
  found = names(workdir)
  started = {int(name.split('/')[0]) for name in found if re.match(r'\d+/', name)}
  complete = {int(name.split('/')[0]) for name in found
              if re.fullmatch(r'\d+/commit_success\.txt', name)}
  return bool(complete and started - complete)


def own_lines(stderr: str) -> list[str]:
  """The run's lines, without tensorstore's complaint that the emulator's bucket has no
  credentials (a real bucket's VM has them)."""
  return [line for line in stderr.strip().splitlines()
          if not (line.startswith('E') and 'google_auth_provider' in line)]


@pytest.mark.slow
@pytest.mark.parametrize('victim', [1, 0])
def test_a_process_lost_during_a_save_to_a_bucket_ends_the_other_at_once_and_the_rerun_proceeds(
    victim, uninterrupted, bucket):
  """The survivor learns of the loss from its lifeline, not JAX's heartbeat, and ends within seconds
  in the one line naming the bucket's newest checkpoint; the rerun at once is not locked out
  (process 0 survived: it released its lock; it was killed: its lock, left on this machine, is
  taken over) and ends as if never lost."""
  workdir = f'{bucket}/run'
  processes = launch_two_processes(ARGS, lambda i: workdir)
  # Asked every 50 ms: each question lists the bucket, which costs the emulator CPU the run needs;
  # a save to a bucket lasts longer than that.
  killed = kill_once(processes, victim, lambda: saving_after_a_checkpoint(workdir), every=0.05)
  complete_at_kill = max(complete_epochs(workdir))
  survivor = processes[1 - victim]
  _, stderr = survivor.communicate(timeout=120)
  seconds = time.monotonic() - killed
  processes[victim].communicate()
  # Not JAX's own detection, a minute or more: the bucket's listing and lock release, under load.
  assert survivor.returncode == 1 and seconds < 30, (survivor.returncode, seconds, stderr)
  # The checkpoint a rerun resumes from: the one complete at the kill, or the save in flight if
  # the killed process had written its part, which the survivor waits for before its line (else
  # the line could name an older one than the rerun then used).
  said = re.search(r'newest checkpoint is epoch (\d+)', stderr)
  named = int(said.group(1)) if said else -1
  assert named == max(complete_epochs(workdir)) and named >= complete_at_kill, stderr
  assert own_lines(stderr) == [lost_line(workdir, named, survivor)]

  rerun = launch_two_processes(ARGS, lambda i: workdir)
  outputs = finish(rerun)
  assert [p.returncode for p in rerun] == [0, 0], [err for _, err in outputs]
  assert f'resumed from epoch {named} ' in outputs[0][0], outputs[0][0]
  killed_0 = took_over(workdir, f'host {socket.gethostname()}, pid {processes[0].pid}')
  assert [line for line in own_lines(outputs[0][1]) if 'took over' in line] == (
      [killed_0] if victim == 0 else [])
  assert without_timings(records(workdir)) == without_timings(read_metrics(uninterrupted[0]))


def test_the_relay_says_jax_s_abort_as_the_run_s_line_and_nothing_after_it():
  out = io.BytesIO()
  lines = [b'W1123 a warning of the run\n', b'F1123 16:08:06.301057 7202 client.h:80] ' +
           JAX_ABORT + b'. absl::Status: UNAVAILABLE\n', b'*** Check failure stack\n',
           b'error: a process of the run was lost (...)\n', b'Fatal Python error: Aborted\n']
  relay(iter(lines), out, lambda: 'a process of the run was lost;  here:  cmd')
  assert out.getvalue() == (b'W1123 a warning of the run\n'
                            b'error: a process of the run was lost; here: cmd\n')
  out = io.BytesIO()
  relay(iter(lines[3:]), out, lambda: 'unused')  # The run said it first.
  assert out.getvalue() == lines[3]


BAD_LAUNCHES = {
    'the TPU v3-8 config on one device': (
        ['--config=configs/tpu_v3_8.py', *override_flags()], 1,
        'num_devices must match the 1 device present, got 8; pass --config.num_devices=0'),
    'a process id past the process count': (
        [CONFIG, '--coordinator_address=127.0.0.1:1', '--num_processes=2', '--process_id=2'], 1,
        'process_id < num_processes'),
    'a coordinator address without a port': (
        [CONFIG, '--coordinator_address=localhost', '--num_processes=2', '--process_id=0'], 1,
        "--coordinator_address='localhost' is not HOST:PORT"),
    # JAX's coordinator would crash the process (a segmentation fault) on a port in use.
    'a coordinator port another program listens on': (
        [CONFIG, '--coordinator_address=127.0.0.1:{held port}', '--num_processes=2',
         '--process_id=0'], 1, 'port {held port} (another program listens there'),
    'a peer that never starts': (
        [CONFIG, '--coordinator_address=127.0.0.1:{port}', '--num_processes=2', '--process_id=0',
         '--initialization_timeout=2'], 1, 'not every process joined the run within 2s'),
}
SLOW_LAUNCHES = ('a peer that never starts',)  # It waits out the 2 s timeout.


@pytest.mark.parametrize('case', [
    pytest.param(case, marks=pytest.mark.slow) if case in SLOW_LAUNCHES else case
    for case in BAD_LAUNCHES])
def test_bad_launch_ends_in_one_line_and_changes_nothing(case, tmp_path, mnist_dir):
  args, devices, expected = BAD_LAUNCHES[case]
  with socket.create_server(('127.0.0.1', 0)) as held:
    ports = {'{port}': str(free_port()), '{held port}': str(held.getsockname()[1])}
    args, expected = ([fill(arg, ports) for arg in args]), fill(expected, ports)
    assert_fails_cleanly(args, expected, tmp_path / 'run', env=on_devices(devices))


def fill(text: str, values: dict[str, str]) -> str:
  for name, value in values.items():
    text = text.replace(name, value)
  return text


def test_the_coordinator_port_check_takes_ipv4_alone_on_a_machine_without_ipv6(monkeypatch):
  """gRPC listens on IPv4's addresses where the machine has no IPv6: so does the check, which
  must neither refuse such a launch nor miss a port in use there."""
  real_socket = socket.socket

  def no_ipv6(family=socket.AF_INET, *args, **kwargs):
    if family == socket.AF_INET6:
      raise OSError(errno.EAFNOSUPPORT, 'Address family not supported by protocol')
    return real_socket(family, *args, **kwargs)

  with socket.create_server(('127.0.0.1', 0)) as held:
    port = held.getsockname()[1]
    monkeypatch.setattr(socket, 'socket', no_ipv6)
    with pytest.raises(UserError, match=f'on port {port} \\(another program listens there'):
      peers.check_port_free(f'127.0.0.1:{port}')
  peers.check_port_free(f'127.0.0.1:{free_port()}')  # Free: no line.
