"""Checkpoints: exact resume after a stop, SIGTERM or SIGKILL; damaged ones, mismatches, NaN."""

import dataclasses
import errno
import hashlib
import json
import logging
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple, NoReturn

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from mlp import randomness
from trainer import checkpoints as checkpoint
from trainer import config_fields, config_rules
from trainer.host import run_dir as run_dir_module
from trainer import evaluation, loop
from trainer.plan import resolve
from trainer.programs import state_template
from trainer.checkpoints import DAMAGED_PREFIX, Checkpoints
import library_errors
from errors import Stopped, UserError
from trainer.host.boundary import Host, Phase
from trainer.host.exits import Exits
from trainer.reporting import EVAL_FILE, METRICS_FILE, keep_records_through, read_records
from trainer.host.run_dir import RunDirectory
from trainer.host.run_lock import LOCK_FILE
from tests.test_library_errors import orbax_step_metadata_warnings
from tests.conftest import (FREE_MEMORY, ROOT, Recorder, make_config, override_flags,
                            read_metrics, run_train, line_of, without_timings)

CONFIG = '--config=configs/default.py'
# A checkpoint every epoch, however little time has passed since the last: these runs check what
# each epoch's checkpoint holds (the default's minimum interval would pass over some of their fast
# epochs; the cadence has tests of its own).
EVERY_EPOCH = dict(checkpoint_min_seconds=0)
# In-process runs: 2,000 training images, 3 epochs; dropout stays on, so its keys must resume too.
SMALL = dict(num_epochs=3, data__train_split='train[:2000]', **EVERY_EPOCH)
# Runs that get a signal: 8,000 images, so an epoch lasts long enough to be caught in the middle.
LONG = dict(num_epochs=4, **EVERY_EPOCH)


def run_dir(tmp_path_factory, name: str, **overrides) -> str:
  """An uninterrupted run of the overrides' config, the reference the other runs must match."""
  workdir = tmp_path_factory.mktemp(name)
  loop.train_and_evaluate(resolve(make_config(**overrides)), RunDirectory(workdir))
  return workdir


@pytest.fixture(scope='module')
def small_run(tmp_path_factory, mnist_dir):
  return run_dir(tmp_path_factory, 'small', **SMALL)


@pytest.fixture(scope='module')
def long_run(tmp_path_factory, mnist_dir):
  return run_dir(tmp_path_factory, 'long', **LONG)


@pytest.fixture
def small_copy(small_run, tmp_path):
  """A copy of the reference run to resume, damage or evaluate."""
  return shutil.copytree(small_run, tmp_path / 'run')


def restore(workdir, config):
  """The newest good checkpoint of a run directory, read without touching it."""
  template = state_template(resolve(config))
  with Checkpoints(RunDirectory(workdir), resolve(config), Recorder(lambda _: None),
                   read_only=True) as checkpoints:
    return checkpoints.restore(template)


def assert_same_params(workdir, reference, config):
  """Bit-identical parameters and optimizer state in the two runs' newest checkpoints."""
  ours, theirs = restore(workdir, config), restore(reference, config)
  assert ours.epoch == theirs.epoch
  leaves = jax.tree.leaves((ours.state.params, ours.state.opt_state, ours.state.step))
  expected = jax.tree.leaves((theirs.state.params, theirs.state.opt_state, theirs.state.step))
  assert len(leaves) == len(expected) > 0
  assert all(np.array_equal(a, b) for a, b in zip(leaves, expected))


def saved_epochs(workdir) -> list[int]:
  return sorted(int(p.name) for p in workdir.iterdir() if p.is_dir() and p.name.isdigit())


def snapshot(folder) -> dict[str, str]:
  """Every file under `folder` and its bytes' hash: what 'nothing changed' is checked against."""
  return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(folder.rglob('*')) if p.is_file()}


def stop_after(epochs: int) -> Recorder:
  """A host that hears a SIGTERM, as a preempted VM's, once `epochs` epochs have ended."""
  return Recorder(stop_after=epochs)


@pytest.mark.slow
def test_a_stopped_and_resumed_run_ends_bit_identical_to_an_uninterrupted_one(
    small_run, tmp_path, capsys):
  config = make_config(**SMALL)
  with pytest.raises(Stopped) as stopped:
    loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path), stop_after(1))
  assert str(stopped.value) == (
      f'stopped by SIGTERM after epoch 1, whose checkpoint is saved in {tmp_path}')
  assert stopped.value.exit_status == 128 + signal.SIGTERM
  assert saved_epochs(tmp_path) == [1] and [r['epoch'] for r in read_metrics(tmp_path)] == [1]

  loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path))
  out = capsys.readouterr().out
  assert 'resumed from epoch 1' in out and 'learning-rate schedule' not in out
  assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(small_run))
  assert_same_params(tmp_path, small_run, config)
  assert_tensorboard_matches_metrics(tmp_path)


def test_a_finished_run_reports_again_and_more_epochs_continue_it(small_run, small_copy, capsys):
  before = snapshot(small_copy)
  record = loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(small_copy))
  assert record == read_metrics(small_run)[-1]
  assert 'nothing to train' in capsys.readouterr().out
  assert {k: v for k, v in snapshot(small_copy).items() if 'tfevents' not in k} == {
      k: v for k, v in before.items() if 'tfevents' not in k}

  # Three more epochs, a checkpoint every 2 and the last, keeping 2: saves 4 and 6, drops 1 to 3.
  more = make_config(**{**SMALL, 'num_epochs': 6}, checkpoint_every_epochs=2,
                     max_checkpoints_to_keep=2)
  loop.train_and_evaluate(resolve(more), RunDirectory(small_copy))
  records = read_metrics(small_copy)
  assert [r['epoch'] for r in records] == [1, 2, 3, 4, 5, 6]
  assert records[:3] == read_metrics(small_run)
  assert records[5]['train_loss'] < records[2]['train_loss']
  assert saved_epochs(small_copy) == [4, 6]


def test_more_epochs_on_a_finished_cosine_run_say_how_far_the_learning_rate_jumps(
    small_run, tmp_path, capsys):
  loop.train_and_evaluate(resolve(make_config(**{**SMALL, 'num_epochs': 2})),
                          RunDirectory(tmp_path))
  capsys.readouterr()
  loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(tmp_path))  # 3 epochs now.
  line = [line for line in capsys.readouterr().out.splitlines() if line.startswith('resumed')][0]
  found = re.search(r'num_epochs 2 -> 3 stretches the learning-rate schedule: epoch 2 ended at a '
                    r'rate of (\S+), which the new schedule puts at (\S+), ', line)
  assert found, line
  old, new = float(found.group(1)), float(found.group(2))
  records, straight = read_metrics(tmp_path), read_metrics(small_run)
  assert old == pytest.approx(records[1]['learning_rate'], rel=5e-3)  # The 2-epoch schedule's end.
  assert new == pytest.approx(straight[1]['learning_rate'], rel=5e-3)  # The 3-epoch one's, there.
  assert new > 10 * old  # Back up from about 0.
  assert records[2]['learning_rate'] == straight[2]['learning_rate']


def test_checkpoints_closed_before_any_save_wait_for_orbaxs_cleanup_of_half_written_ones(
    small_copy, monkeypatch):
  """Orbax looks for half-written saves in a thread that only a save waits for. A run that stops
  before its first save (every checkpoint damaged, say) waits for it on closing: else the exit cuts
  it short, and orbax logs its traceback ('cannot schedule new futures after shutdown')."""
  islink = os.path.islink
  monkeypatch.setattr(os.path, 'islink', lambda path: time.sleep(0.2) or islink(path))
  config, before = make_config(**SMALL), set(threading.enumerate())
  saved = Checkpoints(RunDirectory(small_copy), resolve(config), Recorder(pytest.fail))
  started = [t for t in threading.enumerate() if t not in before and not t.daemon]
  assert any(t.is_alive() for t in started)  # Orbax's look, still under way.
  saved.close()
  assert not any(t.is_alive() for t in started)


