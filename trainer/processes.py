"""Joining a multi-process run (a TPU pod slice, or several machines) before JAX does anything else,
and ending a process in one line: on every survivor when a process is lost, never in JAX's abort,
and past the threads that an error stranded.

JAX aborts a process whose coordination service reports a lost peer (a C++ fatal log, a stack dump,
exit 134), from a thread of its own and with no hook Python can use (`missed_heartbeat_callback`
cannot be given a Python function: the call fails to convert its status). So on several processes
the run's stderr passes through a relay process, `python -m trainer.processes RUN_DIR COMMAND`,
which outlives the abort and turns it into the run's one line; once that line is out, nothing else
follows. JAX is imported inside the functions that use it: the relay never imports it."""

import contextlib
import dataclasses
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

import numpy as np

from command import fail
from errors import UserError, causes
from library_errors import JAX_ABORT, PEER_LOST
from trainer.run_dir import RunDirectory
from trainer.run_lock import release_held_locks

# JAX's own deadline is set this much later than ours, so that a missing peer ends in our one line
# rather than in JAX aborting the process with a stack dump.
_JAX_GRACE_S = 30
# How long a silent process counts as alive (JAX's default: 100 s). A process that waits on a
# lost peer outside a collective (in a barrier of the coordination service) learns of the loss
# only when this runs out; a dead peer's closed connections are noticed at once. At 20 s, processes
# starved of CPU on a loaded machine (and a job paused for 20 s) were taken for lost.
HEARTBEAT_TIMEOUT_S = 60
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOST = 'a process of the run was lost'


@dataclasses.dataclass(frozen=True)
class Launch:
  """How a process was launched: jax.distributed.initialize's arguments, as the flags give them.

  None is detected by JAX (TPU pod slice, Slurm, Open MPI); `detect` asks for that with none given.
  """
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  detect: bool = False
  initialization_timeout: int = 300  # Seconds for every process to join.

  def given(self) -> dict[str, Any]:
    named = {'coordinator_address': self.coordinator_address,
             'num_processes': self.num_processes, 'process_id': self.process_id}
    return {name: value for name, value in named.items() if value is not None}


