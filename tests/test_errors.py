"""errors.py: a refused write, however the library words it, becomes one line naming the OS's reason; so
do a library missing and a machine out of memory or threads wherever a command meets them."""

import errno
import os
import subprocess
import sys

import pytest

from errors import THREAD_REFUSED, missing_module, write_failed
from tests.conftest import ROOT

TENSORSTORE_PATH = '/runs/a/4.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/d/e6'


@pytest.mark.parametrize('error, reason', [
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 'No space left on device'),
    (ValueError(f'RESOURCE_EXHAUSTED: Error writing "params.hidden.0.bias.value/0" in OCDBT database: '
                f'Failed writing: "{TENSORSTORE_PATH}": Failed to write 395387 bytes to file 5: No '
                "space left on device [os_error_code='28']"), 'No space left on device'),
    (ValueError(f'PERMISSION_DENIED: Error opening file: "{TENSORSTORE_PATH}": Failed to open: '
                "Permission denied [os_error_code='13']"), 'Permission denied'),
    # Another tensorstore release names no OS reason, only the status.
    (ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{TENSORSTORE_PATH}"'),
     'No space left on device, or over quota'),
    (ValueError('INTERNAL: something new\nand more'), 'INTERNAL: something new'),
])
def test_a_refused_write_is_one_line_with_the_path_the_reason_and_the_fix(error, reason):
  message = str(write_failed('/runs/a', error, saved=True))
  assert message == (f'cannot write /runs/a ({reason}); free space or restore access there, then '
                     'rerun the same command to resume from the newest checkpoint')


def test_a_refused_write_promises_a_checkpoint_only_when_one_was_saved():
  error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  assert str(write_failed('/r', error, saved=False)).endswith(
      'then rerun the same command to start again: no checkpoint is there to resume from')
  assert str(write_failed('/r', error)).endswith('there, then rerun the same command')


@pytest.mark.parametrize('code', [errno.EISDIR, errno.ENOTDIR])
def test_a_folder_or_file_in_the_way_is_named_as_the_fix(code):
  error = OSError(code, os.strerror(code))
  assert str(write_failed('/r/metrics.jsonl', error)) == (
      f'cannot write /r/metrics.jsonl ({os.strerror(code)}); move the folder or file in its way out '
      'of it, then rerun the same command')


def test_a_folder_that_is_not_there_or_takes_no_files_is_named_as_the_fix():
  error = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
  assert str(write_failed('/proc/self/export', error)) == (
      'cannot write /proc/self/export (No such file or directory); make sure the folder that holds '
      'it is there and takes new files, then rerun the same command')


def test_a_module_of_the_project_missing_is_no_set_up_line_but_a_fault_of_the_code():
  assert missing_module(ModuleNotFoundError("No module named 'trainer.gone'", name='trainer.gone')) is None
  assert missing_module(ModuleNotFoundError("No module named 'gone'", name='errors')) is None
  assert 'no module \'orbax\'' in missing_module(ModuleNotFoundError(name='orbax.checkpoint'))


@pytest.mark.parametrize('raised, said', [
    ("MemoryError('Unable to allocate output buffer.')",
     'error: this machine ran out of memory (MemoryError: Unable to allocate output buffer.); free '
     'memory'),
    (f'RuntimeError({THREAD_REFUSED!r})',
     "error: this machine would not start another thread (can't start new thread): it is short"),
], ids=['memory', 'thread'])
def test_a_machine_limit_that_no_part_of_a_command_said_is_still_one_line(raised, said):
  """As where memory runs out while a library is imported: the commands' excepthook says it."""
  out = subprocess.run([sys.executable, '-c', f'import errors; errors.start_command("stopped"); '
                        f'raise {raised}'], cwd=ROOT, capture_output=True, text=True, timeout=60)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith(said), out.stderr


def test_a_fault_of_the_code_keeps_its_traceback_under_the_commands_excepthook():
  out = subprocess.run([sys.executable, '-c', 'import errors; errors.start_command("stopped"); '
                        'raise ValueError("a bug")'], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
  assert out.returncode == 1 and out.stderr.startswith('Traceback') and 'ValueError: a bug' in out.stderr
