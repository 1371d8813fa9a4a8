"""The training loop in-process: determinism, its three outputs, and an evaluation that misses nobody."""

import gzip
import json
import re
import struct

import jax
import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event

from data.mnist import load_split
from trainer.run_setup import place, set_up_run
from mlp import optim, steps
from trainer import loop
from tests.conftest import make_config, read_metrics

# Small and fast: 2,000 training images, 2 epochs, dropout on so the dropout keys are exercised too.
SMALL = dict(num_epochs=2, data__train_split='train[:2000]', data__eval_split='test[8000:]')


def read_events(path) -> list[Event]:
  """A TensorBoard events file's records (TFRecords: length, its CRC, data, the data's CRC)."""
  data, events, at = path.read_bytes(), [], 0
  while at < len(data):
    (size,) = struct.unpack('<Q', data[at:at + 8])
    events.append(Event.FromString(data[at + 12:at + 12 + size]))
    at += 12 + size + 4
  return events


def test_each_epoch_writes_a_json_line_tensorboard_events_and_a_log_line(tmp_path, capsys,
                                                                         mnist_dir):
  config = make_config(**SMALL)
  record = loop.train_and_evaluate(config, str(tmp_path))
  records = read_metrics(tmp_path)
  assert records[-1] == record
  assert set(record) == {'epoch', 'train_loss', 'train_accuracy', 'eval_loss', 'eval_accuracy',
                         'epoch_seconds', 'train_images_per_second', 'learning_rate'}
  assert all(isinstance(v, float) for k, v in record.items() if k != 'epoch')
  # 2,000 images at batch 128: 15 full steps, 1,920 images trained per epoch.
  assert record['train_images_per_second'] * record['epoch_seconds'] >= 1920 * 0.99
  # The rate of each epoch's last step: warmup ends at step 15, cosine decays to 0 at step 30.
  schedule = optim.learning_rate_schedule(config, steps_per_epoch=15)
  assert [r['learning_rate'] for r in records] == [float(schedule(14)), float(schedule(29))]
  assert records[0]['learning_rate'] == pytest.approx(2e-3 * 14 / 15)
  events = [event for path in tmp_path.glob('events.out.tfevents.*') for event in read_events(path)]
  rates = {e.step: v.simple_value for e in events for v in e.summary.value
           if v.tag == 'train/learning_rate'}
  assert rates == pytest.approx({1: records[0]['learning_rate'], 2: records[1]['learning_rate']})
  out = capsys.readouterr().out
  assert out.startswith('training on 2,000 images (train[:2000]), evaluating on 2,000 '
                        '(test[8000:]); 15 steps of 128 per epoch in float32, matmul precision '
                        'default, jit on 1 ')
  lines = [l for l in out.splitlines() if l.startswith('epoch ')]
  assert len(lines) == 2 and 'ETA' in lines[0]
  assert f'{100 * record["eval_accuracy"]:6.2f}%' in lines[1]


def test_padded_evaluation_scores_every_example_once(mnist_dir):
  config = make_config(data__eval_split='test[8001:]')  # 1,999 images: the last batch is padded.
  examples = load_split(config.data, config.data.eval_split)
  run, on_mesh = set_up_run(config, place(config), None, examples)
  state = jax.device_get(on_mesh)
  sums = jax.device_get(run.programs.evaluate(on_mesh, *run.eval_data))
  assert int(sums['count']) == 1999
  images = (examples.images.astype(np.float32) / 255.0 - 0.1307) / 0.3081
  logits = state.apply_fn({'params': state.params}, images)
  assert int(sums['correct']) == int(np.sum(np.argmax(logits, -1) == examples.labels))
  reference = steps.batch_metrics(logits, examples.labels)
  np.testing.assert_allclose(sums['loss'], reference['loss'], rtol=1e-5)


@pytest.mark.slow
def test_profile_epoch_traces_that_epoch_into_the_run_directory(tmp_path, capsys, mnist_dir):
  loop.train_and_evaluate(make_config(**SMALL, profile_epoch=2), str(tmp_path))
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
  programs = set_up_run(config, place(config), train, evaluation)[0].programs
  for program in (programs.train, programs.evaluate):
    found = set(re.findall(r'operand_precision=(\{[^}]*\})', program.as_text()))
    assert found == ({operands} if operands else set())  # XLA's default leaves it unset.
