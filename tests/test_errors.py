"""trainer/host/faults.py's lines, and a command's first step (trainer/host/boundary.py's start): a
refused write, however the library words it, becomes one line naming the OS's reason; so do a
library missing or unloadable and a machine out of memory or threads wherever a command meets
them."""

import errno
import os
import resource
import subprocess
import sys

import pytest

from errors import clipped
from library_errors import THREAD_REFUSED
from trainer.host.faults import line, missing_module, write_failed
from tests.conftest import ROOT

TENSORSTORE_PATH = '/runs/a/4.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/d/e6'


@pytest.mark.parametrize('error, reason', [
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 'No space left on device'),
    (ValueError(f'RESOURCE_EXHAUSTED: Error writing "params.hidden.0.bias.value/0" in OCDBT '
                f'database: Failed writing: "{TENSORSTORE_PATH}": Failed to write 395387 bytes to '
                "file 5: No space left on device [os_error_code='28']"),
     'No space left on device'),
    (ValueError(f'PERMISSION_DENIED: Error opening file: "{TENSORSTORE_PATH}": Failed to open: '
                "Permission denied [os_error_code='13']"), 'Permission denied'),
    # Another tensorstore release names no OS reason, only the status.
    (ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{TENSORSTORE_PATH}"'),
     'No space left on device, or over quota'),
    (ValueError('INTERNAL: something new\nand more'), 'INTERNAL: something new'),
])
def test_a_refused_write_is_one_line_with_the_path_the_reason_and_the_fix(error, reason):
  message = (write_failed('/runs/a', error, saved=True))
  assert message == (f'cannot write /runs/a ({reason}); free space or restore access there, then '
                     'rerun the same command to resume from the newest checkpoint')


@pytest.mark.parametrize('code, fix', [
    (errno.EMFILE, 'raise the limit of open files (ulimit -n)'),
    (errno.ENFILE, "close other programs: the system's open files are at its limit")])
def test_a_write_past_the_limit_of_open_files_names_that_limit_not_space(code, fix):
  """A save's threads open files and sockets: a small `ulimit -n` (under about 20) refuses one."""
  message = (write_failed('/runs/a', OSError(code, os.strerror(code)), saved=False))
  assert message == (f'cannot write /runs/a ({os.strerror(code)}); {fix}, then rerun the same '
                     'command to start again: no checkpoint is there to resume from')


def test_a_refused_write_promises_a_checkpoint_only_when_one_was_saved():
  error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  assert (write_failed('/r', error, saved=False)).endswith(
      'then rerun the same command to start again: no checkpoint is there to resume from')
  assert (write_failed('/r', error)).endswith('there, then rerun the same command')


@pytest.mark.parametrize('code', [errno.EISDIR, errno.ENOTDIR, errno.EEXIST])
def test_a_folder_or_file_in_the_way_is_named_as_the_fix(code):
  error = OSError(code, os.strerror(code))
  assert (write_failed('/r/metrics.jsonl', error)) == (
      f'cannot write /r/metrics.jsonl ({os.strerror(code)}); move the folder or file in its way '
      'out of it, then rerun the same command')


def test_a_folder_that_is_not_there_or_takes_no_files_is_named_as_the_fix():
  error = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
  assert (write_failed('/proc/self/export', error)) == (
      'cannot write /proc/self/export (No such file or directory); make sure the folder that holds '
      'it is there and takes new files, then rerun the same command')


def test_a_module_of_the_project_missing_is_no_set_up_line_but_a_fault_of_the_code():
  assert line(ModuleNotFoundError(name='trainer.gone')) is None
  assert line(ModuleNotFoundError(name='errors')) is None


