"""Members across the devices (member_shards): the numbers of the members on one device, no
gradient exchanged between devices, checkpoints shared with every other placement, and each
impossible placement refused in one line.

The 8-device cases run in one process with 8 simulated CPU devices (tests/placement_probe.py).
"""

import shutil

import pytest

from benchmarks.collectives import collectives, shape_bytes
from errors import ConfigError, UserError
from tests.conftest import (assert_same_numbers, make_config, member_records, on_devices,
                            override_flags, read_metrics, run_probe, run_train)
from tests.parallel_probe import SETTINGS
from tests.placement_probe import RESUME_MARK, RESUMES
from tests.test_processes import finish, launch_two_processes
from trainer import config_rules
from trainer.plan import AXIS, MEMBERS, choose_mode, make_mesh, resolve

MEMBER_COUNT = 8  # The probe's sweep: 2 learning rates x 2 label smoothings x 2 seeds.


@pytest.fixture(scope='module')
def probe(tmp_path_factory, mnist_dir):
  """tests/placement_probe.py once on 8 simulated devices: its report, stdout and output folder."""
  return run_probe('tests.placement_probe', tmp_path_factory.mktemp('placement'))


def assert_members_agree(records: list[dict], reference: list[dict]) -> None:
  """Every member's figures, and the ensemble's, as the reference's to the members' tolerance."""
  for k in range(MEMBER_COUNT):
    assert_same_numbers(member_records(records, k), member_records(reference, k))
  for ours, theirs in zip(records, reference):
    assert ours['eval_ensemble_loss'] == pytest.approx(theirs['eval_ensemble_loss'], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('name, shards, per_device', [('shards-8', 8, 1), ('shards-4', 4, 2)])
def test_members_spread_over_8_devices_train_as_on_one(probe, name, shards, per_device):
  report, stdout, out = probe
  assert report['device_count'] == 8
  assert (f'mesh on 8 cpu devices, {128 * shards // 8} per device per step; 8 models side by side'
          in stdout)  # Not a silent fallback.
  assert f'{per_device} per device (member_shards={shards})' in stdout
  assert_members_agree(read_metrics(out / name), read_metrics(out / 'one-device'))


@pytest.mark.slow
def test_members_one_per_device_compile_no_collective_where_over_data_they_sum_gradients(probe):
  found = probe[0]['collectives']
  assert found['shards-8'] == {'per_step': {'count': 0, 'bytes': 0, 'ops': []},
                               'per_epoch': {'count': 0, 'bytes': 0, 'ops': []}}
  over_data = found['members-over-data']['per_step']
  # The one per step is the gradients' all-reduce: each of the 8 members' 2x64 model's parameters.
  params = 784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10
  assert over_data['count'] == 1 and over_data['ops'][0]['kind'] == 'all-reduce'
  assert over_data['bytes'] == MEMBER_COUNT * params * 4


@pytest.mark.slow
@pytest.mark.parametrize('first, then', RESUMES)
def test_a_checkpoint_of_one_placement_resumes_under_another(probe, first, then):
  its_lines = probe[1].split(f'{RESUME_MARK}{first}-{then}\n')[1].split(RESUME_MARK)[0]
  assert 'resumed from epoch 1' in its_lines  # This resume's own, not another's.
  assert_members_agree(read_metrics(probe[2] / f'{first}-{then}'),
                       read_metrics(probe[2] / 'one-device'))


@pytest.mark.parametrize('overrides, devices, processes, members, mode', [
    ({'member_shards': 8}, 8, 1, 8, 'mesh'),
    ({'member_shards': 4}, 8, 2, 12, 'mesh'),
    ({'member_shards': 8, 'batch_size': 100}, 8, 1, 8, 'mesh'),  # Each member's batch whole.
    ({'member_shards': 1}, 8, 1, 0, 'mesh'),
])
def test_members_spread_over_a_mesh_that_holds_them(overrides, devices, processes, members, mode):
  assert choose_mode(make_config(**overrides), devices, processes, members) == mode


@pytest.mark.parametrize('overrides, devices, members, message, fix', [
    ({'member_shards': 8}, 8, 0, 'member_shards spreads the models of a run of several '
     '(num_models > 1 or a sweep) over the devices, and this run trains one, got 8', '1'),
    ({'member_shards': 3}, 8, 6, 'member_shards must divide the 8 devices present, got 3', '2'),
    ({'member_shards': 2}, 1, 2, 'member_shards must divide the 1 device present, got 2', '1'),
    ({'member_shards': 4}, 8, 6, 'member_shards must divide the 6 models of the run, got 4', '2'),
    ({'member_shards': 8, 'parallel': 'pmap'}, 8, 8, "parallel must be mesh (or auto) to spread "
     "the models over the devices (member_shards=8), got 'pmap'", 'mesh'),
    ({'member_shards': 4, 'batch_size': 101}, 8, 8,
     "batch_size must divide evenly over 2 devices (each member shard's), got 101", '102'),
])
def test_a_placement_the_run_cannot_hold_names_the_field_and_a_fix(overrides, devices, members,
                                                                   message, fix):
  with pytest.raises(ConfigError) as error:
    choose_mode(make_config(**overrides), devices, 1, members)
  assert str(error.value) == message
  assert error.value.fix == fix


def test_member_shards_must_be_a_positive_integer():
  with pytest.raises(UserError, match='member_shards must be a positive integer, got 0'):
    config_rules.validate(make_config(member_shards=0))


def test_a_run_resumes_in_another_placement():
  assert 'member_shards' in config_rules.FREE_FIELDS  # A resume compares the numbers' fields.


def test_a_run_of_spread_members_classifies_on_one_device():
  """predict.py and export.py resolve a saved config on one device, whatever it trained on."""
  plan = resolve(make_config(num_models=8, member_shards=8), one_device=True)
  assert plan.mesh.size == 1 and plan.mesh.axis_names == (AXIS,)
  assert plan.spec.member_axis is None and len(plan.members) == 8


def test_the_mesh_of_one_shard_is_todays():
  assert make_mesh('mesh').axis_names == (AXIS,) and MEMBERS == 'members'


def test_collectives_and_their_bytes_are_read_from_hlo():
  hlo = '\n'.join([
      '  %all-reduce.1 = (f32[8,64]{1,0}, f32[8,784,64]{2,1,0}) all-reduce(%a, %b), '
      'channel_id=1, to_apply=%add, metadata={op_name="jit(f)/shard_map/while/body/psum"}',
      '  %psum.2 = s32[8]{0} all-reduce(%c), channel_id=2, metadata={op_name="jit(f)/psum"}',
      '  %ag = bf16[4,2]{1,0} all-gather-start(%d), metadata={op_name="jit(f)/all_gather"}',
      '  %dot.3 = f32[8,64]{1,0} dot(%e, %f), metadata={op_name="jit(f)/dot_general"}'])
  found = collectives(hlo)
  assert found['per_step']['count'] == 1
  assert found['per_step']['bytes'] == 4 * (8 * 64 + 8 * 784 * 64)
  assert found['per_epoch']['count'] == 2 and found['per_epoch']['bytes'] == 4 * 8 + 2 * 8
  assert [op['kind'] for op in found['per_epoch']['ops']] == ['all-reduce', 'all-gather']
  assert shape_bytes('pred[]') == 1


@pytest.mark.slow
def test_members_spread_over_two_processes_train_and_resume_as_on_one_device(tmp_path, mnist_dir):
  """4 members one per device of 2 processes of 2 devices: trained from the start, and resumed
  from a one-device run's checkpoint of epoch 1 (restored split across the processes)."""
  args = ['--config=configs/default.py', *override_flags(**{
      **SETTINGS, 'num_models': 4, 'data__train_split': 'train[:2048]'})]
  alone = run_train(*args, '--config.parallel=jit', f'--workdir={tmp_path / "one"}',
                    env=on_devices(1))
  assert alone.returncode == 0, alone.stderr
  shutil.copytree(tmp_path / 'one', tmp_path / 'resumed')
  shutil.rmtree(tmp_path / 'resumed' / '2')
  for name in ('spread', 'resumed'):
    processes = launch_two_processes([*args, '--config.member_shards=4'],
                                     lambda i, name=name: tmp_path / name)
    outputs = finish(processes)
    assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]
    assert ('mesh on 4 cpu devices in 2 processes, 128 per device per step; 4 models side by side '
            '(seeds 1 to 4), 1 per device (member_shards=4)') in outputs[0][0]
    assert ('resumed from epoch 1' in outputs[0][0]) == (name == 'resumed')
    for k in range(4):
      assert_same_numbers(member_records(read_metrics(tmp_path / name), k),
                          member_records(read_metrics(tmp_path / 'one'), k), train_count=2048)
