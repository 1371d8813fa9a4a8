"""Each library text library_errors.py recognizes, as the pinned libraries really word it.

The texts that need a real run to provoke are checked where that run happens: tensorstore's
damage status by the truncated checkpoint of tests/test_checkpoint.py, its OS reason and space
status by the full disks there, orbax's tree mismatch by the checkpoint of another structure
there, a lost peer by the killed processes of tests/test_processes.py, ml_collections' field
guess by the typo of tests/test_cli.py. The rest are provoked here.
"""

import asyncio
import logging
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

import library_errors
from tests.conftest import ROOT, limit_address_space


def test_asyncio_words_a_closed_loop_as_recognized():
  loop = asyncio.new_event_loop()
  loop.close()
  with pytest.raises(RuntimeError) as closed:
    loop.call_soon(print)
  assert str(closed.value) == library_errors.ASYNCIO_LOOP_CLOSED


def orbax_step_metadata_warnings(records: list[logging.LogRecord], folder) -> list[str]:
  return [r.getMessage() for r in records
          if library_errors.ORBAX_NO_STEP_METADATA in r.getMessage()
          and str(folder) in r.getMessage()]


def test_orbax_warns_of_a_step_folder_without_its_metadata_as_recognized(tmp_path, caplog):
  (tmp_path / '7').mkdir()  # A numbered folder that orbax did not write.
  with caplog.at_level(logging.WARNING):
    ocp.CheckpointManager(str(tmp_path), options=ocp.CheckpointManagerOptions(create=False)).close()
  assert orbax_step_metadata_warnings(caplog.records, tmp_path / '7')


def test_orbax_warns_of_a_checkpoint_to_delete_that_is_gone_as_recognized(tmp_path, caplog):
  options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
  with caplog.at_level(logging.WARNING), ocp.CheckpointManager(tmp_path, options=options) as saved:
    saved.save(1, args=ocp.args.StandardSave({'w': np.ones(2)}))
    shutil.rmtree(tmp_path / '1')
    saved.save(2, args=ocp.args.StandardSave({'w': np.ones(2)}))
  gone = [library_errors.ORBAX_STEP_GONE.search(r.getMessage()) for r in caplog.records]
  assert [found.group(1) for found in gone if found] == [str(tmp_path)]


# A program compiled with the cache in a folder below a file: JAX warns that it cannot read it.
CACHE_BELOW_A_FILE = """
import pathlib, sys, warnings
import jax, jax.numpy as jnp
blocker = pathlib.Path(sys.argv[1])
blocker.write_text('a file, not a folder')
jax.config.update('jax_compilation_cache_dir', str(blocker / 'cache'))
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
with warnings.catch_warnings(record=True) as said:
  warnings.simplefilter('always')
  jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()
print('\\n'.join(str(w.message).splitlines()[0] for w in said))
"""


def test_jax_words_a_cache_it_cannot_use_as_recognized(tmp_path):
  out = subprocess.run([sys.executable, '-c', CACHE_BELOW_A_FILE, str(tmp_path / 'blocker')],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={'PATH': '/usr/bin:/bin', 'JAX_PLATFORMS': 'cpu'})
  assert out.returncode == 0, out.stderr
  said = out.stdout.strip().splitlines()
  assert said and all(library_errors.JAX_CACHE_TROUBLE.match(line) for line in said), said


def test_xla_words_an_allocation_past_the_memory_as_recognized():
  """64 GiB asked for where at most 8 GiB may be mapped (the limit keeps the machine safe)."""
  code = (limit_address_space(8 << 30) + 'import jax.numpy as jnp\n'
          'try:\n  jnp.zeros((1 << 36,), jnp.uint8).block_until_ready()\n'
          'except Exception as error:\n  print(type(error).__name__, error)')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={'PATH': '/usr/bin:/bin', 'JAX_PLATFORMS': 'cpu'})
  assert out.stdout.startswith('JaxRuntimeError '), out.stdout + out.stderr
  assert library_errors.DEVICE_OUT_OF_MEMORY.search(out.stdout), out.stdout
  assert library_errors.DEVICE_ALLOCATION.search(out.stdout), out.stdout  # The bytes it asked.



def test_python_words_a_thread_the_machine_will_not_start_as_recognized():
  """Threads started until no stack fits in the address space the child may map (256 MiB)."""
  code = (limit_address_space(256 << 20) + 'import threading\nstop = threading.Event()\n'
          'try:\n  while True:\n    threading.Thread(target=stop.wait, daemon=True).start()\n'
          'except Exception as error:\n  print(type(error).__name__, error)\nstop.set()')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
  assert out.stdout.strip() == f'RuntimeError {library_errors.THREAD_REFUSED}', (
      out.stdout + out.stderr)


def test_numpy_words_an_allocation_past_the_memory_as_a_memory_error():
  code = (limit_address_space(1 << 30) + 'import numpy as np\n'
          'try:\n  np.zeros((1 << 32,), np.uint8)\n'
          'except Exception as error:\n  print(isinstance(error, MemoryError), error)')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
  assert out.stdout.startswith('True Unable to allocate 4.00 GiB'), out.stdout + out.stderr