def join_run(launch: Launch, give_up: Callable[[str], None] = lambda _: None) -> bool:
  """Calls `jax.distributed.initialize` when the launch names a multi-process run; True if it did.

  JAX refuses to initialize once any computation has run, so train.py calls this first. If the
  other processes have not all joined in time, `give_up(message)` is called from a watchdog thread
  and must end the process."""
  address, timeout = launch.coordinator_address, launch.initialization_timeout
  if not launch.given() and not launch.detect:
    return False
  if address is not None and not re.fullmatch(r'\S+:\d{1,5}', address):
    raise UserError(f'--coordinator_address={address!r} is not HOST:PORT; pass the address of '
                    'process 0 and a free port, e.g. --coordinator_address=10.0.0.2:8476')
  if address is not None and launch.process_id == 0:
    check_port_free(address)
  import jax  # pylint: disable=g-import-not-at-top; keeps --help and flag errors fast

  if 'JAX_LOGGING_LEVEL' not in os.environ:
    # JAX's native logs only when fatal: its coordination service logs a lost peer at length, and
    # the run says it in one line.
    jax.config.update('jax_logging_level', 'CRITICAL')
  watchdog = threading.Timer(timeout, give_up, args=(
      f'not every process joined the run within {timeout}s; start all '
      f'{launch.num_processes or "the"} processes with the same --coordinator_address (process '
      '0\'s HOST:PORT, reachable from the others) and each its own --process_id',))
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(**launch.given(), initialization_timeout=timeout + _JAX_GRACE_S,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  except (ValueError, TypeError, RuntimeError) as error:
    raise UserError(
        f'could not join the multi-process run ({error}); on each process pass '
        '--coordinator_address=HOST:PORT (process 0\'s), --num_processes=N and --process_id=I with '
        'I from 0 to N-1, or on a TPU pod slice only --distributed') from error
  finally:
    watchdog.cancel()
  return True


def check_port_free(address: str) -> None:
  """Process 0's coordinator must listen on its port: JAX crashes the process (a segmentation
  fault) where another program already does."""
  # Where JAX binds it: every address of this machine, unless JAX_COORDINATOR_BIND_ADDRESS says.
  bind = os.environ.get('JAX_COORDINATOR_BIND_ADDRESS') or f'[::]:{address.rsplit(":", 1)[1]}'
  host, port = bind.rsplit(':', 1)
  host = host.strip('[]')
  try:
    _bind_once(host, int(port))
  except OSError as error:
    if error.errno not in (errno.EADDRINUSE, errno.EACCES):
      return  # Not ours to judge (a host without IPv6, say): JAX's gRPC has its own ways.
    held = error.errno == errno.EADDRINUSE
    why = ('another program listens there: a run still going, or another job' if held else
           f'{error.strerror}: a port below 1024 needs root')
    raise UserError(f'process 0 cannot serve --coordinator_address={address} on port {port} '
                    f'({why}); {"stop it, or " if held else ""}pass a free port in every '
                    'process\'s --coordinator_address') from error


def _bind_once(host: str, port: int) -> None:
  """Binds and lets go of `port` as a listener would, on every address for '::' (IPv4's alone
  where the machine has no IPv6, as gRPC then does)."""
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  try:
    probe = socket.socket(family, socket.SOCK_STREAM)
  except OSError as error:
    if error.errno != errno.EAFNOSUPPORT or host != '::':
      raise
    family, host, probe = socket.AF_INET, '0.0.0.0', socket.socket(socket.AF_INET)
  with probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # A closed run's port is free.
    if family == socket.AF_INET6:
      probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    probe.bind((host, port))


def mute_native_stdout() -> None:
  """Keeps Python's stdout and sends native code's to /dev/null: gloo prints a line per connection.

  Call once, after joining: the run's log then carries only its own lines, not gloo's "[Gloo] Rank
  0 is connected to 1 peer ranks..." (on several processes, garbled into each other)."""
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


def _gather(*values: int) -> np.ndarray:
  """`values` from every process, a row per process in process order (a collective: every process
  must call it)."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  gathered = multihost_utils.process_allgather(np.array(values, np.int32))
  return np.reshape(gathered, (-1, len(values)))


def true_on_every_process(ok: bool) -> bool:
  """Whether `ok` holds on every process (a collective: every process must call it)."""
  return bool(_gather(int(ok)).all())


def agree_at_epoch_end(signal_name: str | None, lock_lost: bool) -> tuple[str | None, bool]:
  """An epoch's one exchange between the processes, none in a one-process run: the stop request
  of any process, and whether process 0's run lock was taken over, seen by all.

  Orbax's save needs every process at one epoch: a preempted host may be the only one signalled;
  without this, it would wait in the checkpoint save for peers that train on."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return signal_name, lock_lost
  # A row per process: its signal's number (0: none), and whether its lock was lost.
  signals, locks_lost = _gather(signal.Signals[signal_name].value if signal_name else 0,
                                int(lock_lost)).T
  asked = int(signals.max())
  return signal_name or (signal.Signals(asked).name if asked else None), bool(locks_lost.any())


def check_same_checkpoints(newest_epoch: int) -> None:
  """Every process must see one newest checkpoint before any restores: orbax restores together."""
  # The same list on every process: all of them stop, or none.
  newest = _gather(newest_epoch)[:, 0].tolist()
  if len(set(newest)) > 1:
    raise UserError(f'the processes see different checkpoints (newest epoch '
                    f'{", ".join(map(str, newest))} for processes 0, 1, ...; 0: none): give every '
                    'process the same --workdir on storage they all share')


def check_shared_directory(run_dir: RunDirectory) -> None:
  """Every process must see the run directory process 0 made: they all write one checkpoint."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  multihost_utils.sync_global_devices('run directory made')  # Process 0 made it before this.
  seen = _gather(int(run_dir.exists()))[:, 0].tolist()
  if not all(seen):
    missing = ', '.join(str(i) for i, ok in enumerate(seen) if not ok)
    raise UserError(f'process {missing} cannot see the run directory that process 0 made (here: '
                    f'{run_dir}): give every process the same --workdir on storage they all share')


def lost_a_peer(error: BaseException | None) -> bool:
  """Whether `error` is a multi-process run's collective or barrier failing for a lost process."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_count() > 1 and any(  # One process has no peer to lose.
      isinstance(cause, jax.errors.JaxRuntimeError) and PEER_LOST.search(str(cause))
      for cause in causes(error))


def lost_peer_line(run_dir: RunDirectory, command: str) -> str:
  """What every surviving process says: the run stopped, where it resumes, and how."""
  try:
    newest = max(run_dir.checkpoint_epochs(), default=None)
  except Exception:  # pylint: disable=broad-except; the storage is unreachable too: say so
    newest, where = None, f'the run directory {run_dir} cannot be read now'
  else:
    where = (f'the newest checkpoint is epoch {newest} in {run_dir}' if newest is not None else
             f'no checkpoint was saved yet in {run_dir}')
  then = 'resume from it' if newest is not None else 'start again'
  return (f'{LOST} (it stopped, or its host or network went down); {where}; to {then}, rerun '
          f'the same command on every host, here: {command}')


