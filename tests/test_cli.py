"""train.py as users run it: a real-data run, and one clear line for each kind of mistake."""

import errno
import gzip
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import jax
import ml_collections
import pytest
from flax import nnx

from errors import ConfigError, UserError
from trainer.host.exits import say
from trainer.plan import resolve
from library_errors import THREAD_REFUSED
from mlp.model import MLP
from tests.conftest import (FREE_MEMORY, ROOT, assert_fails_cleanly, limit_address_space,
                            line_of, make_config, override_flags, read_metrics, run_train)
from trainer import config_fields, config_rules
from trainer.host import backend, faults
from trainer import evaluation, loop
from trainer.config_file import ConfigFileFailed, ConfigFileParser
from trainer.host.run_dir import RunDirectory

CONFIG = '--config=configs/default.py'


@pytest.mark.slow
def test_two_epochs_on_real_mnist_learn_the_task(tmp_path, mnist_dir):
  out = run_train(CONFIG, f'--workdir={tmp_path}', *override_flags(num_epochs=2))
  assert out.returncode == 0, out.stderr
  records = read_metrics(tmp_path)
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
    'typo in an override key': ([CONFIG, '--config.lerning_rate=0.1'],
                                "did you mean 'learning_rate'"),
    'value of the wrong type': ([CONFIG, '--config.batch_size=big'], 'batch_size=big'),
    'no config flag': ([], 'no config given'),
    'config file that does not exist': (['--config=configs/nope.py'], 'No such file'),
    'unknown splits after the config file': (
        ['--config=configs/default.py:nope'], "error: unknown splits 'nope' after the config file "
        'name; use test or validation, e.g. --config=configs/default.py:validation'),
    'zero batch size': ([CONFIG, *override_flags(batch_size=0)],
                        'batch_size must be a positive integer, got 0; pass --config.batch_size=N'),
    'no models': ([CONFIG, '--config.num_models=0'],
                  'num_models must be a positive integer, got 0; pass --config.num_models=N'),
    'missing data folder': ([CONFIG, *override_flags(data__dir='/nonexistent/mnist')],
                            'does not exist'),
    'seed past 64 bits': ([CONFIG, '--config.seed=9223372036854775808'],
                          'seed must be an integer from 0 to 4294967295 (a JAX key holds 32 bits), '
                          'got 9223372036854775808; pass --config.seed=0'),
    'an infinite learning rate, said before compiling': (
        [CONFIG, '--config.learning_rate=inf'], 'error: learning_rate must be a finite number > 0, '
        'got inf; pass --config.learning_rate=1e-3'),
    'typo in a field of a group': ([CONFIG, '--config.model.hiden=1'],
                                   "error: the config has no field 'model.hiden'; did you mean "
                                   "'model.hidden_sizes'?"),
    'a group set as one field': (
        [CONFIG, '--config.data=x'], 'error: data is a group of fields (data.dir, data.distort.*, '
        'data.eval_split, data.max_shift, data.source, data.tfds_data_dir, data.train_split), not '
        'one; set each on its own: --config.data.FIELD=VALUE'),
    'hidden sizes given as a dict': (
        [CONFIG, '--config.model.hidden_sizes={1:2}'], 'error: --config.model.hidden_sizes={1:2} '
        'is a dict where a tuple goes; write the tuple itself, e.g. '
        '--config.model.hidden_sizes="(512, 512)"'),
    'hidden sizes given twice, a dict first': (  # ml_collections joins a tuple flag's values.
        [CONFIG, '--config.model.hidden_sizes', '{64: 1}', '--config.model.hidden_sizes=8'],
        'error: --config.model.hidden_sizes={64: 1} is a dict where a tuple goes'),
    'hidden sizes given as a set, its value apart': (
        [CONFIG, '--config.model.hidden_sizes', '{512, 512}'],
        'error: --config.model.hidden_sizes={512, 512} is a set where a tuple goes'),
}


@pytest.mark.parametrize('case', BAD_INPUTS)
def test_bad_input_ends_in_one_line_and_changes_nothing(case, tmp_path, mnist_dir):
  args, expected = BAD_INPUTS[case]
  assert_fails_cleanly(args, expected, tmp_path / 'run')


