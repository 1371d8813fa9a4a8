"""Data parallel training: pmap on 8 devices, or 2 processes of 2, gives one device's numbers.

Every multi-device case runs in its own process with its own simulated CPU device count: the count
is fixed when JAX starts, and the flag slows single-device code.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from mlp import config_checks
from mlp import parallel
from mlp.errors import UserError
from mlp.reporting import METRICS_FILE
from tests.conftest import ROOT, assert_fails_cleanly, make_config, override_flags, run_train
from tests.pmap_probe import SETTINGS

CONFIG = '--config=configs/default.py'
TRAIN_COUNT, EVAL_COUNT = 4096, 2000  # Images trained on per epoch and scored, under SETTINGS.


def on_devices(count: int) -> dict[str, str]:
  """Environment for a process that sees `count` CPU devices."""
  return {'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': f'--xla_force_host_platform_device_count={count}'}


def read_metrics(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / METRICS_FILE).read_text().splitlines()]


def assert_same_numbers(records: list[dict], reference: list[dict]) -> None:
  """Losses within 1e-5 relative and accuracies within one example, epoch by epoch."""
  assert [r['epoch'] for r in records] == [r['epoch'] for r in reference] == [1, 2]
  for record, expected in zip(records, reference):
    for name in ('train_loss', 'eval_loss'):
      assert record[name] == pytest.approx(expected[name], rel=1e-5), (name, record, expected)
    for name, count in (('train_accuracy', TRAIN_COUNT), ('eval_accuracy', EVAL_COUNT)):
      assert abs(record[name] - expected[name]) * count <= 1 + 1e-9, (name, record, expected)


@pytest.fixture(scope='module')
def probe(tmp_path_factory, mnist_dir):
  """tests/pmap_probe.py run once on 8 simulated devices: its report, stdout and output folder."""
  out = tmp_path_factory.mktemp('probe')
  result = subprocess.run([sys.executable, '-m', 'tests.pmap_probe', str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **on_devices(8)})
  assert result.returncode == 0, result.stderr
  return json.loads((out / 'probe.json').read_text()), result.stdout, out


def test_pmap_on_8_devices_gives_one_devices_numbers_each_epoch(probe):
  report, stdout, out = probe
  assert report['device_count'] == 8
  assert 'pmap over 8 cpu devices, 16 per device per step' in stdout  # Not a silent jit fallback.
  assert 'jit on 1 cpu device' in stdout
  assert_same_numbers(read_metrics(out / 'pmap'), read_metrics(out / 'jit'))


def test_replicated_state_leaves_as_one_copy_and_counts_each_example_once(probe):
  state = probe[0]['pmap_state']
  assert state['executor'] == 'PmapExecutor'
  assert state['replicated_shapes'] == [[8] + shape for shape in state['initial_shapes']]
  assert state['round_trip_is_initial']
  assert state['host_shapes'] == state['initial_shapes']  # Saved state: one copy, not 8.
  assert state['host_step'] == TRAIN_COUNT // SETTINGS['batch_size']
  assert state['train_sums']['count'] == TRAIN_COUNT  # Summed over devices once, not 8 times.
  assert state['eval_sums']['count'] == EVAL_COUNT
  assert 0 < state['eval_sums']['correct'] <= EVAL_COUNT
  # Resuming from the host copy continues exactly as if the state had never left the devices.
  assert state['resumed_metrics_equal'] and state['resumed_state_equal']


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def launch_two_processes(args: list[str], workdir_of) -> list[subprocess.Popen]:
  """train.py as processes 0 and 1 of one run, 2 simulated CPU devices each."""
  address = f'--coordinator_address=127.0.0.1:{free_port()}'
  env = {**os.environ, **on_devices(2)}
  return [subprocess.Popen(
      [sys.executable, 'train.py', *args, f'--workdir={workdir_of(i)}', address,
       '--num_processes=2', f'--process_id={i}'],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(2)]


def finish(processes: list[subprocess.Popen]) -> list[tuple[str, str]]:
  """Each process's (stdout, stderr), once all have ended; none outlives the test."""
  try:
    return [p.communicate(timeout=300) for p in processes]
  finally:
    for p in processes:
      p.kill()


def test_two_processes_of_two_devices_match_one_process_of_four(tmp_path, mnist_dir):
  args = [CONFIG, *override_flags(parallel='pmap', **SETTINGS)]
  reference = run_train(*args, f'--workdir={tmp_path / "one"}', env=on_devices(4))
  assert reference.returncode == 0, reference.stderr

  processes = launch_two_processes(args, lambda i: tmp_path / f'process{i}')
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]

  assert_same_numbers(read_metrics(tmp_path / 'process0'), read_metrics(tmp_path / 'one'))
  first, second = outputs[0][0], outputs[1][0]
  assert 'pmap over 4 cpu devices in 2 processes, 32 per device per step' in first
  assert sum(line.startswith('epoch ') for line in first.splitlines()) == 2
  assert list((tmp_path / 'process0').glob('events.out.tfevents.*'))
  # Process 1 computed the same epochs but wrote no file and no log line.
  assert not (tmp_path / 'process1').exists()
  assert not [line for line in second.splitlines() if line.startswith(('epoch ', 'training'))]

  # Rerun on workdirs that only process 0 can see (like disks local to each host): process 0
  # would resume at epoch 2 and process 1 start afresh. Both stop with one line before restoring
  # anything (orbax restores together, so a restore on one process alone would wait forever).
  processes = launch_two_processes(args, lambda i: tmp_path / f'process{i}')
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [1, 1]
  for _, err in outputs:
    assert err.strip().splitlines()[-1].startswith(
        'error: the processes see different checkpoints (newest epoch 2, 0 for processes 0, 1, ...')


