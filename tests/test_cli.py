"""train.py as users run it: a real-data run, and one clear line for each kind of mistake."""

import json
import shutil

import pytest

import train
from errors import UserError
from tests.conftest import ROOT, assert_fails_cleanly, make_config, override_flags, run_train
from trainer import config_checks
from trainer import loop

CONFIG = '--config=configs/default.py'


@pytest.mark.slow
def test_two_epochs_on_real_mnist_learn_the_task(tmp_path, mnist_dir):
  out = run_train(CONFIG, f'--workdir={tmp_path}', *override_flags(num_epochs=2))
  assert out.returncode == 0, out.stderr
  records = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [r['epoch'] for r in records] == [1, 2]
  assert records[-1]['eval_accuracy'] > 0.90  # A broken trainer stays near 10%.
  assert records[-1]['train_loss'] < records[0]['train_loss']
  assert sum(l.startswith('epoch ') for l in out.stdout.splitlines()) == 2
  assert list(tmp_path.glob('events.out.tfevents.*'))
  assert 'Traceback' not in out.stderr


def corrupt_copy(mnist_dir, folder):
  folder.mkdir()
  for f in mnist_dir.glob('*.gz'):
    shutil.copy(f, folder / f.name)
  labels = folder / 't10k-labels-idx1-ubyte.gz'
  labels.write_bytes(labels.read_bytes()[:-10] + b'0123456789')
  return folder


# Mistakes a user makes on the command line, each checked as printed by a real train.py.
BAD_INPUTS = {
    'typo in an override key': ([CONFIG, '--config.lerning_rate=0.1'], "did you mean 'learning_rate'"),
    'value of the wrong type': ([CONFIG, '--config.batch_size=big'], 'batch_size=big'),
    'no config flag': ([], 'no config given'),
    'config file that does not exist': (['--config=configs/nope.py'], 'No such file'),
    'zero batch size': ([CONFIG, *override_flags(batch_size=0)],
                        'batch_size must be a positive integer, got 0; pass --config.batch_size=N'),
    'missing data folder': ([CONFIG, *override_flags(data__dir='/nonexistent/mnist')],
                            'does not exist'),
}


@pytest.mark.parametrize('case', BAD_INPUTS)
def test_bad_input_ends_in_one_line_and_changes_nothing(case, tmp_path, mnist_dir):
  args, expected = BAD_INPUTS[case]
  assert_fails_cleanly(args, expected, tmp_path / 'run')
  assert not (ROOT / 'checkpoints' / 'nope').exists()


# Config mistakes, checked in-process: the line train.py prints is advice(error). Each names the
# field, the value given and the flag that fixes it; the wording around them is free to change.
BAD_CONFIGS = {
    'unknown optimizer': (dict(optimizer='rmsprop'), 'optimizer', "'rmsprop'",
                          '--config.optimizer=sgd'),
    'unknown source': (dict(data__source='csv'), 'data.source', "'csv'", '--config.data.source='),
    'unknown dtype': (dict(dtype='float16'), 'dtype', "'float16'", '--config.dtype='),
    'shift out of range': (dict(data__max_shift=30), 'data.max_shift', '30',
                           '--config.data.max_shift='),
    'warmup that is not a number': (dict(warmup_epochs=float('nan')), 'warmup_epochs', 'nan',
                                    '--config.warmup_epochs='),
    'negative epochs': (dict(num_epochs=-1), 'num_epochs', '-1', '--config.num_epochs=N'),
    'negative profile epoch': (dict(profile_epoch=-2), 'profile_epoch', '-2',
                               '--config.profile_epoch='),
    'batch larger than the split': (dict(batch_size=8001), 'batch_size', '8001',
                                    '--config.batch_size=8000'),
}


@pytest.mark.parametrize('case', BAD_CONFIGS)
def test_a_bad_config_is_one_line_naming_the_field_and_the_fix(case):
  overrides, field, value, fix = BAD_CONFIGS[case]
  with pytest.raises(UserError) as error:
    config_checks.validate(make_config(**overrides))
  line = train.advice(error.value)
  assert line.startswith(f'{field} ') and f'got {value}' in line and f'pass {fix}' in line, line
  assert '\n' not in line


def test_a_data_file_failing_its_checksum_is_refused_before_any_work(tmp_path, mnist_dir):
  corrupt = corrupt_copy(mnist_dir, tmp_path / 'corrupt')
  with pytest.raises(UserError, match='t10k-labels-idx1-ubyte.gz is not a whole gzip file'):
    loop.train_and_evaluate(make_config(data__dir=str(corrupt)), str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_a_run_directory_that_cannot_be_made_is_one_line(tmp_path, mnist_dir):
  blocker = tmp_path / 'a_file'
  blocker.write_text('keep me')
  out = run_train(CONFIG, f'--workdir={blocker / "run"}', *override_flags(num_epochs=1))
  assert out.returncode == 1
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr
  assert lines[0].startswith(f'error: cannot create the run directory {blocker / "run"} (')
  assert 'pass a --workdir that can be written to' in lines[0]
  assert blocker.read_text() == 'keep me'