INSTALL_OR_UNSET = ('install its plugin (make train ACCELERATOR=cuda12, or tpu, on a fresh clone), '
                    'or unset JAX_PLATFORMS to run on the devices JAX finds')


@pytest.mark.parametrize('env, expected', [
    ({'JAX_PLATFORMS': 'cuda'},
     f'error: JAX has no backend for JAX_PLATFORMS=cuda; {INSTALL_OR_UNSET}'),
    ({'JAX_PLATFORMS': 'tpu'},
     'error: JAX could not start its tpu backend (INTERNAL: Failed to open libtpu.so: '),
    # JAX tries the rocm backend last for 'gpu', and names that one.
    ({'JAX_PLATFORMS': 'gpu'}, "error: JAX has no backend for JAX_PLATFORMS=gpu (it has 'cpu', "),
    # No JAX_PLATFORMS to unset, and no driver to check: the flags that asked for no CPU device.
    ({'JAX_PLATFORMS': '', 'XLA_FLAGS': '--xla_force_host_platform_device_count=0'},
     'error: JAX could not start its cpu backend (INVALID_ARGUMENT: Could not determine '
     'process_index for this process); check XLA_FLAGS '
     '(--xla_force_host_platform_device_count=0)'),
])
def test_a_backend_that_jax_cannot_start_is_one_line_naming_the_fix(env, expected, tmp_path):
  """A CPU-only install asked for an accelerator: no plugin (cuda, gpu), no libtpu (tpu)."""
  assert_fails_cleanly([CONFIG], expected, tmp_path / 'run', env=env)


# JAX's words where another process holds this machine's TPU and JAX_PLATFORMS is unset (as a TPU
# VM reported them in jax-ml/jax#22070): JAX runs on the CPU instead, with a warning only.
TPU_HELD = ("Backend 'tpu' failed to initialize: ABORTED: The TPU is already in use by process "
            'with pid 2718. Not attempting to load libtpu.so in this process.. Available backends '
            "are ['cpu']")


@pytest.mark.skipif(jax.default_backend() != 'cpu',
                    reason='JAX started on this machine\'s accelerator, not on the CPU instead')
def test_a_tpu_another_process_holds_stops_training_that_jax_would_run_on_the_cpu(monkeypatch):
  devices = jax.devices

  def tpu_held(platform=None):
    if platform == 'tpu':
      raise RuntimeError(TPU_HELD)
    return devices(platform)
  monkeypatch.setattr(jax, 'devices', tpu_held)
  monkeypatch.delenv('JAX_PLATFORMS', raising=False)
  with pytest.raises(UserError) as error:
    backend.start()
  assert str(error.value) == (
      "JAX could not start this machine's TPU (ABORTED: The TPU is already in use by process with "
      'pid 2718. Not attempting to load libtpu.so in this process) and would run on the CPU '
      'instead; another process holds it: wait for that one to end, or stop it, or set '
      'JAX_PLATFORMS=cpu to run on the CPU')
  backend.start(cpu_will_do=True)  # Reading a run (predict.py, export.py) beside the training.
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  backend.start()  # The CPU asked for.
  monkeypatch.setattr(jax, 'devices', devices)
  monkeypatch.delenv('JAX_PLATFORMS')
  backend.start()  # No TPU here: JAX's reason is a libtpu it cannot open.


@pytest.mark.slow
@pytest.mark.parametrize('script, args', [('predict.py', ['docs/digits']),
                                          ('export.py', ['--out=OUT'])])
