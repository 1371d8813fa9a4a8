"""The training loop in-process: determinism, its three outputs, an evaluation missing nobody."""

import errno
import gzip
import json
import os
import re
import signal
import threading

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from data.mnist import load_split
from trainer.plan import recipe_of, resolve
from trainer.programs import compile_programs
from mlp import steps
from trainer import loop
from trainer.host import peers
from trainer.host import run_dir as run_dir_module
from trainer.host.exits import Exits
from trainer.reporting import TAGS, Reporter
from trainer.host.run_dir import RunDirectory
from tests.conftest import Recorder, line_of, make_config, override_flags, read_metrics, run_train

# Small and fast: 2,000 training images, 2 epochs, dropout on so the dropout keys are exercised too.
SMALL = dict(num_epochs=2, data__train_split='train[:2000]', data__eval_split='test[8000:]')


def tensorboard_view(workdir) -> tuple[dict, dict]:
  """What TensorBoard's own reader shows of a run directory: (tag, step) -> each scalar, and
  tag -> each image's (step, PNG bytes)."""
  events = event_accumulator.EventAccumulator(str(workdir), size_guidance={
      event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0})
  events.Reload()
  scalars = [((tag, e.step), e.value) for tag in events.Tags()['scalars']
             for e in events.Scalars(tag)]
  assert len(dict(scalars)) == len(scalars), 'a step shown twice: a resumed run\'s not purged'
  return dict(scalars), {tag: [(i.step, i.encoded_image_string) for i in events.Images(tag)]
                         for tag in events.Tags()['images']}


def as_scalars(records: list[dict]) -> dict:
  """metrics.jsonl's records as TensorBoard's scalars: (tag, step) -> value."""
  return {(TAGS.get(name, name.replace('_', '/', 1)), r['epoch']): value
          for r in records for name, value in r.items() if name != 'epoch'}


def test_each_epoch_writes_a_json_line_tensorboard_events_and_a_log_line(tmp_path, capsys,
                                                                         mnist_dir):
  config = make_config(**SMALL)
  record = loop.train_and_evaluate(resolve(config), RunDirectory(tmp_path))
  records = read_metrics(tmp_path)
  assert records[-1] == record
  assert set(record) == {'epoch', 'train_loss', 'train_accuracy', 'eval_loss', 'eval_accuracy',
                         'epoch_seconds', 'train_images_per_second', 'learning_rate'}
  assert all(isinstance(v, float) for k, v in record.items() if k != 'epoch')
  # 2,000 images at batch 128: 15 full steps, 1,920 images trained per epoch.
  assert record['train_images_per_second'] * record['epoch_seconds'] >= 1920 * 0.99
  # The rate of each epoch's last step: warmup ends at step 15, cosine decays to 0 at step 30.
  schedule = recipe_of(config, (), steps_per_epoch=15).schedule
  assert [r['learning_rate'] for r in records] == [float(schedule(14)), float(schedule(29))]
  assert records[0]['learning_rate'] == pytest.approx(2e-3 * 14 / 15)
  scalars, images = tensorboard_view(tmp_path)  # Each figure of each epoch, as in metrics.jsonl:
  assert scalars == pytest.approx(as_scalars(records))
  assert images == {name: [(2, (tmp_path / f'{name}.png').read_bytes())]
                    for name in ('mistakes', 'confusion', 'curves')}
  out = capsys.readouterr().out
  assert out.startswith('training on 2,000 images (train[:2000]), evaluating on 2,000 '
                        '(test[8000:]); 15 steps of 128 per epoch in float32, matmul precision '
                        'default, jit on 1 ')
  lines = [l for l in out.splitlines() if l.startswith('epoch ')]
  assert len(lines) == 2 and 'ETA' in lines[0]
  assert f'{100 * record["eval_accuracy"]:6.2f}%' in lines[1]


