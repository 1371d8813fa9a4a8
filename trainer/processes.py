"""Joining a multi-process run (a TPU pod slice, or several machines) before JAX does anything else."""

import os
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from errors import UserError
from trainer.storage import RunDirectory

# JAX's own deadline is set this much later than ours, so that a missing peer ends in our one line
# rather than in JAX aborting the process with a stack dump.
_JAX_GRACE_S = 30
# How long a silent process counts as alive (JAX's default: 100 s). A process that waits on a
# lost peer outside a collective (in a barrier of the coordination service) learns of the loss
# only when this runs out; a dead peer's closed connections are noticed at once. At 20 s, processes
# starved of CPU on a loaded machine (and a job paused for 20 s) were taken for lost.
HEARTBEAT_TIMEOUT_S = 60


def join(coordinator_address: str | None = None, num_processes: int | None = None,
         process_id: int | None = None, *, detect: bool = False, initialization_timeout: int = 300,
         give_up: Callable[[str], None] | None = None) -> bool:
  """Calls `jax.distributed.initialize` when the launch names a multi-process run; True if it did.

  JAX refuses to initialize once any computation has run, so train.py calls this first. Arguments
  left as None are detected by JAX (TPU pod slice, Slurm, Open MPI); `detect` asks for that with
  none given. If the other processes have not all joined after `initialization_timeout` seconds,
  `give_up(message)` is called from a watchdog thread and must end the process.
  """
  named: dict[str, Any] = {'coordinator_address': coordinator_address,
                           'num_processes': num_processes, 'process_id': process_id}
  given = {name: value for name, value in named.items() if value is not None}
  if not given and not detect:
    return False
  if coordinator_address is not None and not re.fullmatch(r'\S+:\d{1,5}', coordinator_address):
    raise UserError(f'--coordinator_address={coordinator_address!r} is not HOST:PORT; pass the '
                    'address of process 0 and a free port, e.g. --coordinator_address=10.0.0.2:8476')
  import jax  # pylint: disable=g-import-not-at-top; keeps --help and flag errors fast

  if 'JAX_LOGGING_LEVEL' not in os.environ:
    # JAX's native logs only when fatal: its coordination service logs a lost peer at length, and
    # the run says it in one line.
    jax.config.update('jax_logging_level', 'CRITICAL')
  watchdog = threading.Timer(initialization_timeout, give_up or (lambda _: None), args=(
      f'not every process joined the run within {initialization_timeout}s; start all '
      f'{num_processes or "the"} processes with the same --coordinator_address (process 0\'s '
      'HOST:PORT, reachable from the others) and each its own --process_id',))
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(
        **given, initialization_timeout=initialization_timeout + _JAX_GRACE_S,
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  except (ValueError, TypeError, RuntimeError) as error:
    raise UserError(
        f'could not join the multi-process run ({error}); on each process pass '
        '--coordinator_address=HOST:PORT (process 0\'s), --num_processes=N and --process_id=I with '
        'I from 0 to N-1, or on a TPU pod slice only --distributed') from error
  finally:
    watchdog.cancel()
  return True


def mute_native_stdout() -> None:
  """Keeps Python's stdout and sends native code's to /dev/null: gloo prints a line per connection.

  Call once, after joining: the run's log then carries only its own lines, not gloo's "[Gloo] Rank
  0 is connected to 1 peer ranks..." (on several processes, garbled into each other).
  """
  import sys  # pylint: disable=g-import-not-at-top
  sys.stdout.flush()
  python_stdout = os.dup(1)
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 1)
  os.close(devnull)
  sys.stdout = os.fdopen(python_stdout, 'w', buffering=1, encoding=sys.stdout.encoding)


def is_primary() -> bool:
  """Process 0 writes the run's files and log; every process computes."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def _gather(value: int) -> list[int]:
  """`value` from every process, in process order (a collective: every process must call it)."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return [int(v) for v in np.ravel(multihost_utils.process_allgather(np.int32(value)))]


def everyone(ok: bool) -> bool:
  """Whether `ok` holds on every process (a collective: every process must call it)."""
  return all(_gather(int(ok)))


def agree_to_stop(signal_name: str | None) -> str | None:
  """The stop request of any process, seen by all: orbax's save needs every process at one epoch.

  A preempted host may be the only one signalled; without this, it would wait in the checkpoint
  save for peers that train on.
  """
  asked = max(_gather(signal.Signals[signal_name].value if signal_name else 0))
  return signal_name or (signal.Signals(asked).name if asked else None)


def check_same_checkpoints(newest_epoch: int) -> None:
  """Every process must see the same newest checkpoint before any restores: orbax restores together."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  try:
    multihost_utils.assert_equal(np.int32(newest_epoch))
  except AssertionError as error:  # On every process: each sees the others' epochs differ.
    newest = ', '.join(map(str, _gather(newest_epoch)))
    raise UserError(f'the processes see different checkpoints (newest epoch {newest} for processes '
                    '0, 1, ...; 0: none): give every process the same --workdir on storage they '
                    'all share') from error


def check_shared_directory(run_dir: RunDirectory) -> None:
  """Every process must see the run directory process 0 made: they all write one checkpoint."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  multihost_utils.sync_global_devices('run directory made')  # Process 0 made it before this.
  seen = _gather(int(run_dir.exists()))
  if not all(seen):
    missing = ', '.join(str(i) for i, ok in enumerate(seen) if not ok)
    raise UserError(f'process {missing} cannot see the run directory that process 0 made (here: '
                    f'{run_dir}): give every process the same --workdir on storage they all share')