def test_a_finished_run_without_its_metrics_file_evaluates_its_checkpoint(small_run, small_copy):
  (small_copy / METRICS_FILE).unlink()
  record = loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(small_copy))
  final = read_metrics(small_run)[-1]
  assert (record['epoch'], record['eval_loss'], record['eval_accuracy']) == (
      3, final['eval_loss'], final['eval_accuracy'])
  assert saved_epochs(small_copy) == [1, 2, 3]


def truncate(path):
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def replace_first_byte(path, byte=None):
  """Writes `byte` over the file's first one; by default, that byte with its lowest bit flipped."""
  data = path.read_bytes()
  path.write_bytes(bytes([data[0] ^ 0x01 if byte is None else byte]) + data[1:])


def folder_in_place_of(path):
  path.unlink()
  path.mkdir()


def file_in_place_of(path):
  shutil.rmtree(path)
  path.write_text('')


def link_to_nothing_in_place_of(path):
  shutil.rmtree(path)
  path.symlink_to(path.parent / 'nowhere')


def flip_a_stored_bit(state):
  """Flips the lowest bit of one weight, written through tensorstore: the chunk still decodes, to
  another number. (A bit flipped in the files themselves lands in zstd-compressed chunks, laid out
  anew by each write: where it decodes to other numbers, and where it breaks the decoding, differs
  from one write, and one CPU's float bits, to the next.)"""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top; orbax's storage
  kernel = ts.open({'driver': 'zarr', 'path': 'params.hidden.0.kernel.value',
                    'kvstore': {'driver': 'ocdbt', 'base': f'file://{state}/'}}).result()
  value = kernel[0, 0].read().result()
  kernel[0, 0].write((np.float32(value).view(np.uint32) ^ np.uint32(1)).view(np.float32)).result()
  assert kernel[0, 0].read().result() != value


