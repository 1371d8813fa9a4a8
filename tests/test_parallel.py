"""The device mesh: jit, mesh and pmap on 8 devices give one device's numbers and share checkpoints.

The multi-device cases run in one process with 8 simulated CPU devices (tests/parallel_probe.py):
the count is fixed when JAX starts, and the flag slows single-device code.
"""

import os
import subprocess
import sys

import pytest

from errors import ConfigError, UserError
from tests.conftest import (EVAL_COUNT, ROOT, TRAIN_COUNT, assert_same_numbers, make_config,
                            member_records, on_devices, read_metrics, run_probe)
from tests.parallel_probe import MEMBER_MODES, RESUME_MARK, RESUMES, SETTINGS
from trainer import config_rules
from trainer.plan import choose_mode


@pytest.fixture(scope='module')
def probe(tmp_path_factory, mnist_dir):
  """tests/parallel_probe.py once on 8 simulated devices: its report, stdout and output folder."""
  return run_probe('tests.parallel_probe', tmp_path_factory.mktemp('probe'))


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['mesh', 'pmap'])
def test_8_devices_give_one_devices_numbers_each_epoch(probe, mode):
  report, stdout, out = probe
  assert report['device_count'] == 8
  assert f'{mode} on 8 cpu devices, 16 per device per step' in stdout  # Not a silent fallback.
  assert 'jit on 1 cpu device' in stdout
  assert_same_numbers(read_metrics(out / mode), read_metrics(out / 'jit'))


@pytest.mark.slow
@pytest.mark.parametrize('mode', MEMBER_MODES)
def test_a_member_on_8_devices_trains_as_its_seeds_run_on_one(probe, mode):
  """Member 1 of seeds 0 and 1, vmapped under shard_map or pmap, against seed 1's jit run."""
  records = read_metrics(probe[2] / f'members-{mode}')
  assert f'{mode} on 8 cpu devices, 16 per device per step; 2 models side by side' in probe[1]
  assert_same_numbers(member_records(records, 1), read_metrics(probe[2] / 'jit'))


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
    ({'parallel': 'jit'}, 4, 2,
     "parallel must be mesh (or auto) in a run of 2 processes, got 'jit'", 'mesh'),
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
    config_rules.validate(make_config(num_devices=-1))


@pytest.mark.slow
@pytest.mark.parametrize('first, then', RESUMES)
def test_a_checkpoint_saved_in_one_mode_resumes_in_any_other_exactly(probe, first, then):
  """jit runs on 1 of the 8 devices, mesh and pmap on all 8: modes and device counts both change."""
  out = probe[2]
  its_lines = probe[1].split(f'{RESUME_MARK}{first}-{then}\n')[1].split(RESUME_MARK)[0]
  assert 'resumed from epoch 1' in its_lines  # This resume's own, not another's.
  assert_same_numbers(read_metrics(out / f'{first}-{then}'), read_metrics(out / 'jit'))


@pytest.mark.slow
def test_the_tpu_recipe_starts_on_a_simulated_v3_32_pod_slice(tmp_path, mnist_dir):
  """configs/tpu_v3_8.py, its docstring's pod flags, on 32 devices (tiny model, 2 short epochs)."""
  out = subprocess.run(
      [sys.executable, 'train.py', '--config=configs/tpu_v3_8.py', f'--workdir={tmp_path}',
       '--config.parallel=mesh', '--config.num_devices=32', '--config.num_epochs=2',
       '--config.model.hidden_sizes=(32,)', '--config.data.train_split=train[:8192]',
       '--config.data.eval_split=test[:1000]'],
      cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **on_devices(32)})
  assert out.returncode == 0, out.stderr
  assert 'mesh on 32 cpu devices, 32 per device per step' in out.stdout
  records = read_metrics(tmp_path)
  assert [r['epoch'] for r in records] == [1, 2] and records[-1]['eval_accuracy'] > 0.5
