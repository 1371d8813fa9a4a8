"""The set-up on users' machines: the Python make chooses or refuses, and a missing extra's line."""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, assert_fails_cleanly, override_flags

MAKE = shutil.which('make')
needs_make = pytest.mark.skipif(MAKE is None, reason='no make on this machine')


def fake_python(folder: pathlib.Path, name: str, version: str, runs: bool = True) -> None:
  """An interpreter that says it is `version` and runs the project's check of its version as that
  version would; one that does not `runs` fails every command (a stale pyenv shim)."""
  major, minor, micro = (int(part) for part in version.split('.'))
  as_version = f'import sys; sys.hexversion = {major << 24 | minor << 16 | micro << 8 | 0xF0}'
  python = shlex.quote(sys.executable)  # A clone in a folder with spaces runs its tests too.
  check = f'-c) exec {python} -c "{as_version}; exec(sys.argv[1])" "$2";;' if runs else ''
  script = folder / name
  script.write_text(f'#!/bin/sh\ncase "$1" in --version) echo "Python {version}";; {check} '
                    '*) exit 1;; esac\n')
  script.chmod(0o755)


def make(folder: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
  """make in the project, with only `folder` and head on the PATH: no other Python to find."""
  if not (folder / 'head').exists():
    os.symlink(shutil.which('head') or '/usr/bin/head', folder / 'head')
  return subprocess.run([MAKE, '--no-print-directory', *args, f'VENV={folder}/venv'], cwd=ROOT,
                        capture_output=True, text=True, env={'PATH': str(folder)}, timeout=60)


@needs_make
@pytest.mark.parametrize('version', ['3.10.13',  # Ubuntu 22.04's, as on a TPU VM.
                                     '3.15.0'])  # Newer than every wheel of the stack.
def test_without_a_python_of_3_11_to_3_14_make_stops_in_one_line_creating_nothing(
    version, tmp_path):
  fake_python(tmp_path, 'python3', version)
  out = make(tmp_path, 'train')
  assert out.returncode != 0 and not (tmp_path / 'venv').exists()
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr
  assert f'needs Python 3.11 to 3.14, and python3 is Python {version}' in lines[0]
  assert 'uv python install 3.12' in lines[0] and 'make PYTHON=' in lines[0]


@needs_make
def test_make_takes_python3_when_supported_else_the_newest_python3_n_that_runs(tmp_path):
  fake_python(tmp_path, 'python3', '3.10.13')
  fake_python(tmp_path, 'python3.14', '3.14.0', runs=False)  # On the PATH, but a stale shim.
  fake_python(tmp_path, 'python3.13', '3.13.2')
  fake_python(tmp_path, 'python3.12', '3.12.1')
  assert f'{tmp_path}/python3.13 -m venv' in make(tmp_path, '-n', 'train').stdout
  fake_python(tmp_path, 'python3', '3.15.0')  # The newest Python: the stack has no wheels for it.
  assert f'{tmp_path}/python3.13 -m venv' in make(tmp_path, '-n', 'train').stdout
  os.remove(tmp_path / 'python3.13')
  assert f'{tmp_path}/python3.12 -m venv' in make(tmp_path, '-n', 'train').stdout
  os.remove(tmp_path / 'python3')
  os.symlink(sys.executable, tmp_path / 'python3')
  assert f'{tmp_path}/python3 -m venv' in make(tmp_path, '-n', 'train').stdout


@needs_make
def test_a_python_named_on_the_command_line_is_checked_too(tmp_path):
  fake_python(tmp_path, 'old', '3.10.13')
  out = make(tmp_path, 'train', f'PYTHON={tmp_path}/old')
  assert out.returncode != 0 and f'{tmp_path}/old is Python 3.10.13' in out.stderr
  as_run = sys.executable.replace(' ', '\\ ')  # As make runs it, in a folder with spaces too.
  assert f'{as_run} -m venv' in make(tmp_path, '-n', 'train', f'PYTHON={sys.executable}').stdout


@pytest.mark.parametrize('missing', ['tensorflow', 'tensorflow_datasets'])
def test_the_tfds_source_without_its_extra_names_the_command_installing_it(tmp_path, missing):
  """A run of data.source=tfds where TensorFlow, or TensorFlow Datasets, cannot be imported."""
  hidden = tmp_path / 'site'
  for name in ('tensorflow', 'tensorflow_datasets'):  # The other one stands in, empty: quick.
    (hidden / name).mkdir(parents=True)
    (hidden / name / '__init__.py').write_text(
        f"raise ImportError(\"No module named '{name}'\")\n" if name == missing else '')
  assert_fails_cleanly(['--config=configs/quick.py', *override_flags(data__source='tfds')],
                       f"needs TensorFlow and TensorFlow Datasets (No module named '{missing}'), "
                       'an extra that `make train` leaves out: pip install -r '
                       'requirements/tfds.txt',
                       tmp_path / 'run', env={'PYTHONPATH': str(hidden)})


@pytest.mark.parametrize('command, module', [
    (['train.py', '--config=configs/quick.py'], 'ml_collections'),
    (['predict.py', '--workdir=run', 'docs/digits'], 'numpy'),
    (['export.py', '--workdir=run', '--out=model'], 'absl')])
def test_a_command_run_by_a_python_without_the_libraries_is_one_line_with_both_fixes(
    command, module):
  """As when a user runs `python train.py` without the environment `make train` made."""
  out = subprocess.run([sys.executable, '-S', '-E', *command], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)  # No site-packages: the standard library alone.
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1, out.stderr
  assert lines[0].startswith('error: this Python (') and lines[0].endswith(
      f'has no module {module!r}, which this project needs; run the command with the Python of its '
      f'environment (make train makes it): .venv/bin/python {" ".join(command)}'), lines[0]


def core_pins() -> dict[str, str]:
  """requirements.txt's distributions (`make train`'s), each with its environment marker."""
  pins = {}
  for line in (ROOT / 'requirements.txt').read_text().splitlines():
    if line and not line[0].isspace() and not line.startswith('#'):
      pin, _, marker = line.partition(';')
      pins.setdefault(pin.split('==')[0].strip().lower(), marker.strip())
  return pins


def test_make_train_installs_what_export_py_needs_to_write_its_stablehlo_file():
  """jax.export's serialization imports flatbuffers, which jax does not require: a user of
  `make train` alone, then `python export.py`, met a traceback asking to install it."""
  assert core_pins().get('flatbuffers') == '', 'flatbuffers pinned for every Python'


def test_a_run_directory_the_locale_names_otherwise_than_utf8_is_refused_before_training(
    tmp_path):
  """Under a locale that is not UTF-8 (here ASCII, as LC_ALL=C is where Python's UTF-8 mode is
  off), a non-ASCII --workdir: tensorstore names files in UTF-8, so the checkpoints' arrays went
  into another folder (Latin-1), or tensorstore failed in a traceback per thread (ASCII), after
  the run had trained an epoch and said it saved it."""
  assert_fails_cleanly(['--config=configs/quick.py'], 'pass a --workdir whose path is ASCII',
                       tmp_path / 'r\u00e9sum\u00e9', env={'LC_ALL': 'C', 'PYTHONUTF8': '0',
                                                          'PYTHONCOERCECLOCALE': '0'})


@needs_make
def test_an_environment_whose_python_is_gone_is_one_line_naming_make_clean_env(tmp_path):
  """As after `pyenv uninstall`, or an upgrade that moved the Python the environment links to:
  make ran .venv/bin/python and ended in `No such file or directory` and `Error 127`."""
  bin_folder = tmp_path / 'venv' / 'bin'
  bin_folder.mkdir(parents=True)
  os.symlink(tmp_path / 'gone' / 'python3.12', bin_folder / 'python')
  (tmp_path / 'venv' / 'pyvenv.cfg').write_text(f'home = {tmp_path / "gone"}\n')
  (tmp_path / 'venv' / 'installed').touch()  # Newer than requirements.txt: nothing to install.
  fake_python(tmp_path, 'python3', '3.12.1')
  out = make(tmp_path, 'train')
  lines = out.stderr.strip().splitlines()
  assert out.returncode != 0 and out.stdout == '' and len(lines) == 1, out.stderr
  assert f'the environment {tmp_path}/venv was made by a Python that no longer runs' in lines[0]
  assert 'make clean-env train' in lines[0], lines[0]
  os.symlink(shutil.which('rm') or '/bin/rm', tmp_path / 'rm')
  assert make(tmp_path, 'clean-env').returncode == 0  # The fix it names then makes it anew.
  assert f'{tmp_path}/python3 -m venv' in make(tmp_path, '-n', 'train').stdout


@needs_make
def test_a_python_found_in_a_folder_with_a_space_makes_the_environment(tmp_path):
  """As where the environment of a clone in "~/My Projects/mnist" is activated, and make runs
  again (requirements.txt changed): make said that Python was "not found"."""
  folder = tmp_path / 'My Projects'
  folder.mkdir()
  fake_python(folder, 'python3', '3.12.1')
  out = subprocess.run([MAKE, '--no-print-directory', '-n', 'train', f'VENV={tmp_path}/venv'],
                       cwd=ROOT, capture_output=True, text=True, env={'PATH': str(folder)},
                       timeout=60)
  assert out.returncode == 0 and out.stderr == '', out.stderr
  assert f'{tmp_path}/My\\ Projects/python3 -m venv' in out.stdout, out.stdout


@needs_make
@pytest.mark.parametrize('accelerator', ['gpu', 'CUDA12', 'cuda-12', 'tpu cuda12'])
def test_an_accelerator_jax_has_no_plugin_for_stops_make_before_it_makes_anything(
    accelerator, tmp_path):
  """pip installs `jax[gpu]` as plain JAX with a warning alone: a typo gave an environment for the
  CPU, and as make installs a plugin only when it makes the environment, the right name later
  changed nothing."""
  fake_python(tmp_path, 'python3', '3.12.1')
  out = make(tmp_path, 'train', f'ACCELERATOR={accelerator}')
  lines = out.stderr.strip().splitlines()
  assert out.returncode != 0 and not (tmp_path / 'venv').exists() and len(lines) == 1, out.stderr
  assert f'ACCELERATOR={accelerator} names no accelerator of JAX' in lines[0], lines[0]
  assert 'make train ACCELERATOR=cuda12' in lines[0], lines[0]
  assert '"jax[cuda12]==' in make(tmp_path, '-n', 'train', 'ACCELERATOR=cuda12').stdout


@needs_make
def test_an_environment_of_another_python_is_not_made_over_but_named(tmp_path):
  """python -m venv over an environment of another Python keeps the old one's links and writes the
  new one's name: an environment of neither, made without a word (as after python3 became 3.12)."""
  (tmp_path / 'venv' / 'bin').mkdir(parents=True)
  fake_python(tmp_path / 'venv' / 'bin', 'python', '3.11.7')  # No `installed`: make must install.
  fake_python(tmp_path, 'python3', '3.12.1')
  out = make(tmp_path, '-n', 'train')
  lines = out.stderr.strip().splitlines()
  assert out.returncode != 0 and '-m venv' not in out.stdout and len(lines) == 1, out.stderr
  assert (f'the environment {tmp_path}/venv runs Python 3.11, and make chose {tmp_path}/python3 '
          '(Python 3.12); make clean-env train') in lines[0], lines[0]
  assert 'make train PYTHON=python3.11' in lines[0]
  fake_python(tmp_path, 'python3', '3.11.9')  # The same minor version: made over, as before.
  assert f'{tmp_path}/python3 -m venv' in make(tmp_path, '-n', 'train').stdout