def test_a_run_imports_no_torch_where_torch_is_installed(tmp_path, mnist_dir):
  """TensorBoard's events cost a user who trains PyTorch models too no seconds of importing it."""
  (tmp_path / 'site' / 'torch').mkdir(parents=True)
  (tmp_path / 'site' / 'torch' / '__init__.py').write_text('raise RuntimeError("imported torch")')
  path = os.pathsep.join(filter(None, [str(tmp_path / 'site'), os.environ.get('PYTHONPATH')]))
  out = run_train('--config=configs/default.py', f'--workdir={tmp_path / "run"}', *override_flags(
      num_epochs=1, data__train_split='train[:512]', data__eval_split='test[:256]',
      batch_size=128), env={'PYTHONPATH': path})
  assert out.returncode == 0, out.stderr
  assert len(list((tmp_path / 'run').glob('events.out.tfevents.*.from-epoch-0'))) == 1


def test_events_grow_in_place_and_a_refused_write_is_one_line_at_once_with_no_thread(
    tmp_path, monkeypatch):
  threads = set(threading.enumerate())
  reporter = Reporter(RunDirectory(tmp_path), resolve(make_config(num_epochs=2)), Recorder())
  reporter.start(0)
  [events] = tmp_path.glob('events.out.tfevents.*')
  started, inode = events.read_bytes(), events.stat().st_ino
  reporter.write({'epoch': 1, 'train_loss': 0.5, 'epoch_seconds': 1.0, 'eval_loss': 0.5,
                  'train_accuracy': 0.9, 'eval_accuracy': 0.9, 'train_images_per_second': 9.0})
  # The same file, longer: a live TensorBoard reads on from where it stopped.
  assert events.stat().st_ino == inode and events.read_bytes().startswith(started)
  assert len(events.read_bytes()) > len(started)

  def full_disk(path, mode='r', *args, **kwargs):  # The OS refuses what the events' file grows by.
    if 'a' in mode:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return open(path, mode, *args, **kwargs)  # pylint: disable=consider-using-with

  monkeypatch.setattr(run_dir_module, 'open', full_disk, raising=False)
  assert line_of(lambda: reporter.write({'epoch': 2, 'train_loss': 0.5, 'epoch_seconds': 1.0})) == (
      f'cannot write {events} (No space left on device); free space or restore access there, then '
      'rerun the same command')
  assert line_of(lambda: reporter.pictures({'mistakes': np.zeros((4, 4, 3), np.uint8)}, epoch=1)
                 ).startswith(f'cannot write {events} (No space left on device)')  # The events'.
  assert not set(threading.enumerate()) - threads  # (One left by an earlier test may have ended.)


def test_padded_evaluation_scores_every_example_once(mnist_dir):
  config = make_config(data__eval_split='test[8001:]')  # 1,999 images: the last batch is padded.
  examples = load_split(config.data, config.data.eval_split)
  run = compile_programs(resolve(config), None, examples)
  on_mesh = run.fresh_state()
  state = jax.device_get(on_mesh)
  sums = jax.device_get(run.eval_program(on_mesh, run.eval_data))
  assert int(sums['count']) == 1999
  images = (examples.images.astype(np.float32) / 255.0 - 0.1307) / 0.3081
  logits = state.model()(images)
  assert int(sums['correct']) == int(np.sum(np.argmax(logits, -1) == examples.labels))
  reference = steps.batch_metrics(logits, examples.labels)
  np.testing.assert_allclose(sums['loss'], reference['loss'], rtol=1e-5)


@pytest.mark.slow
def test_profile_epoch_traces_that_epoch_into_the_run_directory(tmp_path, capsys, mnist_dir):
  loop.train_and_evaluate(resolve(make_config(**SMALL, profile_epoch=2)), RunDirectory(tmp_path))
  traces = list(tmp_path.glob('plugins/profile/*/perfetto_trace.json.gz'))
  assert len(traces) == 1 and list(traces[0].parent.glob('*.xplane.pb'))
  events = json.load(gzip.open(traces[0]))['traceEvents']
  names = {event.get('name', '') for event in events}
  assert 'PjitFunction(jit(train_epoch))' in names  # The epoch's program, and its XLA ops:
  assert any('fusion' in name for name in names)
  assert f'traced epoch 2 into {traces[0].parent}' in capsys.readouterr().out


