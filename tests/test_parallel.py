"""Data parallel training: mesh or pmap on 8 devices, or 2 processes of 2, give one device's numbers.

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

from trainer import config_checks
from trainer.devices import choose_mode
from errors import ConfigError, UserError
from trainer.reporting import METRICS_FILE
from tests.conftest import (ROOT, assert_fails_cleanly, make_config, override_flags, read_metrics,
                            run_train)
from tests.parallel_probe import MODES, SETTINGS

CONFIG = '--config=configs/default.py'
TRAIN_COUNT, EVAL_COUNT = 4096, 2000  # Images trained on per epoch and scored, under SETTINGS.


def on_devices(count: int) -> dict[str, str]:
  """Environment for a process that sees `count` CPU devices."""
  return {'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': f'--xla_force_host_platform_device_count={count}'}


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
  """tests/parallel_probe.py run once on 8 simulated devices: its report, stdout and output folder."""
  out = tmp_path_factory.mktemp('probe')
  result = subprocess.run([sys.executable, '-m', 'tests.parallel_probe', str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **on_devices(8)})
  assert result.returncode == 0, result.stderr
  return json.loads((out / 'probe.json').read_text()), result.stdout, out


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['mesh', 'pmap'])
def test_8_devices_give_one_devices_numbers_each_epoch(probe, mode):
  report, stdout, out = probe
  assert report['device_count'] == 8
  assert f'{mode} on 8 cpu devices, 16 per device per step' in stdout  # Not a silent fallback.
  assert 'jit on 1 cpu device' in stdout
  assert_same_numbers(read_metrics(out / mode), read_metrics(out / 'jit'))


@pytest.mark.slow
def test_replicated_state_is_one_global_copy_and_counts_each_example_once(probe):
  state = probe[0]['mesh_state']
  assert state['mesh_size'] == 8 and state['replicated']
  assert state['host_shapes'] == state['initial_shapes']  # Saved state: one copy, not 8.
  assert state['host_step'] == TRAIN_COUNT // SETTINGS['batch_size']
  jit_first = read_metrics(probe[2] / 'jit')[0]
  assert state['train_metrics']['loss'] == pytest.approx(jit_first['train_loss'], rel=1e-5)
  assert state['eval_metrics']['accuracy'] == pytest.approx(jit_first['eval_accuracy'],
                                                            abs=1 / EVAL_COUNT + 1e-9)
  assert state['eval_count'] == EVAL_COUNT  # Summed over the devices once, not 8 times.
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


@pytest.mark.slow
def test_two_processes_of_two_devices_match_one_process_of_four(tmp_path, mnist_dir):
  args = [CONFIG, *override_flags(parallel='mesh', **SETTINGS)]
  reference = run_train(*args, f'--workdir={tmp_path / "one"}', env=on_devices(4))
  assert reference.returncode == 0, reference.stderr

  shared = tmp_path / 'shared'
  processes = launch_two_processes(args, lambda i: shared)
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]

  assert_same_numbers(read_metrics(shared), read_metrics(tmp_path / 'one'))
  first, second = outputs[0][0], outputs[1][0]
  assert 'mesh on 4 cpu devices in 2 processes, 32 per device per step' in first
  assert sum(line.startswith('epoch ') for line in first.splitlines()) == 2
  assert len(list(shared.glob('events.out.tfevents.*'))) == 1
  # Process 1 computed the same epochs but printed no log line.
  assert not [line for line in second.splitlines() if line.startswith(('epoch ', 'training'))]

  # Run directories local to each host: process 1 cannot see the one process 0 made. Both stop
  # with one line before any checkpoint is written (orbax writes one checkpoint together).
  processes = launch_two_processes(args, lambda i: tmp_path / f'local{i}')
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [1, 1]
  for _, err in outputs:
    assert err.strip().splitlines()[-1].startswith(
        'error: process 1 cannot see the run directory that process 0 made')

  # Each host's own copy, one of them behind: process 0 would resume at epoch 2 and process 1
  # start afresh. Both stop with one line before restoring anything (orbax restores together).
  (tmp_path / 'behind').mkdir()
  processes = launch_two_processes(args, lambda i: shared if i == 0 else tmp_path / 'behind')
  outputs = finish(processes)
  assert [p.returncode for p in processes] == [1, 1]
  for _, err in outputs:
    assert err.strip().splitlines()[-1].startswith(
        'error: the processes see different checkpoints (newest epoch 2, 0 for processes 0, 1, ...')


@pytest.mark.slow
def test_sigterm_to_one_process_stops_every_process_at_the_same_checkpoint(tmp_path, mnist_dir):
  epochs = 12
  args = [CONFIG, *override_flags(**{**SETTINGS, 'num_epochs': epochs,
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
    ({}, 8, 1, 'mesh'),
    ({}, 4, 2, 'mesh'),
    ({'parallel': 'pmap'}, 1, 1, 'pmap'),
    ({'parallel': 'mesh'}, 1, 1, 'mesh'),
    ({'parallel': 'jit', 'batch_size': 100}, 8, 1, 'jit'),
    ({'num_devices': 8}, 8, 1, 'mesh'),
])
def test_mode_follows_the_config_and_the_devices(overrides, devices, processes, mode):
  assert choose_mode(make_config(**overrides), devices, processes) == mode


@pytest.mark.parametrize('overrides, devices, processes, message, fix', [
    ({'batch_size': 100}, 8, 1, 'batch_size must divide evenly over 8 devices, got 100', '104'),
    ({'eval_batch_size': 1001}, 4, 2,
     'eval_batch_size must divide evenly over 4 devices, got 1001', '1004'),
    ({'num_devices': 8}, 1, 1, 'num_devices must match the 1 device present, got 8', '0'),
    ({'parallel': 'jit'}, 4, 2, "parallel must be mesh (or auto) in a run of 2 processes, got 'jit'",
     'mesh'),
    ({'parallel': 'pmap'}, 4, 2, 'parallel must be mesh (or auto) in a run of 2 processes (pmap',
     'mesh'),
    ({'parallel': 'jit', 'num_devices': 8}, 8, 1,
     'parallel must be mesh or pmap (or auto) to train on num_devices=8', 'mesh'),
])
def test_a_mismatch_of_config_and_devices_names_the_field_and_a_fix(overrides, devices, processes,
                                                                     message, fix):
  with pytest.raises(ConfigError) as error:
    choose_mode(make_config(**overrides), devices, processes)
  assert message in str(error.value) and '\n' not in str(error.value)
  assert error.value.fix == fix


def test_a_negative_device_count_is_refused_before_any_work():
  with pytest.raises(UserError, match='num_devices must be an integer >= 0'):
    config_checks.validate(make_config(num_devices=-1))


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
  args = [arg.replace('{port}', str(free_port())) for arg in args]
  assert_fails_cleanly(args, expected, tmp_path / 'run', env=on_devices(devices))


@pytest.mark.slow
@pytest.mark.parametrize('first, then', [(a, b) for a in MODES for b in MODES if a != b])
def test_a_checkpoint_saved_in_one_mode_resumes_in_any_other_exactly(probe, first, then):
  """jit runs on 1 of the 8 devices, mesh and pmap on all 8: modes and device counts both change."""
  out = probe[2]
  assert 'resumed from epoch 1' in probe[1]
  assert_same_numbers(read_metrics(out / f'{first}-{then}'), read_metrics(out / 'jit'))