def relay(lines: Iterable[bytes], out: BinaryIO, lost_line: Callable[[], str]) -> None:
  """Copies stderr lines until the run's lost-process line or JAX's abort (said as that line)."""
  lines = iter(lines)
  for line in lines:
    if JAX_ABORT in line:
      line = f'error: {" ".join(lost_line().split())}\n'.encode()
    out.write(line)
    out.flush()
    if line.startswith(f'error: {LOST}'.encode()):
      break
  for _ in lines:  # The rest (a stack dump, a second report) is dropped; the writer never blocks.
    pass


_RELAYS: list[subprocess.Popen] = []  # The relay this process's stderr goes through, if any.


def start_relay(run_dir: RunDirectory, command: str) -> None:
  """Sends this process's stderr through the relay from now on; stderr as it was if none starts."""
  read, write = os.pipe()
  try:  # The run directory by its absolute name: the relay runs from the project's root.
    _RELAYS.append(subprocess.Popen(
        [sys.executable, '-m', 'trainer.processes', run_dir.name, command], stdin=read,
        stdout=subprocess.DEVNULL, cwd=ROOT))
  except OSError:
    os.close(write)
    return
  finally:
    os.close(read)
  sys.stderr.flush()
  os.dup2(write, 2)
  os.close(write)


_HOLDS: list[int] = []  # The read end of hold_stderr()'s pipe, kept open: its writers wait.


def hold_stderr() -> None:
  """Points file descriptor 2 at a full pipe that nobody reads, and sys.stderr at the real one.

  JAX's abort writes its fatal log there first, so it waits until the run's own line is out and
  the process ends (end_now): where JAX would end the process, the line still comes first."""
  read, write = os.pipe()
  os.set_blocking(write, False)
  with contextlib.suppress(BlockingIOError):
    while True:  # A write larger than PIPE_BUF fails only once no byte fits.
      os.write(write, bytes(65536))
  os.set_blocking(write, True)
  sys.stderr.flush()
  real = os.dup(2)
  os.dup2(write, 2)
  os.close(write)
  _HOLDS.append(read)
  sys.stderr = os.fdopen(real, 'w', buffering=1, encoding=sys.stderr.encoding)


def quiet_stderr() -> None:
  """Points file descriptor 2, and with it sys.stderr, at nothing: the run's last line is out."""
  sys.stderr.flush()
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stderr.fileno())
  os.close(devnull)


def end_now(status: int) -> None:
  """Ends the process at once (os._exit), once the relay has passed on its last line: the shell's
  prompt, or a launcher seeing the exit, never comes before it."""
  sys.stdout.flush()
  sys.stderr.flush()
  if _RELAYS:
    quiet_stderr()  # The relay's pipe closes: it writes what it has, ends.
    with contextlib.suppress(subprocess.TimeoutExpired):
      _RELAYS[0].wait(timeout=5)
  os._exit(status)


_ENDING = threading.Lock()  # Held by the first thread to end the process for a lost peer.


def stop_for_lost_peer(run_dir: RunDirectory, command: str) -> None:
  """Ends a process whose peer is gone at once, its run lock released (it writes nothing more):
  JAX's own exit would wait for the peer, then abort. Called by whichever learns of it first: the
  lifelines' thread, or the main thread's failed collective."""
  if not _ENDING.acquire(blocking=False):
    threading.Event().wait()  # The other thread is ending the process.
  hold_stderr()  # JAX, where it aborts the process now, waits for this line.
  line = lost_peer_line(run_dir, command)
  release_held_locks()  # Before the line: a warning of its release is not cut off.
  sys.stdout.flush()
  fail(line, 1, exit_now=end_now)


ABANDONED_GRACE_S = 5.0  # How long an error's exit waits for threads still running.


def exit_past_abandoned_work(status: int) -> None:
  """sys.exit, or at once where threads outlive the run: a save that failed before its folder was
  made leaves orbax's threads waiting minutes for that folder, which would hold the exit, then print
  their tracebacks. (The run closed its checkpoints first: every save that could end has ended.)
  The error's line is out: what threads that the error stranded report after it is not shown."""
  quiet_stderr()
  others = [thread for thread in threading.enumerate()
            if not thread.daemon and thread is not threading.current_thread()]
  deadline = time.monotonic() + ABANDONED_GRACE_S  # Polled: orbax's threads' join() may raise.
  while any(thread.is_alive() for thread in others) and time.monotonic() < deadline:
    time.sleep(0.05)
  if any(thread.is_alive() for thread in others):
    release_held_locks()
    end_now(status)
  sys.exit(status)


if __name__ == '__main__':
  # The relay ends when the run's stderr closes: a Ctrl-C or a SIGTERM to the whole job is the
  # run's to handle, and its last lines still have to reach the user.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  relay(sys.stdin.buffer, sys.stderr.buffer,
        lambda: lost_peer_line(RunDirectory(sys.argv[1]), sys.argv[2]))