def largest_file(folder):
  return max((p for p in folder.rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)


def assert_tensorboard_matches_metrics(workdir):
  """TensorBoard shows each epoch once, with metrics.jsonl's values, orphaned steps purged."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(str(workdir))
  events.Reload()
  scalars = [(event.step, event.value) for event in events.Scalars('eval/accuracy')]
  records = read_metrics(workdir)
  assert [step for step, _ in scalars] == [r['epoch'] for r in records]
  np.testing.assert_allclose([v for _, v in scalars], [r['eval_accuracy'] for r in records],
                             rtol=1e-6)


# How each damage is done to a checkpoint folder, what the warning must say about it, and whether
# the rerun is train.py itself (the failed read of a truncated file used to print tracebacks at
# exit) or, faster, in-process.
class Damage(NamedTuple):
  """A way to damage a saved checkpoint, the words its warning gives, and whether the rerun that
  falls back is train.py itself."""
  harm: Callable[[pathlib.Path], Any]
  why: str
  with_train_py: bool = False


def damage(harm: Callable[[pathlib.Path], Any], why: str, name: str, with_train_py: bool = False,
           slow: bool = False) -> Any:
  return pytest.param(Damage(harm, why, with_train_py), id=name,
                      marks=[pytest.mark.slow] if slow else [])


DAMAGE = [
    damage(lambda ckpt: truncate(largest_file(ckpt / 'state')), 'cannot be read',
           'truncated data file', with_train_py=True, slow=True),
    damage(lambda ckpt: flip_a_stored_bit(ckpt / 'state'), 'fingerprint',
           'one flipped bit of a weight'),
    # The file's first bytes open a zstd frame: a chunk that no longer decodes.
    damage(lambda ckpt: replace_first_byte(largest_file(ckpt / 'state')), 'cannot be read',
           'a chunk that no longer decodes'),
    damage(lambda ckpt: (ckpt / 'state' / '_METADATA').unlink(), 'cannot be read',
           'deleted metadata', slow=True),
    damage(lambda ckpt: replace_first_byte(ckpt / 'state' / '_METADATA', 0x84),
           'UnicodeDecodeError', 'metadata that is not text'),
    damage(lambda ckpt: folder_in_place_of(ckpt / 'meta' / 'metadata'), 'IsADirectoryError',
           'a folder in place of a file', slow=True),
    damage(lambda ckpt: file_in_place_of(ckpt / 'state'), 'NotADirectoryError',
           'a file in place of a folder', slow=True),
    damage(lambda ckpt: (ckpt / 'meta' / 'metadata').write_text('{"config": [], "epoch": 3}'),
           'holds no fingerprint, or no config', 'metadata of another shape', slow=True),
    # A file where orbax writes the epoch's checkpoint: it used to delete the file to save there.
    damage(file_in_place_of, 'it is a file, not a folder', 'a file in place of the checkpoint',
           slow=True),
    damage(link_to_nothing_in_place_of, 'it is a link to nothing',
           'a link to nothing in place of the checkpoint', slow=True),
]


@pytest.mark.parametrize('damaged', DAMAGE)
def test_a_damaged_newest_checkpoint_warns_falls_back_and_finishes_exactly(
    damaged, small_run, small_copy, capfd):
  damaged.harm(small_copy / '3')
  if damaged.with_train_py:
    out = run_train(CONFIG, f'--workdir={small_copy}', *override_flags(**SMALL))
    assert out.returncode == 0, out.stderr
    stdout, stderr = out.stdout, out.stderr
  else:
    loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(small_copy))
    stdout, stderr = capfd.readouterr()
  warnings = stderr.strip().splitlines()
  assert len(warnings) == 1, stderr  # One line: no traceback from the failed read either.
  assert (warnings[0].startswith('warning: the checkpoint of epoch 3 is damaged')
          and damaged.why in warnings[0])
  assert 'fell back to epoch 2' in warnings[0]
  assert 'resumed from epoch 2' in stdout
  assert without_timings(read_metrics(small_copy)) == without_timings(read_metrics(small_run))
  assert_same_params(small_copy, small_run, make_config(**SMALL))
  assert_tensorboard_matches_metrics(small_copy)  # Epoch 3 was recorded twice, and shows once.
  assert os.path.lexists(small_copy / f'{DAMAGED_PREFIX}3')  # Kept for inspection, not deleted.


def failing_state_reads(monkeypatch, epoch: int, error: BaseException) -> None:
  """Orbax's reads of epoch `epoch`'s state raise `error`, as a storage fault would: inside the
  Exception orbax wraps every failed read of an array in, which names no cause of its own."""
  read = checkpoint.ocp.CheckpointManager.restore
  wrapper = ('Encountered error while reading array index: (slice(0, 784, 1), slice(0, 512, 1)). '
             'See full TensorStore details: <bound method pybind11_detail_function_record_v1_'
             "system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1.spec of TensorStore({'driver': "
             "'zarr'})>.")

  def restore(manager, step, *args, **kwargs):
    if step == epoch and checkpoint.STATE in kwargs['args'].keys():
      raise Exception(wrapper) from error  # pylint: disable=broad-exception-raised
    return read(manager, step, *args, **kwargs)

  monkeypatch.setattr(checkpoint.ocp.CheckpointManager, 'restore', restore)


# Failures of a read that say nothing about the checkpoint's files, with what the user is told.
TRANSIENT = {
    'EIO': (OSError(errno.EIO, 'Input/output error'), 'OSError: [Errno 5] Input/output error'),
    'an NFS timeout': (ValueError('DEADLINE_EXCEEDED: Error reading '
                                  '"params.hidden.0.kernel.value/0.0" in OCDBT database'),
                       'ValueError: DEADLINE_EXCEEDED'),
    'no permission': (ValueError('PERMISSION_DENIED: Error reading '
                                 '"params.hidden.0.kernel.value/0.0" in OCDBT database at local '
                                 'file "/r/3/state/": Failed to open'),
                      'ValueError: PERMISSION_DENIED'),
}


def test_metadata_this_user_may_not_read_is_not_damage_and_moves_nothing(tmp_path, monkeypatch):
  """predict.py and export.py read the run's config first: metadata this user may not read (a
  folder of another user's) is named as that, not as damage whose fix is to move checkpoints away.
  (The OS's refusal is patched in: root reads any file.)"""
  meta = tmp_path / '1' / checkpoint.META_FILE
  meta.parent.mkdir(parents=True)
  meta.write_text('{}')
  gpath, read_text = type(RunDirectory(tmp_path).path()), epath.Path.read_text

  def read_as_the_os_would(path, *args, **kwargs):
    if os.fspath(path) == str(meta):
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
    return read_text(path, *args, **kwargs)
  monkeypatch.setattr(gpath, 'read_text', read_as_the_os_would)
  assert re.fullmatch(rf'cannot read the checkpoint of epoch 1 in {tmp_path} \(PermissionError: '
                      r'.*\); every checkpoint was left in place: let this user read its files, '
                      'then rerun the same command',
                      line_of(lambda: evaluation.restore_run(RunDirectory(tmp_path))))
  assert meta.read_text() == '{}' and sorted(os.listdir(tmp_path)) == ['1']


@pytest.mark.parametrize('case', TRANSIENT)
def test_a_transient_read_error_stops_the_run_and_sets_no_checkpoint_aside(
    case, small_copy, monkeypatch):
  error, reason = TRANSIENT[case]
  failing_state_reads(monkeypatch, 3, error)
  before = snapshot(small_copy)
  message = line_of(lambda: loop.train_and_evaluate(resolve(make_config(**SMALL)),
                                                    RunDirectory(small_copy)))
  assert message.startswith(f'cannot read the checkpoint of epoch 3 in {small_copy} ({reason}')
  assert 'every checkpoint was left in place' in message and '\n' not in message
  assert message.endswith('let this user read its files, then rerun the same command'
                          if 'PERMISSION' in reason else 'once the storage reads again')
  assert snapshot(small_copy) == before and saved_epochs(small_copy) == [1, 2, 3]
  monkeypatch.undo()  # The storage reads again: the newest checkpoint is still the one resumed.
  assert restore(small_copy, make_config(**SMALL)).epoch == 3


# The fix a device out of memory names where what it was doing is not known
# (trainer/host/faults.py).
LOWER_OR_MORE_MEMORY = ('lower eval_batch_size (the same command then resumes), or batch_size, '
                        'num_models or model.hidden_sizes in a new --workdir, or use a device with '
                        'more memory')
XLA_OUT_OF_MEMORY = 'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.'
NUMPY_OUT_OF_MEMORY = ('Unable to allocate 1.50 MiB for an array with shape (784, 512) and data '
                       'type float32')


@pytest.mark.parametrize('error, said', [
    (jax.errors.JaxRuntimeError(f'{XLA_OUT_OF_MEMORY}\nBufferAssignment OOM'),
     f'this machine ran out of memory ({XLA_OUT_OF_MEMORY}); {LOWER_OR_MORE_MEMORY}'),
    (MemoryError(NUMPY_OUT_OF_MEMORY),  # The host's memory (numpy's words), whatever the device.
     f'this machine ran out of memory (MemoryError: {NUMPY_OUT_OF_MEMORY}); {FREE_MEMORY}'),
    (MemoryError(), f'this machine ran out of memory (MemoryError); {FREE_MEMORY}'),
], ids=['device', 'host', 'host, unworded'])
def test_memory_that_runs_out_in_a_restore_is_one_line_and_moves_nothing(small_copy, monkeypatch,
                                                                         error, said):
  failing_state_reads(monkeypatch, 3, error)
  before = snapshot(small_copy)
  assert line_of(lambda: loop.train_and_evaluate(resolve(make_config(**SMALL)),
                                                 RunDirectory(small_copy))) == said
  assert snapshot(small_copy) == before  # Not taken for damage: nothing set aside.


@pytest.mark.parametrize('doing, fix', [
    ('training', 'lower batch_size, num_models or model.hidden_sizes in a new --workdir'),
    ('evaluating', 'lower eval_batch_size (the same command then resumes)'),
    ('drawing', 'lower eval_batch_size (the same command then resumes)'),
    ('creating', 'lower batch_size, num_models or model.hidden_sizes in a new --workdir')])
def test_a_device_out_of_memory_names_the_fix_for_what_it_was_doing(tmp_path, monkeypatch, doing,
                                                                   fix):
  """A smaller eval_batch_size does nothing for training's memory, nor batch_size for
  evaluation's (the pictures' predictions are evaluation's too); the state's creation is
  training's."""
  from trainer import run  # pylint: disable=g-import-not-at-top

  def out_of_memory(*_, **__):
    raise jax.errors.JaxRuntimeError(f'{XLA_OUT_OF_MEMORY}\nBufferAssignment OOM')

  if doing == 'drawing':
    monkeypatch.setattr(evaluation, '_predict', out_of_memory)
  elif doing == 'creating':  # The model's parameters, made in the fresh state's program.
    compile_programs = run.compile_programs

    def model_out_of_memory(*args):
      programs = compile_programs(*args)
      plan = programs.plan
      return dataclasses.replace(programs, plan=dataclasses.replace(
          plan, recipe=plan.recipe._replace(model=out_of_memory)))

    monkeypatch.setattr(run, 'compile_programs', model_out_of_memory)
  else:
    compile_programs = run.compile_programs
    program = {'training': 'train_program', 'evaluating': 'eval_program'}[doing]
    monkeypatch.setattr(run, 'compile_programs', lambda *args: dataclasses.replace(
        compile_programs(*args), **{program: out_of_memory}))
  stopped = line_of(lambda: loop.train_and_evaluate(
      resolve(make_config(num_epochs=1, data__train_split='train[:512]',
                          data__eval_split='test[:100]')),
      RunDirectory(tmp_path)))
  said = {'drawing': 'evaluating', 'creating': 'training'}.get(doing, doing)
  assert stopped == (f'this machine ran out of memory {said} ({XLA_OUT_OF_MEMORY}); '
                     f'{fix}, or use a device with more memory')


# A GPU's compiler out of memory while it tries kernels (an NVIDIA H200, jax 0.11.2): its text heads
# with the kernels it could not try, then one example's HLO and status.
AUTOTUNING_OUT_OF_MEMORY = (
    'RESOURCE_EXHAUSTED: Failed to get configs for: 17 out of 81 instructions. See logs for all '
    'failures. Example failure:\nCould not get config for HLO: %gemm_fusion_dot.8 = '
    'f32[20000,128,1500]{2,1,0} fusion(%a, %b), kind=kCustom. Status: RESOURCE_EXHAUSTED: Out of '
    'memory while trying to allocate 19.09GiB with allocator GPU_0_bfc on device 0.')


@pytest.mark.parametrize('program, said', [(True, 'training'), (False, 'evaluating')],
                         ids=['training', 'evaluating'])
def test_a_device_out_of_memory_while_compiling_names_the_program_s_fix_and_its_allocation(
    tmp_path, monkeypatch, program, said):
  """A GPU's compiler times candidate kernels in device memory: a model too big runs out there,
  before any epoch; the line names the allocation, not the count of kernels."""
  from trainer import programs  # pylint: disable=g-import-not-at-top
  compile_program = programs._compile  # pylint: disable=protected-access

  def out_of_memory_compiling(*args, donate):
    if donate == program:  # The training program is the one that donates its state.
      raise jax.errors.JaxRuntimeError(AUTOTUNING_OUT_OF_MEMORY)
    return compile_program(*args, donate=donate)

  monkeypatch.setattr(programs, '_compile', out_of_memory_compiling)
  stopped = line_of(lambda: loop.train_and_evaluate(
      resolve(make_config(num_epochs=1, data__train_split='train[:512]',
                          data__eval_split='test[:100]')),
      RunDirectory(tmp_path)))
  fix = {'training': 'lower batch_size, num_models or model.hidden_sizes in a new --workdir',
         'evaluating': 'lower eval_batch_size (the same command then resumes)'}[said]
  assert stopped == (
      f'this machine ran out of memory {said} (Out of memory while trying to allocate 19.09GiB); '
      f'{fix}, or use a device with more memory')


def test_memory_that_runs_out_reading_a_checkpoint_s_metadata_is_no_damage(small_copy, monkeypatch):
  """Its small JSON is read before anything restores: the machine's line, not 'cannot be read'."""
  def out_of_memory(*_, **__):
    raise MemoryError(NUMPY_OUT_OF_MEMORY)

  before = snapshot(small_copy)
  with monkeypatch.context() as patch:
    patch.setattr(checkpoint.json, 'loads', out_of_memory)
    stopped = line_of(lambda: evaluation.restore_run(RunDirectory(small_copy)))
  assert stopped == (
      f'this machine ran out of memory (MemoryError: {NUMPY_OUT_OF_MEMORY}); {FREE_MEMORY}')
  assert snapshot(small_copy) == before


def test_a_thread_the_machine_will_not_start_mid_run_is_one_line_and_the_rerun_resumes(
    tmp_path, monkeypatch):
  """Orbax starts a thread for each save: a machine at its limit of threads refuses the second."""
  save = checkpoint.ocp.CheckpointManager.save

  def refused(manager, step, *args, **kwargs):
    if step == 2:
      raise RuntimeError(library_errors.THREAD_REFUSED)
    return save(manager, step, *args, **kwargs)

  monkeypatch.setattr(checkpoint.ocp.CheckpointManager, 'save', refused)
  run_dir = RunDirectory(tmp_path / 'run')
  stopped = line_of(lambda: loop.train_and_evaluate(resolve(make_config(**SMALL)), run_dir))
  assert stopped == (
      "this machine would not start another thread (can't start new thread): it is short of memory "
      "or at its limit of processes (ulimit -u, or a container's pids limit); free memory or raise "
      'that limit, then rerun the same command')
  assert saved_epochs(tmp_path / 'run') == [1]
  assert (tmp_path / 'run' / LOCK_FILE).read_text() == ''  # Released.
  monkeypatch.undo()
  loop.train_and_evaluate(resolve(make_config(**SMALL)), run_dir)
  assert [r['epoch'] for r in read_metrics(tmp_path / 'run')] == [1, 2, 3]
  assert saved_epochs(tmp_path / 'run') == [1, 2, 3]


def test_a_state_whose_structure_does_not_fit_the_code_is_one_line_and_moves_nothing(small_copy):
  """The same config, but code whose state has another shape (here: a template of another model)."""
  config = make_config(**SMALL)
  other = make_config(**SMALL, model__hidden_sizes=(64,))
  before = snapshot(small_copy)
  with Checkpoints(RunDirectory(small_copy), resolve(config), Recorder(pytest.fail),
                   read_only=True) as checkpoints:
    template = state_template(resolve(other))
    message = line_of(lambda: checkpoints.restore(template))
  assert message.startswith(f'the checkpoint of epoch 3 in {small_copy} holds a state whose '
                            'structure does not fit this code (')
  assert '\n' not in message and snapshot(small_copy) == before


def test_a_half_written_checkpoint_never_blocks_a_resume(small_copy, capsys):
  # What a kill during a save leaves: orbax's temporary folder, renamed only once complete.
  partial = shutil.copytree(small_copy / '3', small_copy / '4.orbax-checkpoint-tmp')
  truncate(largest_file(partial / 'state'))
  (partial / 'state' / '_METADATA').unlink()
  loop.train_and_evaluate(resolve(make_config(**{**SMALL, 'num_epochs': 4})),
                          RunDirectory(small_copy))
  assert 'resumed from epoch 3' in capsys.readouterr().out
  assert not partial.exists() and saved_epochs(small_copy) == [2, 3, 4]
  assert [r['epoch'] for r in read_metrics(small_copy)] == [1, 2, 3, 4]


@pytest.mark.parametrize('make_stray, why', [
    (lambda path: path.mkdir(), 'its metadata cannot be read'),  # Orbax warns of its step metadata.
    (lambda path: path.write_text('notes'), 'it is a file, not a folder'),
    pytest.param(lambda path: path.symlink_to(path.parent / 'nowhere'), 'it is a link to nothing',
                 marks=pytest.mark.slow),
], ids=['folder', 'file', 'link to nothing'])
def test_a_stray_numbered_entry_is_said_once_in_the_apps_own_words_and_kept(
    make_stray, why, small_copy, capsys, caplog):
  make_stray(small_copy / '9')
  with caplog.at_level(logging.WARNING):
    loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(small_copy))
  assert not orbax_step_metadata_warnings(caplog.records, small_copy / '9')
  warnings = [line for line in capsys.readouterr().err.splitlines() if line]
  assert len(warnings) == 1, warnings
  assert warnings[0].startswith(f'warning: the checkpoint of epoch 9 is damaged: {why}')
  assert warnings[0].endswith(f'moved it to {small_copy / DAMAGED_PREFIX}9 and fell back to '
                              'epoch 3')
  assert (not os.path.lexists(small_copy / '9')
          and os.path.lexists(small_copy / f'{DAMAGED_PREFIX}9'))


def test_a_stray_numbered_file_alone_is_refused_and_kept(tmp_path):
  (tmp_path / '2').write_text('notes')
  with pytest.raises(UserError, match=r'no checkpoint in .* can be restored \(epoch 2: it is a '
                     r'file, not a folder\)'):
    loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(tmp_path))
  # Nothing moved, nothing made.
  assert sorted(p.name for p in tmp_path.iterdir()) == ['2', 'run.lock']
  assert (tmp_path / '2').read_text() == 'notes'