@pytest.mark.parametrize('prefix, base, fix', [
    ('/usr', '/usr', 'run the command with the Python of its environment (make train makes it): '),
    ('/home/u/env', '/usr', 'or install the requirements into this one: '),
    (os.path.join(ROOT, '.venv'), '/usr', 'which this project needs; install its requirements '
                                          'again: '),
], ids=['a system Python', 'a virtual environment of the user', 'the project\'s own'])
def test_a_library_missing_is_said_with_the_fix_for_this_python(monkeypatch, prefix, base, fix):
  monkeypatch.setattr(sys, 'prefix', prefix)
  monkeypatch.setattr(sys, 'base_prefix', base)
  line = missing_module(ModuleNotFoundError(name='no_such_library.part'))
  assert "has no module 'no_such_library.part', which this project needs; " in line and fix in line
  assert ('-m pip install -r requirements.txt' in line) == (prefix != '/usr')


def test_a_module_missing_from_an_installed_library_or_from_python_itself_is_said_so():
  assert missing_module(ModuleNotFoundError(name='jax.no_such_part')).startswith(
      "this Python's jax has no module 'jax.no_such_part' (another version than the project pins?)")
  assert "was built without its standard module '_lzma'" in missing_module(
      ModuleNotFoundError(name='_lzma'))


def run_python(code: str) -> subprocess.CompletedProcess:
  """A Python program of the project's modules alone, as a command would start."""
  return subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                        timeout=60)


@pytest.mark.parametrize('raised, said', [
    ("MemoryError('Unable to allocate output buffer.')",
     'error: this machine ran out of memory (MemoryError: Unable to allocate output buffer.); free '
     'memory'),
    (f'RuntimeError({THREAD_REFUSED!r})',
     "error: this machine would not start another thread (can't start new thread): it is short"),
], ids=['memory', 'thread'])
def test_a_machine_limit_that_no_part_of_a_command_said_is_still_one_line(raised, said):
  """As where memory runs out while a library is imported: the commands' excepthook says it."""
  out = run_python(f'from trainer.host import boundary; boundary.start("stopped"); raise {raised}')
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith(said), out.stderr


# Loaded with the address space limited to just above what the process already holds, a library
# fails in the system's dlopen as a command's does under a small `ulimit -v`: tensorstore's
# (orbax's) met by the commands' excepthook, and TensorFlow's (one it needs, by its bare name) by
# the export's and the TFDS source's import of it.
PAST_THE_LIMIT = (
    'import resource, numpy, native_logs\n'
    'from trainer.host import boundary\n'
    'boundary.start("stopped")\n'
    'held = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) << 10\n'
    'resource.setrlimit(resource.RLIMIT_AS, (held + (8 << 20), resource.RLIM_INFINITY))\n')


@pytest.mark.parametrize('load, library', [
    pytest.param('import tensorstore', '_tensorstore', id='excepthook'),
    pytest.param('native_logs.import_tensorflow_quietly()', 'libtensorflow', id='tensorflow',
                 marks=pytest.mark.slow),  # TensorFlow's import takes seconds.
])
def test_a_library_past_the_memory_limit_is_one_line_naming_the_limit(load, library):
  if library == 'libtensorflow':
    pytest.importorskip('tensorflow', reason='TensorFlow (the TFDS extra) is not installed here')
  out = run_python(PAST_THE_LIMIT + load)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1, out.stderr
  assert lines[0].startswith('error: the system would not load ') and library in lines[0], lines[0]
  assert "this process's memory limit (" in lines[0] and 'ulimit -v' in lines[0], lines[0]


def statvfs_saying(flags: int):
  """os.statvfs as a filesystem with these mount flags gives it; -1: a path it cannot stat."""
  def statvfs(path):
    if flags < 0:
      raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    return os.statvfs_result((0,) * 8 + (flags, 0))
  return statvfs