def test_predict_and_export_say_a_backend_that_jax_cannot_start_in_one_line(script, args, tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  args = [arg.replace('OUT', str(tmp_path / 'export')) for arg in args]
  out = run_train(f'--workdir={workdir}', *args, script=script, env={'JAX_PLATFORMS': 'cuda'})
  assert out.returncode == 1 and out.stdout == ''
  assert out.stderr.splitlines() == [
      f'error: JAX has no backend for JAX_PLATFORMS=cuda; {INSTALL_OR_UNSET}']
  assert os.listdir(tmp_path) == ['run']


# Config mistakes, checked in-process: the line train.py prints is advice(error). Each names the
# field, the value given and the flag that fixes it; the wording around them is free to change.
BAD_CONFIGS = {
    'unknown optimizer': (dict(optimizer='rmsprop'), 'optimizer', "'rmsprop'",
                          '--config.optimizer=sgd'),
    'unknown source': (dict(data__source='csv'), 'data.source', "'csv'", '--config.data.source='),
    'unknown dtype': (dict(dtype='float16'), 'dtype', "'float16'", '--config.dtype='),
    'shift out of range': (dict(data__max_shift=30), 'data.max_shift', '30',
                           '--config.data.max_shift='),
    'rotation past a half turn': (dict(data__distort__rotation=200.0), 'data.distort.rotation',
                                  '200.0', '--config.data.distort.rotation=15'),
    'a sharp elastic field': (dict(data__distort__elastic_sigma=0.0), 'data.distort.elastic_sigma',
                              '0.0', '--config.data.distort.elastic_sigma=4'),
    'warmup that is not a number': (dict(warmup_epochs=float('nan')), 'warmup_epochs', 'nan',
                                    '--config.warmup_epochs='),
    'negative epochs': (dict(num_epochs=-1), 'num_epochs', '-1', '--config.num_epochs=N'),
    'negative profile epoch': (dict(profile_epoch=-2), 'profile_epoch', '-2',
                               '--config.profile_epoch='),
    'profile epoch past the last': (dict(profile_epoch=5, num_epochs=1), 'profile_epoch', '5',
                                    '--config.profile_epoch=1'),
    'batch larger than the split': (dict(batch_size=8001), 'batch_size', '8001',
                                    '--config.batch_size=8000'),
    'seed that a JAX key cannot tell from 0': (dict(seed=2**32), 'seed', '4294967296',
                                               '--config.seed=0'),
    'negative seed': (dict(seed=-1), 'seed', '-1', '--config.seed=0'),
    'no models': (dict(num_models=0), 'num_models', '0', '--config.num_models=N'),
    'members past the last seed': (dict(seed=2**32 - 2, num_models=3), 'num_models', '3',
                                   '--config.num_models=2'),
    'all of a label smoothed away': (dict(label_smoothing=1.0), 'label_smoothing', '1.0',
                                     '--config.label_smoothing=0.1'),
    'warmup left None': (dict(warmup_epochs=None), 'warmup_epochs', 'None',
                         '--config.warmup_epochs=0'),
    'an infinite learning rate': (dict(learning_rate=float('inf')), 'learning_rate', 'inf',
                                  '--config.learning_rate=1e-3'),
    'momentum past 1': (dict(momentum=1.5), 'momentum', '1.5', '--config.momentum=0.9'),
    'a hidden layer of no units': (dict(model__hidden_sizes=(512, 0)), 'model.hidden_sizes',
                                   '(512, 0)', '--config.model.hidden_sizes="(512, 512)"'),
    'no data folder': (dict(data__dir=None), 'data.dir', 'None', "--config.data.dir=''"),
    'eval_only left None': (dict(eval_only=None), 'eval_only', 'None', '--config.eval_only=false'),
}


def load_config(path) -> ml_collections.ConfigDict:
  """A config file, loaded by the parser of train.py's --config flag."""
  return ConfigFileParser().parse(str(path))


@pytest.mark.parametrize('config_file', sorted((ROOT / 'configs').glob('[!_]*.py')),
                         ids=lambda path: path.name)
def test_every_config_file_passes_the_checks_it_gives_its_users(config_file):
  config = load_config(config_file)
  config_rules.validate(config)
  assert config_flag_names(config) == config_flag_names(make_config())  # No field of its own.


def config_flag_names(config) -> list[str]:
  return [line.split('=')[0] for line in config_fields.flag_lines(config)]


@pytest.mark.parametrize('case', BAD_CONFIGS)
def test_a_bad_config_is_one_line_naming_the_field_and_the_fix(case):
  overrides, field, value, fix = BAD_CONFIGS[case]
  with pytest.raises(UserError) as error:
    config_rules.validate(make_config(**overrides))
  line = faults.line(error.value)
  assert line.startswith(f'{field} ') and f'got {value}' in line and f'pass {fix}' in line, line
  assert '\n' not in line


# A config file may set any field to a value of another kind; one not built on the default's
# get_config() (whose fields keep their type) to anything.
DEFAULT_FIELDS = config_fields.fields(make_config())
OTHER_KINDS = [(name, value) for name, usual in DEFAULT_FIELDS.items()
               for value in (None, 'x', ['x'], {'x': 1}) if not isinstance(value, type(usual))]


@pytest.mark.parametrize('name, value', OTHER_KINDS, ids=str)
def test_a_value_of_another_kind_in_any_field_is_that_fields_one_line(name, value):
  config = config_fields.config_from_flat({**DEFAULT_FIELDS, name: value})
  with pytest.raises(UserError) as error:
    config_rules.validate(config)
  line = faults.line(error.value)
  assert name in line and '\n' not in line, line
  if not isinstance(value, dict):  # A dict is a group of fields: the config lacks the field.
    assert line.startswith(f'{name} must be ') and f'; pass --config.{name}=' in line, line


@pytest.mark.parametrize('name', [name for name, value in DEFAULT_FIELDS.items()
                                  if isinstance(value, float)])
@pytest.mark.parametrize('value', [float('inf'), float('-inf'), float('nan')], ids=repr)
def test_every_number_field_refuses_what_is_not_finite_before_any_work(name, value):
  with pytest.raises(ConfigError) as error:
    config_rules.validate(make_config(**{name.replace('.', '__'): value}))
  assert error.value.field == name


def test_no_hidden_layer_is_a_linear_model_by_choice_and_a_width_is_a_layer():
  """() is multinomial logistic regression, deliberately allowed; an override of one width is that
  layer; a dict or set would pass as its keys, losing order and repeats."""
  config_rules.validate(make_config(model__hidden_sizes=()))
  assert not MLP((), rngs=nnx.Rngs(0)).hidden
  for override, widths in (('512', '(512,)'), ('()', '()')):
    printed = run_train(CONFIG, f'--config.model.hidden_sizes={override}', '--print_config')
    assert f"--config.model.hidden_sizes='{widths}'" in printed.stdout.splitlines(), printed.stderr


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
  with pytest.raises(ConfigFileFailed) as error:
    load_config(config_file)
  assert str(error.value) == (
      f'the config file raised ValueError: math domain error ({config_file}, line 4); fix it, or '
      'pass --config=configs/default.py')


PARTIAL_CONFIG = ('import ml_collections\n\ndef get_config():\n'
                  '  return ml_collections.ConfigDict({"seed": 1})\n')
FROM_THE_DEFAULT = ('from configs import default\n\ndef get_config():\n'
                    '  config = default.get_config()\n')


@pytest.mark.parametrize('code, expected', [
    ('def get_config():\n  pass\n',
     'error: get_config() of the config file {file} returned None; return the '
     'ml_collections.ConfigDict it builds'),
    ('SEED = 1\n', 'error: the config file {file} has no get_config(); define one that returns an '
     'ml_collections.ConfigDict, or pass --config=configs/default.py'),
    (PARTIAL_CONFIG, 'error: the config file {file} lacks the fields batch_size, '
     'checkpoint_every_epochs, checkpoint_min_seconds, data.dir and 43 more; build it as every '
     'config in configs/ does: `from configs import default`, `config = default.get_config()`, '
     'then change fields'),
    (FROM_THE_DEFAULT + '  config.lerning_rate = 0.1\n  return config\n',
     'error: the config file {file} has the field lerning_rate (did you mean learning_rate?), '
     'which no part of this project reads; rename or remove it'),
    (FROM_THE_DEFAULT + '  config.warmup_epochs = None\n  return config\n',
     'error: warmup_epochs must be a finite number >= 0, got None; pass --config.warmup_epochs=0'),
    ('def get_config():\n  x = = 1\n', 'error: the config file raised SyntaxError: invalid syntax '
     '({file}, line 2); fix it, or pass --config=configs/default.py'),
    ('def get_config():\n  return open("/nonexistent/config.json")\n',
     "error: the config file raised FileNotFoundError: [Errno 2] No such file or directory: "
     "'/nonexistent/config.json' ({file}, line 2); fix it, or pass --config=configs/default.py"),
], ids=['returns None', 'no get_config', 'lacks fields', 'a field of its own', 'a None',
        'a syntax error', 'an OSError'])
def test_a_config_file_without_a_config_that_can_work_is_one_line_naming_the_fix(code, expected,
                                                                                  tmp_path):
  config_file = tmp_path / 'lacking.py'
  config_file.write_text(code)
  assert_fails_cleanly([f'--config={config_file}'], expected.format(file=config_file),
                       tmp_path / 'run')


def test_print_config_of_a_config_file_lacking_fields_fails_as_training_would(tmp_path):
  config_file = tmp_path / 'partial.py'
  config_file.write_text(PARTIAL_CONFIG)
  out = run_train(f'--config={config_file}', '--print_config')
  assert out.returncode == 2 and out.stdout == ''
  assert out.stderr.startswith(f'error: the config file {config_file} lacks the fields ')


def test_a_config_path_from_elsewhere_is_one_line_whose_fix_works_from_there(tmp_path):
  """The project's configs/quick.py named from another folder: the fix names it where it is, and
  nothing else is loaded in its place."""
  out = run_train('--config=configs/quick.py:validation', cwd=tmp_path)
  quick, default, configs = (shlex.quote(str(path)) for path in (
      ROOT / 'configs' / 'quick.py', ROOT / 'configs' / 'default.py', ROOT / 'configs'))
  assert out.returncode == 2 and out.stdout == ''
  assert out.stderr.splitlines() == [
      f'error: configs/quick.py is not in {tmp_path}; pass --config={quick}:validation']
  out = run_train(cwd=tmp_path)
  assert out.stderr.splitlines() == [
      f'error: no config given; pass --config={default} or another file in {configs}/']
  out = run_train('--nosuchflag', cwd=tmp_path)
  assert out.stderr.splitlines() == [
      "error: Unknown command line flag 'nosuchflag'; run python "
      f"{shlex.quote(str(ROOT / 'train.py'))} --helpshort for the flags"]
  assert os.listdir(tmp_path) == []


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


def test_output_that_cannot_be_written_is_one_line_and_later_lines_go_nowhere(tmp_path):
  """Output redirected to a full disk (`> train.log`): the user's one line, and no second error
  when Python flushes the stream at exit."""
  with open('/dev/full', 'w', encoding='utf-8') as full:
    assert line_of(lambda: say('a line', full)).startswith(
        'cannot write the output (No space left on device); free space where it is redirected')
    say('the next line', full)  # Now to /dev/null: no error.
    full.flush()
  for args in ([CONFIG, '--print_config'], ['--helpshort']):  # The help: never the config's fault.
    with open('/dev/full', 'w', encoding='utf-8') as full:
      out = subprocess.run([sys.executable, 'train.py', *args], cwd=ROOT, stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.splitlines() == ['error: cannot write the output (No space left on device); '
                                       'free space where it is redirected, then rerun the same '
                                       'command']


@pytest.mark.parametrize('script', ['train.py', 'predict.py', 'export.py'])
@pytest.mark.parametrize('sent, said', [('SIGINT', 'Ctrl-C'), ('SIGTERM', 'SIGTERM')])
def test_a_ctrl_c_or_a_sigterm_while_the_libraries_load_is_one_line(script, sent, said, tmp_path):
  """The first moment a signal can meet: the first import of a library (absl, here one that sends
  the program the signal as it loads). A SIGTERM there, as a preempted VM sends, ended silently."""
  (tmp_path / 'absl').mkdir()
  (tmp_path / 'absl' / '__init__.py').write_text(
      f'import os, signal, time\nos.kill(os.getpid(), signal.{sent})\ntime.sleep(60)\n')
  out = run_train(CONFIG, f'--workdir={tmp_path / "run"}', script=script, timeout=60,
                  env={'PYTHONPATH': f'{tmp_path}{os.pathsep}{ROOT}'})
  assert out.returncode == 128 + signal.Signals[sent]
  lines = out.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'error: stopped by {said}'), out.stderr
  assert not (tmp_path / 'run').exists()


def test_a_run_directory_that_is_a_file_is_one_line(tmp_path, mnist_dir):
  (tmp_path / 'run').write_text('keep me')
  for use in (loop.train_and_evaluate, evaluation.evaluate_checkpoint):  # Training, eval_only.
    with pytest.raises(UserError, match=f'^the run directory {tmp_path / "run"} is a file; pass a '
                       '--workdir that names a folder$'):
      use(resolve(make_config(num_epochs=1)), RunDirectory(tmp_path / 'run'))
  assert (tmp_path / 'run').read_text() == 'keep me'


@pytest.mark.parametrize('script, args, url', [
    ('train.py', [f'--config={ROOT / "configs" / "quick.py"}'], 's3://bucket/run'),
    ('predict.py', [str(ROOT / 'docs' / 'digits')], 'https://example.com/run'),
    ('export.py', ['--out=out'], 'file:///tmp/run')])
def test_a_workdir_url_of_no_bucket_is_one_line_and_makes_no_folder(script, args, url, tmp_path):
  """A run directory is a local folder or a gs:// bucket: an s3:// one trained into ./s3:/."""
  out = subprocess.run([sys.executable, str(ROOT / script), f'--workdir={url}', *args],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1
  assert out.stderr.splitlines() == [
      f'error: cannot keep a run directory at {url}: a --workdir is a local folder or a Cloud '
      f'Storage bucket (gs://BUCKET/PATH), not {url.split(":")[0]}://; pass one of those']
  assert not list(tmp_path.iterdir())


def test_helpshort_exits_0_and_print_config_lists_every_field_with_the_overrides():
  assert run_train('--helpshort').returncode == 0
  out = run_train(CONFIG, '--config.model.hidden_sizes=(64,)', '--config.data.dir=a b',
                  '--print_config')
  assert out.returncode == 0 and out.stderr == ''
  lines = out.stdout.splitlines()
  assert len(lines) == len(config_fields.flat_config(make_config()))
  assert "--config.model.hidden_sizes='(64,)'" in lines and "--config.data.dir='a b'" in lines
  assert '--config.learning_rate=0.002' in lines and "--config.data.tfds_data_dir=''" in lines


def test_a_config_file_loads_where_deprecations_are_errors():
  """Not through importlib's deprecated load_module() (ml_collections' loader): a user running
  with `-W error::DeprecationWarning` met it as the config file's own error."""
  out = subprocess.run([sys.executable, '-W', 'error::DeprecationWarning', 'train.py',
                        '--config=configs/quick.py:validation', '--print_config'], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0 and out.stderr == '', out.stderr
  assert "--config.data.eval_split='train[50000:]'" in out.stdout.splitlines()


def test_a_data_file_failing_its_checksum_is_refused_before_any_work(tmp_path, mnist_dir):
  corrupt = corrupt_copy(mnist_dir, tmp_path / 'corrupt')
  with pytest.raises(UserError, match='t10k-labels-idx1-ubyte.gz is not a whole gzip file'):
    loop.train_and_evaluate(resolve(make_config(data__dir=str(corrupt))),
                            RunDirectory(tmp_path / 'run'))
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


def test_settings_that_train_otherwise_than_they_read_are_each_a_warning_before_the_run(tmp_path):
  """Dropout without a hidden layer, a warmup past the run's end: valid, and each warned of."""
  assert config_rules.settings_to_warn_of(make_config()) == []
  assert config_rules.settings_to_warn_of(make_config(model__hidden_sizes=(), eval_only=True)) == []
  assert config_rules.settings_to_warn_of(make_config(
      warmup_epochs=2.0, num_epochs=2, model__dropout_rate=0.0, model__hidden_sizes=())) == []
  blocker = tmp_path / 'a_file'  # Ends the run, in its one line, after the warnings.
  blocker.write_text('')
  out = run_train(CONFIG, f'--workdir={blocker / "run"}', '--config.model.hidden_sizes=()',
                  '--config.warmup_epochs=2.5', '--config.num_epochs=2')
  assert out.returncode == 1 and out.stdout == ''
  lines = out.stderr.splitlines()
  assert lines[:2] == [
      'warning: model.dropout_rate=0.2 does nothing: dropout acts on hidden layers and '
      'model.hidden_sizes=() has none; pass --config.model.dropout_rate=0 to say so',
      'warning: warmup_epochs=2.5 is longer than num_epochs=2: the learning rate reaches '
      'learning_rate=0.002 only at the last step, and never decays']
  assert len(lines) == 3 and lines[2].startswith('error: cannot create the run directory ')


def test_a_run_directory_this_user_cannot_write_names_a_copy_as_the_way_on(tmp_path,
                                                                           monkeypatch):
  """A shared, read-only run (eval_only writes its eval.jsonl there): a new folder alone would
  hold no checkpoint to go on from. (os.access is patched: root may write anywhere.)"""
  (tmp_path / 'run').mkdir()
  monkeypatch.setattr(os, 'access', lambda path, mode: not mode & os.W_OK)  # Read, not written.
  with pytest.raises(UserError, match=r'is not writable; pass a --workdir that can be written to '
                                      r'\(a copy of this one, to go on from its checkpoints'):
    RunDirectory(tmp_path / 'run').make()


@pytest.mark.parametrize('use', [
    lambda run: loop.train_and_evaluate(resolve(make_config(num_epochs=1)), RunDirectory(run)),
    lambda run: evaluation.restore_run(RunDirectory(run))], ids=['resume', 'predict or export'])
def test_a_run_directory_this_user_may_not_list_is_one_line(use, tmp_path, monkeypatch):
  """Another user's private run (mode 700): a resume, predict.py and export.py name it before
  listing its checkpoints. (The OS's answers are patched: root may list anything.)"""
  run, listdir, access = tmp_path / 'run', os.listdir, os.access
  run.mkdir()

  def list_as_the_os_would(path='.'):
    if os.fspath(path) == str(run):
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
    return listdir(path)
  monkeypatch.setattr(os, 'listdir', list_as_the_os_would)
  monkeypatch.setattr(os, 'access', lambda path, mode: (
      not mode & os.R_OK if os.fspath(path) == str(run) else access(path, mode)))
  with pytest.raises(UserError, match=rf'^this user may not list the run directory {run} '
                     r'\(Permission denied\); let this user read it .* or pass a --workdir that '
                     'this user can read$'):
    use(run)


def test_a_run_file_that_cannot_be_read_is_one_line_and_is_left_in_place(tmp_path, mnist_dir):
  (tmp_path / 'metrics.jsonl').mkdir()  # A folder where the run keeps its records.
  (tmp_path / 'metrics.jsonl' / 'notes.txt').write_text('keep me')
  assert re.fullmatch(r'cannot read \S+/metrics.jsonl \(Is a directory\); move it out of the run '
                      'directory or restore it, then rerun the same command', line_of(
                          lambda: loop.train_and_evaluate(resolve(make_config(num_epochs=1)),
                                                          RunDirectory(tmp_path))))
  assert (tmp_path / 'metrics.jsonl' / 'notes.txt').read_text() == 'keep me'


def test_memory_the_machine_cannot_give_for_the_data_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch):
  """zlib's words where it cannot allocate the decompressed MNIST."""
  def decompress(data: bytes) -> bytes:
    raise MemoryError('Unable to allocate output buffer.')

  monkeypatch.setattr(gzip, 'decompress', decompress)
  assert line_of(lambda: loop.train_and_evaluate(resolve(make_config(num_epochs=1)), RunDirectory(
      tmp_path / 'run'))) == ('this machine ran out of memory (MemoryError: Unable to allocate '
                              f'output buffer.); {FREE_MEMORY}')
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_ctrl_c_twice_ends_at_once_in_one_line_wherever_it_lands_and_the_rerun_resumes(tmp_path,
                                                                                      mnist_dir):
  """The second Ctrl-C may land mid-save: raised there, it once left orbax's threads waiting and
  the exit hung, or ended in a traceback. Three moments after the first; each rerun resumes from a
  checkpoint that was saved before the first Ctrl-C (on a loaded machine each launch's first save
  may still be in flight then, and the second Ctrl-C abandons it)."""
  command = [sys.executable, 'train.py', CONFIG, f'--workdir={tmp_path}',
             *override_flags(num_epochs=12, data__train_split='train[:2000]')]
  for delay in (0.0, 0.03, 0.3):
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
      while not process.stdout.readline().startswith('training on '):  # Past start-up.
        assert process.poll() is None, process.stderr.read()
      process.stdout.readline()  # An epoch's line.
      while not any(p.name.isdigit() for p in tmp_path.iterdir()):  # A checkpoint to resume from.
        assert process.stdout.readline(), process.stderr.read()
      process.send_signal(signal.SIGINT)
      time.sleep(delay)
      process.send_signal(signal.SIGINT)
      _, stderr = process.communicate(timeout=60)  # No hang.
    # -2: the second SIGINT itself ended the process in its last moments, once Python's exit had
    # restored the default handler: a shell reports that as 130 too.
    assert process.returncode in (130, -signal.SIGINT), stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith((
        'error: interrupted before the next checkpoint; the same command resumes from the newest '
        'one, or starts afresh where none was saved: ', 'stopped by SIGINT after epoch ')), lines[0]
  out = run_train(*command[2:], timeout=300)
  assert out.returncode == 0 and out.stderr == '', out.stderr
  assert 'resumed from epoch' in out.stdout
  assert [r['epoch'] for r in read_metrics(tmp_path)] == list(range(1, 13))


@pytest.mark.slow
def test_a_thread_the_machine_will_not_start_is_one_line_though_stranded_threads_report_after(
    tmp_path, mnist_dir):
  """Orbax's save of epoch 2 meets Python's refusal of a thread, as on a machine at its limit of
  processes, and leaves a thread of its own that reports a failure after the run's line."""
  workdir = tmp_path / 'run'
  args = [CONFIG, f'--workdir={workdir}', *override_flags(
      num_epochs=3, data__train_split='train[:2000]', checkpoint_min_seconds=0)]
  child = (
      'import runpy, sys, threading, time\nimport orbax.checkpoint as ocp\n'
      'from trainer.host import boundary\n'
      'said, print_error = threading.Event(), boundary.print_error\n'
      'save = ocp.CheckpointManager.save\n'
      'def printed(line):  # Its line out, then train.py\'s exit.\n'
      '  print_error(line)\n  said.set()\n'
      'def stranded():  # Reports once the run has said its line, as its exit waits for threads.\n'
      '  said.wait(120)\n  time.sleep(0.5)\n  raise RuntimeError("a stranded thread reports")\n'
      'def refused(manager, step, *args, **kwargs):\n  if step == 2:\n'
      '    threading.Thread(target=stranded).start()\n'
      f'    raise RuntimeError({THREAD_REFUSED!r})\n'
      '  return save(manager, step, *args, **kwargs)\n'
      'boundary.print_error, ocp.CheckpointManager.save = printed, refused\n'
      'sys.argv = sys.argv[1:]; runpy.run_path("train.py", run_name="__main__")')
  out = subprocess.run([sys.executable, '-c', child, 'train.py', *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 1 and out.stderr.startswith(
      "error: this machine would not start another thread (can't start new thread): "), out.stderr
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert [r['epoch'] for r in read_metrics(workdir)] == [1, 2]
  assert sorted(p.name for p in workdir.glob('[0-9]*')) == ['1']  # Resumable.


@pytest.mark.slow
def test_a_model_too_big_for_the_machine_is_one_line_naming_what_to_lower(tmp_path, mnist_dir):
  workdir = tmp_path / 'run'
  args = [CONFIG, f'--workdir={workdir}', *override_flags(
      num_epochs=1, data__train_split='train[:2000]', model__hidden_sizes=(60000, 60000))]
  limited = limit_address_space(12 << 30) + (
      'import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path("train.py", run_name="__main__")')
  out = subprocess.run([sys.executable, '-c', limited, 'train.py', *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1, out.stderr  # 14.4 GB of weights in 12 GB.
  assert lines[0].startswith('error: this machine ran out of memory training (')
  assert 'Out of memory' in lines[0] and lines[0].endswith(
      '); lower batch_size, num_models or model.hidden_sizes in a new --workdir, or use a device '
      'with more memory')
  assert (workdir / 'run.lock').read_text() == '' and not list(workdir.glob('[0-9]*'))