def test_no_good_checkpoint_is_one_clear_error_and_nothing_is_deleted(small_copy):
  for epoch in saved_epochs(small_copy):
    truncate(largest_file(small_copy / str(epoch) / 'state'))
  before = snapshot(small_copy)
  with pytest.raises(UserError, match='no checkpoint in .* can be restored') as error:
    loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(small_copy))
  assert all(f'epoch {epoch}' in str(error.value) for epoch in (1, 2, 3))
  assert snapshot(small_copy) == before


def test_a_checkpoint_of_another_model_or_optimizer_is_refused_naming_the_fields(small_copy):
  before = snapshot(small_copy)
  # With data nowhere: refused before the data loads (data.dir is free to change on a resume).
  other = make_config(**SMALL, model__hidden_sizes=(64,), optimizer='sgd',
                      data__dir='/nonexistent/mnist')
  message = line_of(lambda: loop.train_and_evaluate(resolve(other), RunDirectory(small_copy)))
  assert 'model.hidden_sizes=(512, 512)' in message and 'model.hidden_sizes=(64,)' in message
  assert "optimizer='adamw'" in message and "optimizer='sgd'" in message
  assert 'learning_rate' not in message and '--workdir' in message
  assert snapshot(small_copy) == before


def test_a_nan_loss_stops_the_run_and_the_poisoned_state_is_never_saved(tmp_path):
  # Plain SGD warming up to a learning rate far too high: finite at first, then it diverges.
  config = make_config(num_epochs=4, data__train_split='train[:2000]', model__hidden_sizes=(64,),
                       model__dropout_rate=0.0, optimizer='sgd', schedule='constant',
                       warmup_epochs=4.0, learning_rate=4000.0, **EVERY_EPOCH)
  error = line_of(lambda: loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path)))
  bad_epoch = int(re.search(r'loss is (nan|inf) in epoch (\d)', error).group(2))
  assert bad_epoch >= 2  # Otherwise nothing good was saved before it and this proves little.
  assert f'newest checkpoint: epoch {bad_epoch - 1}' in error
  assert saved_epochs(tmp_path) == list(range(1, bad_epoch))
  assert [r['epoch'] for r in read_metrics(tmp_path)] == list(range(1, bad_epoch))
  newest = restore(tmp_path, config)
  assert newest.epoch == bad_epoch - 1
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(newest.state.params))


def test_eval_only_scores_the_newest_checkpoint_without_training(small_run, small_copy, tmp_path):
  before = snapshot(small_copy)
  record = evaluation.evaluate_checkpoint(resolve(make_config(**SMALL, eval_only=True)),
                                          RunDirectory(small_copy))
  final = read_metrics(small_run)[-1]
  assert (record['epoch'], record['eval_loss'], record['eval_accuracy']) == (
      3, final['eval_loss'], final['eval_accuracy'])
  lines = (small_copy / EVAL_FILE).read_text().splitlines()
  assert [json.loads(line) for line in lines] == [record]
  # Besides its record, only its pictures' TensorBoard events: the PNG files are drawn the same.
  written = {EVAL_FILE, *(p.name for p in small_copy.glob('events.*.eval-epoch-3'))}
  assert len(written) == 2
  assert {k: v for k, v in snapshot(small_copy).items() if k not in written} == before

  other_split = evaluation.evaluate_checkpoint(
      resolve(make_config(**SMALL, eval_only=True, data__eval_split='test[:1000]')),
      RunDirectory(small_copy))
  assert other_split['eval_split'] == 'test[:1000]'
  assert other_split['eval_accuracy'] != record['eval_accuracy']

  with pytest.raises(UserError, match='no checkpoint in .* to evaluate'):
    evaluation.evaluate_checkpoint(resolve(make_config(**SMALL, eval_only=True)),
                                   RunDirectory(tmp_path / 'none'))
  assert not (tmp_path / 'none').exists()