@pytest.mark.parametrize('precision, operands', [('default', None), ('high', '{high,high}'),
                                                 ('highest', '{highest,highest}')])
def test_the_matmul_precision_is_compiled_into_the_epochs_matmuls(precision, operands, mnist_dir):
  config = make_config(matmul_precision=precision, data__train_split='train[:256]',
                       data__eval_split='test[:100]')
  train, evaluation = (load_split(config.data, s) for s in ('train[:256]', 'test[:100]'))
  epochs = compile_programs(resolve(config), train, evaluation)
  for program in (epochs.train_program, epochs.eval_program):
    found = set(re.findall(r'operand_precision=(\{[^}]*\})', program.as_text()))
    assert found == ({operands} if operands else set())  # XLA's default leaves it unset.


def test_an_epoch_moves_nothing_between_host_and_devices_unasked(mnist_dir):
  """jax.transfer_guard: an epoch's every transfer is explicit, so a host round trip (an implicit
  copy of the data, the state or the epoch number) cannot come back unseen."""
  config = make_config(data__train_split='train[:256]', data__eval_split='test[:100]')
  train, evaluation = (load_split(config.data, s) for s in ('train[:256]', 'test[:100]'))
  epochs = compile_programs(resolve(config), train, evaluation)
  state = epochs.fresh_state()
  with jax.transfer_guard('disallow'):
    with pytest.raises(jax.errors.JaxRuntimeError, match='Disallowed host-to-device transfer'):
      # The guard bites.
      epochs.train_program(state, epochs.train_data, epochs.run_key, np.int32(1))
    state, train_metrics = epochs.train_epoch(state, 1)
    eval_metrics = epochs.evaluate(state)
  assert jax.device_get(state.step) == epochs.plan.steps_per_epoch == 2
  assert 0 < train_metrics['loss'] < 5 and 0 < eval_metrics['loss'] < 5


@pytest.mark.parametrize('parallel', ['jit', 'mesh', 'pmap'])
def test_an_epoch_consumes_the_state_it_starts_from_in_every_mode(parallel, mnist_dir):
  """Donated: its buffers become the new state's, so a run holds one state, not two (under pmap
  too, which once kept both)."""
  config = make_config(parallel=parallel, data__train_split='train[:256]',
                       data__eval_split='test[:100]')
  train, evaluation = (load_split(config.data, s) for s in ('train[:256]', 'test[:100]'))
  epochs = compile_programs(resolve(config), train, evaluation)
  start = epochs.fresh_state()
  state, _ = epochs.train_epoch(start, 1)
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(start))
  assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))
  assert not any(leaf.is_deleted() for leaf in epochs.train_data)  # The data stays resident.


def test_a_one_process_run_exchanges_nothing_between_processes(tmp_path, monkeypatch, mnist_dir):
  """The multi-process machinery is entered only where a run has several processes: a run of one
  makes no collective, at its start or in its epochs."""
  gathered = []
  monkeypatch.setattr(peers, '_gather',
                      lambda *values: gathered.append(values) or np.array([values]))
  tiny = dict(data__train_split='train[:256]', data__eval_split='test[:100]',
              model__hidden_sizes=(16,))
  for num_epochs in (1, 3):
    loop.train_and_evaluate(resolve(make_config(num_epochs=num_epochs, **tiny)),
                            RunDirectory(tmp_path / str(num_epochs)))
  assert not gathered


def test_processes_agree_on_a_stop_and_a_lost_lock_in_one_exchange(monkeypatch):
  """Process 1's view of a two-process run: process 0 was asked to stop and lost its lock."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  exchanges = []

  def gather(values: np.ndarray) -> np.ndarray:
    exchanges.append(values.tolist())
    return np.stack([np.array([signal.SIGTERM.value, 1], np.int32), values])

  monkeypatch.setattr(multihost_utils, 'process_allgather', gather)
  second = peers.Peers(Exits(), RunDirectory('unused'), index=1)
  assert second.agree_at_epoch_end(None, False) == ('SIGTERM', True)
  assert exchanges == [[0, 0]]
  assert second.agree_at_epoch_end('SIGINT', False) == ('SIGINT', True)  # Its own comes first.