def test_sigterm_to_one_process_stops_every_process_at_the_same_checkpoint(tmp_path, mnist_dir):
  epochs = 12
  args = [CONFIG, *override_flags(parallel='pmap', **{**SETTINGS, 'num_epochs': epochs,
                                                       'data__train_split': 'test[:2048]'})]
  workdir = tmp_path / 'run'
  processes = launch_two_processes(args, lambda i: workdir)
  metrics = workdir / METRICS_FILE
  deadline = time.monotonic() + 240
  while not (metrics.exists() and metrics.read_text().strip()):
    assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
    time.sleep(0.2)
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


@pytest.mark.parametrize('overrides, devices, processes, mode', [
    ({}, 1, 1, 'jit'),
    ({}, 8, 1, 'pmap'),
    ({}, 4, 2, 'pmap'),
    ({'parallel': 'pmap'}, 1, 1, 'pmap'),
    ({'parallel': 'jit', 'batch_size': 100}, 8, 1, 'jit'),
    ({'num_devices': 8}, 8, 1, 'pmap'),
])
def test_mode_follows_the_config_and_the_devices(overrides, devices, processes, mode):
  assert parallel.choose_mode(make_config(**overrides), devices, processes) == mode


@pytest.mark.parametrize('overrides, devices, processes, message', [
    ({'batch_size': 100}, 8, 1,
     'batch_size 100 does not divide evenly over 8 devices; pass --config.batch_size=104'),
    ({'eval_batch_size': 1001}, 4, 2,
     'eval_batch_size 1001 does not divide evenly over 4 devices; pass --config.eval_batch_size=1004'),
    ({'num_devices': 8}, 1, 1, 'asks for 8 devices (num_devices=8) but 1 is present'),
    ({'parallel': 'jit'}, 4, 2, 'parallel=jit trains on one device, but this run has 2 processes'),
    ({'parallel': 'jit', 'num_devices': 8}, 8, 1, 'the config asks for 8 (num_devices)'),
])
def test_a_mismatch_of_config_and_devices_is_one_actionable_line(overrides, devices, processes,
                                                                  message):
  with pytest.raises(UserError) as error:
    parallel.choose_mode(make_config(**overrides), devices, processes)
  assert message in str(error.value) and '\n' not in str(error.value)


def test_a_negative_device_count_is_refused_before_any_work():
  with pytest.raises(UserError, match='num_devices must be an integer >= 0'):
    config_checks.validate(make_config(num_devices=-1))


BAD_LAUNCHES = {
    'batch that does not split over 8 devices': (
        [CONFIG, *override_flags(batch_size=100)], 8,
        'batch_size 100 does not divide evenly over 8 devices'),
    'the TPU v3-8 config on one device': (
        ['--config=configs/tpu_v3_8.py', *override_flags()], 1,
        'the config asks for 8 devices (num_devices=8) but 1 is present'),
    'a process id past the process count': (
        [CONFIG, '--coordinator_address=127.0.0.1:1', '--num_processes=2', '--process_id=2'], 1,
        'process_id < num_processes'),
    'a coordinator address without a port': (
        [CONFIG, '--coordinator_address=localhost', '--num_processes=2', '--process_id=0'], 1,
        "--coordinator_address='localhost' is not HOST:PORT"),
    'a peer that never starts': (
        [CONFIG, '--coordinator_address=127.0.0.1:{port}', '--num_processes=2', '--process_id=0',
         '--initialization_timeout=2'], 1, 'not every process joined the run within 2s'),
}


@pytest.mark.parametrize('case', BAD_LAUNCHES)
def test_bad_launch_ends_in_one_line_and_changes_nothing(case, tmp_path, mnist_dir):
  args, devices, expected = BAD_LAUNCHES[case]
  args = [arg.replace('{port}', str(free_port())) for arg in args]
  assert_fails_cleanly(args, expected, tmp_path / 'run', env=on_devices(devices))


# Constant learning rate: a run stopped after epoch 1 (num_epochs=1) and resumed with num_epochs=2
# then follows the same schedule as one that ran 2 epochs straight.
RESUMABLE = {**SETTINGS, 'schedule': 'constant', 'warmup_epochs': 0}


def train_on(devices: int, workdir, epochs: int) -> subprocess.CompletedProcess:
  mode = 'pmap' if devices > 1 else 'jit'
  out = run_train(CONFIG, f'--workdir={workdir}', env=on_devices(devices),
                  *override_flags(**{**RESUMABLE, 'num_epochs': epochs, 'parallel': mode}))
  assert out.returncode == 0, out.stderr
  return out


@pytest.fixture(scope='module')
def straight_run(tmp_path_factory, mnist_dir):
  """2 epochs on one device without a stop: the numbers every resumed run must end with."""
  workdir = tmp_path_factory.mktemp('straight')
  train_on(1, workdir, 2)
  return read_metrics(workdir)


@pytest.mark.parametrize('first, then', [(8, 1), (1, 8)])
def test_a_checkpoint_from_one_device_count_resumes_on_another(first, then, straight_run, tmp_path):
  workdir = tmp_path / 'run'
  train_on(first, workdir, 1)
  out = train_on(then, workdir, 2)
  assert 'resumed from epoch 1' in out.stdout
  assert ('pmap over 8 cpu devices' if then == 8 else 'jit on 1 cpu device') in out.stdout
  assert_same_numbers(read_metrics(workdir), straight_run)