def start_train(workdir, **overrides) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, 'train.py', CONFIG, f'--workdir={workdir}', *override_flags(**overrides)],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, process: subprocess.Popen, timeout: float = 120) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    if process.poll() is not None:
      pytest.fail(f'train.py ended early: {process.communicate()[1]}')
    if time.monotonic() > deadline:
      process.kill()
      pytest.fail('train.py did not get there in time')
    time.sleep(0.01)


def recorded(workdir, epoch: int) -> bool:
  return any(r['epoch'] == epoch for r in read_records(RunDirectory(str(workdir))))


@pytest.mark.slow
def test_sigkill_in_the_middle_of_an_epoch_then_rerun_ends_with_the_same_numbers(long_run,
                                                                                 tmp_path):
  process = start_train(tmp_path, **LONG)
  # Killed as soon as checkpoint 2 is on disk: epoch 3 is training, and its save has not begun.
  wait_for(lambda: recorded(tmp_path, 2) and (tmp_path / '2').is_dir(), process)
  process.kill()
  process.communicate()
  assert (2 in saved_epochs(tmp_path)
          and len(read_records(RunDirectory(str(tmp_path)))) < LONG["num_epochs"])

  out = run_train(CONFIG, f'--workdir={tmp_path}', *override_flags(**LONG))
  assert out.returncode == 0, out.stderr
  assert 'resumed from epoch' in out.stdout
  assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(long_run))
  assert_same_params(tmp_path, long_run, make_config(**LONG))
  assert_tensorboard_matches_metrics(tmp_path)


@pytest.mark.slow
def test_sigterm_saves_exits_with_a_resume_hint_and_the_rerun_ends_exactly(long_run, tmp_path):
  process = start_train(tmp_path, **LONG)
  wait_for(lambda: recorded(tmp_path, 1), process)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 128 + signal.SIGTERM, stderr
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and 'stopped by SIGTERM after epoch' in lines[0], stderr
  assert lines[0].endswith('; resume with: ' + shlex.join(process.args)), lines[0]
  stopped_at = len(read_metrics(tmp_path))
  assert stopped_at < LONG['num_epochs'] and saved_epochs(tmp_path)[-1] == stopped_at

  out = run_train(CONFIG, f'--workdir={tmp_path}', *override_flags(**LONG))
  assert out.returncode == 0, out.stderr
  assert f'resumed from epoch {stopped_at}' in out.stdout and not out.stderr
  assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(long_run))


class Interruptible(Exits):
  """Exits whose end at once raises, as Python's Ctrl-C does, rather than end the process."""

  def fail_now(self, line: str, status: int) -> NoReturn:
    raise KeyboardInterrupt


def test_a_signal_is_recorded_not_fatal_and_a_second_ctrl_c_interrupts():
  previous = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
  host = Host(Interruptible())
  with host.phase(Phase.EPOCHS):
    assert host.agree_at_epoch_end(False) == (None, False)
    os.kill(os.getpid(), signal.SIGINT)
    assert host.agree_at_epoch_end(False) == ('SIGINT', False)
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  host = Host(Interruptible())
  with host.phase(Phase.EPOCHS):  # A preemption's: recorded, and a second one is no error.
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    assert host.agree_at_epoch_end(False) == ('SIGTERM', False)
  assert {number: signal.getsignal(number) for number in previous} == previous  # Both restored.


def test_metrics_past_the_restored_epoch_and_torn_lines_are_dropped(tmp_path):
  lines = [json.dumps({'epoch': e, 'eval_loss': e / 10}) for e in (1, 2, 3)] + ['{"epoch": 4, "ev']
  (tmp_path / METRICS_FILE).write_text('\n'.join(lines))
  keep_records_through(RunDirectory(str(tmp_path)), 2)
  assert read_metrics(tmp_path) == [{'epoch': 1, 'eval_loss': 0.1}, {'epoch': 2, 'eval_loss': 0.2}]


def test_lines_that_are_not_utf8_or_no_json_object_are_dropped_and_the_resume_stays_exact(
    small_run, small_copy):
  """A damaged byte, or a JSON value that is no record, is a line dropped as a torn one is:
  before, the resume ended in a UnicodeDecodeError's or an AttributeError's traceback."""
  shutil.rmtree(small_copy / '3')  # Resumed from epoch 2: epoch 3 trains again.
  with open(small_copy / METRICS_FILE, 'ab') as metrics:
    metrics.write(b'{"note": "caf\xe9"}\n5\n')
  loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(small_copy))
  assert without_timings(read_metrics(small_copy)) == without_timings(read_metrics(small_run))
  assert_same_params(small_copy, small_run, make_config(**SMALL))

  (small_copy / EVAL_FILE).write_bytes(b'\xff\xfe\n')
  record = evaluation.evaluate_checkpoint(resolve(make_config(**SMALL, eval_only=True)),
                                          RunDirectory(small_copy))
  assert [json.loads(line) for line in (small_copy / EVAL_FILE).read_text().splitlines()] == [
      record]


@pytest.mark.parametrize('name', ['checkpoint_every_epochs', 'max_checkpoints_to_keep'])
def test_checkpoint_settings_must_be_positive(name):
  with pytest.raises(UserError, match=f'{name} must be a positive integer, got 0'):
    config_rules.validate(make_config(**{name: 0}))


def test_the_minimum_interval_must_be_a_number_of_seconds_and_may_change_on_resume():
  with pytest.raises(UserError,
                     match='checkpoint_min_seconds must be a finite number >= 0, got -1'):
    config_rules.validate(make_config(checkpoint_min_seconds=-1))
  saved = config_fields.flat_config(make_config())
  del saved['checkpoint_min_seconds']  # A checkpoint from before the field.
  assert config_rules.config_mismatches(saved, config_fields.flat_config(
      make_config(checkpoint_min_seconds=60))) == []


def test_a_minimum_interval_skips_saves_but_never_the_last_epoch_or_a_signalled_one(small_run,
                                                                                 tmp_path):
  """An hour between saves: after the first, only the last epoch and a signalled one are saved."""
  config = make_config(**{**SMALL, 'checkpoint_min_seconds': 3600})
  loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path / 'straight'))
  assert saved_epochs(tmp_path / 'straight') == [1, 3]
  with pytest.raises(Stopped):
    loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path / 'stopped'), stop_after(2))
  assert saved_epochs(tmp_path / 'stopped') == [1, 2]
  loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path / 'stopped'))
  assert saved_epochs(tmp_path / 'stopped') == [1, 2, 3]
  for run in ('straight', 'stopped'):  # Which epochs are saved never changes the numbers.
    assert without_timings(read_metrics(tmp_path / run)) == without_timings(read_metrics(small_run))
    assert_same_params(tmp_path / run, small_run, config)


def ones_state(config):
  """A state of the config's shapes and placement, every value one: quick to save."""
  template = state_template(resolve(config))
  return jax.tree.map(lambda leaf: jax.device_put(np.ones(leaf.shape, leaf.dtype), leaf.sharding),
                      template)