@pytest.mark.parametrize('named, flags, said', [
    ('/env/lib/_native.so', os.ST_NOEXEC, 'the system would not load /env/lib/_native.so (failed '
     'to map segment from shared object): its filesystem is mounted noexec; make the environment'),
    ('libdep.so.2', os.ST_NOEXEC, 'the system would not load libdep.so.2 (failed to map segment '
     'from shared object): its filesystem is mounted noexec'),
    ('/env/lib/_native.so', -1, 'the system would not load /env/lib/_native.so (failed to map '
     'segment from shared object): this machine may be short of memory, or a security policy'),
], ids=['noexec', 'a library it needs on noexec', 'no limit'])
def test_a_library_the_system_will_not_load_is_said_by_its_likely_reason(monkeypatch, named, flags,
                                                                          said):
  monkeypatch.setattr(os, 'statvfs', statvfs_saying(flags))
  monkeypatch.setattr(resource, 'getrlimit', lambda _: (resource.RLIM_INFINITY,) * 2)
  wrapped = RuntimeError('a library could not be imported')
  wrapped.__cause__ = ImportError(f'{named}: failed to map segment from shared object')
  assert line(wrapped).startswith(said)
  assert line(ImportError('cannot import name "x" from "y"')) is None


def test_a_fault_of_the_code_keeps_its_traceback_under_the_commands_excepthook():
  out = run_python('from trainer.host import boundary; boundary.start("stopped"); '
                   'raise ValueError("a bug")')
  assert out.returncode == 1 and out.stderr.startswith('Traceback'), out.stderr
  assert 'ValueError: a bug' in out.stderr


# A Ctrl-C while TensorFlow imports, its C++ notes muted: Python's line still reaches the user.
MUTED_CTRL_C = ('import os, signal, time, native_logs\n'
                'from trainer.host import boundary\n'
                'boundary.start("stopped while muted")\n'
                'with native_logs.native_stderr_muted():\n'
                '  os.write(2, b"a library log line in C++\\n")\n'
                '  os.kill(os.getpid(), signal.SIGINT)\n'
                '  time.sleep(10)\n')


def test_a_ctrl_c_while_native_logs_are_muted_still_says_its_line_and_only_it():
  out = run_python(MUTED_CTRL_C)
  assert out.returncode == 130 and out.stderr == 'error: stopped while muted\n', out.stderr


@pytest.mark.parametrize('command', ['predict.py', 'export.py'])
def test_a_tool_s_help_exits_0_and_a_reader_gone_or_a_full_disk_is_no_traceback(command):
  """absl's help exits 1 once printed; a reader that has gone (`| head -1`) is no error."""
  for asked in ('--helpshort', '--help=true'):
    helped = subprocess.run([sys.executable, command, asked], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and '--workdir' in helped.stdout, (asked, helped.stderr)
  read, write = os.pipe()
  os.close(read)  # The reader is gone before the help is printed.
  gone = subprocess.run([sys.executable, command, '--helpfull'], cwd=ROOT, stdout=write,
                        stderr=subprocess.PIPE, text=True, timeout=60)
  os.close(write)
  assert (gone.returncode, gone.stderr) == (0, '')
  if os.path.exists('/dev/full'):
    with open('/dev/full', 'w') as full:
      failed = subprocess.run([sys.executable, command, '--helpfull'], cwd=ROOT, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert failed.returncode == 1
    assert failed.stderr.splitlines() == [
        'error: cannot write the output (No space left on device); free space where it is '
        'redirected, then rerun the same command']


def test_a_library_s_long_text_is_cut_between_words_never_inside_a_number():
  text = ('Requested byte range [985272, 987220) is out of range for a file of 9872 bytes\n'
          'a second line')
  assert clipped(text, 40) == 'Requested byte range [985272, 987220) is ...'
  assert clipped(text, 35) == 'Requested byte range [985272 ...'
  assert clipped(text) == text.splitlines()[0]  # Short enough: the first line, whole.
  path = '/a' * 30  # A word longer than the limit is kept whole.
  assert clipped(f'{path} is gone for good', 20) == f'{path} ...'
  assert clipped(path, 20) == path
