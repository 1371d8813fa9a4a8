"""train.py as users run it: a real-data run, and one clear line for each kind of mistake."""

import json
import shutil
import subprocess
import sys

import jax
import pytest

import train
from errors import UserError
from tests.conftest import (ROOT, assert_fails_cleanly, make_config, override_flags, read_metrics,
                            run_train)
from trainer import checkpoints, config_checks
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
  for f in mnist_dir.glob('t10k-*'):
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


# Config mistakes, checked in-process: the line train.py prints is advice(error).
BAD_CONFIGS = {
    'unknown optimizer': (dict(optimizer='rmsprop'), "optimizer must be one of sgd, momentum, "
                          "adam, adamw, got 'rmsprop'; pass --config.optimizer=sgd"),
    'unknown source': (dict(data__source='csv'),
                       "data.source must be one of tfds, idx, got 'csv'; pass --config.data.source="),
    'unknown dtype': (dict(dtype='float16'), "dtype must be one of float32, bfloat16, got 'float16'"),
    'shift out of range': (dict(data__max_shift=30), 'data.max_shift must be an integer from 0 to 8'),
    'warmup that is not a number': (dict(warmup_epochs=float('nan')),
                                    'warmup_epochs must be a finite number >= 0, got nan'),
    'negative epochs': (dict(num_epochs=-1), 'num_epochs must be a positive integer, got -1'),
    'negative profile epoch': (dict(profile_epoch=-2), 'profile_epoch must be an integer >= 0'),
    'profile epoch past the last': (
        dict(profile_epoch=5, num_epochs=1), 'profile_epoch must be an epoch of the run (1 to '
        'num_epochs=1), or 0 for no trace, got 5; pass --config.profile_epoch=1'),
    'batch larger than the split': (dict(batch_size=8001), "batch_size must be at most the "
                                    "training split 'test[:8000]' has (8000 examples), got 8001; "
                                    'pass --config.batch_size=8000'),
}


@pytest.mark.parametrize('case', BAD_CONFIGS)
def test_a_bad_config_is_one_line_naming_the_field_and_the_fix(case):
  overrides, expected = BAD_CONFIGS[case]
  with pytest.raises(UserError) as error:
    config_checks.validate(make_config(**overrides))
  line = train.advice(error.value)
  assert expected in line and '\n' not in line


def test_a_config_file_that_raises_is_one_line_naming_the_exception_and_the_file(tmp_path):
  """Never mistaken for an override's typo ("the config has no field 'lr'")."""
  config_file = tmp_path / 'broken.py'
  config_file.write_text('def get_config():\n  return {}["lr"]\n')
  assert_fails_cleanly([f'--config={config_file}'], f"error: the config file raised KeyError: 'lr' "
                       f'({config_file}, line 2); fix it, or pass --config=configs/default.py',
                       tmp_path / 'run')


def test_a_config_file_raising_a_value_error_is_named_without_its_traceback(tmp_path):
  config_file = tmp_path / 'broken.py'
  config_file.write_text('import math\n\ndef get_config():\n  return math.sqrt(-1)\n')
  with pytest.raises(train.ConfigFileFailed) as error:
    train.ConfigFileParser('config').parse(str(config_file))
  assert str(error.value) == (
      f'the config file raised ValueError: math domain error ({config_file}, line 4); fix it, or '
      'pass --config=configs/default.py')


def test_a_reader_that_stops_reading_ends_neither_the_run_nor_in_a_traceback(tmp_path, mnist_dir):
  """`python train.py ... | head -1`: the rest of the log goes nowhere; the run saves its work."""
  stderr_path = tmp_path / 'stderr.txt'
  with open(stderr_path, 'w', encoding='utf-8') as stderr, subprocess.Popen(
      [sys.executable, 'train.py', CONFIG, *override_flags(num_epochs=2), f'--workdir={tmp_path}'],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True) as process:
    assert process.stdout.readline().startswith('training on ')
    process.stdout.close()  # Before the epochs' lines.
    assert process.wait(timeout=300) == 0
  assert stderr_path.read_text() == ''
  assert [r['epoch'] for r in read_metrics(tmp_path)] == [1, 2]
  assert (tmp_path / '2').is_dir()  # The last epoch's checkpoint.


def test_helpshort_exits_0_and_print_config_lists_every_field_with_the_overrides():
  assert run_train('--helpshort').returncode == 0
  out = run_train(CONFIG, '--config.model.hidden_sizes=(64,)', '--config.data.dir=a b',
                  '--print_config')
  assert out.returncode == 0 and out.stderr == ''
  lines = out.stdout.splitlines()
  assert len(lines) == len(checkpoints.flat_config(make_config()))
  assert "--config.model.hidden_sizes='(64,)'" in lines and "--config.data.dir='a b'" in lines
  assert '--config.learning_rate=0.002' in lines and "--config.data.tfds_data_dir=''" in lines


def test_a_data_file_failing_its_checksum_is_refused_before_any_work(tmp_path, mnist_dir):
  corrupt = corrupt_copy(mnist_dir, tmp_path / 'corrupt')
  with pytest.raises(UserError, match='t10k-labels-idx1-ubyte.gz fails its SHA-256 check'):
    loop.train_and_evaluate(make_config(data__dir=str(corrupt)), str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_a_run_directory_that_cannot_be_made_is_one_line(tmp_path, mnist_dir):
  blocker = tmp_path / 'a_file'
  blocker.write_text('keep me')
  out = run_train(CONFIG, f'--workdir={blocker / "run"}', *override_flags(num_epochs=1))
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [
      f'error: cannot create the run directory {blocker / "run"} (Not a directory); pass a '
      '--workdir that can be written to']
  assert blocker.read_text() == 'keep me'


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != 'cpu',
                    reason="the recorded numbers are XLA:CPU's; an accelerator sums in other orders")
def test_the_default_config_reproduces_its_recorded_numbers_bit_for_bit(tmp_path, mnist_dir):
  """configs/default.py, seed 0, on the carried split: every epoch's figures as recorded."""
  out = run_train(CONFIG, f'--workdir={tmp_path}', *override_flags())
  assert out.returncode == 0, out.stderr
  timings = ('epoch_seconds', 'train_images_per_second')
  records = [{k: v for k, v in json.loads(line).items() if k not in timings}
             for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  golden = ROOT / 'tests' / 'golden' / 'default_seed0_idx_8000.jsonl'
  assert records == [json.loads(line) for line in golden.read_text().splitlines()]