def test_orbax_keeps_the_newest_checkpoints_and_never_counts_or_deletes_one_set_aside(tmp_path):
  config = make_config(max_checkpoints_to_keep=2, model__hidden_sizes=(8,))
  state = ones_state(config)
  with Checkpoints(RunDirectory(tmp_path), resolve(config),
                   Recorder(pytest.fail)) as checkpoints:
    for epoch in (1, 2, 3):
      checkpoints.save(epoch, state, force=True)
  assert saved_epochs(tmp_path) == [2, 3]  # Deleted in the background, done once closed.
  with Checkpoints(RunDirectory(tmp_path), resolve(config),
                   Recorder(pytest.fail)) as checkpoints:
    assert checkpoints.set_aside([3]) == [str(tmp_path / f'{DAMAGED_PREFIX}3')]
    for epoch in (3, 4):  # Its epoch can be saved again.
      checkpoints.save(epoch, state, force=True)
  assert saved_epochs(tmp_path) == [3, 4] and (tmp_path / f'{DAMAGED_PREFIX}3').is_dir()


def test_an_old_checkpoint_removed_by_hand_mid_run_is_no_warning(tmp_path, caplog):
  config = make_config(max_checkpoints_to_keep=2, model__hidden_sizes=(8,))
  state = ones_state(config)
  with caplog.at_level(logging.WARNING), Checkpoints(
      RunDirectory(tmp_path), resolve(config), Recorder(pytest.fail)) as checkpoints:
    for epoch in (1, 2):
      checkpoints.save(epoch, state, force=True)
    checkpoints.wait()
    shutil.rmtree(tmp_path / '1')  # Orbax deletes it with the next save: it finds it gone.
    checkpoints.save(3, state, force=True)
  assert saved_epochs(tmp_path) == [2, 3]
  assert not [record for record in caplog.records if 'step 1' in record.getMessage()]


def test_old_checkpoints_that_cannot_be_deleted_are_one_warning_naming_them(tmp_path, monkeypatch):
  config = make_config(max_checkpoints_to_keep=1, model__hidden_sizes=(8,))
  state, rmtree = ones_state(config), shutil.rmtree

  def refused(path, *args, **kwargs):  # What a user who may not write into 1/ meets.
    if os.path.basename(os.fspath(path)) == '1':
      raise PermissionError(errno.EACCES, 'Permission denied', '_CHECKPOINT_METADATA')
    rmtree(path, *args, **kwargs)
  monkeypatch.setattr(shutil, 'rmtree', refused)
  warnings = []
  with Checkpoints(RunDirectory(tmp_path), resolve(config),
                   Recorder(warnings.append)) as checkpoints:
    for epoch in (1, 2, 3):
      checkpoints.save(epoch, state, force=True)
  assert saved_epochs(tmp_path) == [1, 2, 3]  # Orbax deletes no more after a failed deletion.
  assert warnings == [
      f'could not delete old checkpoints in {tmp_path} (Permission denied): the checkpoints of '
      'epochs 1, 2 are still there beyond max_checkpoints_to_keep=1; let this user delete them, or '
      'remove them by hand (every checkpoint was saved)']


def save_the_old_way(workdir, epoch: int, state, rng_data, config, **more) -> None:
  """A checkpoint as the code before checkpoint_min_seconds wrote it, through orbax's stock
  handlers: the state with the run key's data, and JSON of the epoch, config and fingerprint (and
  `more` fields)."""
  flat = config_fields.flat_config(config)
  del flat['checkpoint_min_seconds']  # Older configs lack it.
  tree = checkpoint.saved_tree(state, rng_data)
  fields = {'epoch': epoch, 'config': flat, 'fingerprint': checkpoint.fingerprint(
      jax.device_get(tree)), **more}
  manager = ocp.CheckpointManager(workdir, item_names=(checkpoint.STATE, checkpoint.META))
  manager.save(epoch, args=ocp.args.Composite(**{checkpoint.STATE: ocp.args.PyTreeSave(tree),
                                                 checkpoint.META: ocp.args.JsonSave(fields)}))
  manager.close()


def resave_newest_the_old_way(workdir, config, run_seed: int, **more) -> dict:
  """Epoch 3 saved again the old way from its own state, with the run key of `run_seed`; returns
  the run directory's snapshot after."""
  newest = restore(workdir, config)
  shutil.rmtree(workdir / '3')
  save_the_old_way(workdir, 3, newest.state, jax.random.key_data(randomness.run_keys(run_seed)[1]),
                   config, **more)
  return snapshot(workdir)


def test_a_checkpoint_of_the_older_linen_model_is_refused_in_one_line_and_moves_nothing(
    small_copy):
  """The Linen model's checkpoints say nothing of the model: its parameters are others."""
  config = make_config(**SMALL)
  before = resave_newest_the_old_way(small_copy, config, config.seed)
  for attempt in (lambda: loop.train_and_evaluate(resolve(config), RunDirectory(small_copy)),
                  lambda: evaluation.restore_run(RunDirectory(small_copy))):
    message = line_of(attempt)
    assert message.startswith(f'the checkpoint of epoch 3 in {small_copy} holds the parameters '
                              'of the Flax Linen model'), message
    assert '--workdir' in message and 'git checkout ' in message and '\n' not in message
    assert snapshot(small_copy) == before


def test_a_checkpoint_saved_the_old_way_with_the_nnx_model_restores_and_resumes_exactly(
    small_run, small_copy):
  config = make_config(**SMALL)
  shutil.rmtree(small_copy / '3')
  saved = restore(small_copy, config)
  assert saved.epoch == 2
  shutil.rmtree(small_copy / '2')
  save_the_old_way(small_copy, 2, saved.state,
                   jax.random.key_data(randomness.run_keys(config.seed)[1]), config,
                   model=checkpoint.MODEL_API)
  again = restore(small_copy, config)
  assert again.epoch == 2 and 'checkpoint_min_seconds' not in again.config
  assert evaluation.restore_run(RunDirectory(small_copy))[1].epoch == 2  # Under its own config.
  leaves, expected = jax.tree.leaves(again.state), jax.tree.leaves(saved.state)
  assert len(leaves) == len(expected) > 0
  assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(leaves, expected))
  loop.train_and_evaluate(resolve(config), RunDirectory(small_copy))  # Epoch 3 again, from it.
  assert without_timings(read_metrics(small_copy)) == without_timings(read_metrics(small_run))
  assert_same_params(small_copy, small_run, config)


def test_an_intact_checkpoint_whose_run_key_is_not_the_seeds_is_refused_and_moves_nothing(
    small_copy):
  """What code that derives its run key otherwise saves: its data order and dropout are others."""
  config = make_config(**SMALL)
  before = resave_newest_the_old_way(small_copy, config, config.seed + 1,
                                     model=checkpoint.MODEL_API)
  message = line_of(lambda: loop.train_and_evaluate(resolve(config), RunDirectory(small_copy)))
  assert message.startswith(f'the checkpoint of epoch 3 in {small_copy} holds the run key [')
  assert f'but seed {config.seed} gives this code [' in message and '--workdir' in message
  assert '\n' not in message and snapshot(small_copy) == before


def test_a_finished_run_rerun_on_another_eval_split_reports_that_split(small_run, small_copy):
  other = make_config(**SMALL, data__eval_split='test[6000:8000]')
  record = loop.train_and_evaluate(resolve(other), RunDirectory(small_copy))
  final = read_metrics(small_run)[-1]
  assert record['train_loss'] == final['train_loss']  # Training figures as recorded...
  assert record['eval_loss'] != final['eval_loss']  # ...evaluation of the split asked for now.
  reference = evaluation.evaluate_checkpoint(
      resolve(make_config(**SMALL, data__eval_split='test[6000:8000]', eval_only=True)),
      RunDirectory(small_copy))
  assert (record['eval_loss'], record['eval_accuracy']) == (reference['eval_loss'],
                                                            reference['eval_accuracy'])


def test_the_data_source_may_not_change_on_resume_but_its_folder_may():
  saved = config_fields.flat_config(make_config())
  assert config_rules.config_mismatches(saved, config_fields.flat_config(
      make_config(data__source='tfds'))) == ['data.source']
  assert config_rules.config_mismatches(saved, config_fields.flat_config(
      make_config(data__dir='/elsewhere', num_epochs=40))) == []


# A 64x64 model: each checkpoint is about 0.7 MB, so a 2 MB disk holds two and fails on the third.
TINY_DISK_RUN = dict(num_epochs=4, model__hidden_sizes=(64, 64), data__train_split='train[:2000]',
                     max_checkpoints_to_keep=3, **EVERY_EPOCH)


@pytest.mark.slow
def test_a_full_disk_is_one_line_keeps_older_checkpoints_and_resumes_exactly(tiny_disk, tmp_path):
  reference = tmp_path / 'reference'
  loop.train_and_evaluate(resolve(make_config(**TINY_DISK_RUN)), RunDirectory(reference))
  workdir = tiny_disk / 'run'
  out = run_train(CONFIG, f'--workdir={workdir}', *override_flags(**TINY_DISK_RUN))
  assert out.returncode == 1
  lines = out.stderr.strip().splitlines()
  # One line: the path, the OS's reason (for some writes only tensorstore's status) and the fix.
  # Which write meets the full disk first (a checkpoint, metrics.jsonl, the events) varies.
  assert len(lines) == 1, out.stderr
  assert lines[0].startswith(f'error: cannot write {workdir}'), lines[0]
  assert '(No space left on device' in lines[0], lines[0]
  assert 'free space or restore access there, then rerun the same command' in lines[0]
  kept = saved_epochs(workdir)
  assert kept and kept[-1] < 4
  subprocess.run(['mount', '-o', 'remount,size=16m', str(tiny_disk)], check=True)
  out = run_train(CONFIG, f'--workdir={workdir}', *override_flags(**TINY_DISK_RUN))
  assert out.returncode == 0, out.stderr
  # The newest checkpoint the disk kept was whole: the run goes on from it as if never stopped.
  assert f'resumed from epoch {kept[-1]}' in out.stdout
  assert_same_params(workdir, reference, make_config(**TINY_DISK_RUN))
  assert without_timings(read_metrics(workdir)) == without_timings(read_metrics(reference))


@pytest.mark.slow
def test_a_disk_full_before_any_checkpoint_promises_none_and_leaves_no_partial_save(tiny_disk):
  workdir = tiny_disk / 'run'  # 2 MB: epoch 1's metrics fit, the 512-512 MLP's checkpoint not.
  out = run_train(CONFIG, f'--workdir={workdir}', *override_flags(
      num_epochs=1, data__train_split='test[:2000]'))
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() in ([
      f'error: cannot write {workdir} ({reason}); free space or restore access there, then rerun '
      'the same command to start again: no checkpoint is there to resume from']
      for reason in ('No space left on device', 'No space left on device, or over quota')), (
          out.stderr)
  assert [r['epoch'] for r in read_metrics(workdir)] == [1]
  assert sorted(p.name for p in workdir.iterdir() if p.is_dir()) == []


def test_an_injected_failed_save_stops_the_run_at_that_epoch_and_keeps_the_rest(small_run, tmp_path,
                                                                                monkeypatch):
  """The same path as a full disk, on any machine: orbax reports a failed background save.

  Once epoch 2's save has started, orbax "reports" it failed whenever the run next asks: at the
  end of epoch 3, or in epoch 3's save. Each report first waits for the save as orbax would, so
  that no save still writes while the run clears up after the failure.
  """
  saved, save, wait = ([], checkpoint.Checkpoints.save,
                       checkpoint.ocp.CheckpointManager.wait_until_finished)

  def counted_save(self, epoch, *args, **kwargs):
    save(self, epoch, *args, **kwargs)
    saved.append(epoch)

  def failing_wait(manager):
    wait(manager)
    if len(saved) >= 2:
      raise ValueError('RESOURCE_EXHAUSTED: Failed writing: "x": Failed to write 4931 bytes to '
                       "file 16: No space left on device [os_error_code='28']")

  monkeypatch.setattr(checkpoint.Checkpoints, 'save', counted_save)
  monkeypatch.setattr(checkpoint.ocp.CheckpointManager, 'wait_until_finished', failing_wait)
  error = line_of(lambda: loop.train_and_evaluate(resolve(make_config(**SMALL)),
                                                  RunDirectory(tmp_path)))
  assert error.startswith(f'cannot write {tmp_path} (No space left on device);')
  assert saved == [1, 2]  # The run stopped in epoch 3: no further save was started.
  assert [r['epoch'] for r in read_metrics(tmp_path)] in ([1, 2], [1, 2, 3])
  monkeypatch.undo()
  loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(tmp_path))
  assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(small_run))
  assert_same_params(tmp_path, small_run, make_config(**SMALL))


def test_a_signal_whose_checkpoint_cannot_be_written_says_so_and_names_the_one_to_resume(
    tmp_path, monkeypatch):
  """SIGTERM, then the disk refuses that epoch's save: the run may not say it was saved."""
  write_text = epath.gpath.PosixGPath.write_text

  def full_disk(path, *args, **kwargs):  # Every small file of epoch 2's save, as on a full disk.
    if f'{os.sep}2.orbax-checkpoint-tmp' in str(path):
      raise OSError(errno.ENOSPC, 'No space left on device', str(path))
    return write_text(path, *args, **kwargs)

  monkeypatch.setattr(epath.gpath.PosixGPath, 'write_text', full_disk)
  error = line_of(lambda: loop.train_and_evaluate(resolve(make_config(**SMALL)),
                                                  RunDirectory(tmp_path), stop_after(2)))
  assert error == (
      f'stopped by SIGTERM after epoch 2, but its checkpoint was not saved: cannot write '
      f'{tmp_path} (No space left on device); free space or restore access there, then rerun the '
      'same command to resume from the newest checkpoint (epoch 1)')
  assert saved_epochs(tmp_path) == [1]
  assert [r['epoch'] for r in read_metrics(tmp_path)] == [1, 2]


class FullDiskFile:
  """A file on a disk that fills after its first `room` bytes: the OS's ENOSPC for the rest."""

  def __init__(self, file: BinaryIO, room: int):
    self._file, self._room = file, room

  def __enter__(self) -> 'FullDiskFile':
    return self

  def __exit__(self, *exc_info) -> None:
    self._file.close()

  def write(self, data: bytes) -> int:
    self._file.write(data[:self._room])
    self._file.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._file.name)


def test_a_disk_full_at_a_metrics_write_ends_in_one_line_leaves_no_partial_file_and_resumes(
    small_run, tmp_path, monkeypatch):
  """The disk fills while metrics.jsonl is rewritten after epoch 2 (SIGTERM asked to stop there)."""
  writes = []

  def open_on_a_filling_disk(path, mode='r', *args, **kwargs):
    file = open(path, mode, *args, **kwargs)
    writes.append(path)
    return FullDiskFile(file, 10) if writes.count(f'{tmp_path}/{METRICS_FILE}.tmp') == 2 else file

  monkeypatch.setattr(run_dir_module, 'open', open_on_a_filling_disk, raising=False)
  error = line_of(lambda: loop.train_and_evaluate(resolve(make_config(**SMALL)),
                                                  RunDirectory(tmp_path), stop_after(2)))
  assert error == (f'cannot write {tmp_path}/{METRICS_FILE} (No space left on device); '
                   'free space or restore access there, then rerun the same command')
  # What a run writes, and nothing half-written: epoch 1's records and checkpoint, its events.
  names = sorted(p.name for p in tmp_path.iterdir())
  assert [n for n in names if not n.startswith('events.out.tfevents.')] == [
      '1', METRICS_FILE, 'run.lock'] and len(names) == 4, names
  assert [r['epoch'] for r in read_metrics(tmp_path)] == [1]
  monkeypatch.undo()
  loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(tmp_path))
  assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(small_run))
  assert_same_params(tmp_path, small_run, make_config(**SMALL))


def test_only_reports_naming_an_open_checkpoints_folder_are_muted(tmp_path, monkeypatch):
  """Orbax's and asyncio's reports of a failed read or write, after the run's one error line."""
  unraisable = []
  monkeypatch.setattr(sys, 'unraisablehook', unraisable.append)
  array_handler = checkpoint.ocp.type_handlers.get_type_handler(jax.Array)
  checkpoints = Checkpoints(RunDirectory(tmp_path / 'run'), resolve(make_config()),
                            Recorder(pytest.fail))
  loggers = [logging.getLogger('absl'), logging.getLogger('asyncio')]

  def shown(message: str, exception: Exception) -> list[bool]:
    """Whether each logger lets the error report through (Python 3.12 on: the record, or False)."""
    info = (type(exception), exception, None)
    return [bool(logger.filter(logging.LogRecord(logger.name, logging.ERROR, 'x.py', 1, message,
                                                 None, info)))
            for logger in loggers]

  def hook(exception: Exception) -> None:
    sys.unraisablehook(type('Unraisable', (), {'exc_value': exception, 'object': None}))

  write = ValueError(f'RESOURCE_EXHAUSTED: Error writing "params.hidden.0.bias.value/0" at local '
                     f'file "{tmp_path}/run/4.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/"')
  read = Exception('Encountered error while reading array index: (slice(0, 512, 1),). See full '
                   f"TensorStore details: {{'path': '{tmp_path}/run/3/state/'}}")
  assert shown('Future exception was never retrieved', write) == [False, False]
  assert shown('Save Finalize thread (save_finalize) failed.', RuntimeError(read)) == [False, False]
  assert shown(f'Failed to run 4 Handler Commit operations, directory: {tmp_path}/run/4',
               OSError()) == [False, False]
  another = ValueError(f'RESOURCE_EXHAUSTED: at local file "{tmp_path}/run2/4/"')
  assert shown('Future exception was never retrieved', another) == [True, True]
  closed = RuntimeError('Event loop is closed')
  for exception in (read, closed, another):
    hook(exception)
  # Only this test's own: an earlier test's abandoned orbax work may report here too.
  assert [u.exc_value for u in unraisable if u.exc_value in (read, closed, another)] == [another]
  checkpoints.close()
  assert shown('Future exception was never retrieved', write) == [True, True]
  assert sys.unraisablehook == unraisable.append  # pylint: disable=comparison-with-callable
  # Its handlers are its manager's: orbax's own registry is as it was.
  assert checkpoint.ocp.type_handlers.get_type_handler(jax.Array) is array_handler


@pytest.mark.slow
def test_a_bfloat16_run_resumes_exactly_and_may_not_change_its_dtype(tmp_path):
  config = make_config(**{**SMALL, 'num_epochs': 2}, dtype='bfloat16')
  loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path / 'straight'))
  with pytest.raises(Stopped):
    loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path / 'stopped'), stop_after(1))
  with pytest.raises(UserError, match="saved with dtype='bfloat16', but this run has "
                                      "dtype='float32'"):
    loop.train_and_evaluate(resolve(make_config(**{**SMALL, 'num_epochs': 2})),
                            RunDirectory(tmp_path / 'stopped'))
  loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path / 'stopped'))
  assert without_timings(read_metrics(tmp_path / 'stopped')) == without_timings(
      read_metrics(tmp_path / 'straight'))
  assert_same_params(tmp_path / 'stopped', tmp_path / 'straight', config)


@pytest.mark.parametrize('field', sorted(config_rules.DEFAULTS_OF_NEWER_FIELDS))
def test_checkpoints_from_before_a_newer_field_count_as_the_default_configs_value(field):
  """Also keeps the two places that spell these defaults (configs/default.py, the code) in step."""
  saved = config_fields.flat_config(make_config())
  del saved[field]
  assert config_rules.config_mismatches(config_rules.as_trained(saved),
                                        config_fields.flat_config(make_config())) == []


def test_checkpoints_from_before_the_dtype_field_count_as_float32():
  saved = config_fields.flat_config(make_config())
  del saved['dtype']
  assert config_rules.config_mismatches(config_rules.as_trained(saved), config_fields.flat_config(
      make_config(dtype='bfloat16'))) == ['dtype']


@pytest.mark.parametrize('eval_only', [False, True])
def test_a_checkpoint_from_before_a_field_names_the_value_it_trained_with(small_run, tmp_path,
                                                                         eval_only):
  """Each path that reads a checkpoint's config (the resume's early check, the restore's own,
  eval_only's) sees the newer field at the value the checkpoint trained with, never None."""
  workdir = shutil.copytree(small_run, tmp_path / 'run')
  for meta_file in workdir.glob(f'*/{checkpoint.META_FILE}'):
    meta = json.loads(meta_file.read_text())
    del meta['config']['num_models']  # As a checkpoint saved before the field.
    meta_file.write_text(json.dumps(meta))
  config = make_config(**SMALL, num_models=3, eval_only=eval_only)
  run = evaluation.evaluate_checkpoint if eval_only else loop.train_and_evaluate
  with pytest.raises(UserError, match=r'was saved with num_models=1, but this run has '
                                      r'num_models=3; rerun with the checkpoint'):
    run(resolve(config), RunDirectory(workdir))


@pytest.mark.slow
def test_a_run_directory_removed_mid_run_is_one_line_and_the_rerun_starts_again(
    small_run, tmp_path, monkeypatch):
  workdir, rename = tmp_path / 'run', os.rename

  def removed_first(source, target):  # As epoch 2's save is finished: epoch 1's goes too.
    if os.path.basename(source).startswith('2.orbax-checkpoint-tmp'):
      rename(workdir, tmp_path / 'moved')  # At once: an rmtree here races the run's own writes.
    rename(source, target)

  with monkeypatch.context() as patch:
    patch.setattr(os, 'rename', removed_first)
    error = line_of(lambda: loop.train_and_evaluate(resolve(make_config(**SMALL)),
                                                    RunDirectory(workdir)))
  assert error == (
      f'the run directory {workdir} was removed or moved while the run wrote there; move it back '
      'and rerun the same command to resume, or rerun it to start again')
  loop.train_and_evaluate(resolve(make_config(**SMALL)), RunDirectory(workdir))
  assert without_timings(read_metrics(workdir)) == without_timings(read_metrics(small_run))


# train.py, with the OS refusing to make epoch 2's folder, as it does when the run directory has
# become read-only for this user (root would not be refused).
REFUSE_EPOCH_2 = '''
import errno, os, runpy, sys
make = os.mkdir
def refused(path, *args, **kwargs):
  if os.path.basename(os.fspath(path)).startswith('2.orbax-checkpoint-tmp'):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
  return make(path, *args, **kwargs)
os.mkdir = refused
sys.argv = sys.argv[1:]
runpy.run_path('train.py', run_name='__main__')
'''


@pytest.mark.slow
def test_a_save_refused_its_folder_ends_in_one_line_at_once_and_resumes(small_run, tmp_path):
  """Orbax's threads of that save wait minutes for the folder (holding the exit), then print their
  tracebacks: the run ends without them."""
  args = [CONFIG, f'--workdir={tmp_path}', *override_flags(**SMALL)]
  start = time.monotonic()
  out = subprocess.run([sys.executable, '-c', REFUSE_EPOCH_2, 'train.py', *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
  assert out.returncode == 1 and time.monotonic() - start < 120, out.stderr
  assert out.stderr.strip().splitlines() == [
      f'error: cannot write {tmp_path} (Permission denied); free space or restore access there, '
      'then rerun the same command to resume from the newest checkpoint (epoch 1)']
  assert not (tmp_path / LOCK_FILE).read_text()  # Released: a rerun need not wait for it.
  resumed = run_train(*args)
  assert resumed.returncode == 0 and 'resumed from epoch 1' in resumed.stdout, resumed.stderr
  assert without_timings(read_metrics(tmp_path)) == without_timings(read_metrics(small_run))


def test_a_bucket_that_will_not_answer_for_a_checkpoint_s_metadata_names_no_damage(monkeypatch):
  """gcsfs's HttpError (a 503 after its retries) is no damage: the newest checkpoint is neither set
  aside nor passed over for an older one."""
  from gcsfs.retry import HttpError  # pylint: disable=g-import-not-at-top

  def read_text(path, *_, **__):
    if '/2/' in str(path):
      raise HttpError({'code': 503, 'message': 'Service Unavailable'})
    return json.dumps({'fingerprint': 'f', 'config': {'seed': 0}})

  monkeypatch.setattr(RunDirectory, 'checkpoint_epochs', lambda self: [1, 2])
  monkeypatch.setattr(epath.Path, 'read_text', read_text)
  assert re.match(r'Cloud Storage answered Service Unavailable, 503 reading gs://b/run/2/\S+, '
                  r'again after the retries',
                  line_of(lambda: checkpoint.saved_config(RunDirectory('gs://b/run'))))
