"""The other processes of a multi-process run (a TPU pod slice, several machines): joining them
before JAX does anything else, what they agree on, and the end of every survivor in one line when
one of them is lost. Entered only where a run has several processes (Host.join).

JAX aborts a process whose coordination service reports a lost peer (a C++ fatal log, a stack dump,
exit 134), from a thread of its own and with no hook Python can use. So the run's stderr passes
through a relay process, `python -m trainer.host.peers RUN_DIR COMMAND`, which outlives the abort
and turns it into the run's one line. And every process keeps a TCP lifeline to process 0: the
kernel of a killed process closes it, so a lost process is known within milliseconds, wherever the
others wait (JAX learns of it at once in a collective, but in a barrier of its coordination
service, where every checkpoint save waits, only once the heartbeat runs out). JAX is imported
inside the functions that use it: the relay never imports it."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

import numpy as np

from errors import During, UserError, causes
from library_errors import JAX_ABORT, PEER_LOST
from trainer.host.exits import Exits, error_line, nowhere, on_stop_signals, this_command
from trainer.host.cloud_storage import failures
from trainer.host.run_dir import RunDirectory

# JAX's own deadline is set this much later than ours, so that a missing peer ends in our one line
# rather than in JAX aborting the process with a stack dump.
_JAX_GRACE_S = 30
# How long a silent process counts as alive (JAX's default: 100 s). A process that waits on a
# lost peer outside a collective (in a barrier of the coordination service) learns of the loss
# only when this runs out; a dead peer's closed connections are noticed at once. At 20 s, processes
# starved of CPU on a loaded machine (and a job paused for 20 s) were taken for lost.
HEARTBEAT_TIMEOUT_S = 60
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOST = 'a process of the run was lost'
SAVE_IN_FLIGHT_S = 5.0  # How long a survivor waits for a checkpoint being written before its line.
BYE = b'.'  # Sent on a lifeline by a process that ends of its own accord (not os._exit, a kill).
_TOKEN_BYTES = 8  # Process 0 accepts only lifelines that send its token first.
_SHARED_BYTES = 256  # Process 0's port, token and host name, broadcast to the others.
_CONNECT_TIMEOUT_S = 10.0


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

  def several(self) -> bool:
    """Whether the launch names a multi-process run."""
    return bool(self.given()) or self.detect


def join(launch: Launch, exits: Exits, run_dir: RunDirectory) -> Peers:
  """Joins the run (`jax.distributed.initialize`, which JAX refuses once any computation has run),
  starts JAX's backend, and sets up the relay and the lifelines; a peer that has not joined within
  the launch's timeout ends this process in one line."""
  address, timeout = launch.coordinator_address, launch.initialization_timeout
  if address is not None and not re.fullmatch(r'\S+:\d{1,5}', address):
    raise UserError(f'--coordinator_address={address!r} is not HOST:PORT; pass the address of '
                    'process 0 and a free port, e.g. --coordinator_address=10.0.0.2:8476')
  if address is not None and launch.process_id == 0:
    check_port_free(address)
  import jax  # pylint: disable=g-import-not-at-top; keeps --help and flag errors fast
  from trainer.host import backend  # pylint: disable=g-import-not-at-top
  if 'JAX_LOGGING_LEVEL' not in os.environ:
    # JAX's native logs only when fatal: its coordination service logs a lost peer at length, and
    # the run says it in one line.
    jax.config.update('jax_logging_level', 'CRITICAL')
  watchdog = threading.Timer(timeout, exits.fail_now, args=(
      f'not every process joined the run within {timeout}s; start all '
      f'{launch.num_processes or "the"} processes with the same --coordinator_address (process '
      '0\'s HOST:PORT, reachable from the others) and each its own --process_id', 1))
  watchdog.daemon = True
  watchdog.start()
  with During('joining'), contextlib.ExitStack() as joined:
    joined.callback(watchdog.cancel)
    jax.distributed.initialize(**launch.given(), initialization_timeout=timeout + _JAX_GRACE_S,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  backend.start()
  _mute_native_stdout()
  exits.relay = _start_relay(run_dir)
  peers = Peers(exits, run_dir, jax.process_index())
  peers.watch(address)
  return peers


def check_port_free(address: str) -> None:
  """Process 0's coordinator must listen on its port: JAX crashes the process (a segmentation
  fault) where another program already does."""
  # Where JAX binds it: every address of this machine, unless JAX_COORDINATOR_BIND_ADDRESS says.
  bind = os.environ.get('JAX_COORDINATOR_BIND_ADDRESS') or f'[::]:{address.rsplit(":", 1)[1]}'
  host, port = bind.rsplit(':', 1)
  try:
    _bind_once(host.strip('[]'), int(port))
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


def _gather(*values: int) -> np.ndarray:
  """`values` from every process, a row per process in process order (a collective)."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  gathered = multihost_utils.process_allgather(np.array(values, np.int32))
  return np.reshape(gathered, (-1, len(values)))


class Peers:
  """The run's processes, seen from this one: their collectives, and this process's end when one
  of them is lost. Every process must make the same calls."""

  def __init__(self, exits: Exits, run_dir: RunDirectory, index: int):
    self.index = index  # This process's: jax.process_index().
    self._exits, self._run_dir = exits, run_dir
    self._ending = threading.Lock()  # Held by the first thread to end the process for a lost peer.

  def true_everywhere(self, ok: bool) -> bool:
    """Whether `ok` holds on every process."""
    return bool(_gather(int(ok)).all())

  def agree_at_epoch_end(self, signal_name: str | None,
                         lock_lost: bool) -> tuple[str | None, bool]:
    """An epoch's one exchange: the stop request of any process (a preempted host may be the only
    one signalled, and orbax's save needs every process), and process 0's lock taken over."""
    signals, locks_lost = _gather(signal.Signals[signal_name].value if signal_name else 0,
                                  int(lock_lost)).T
    asked = int(signals.max())
    return signal_name or (signal.Signals(asked).name if asked else None), bool(locks_lost.any())

  def check_same_checkpoints(self, newest_epoch: int) -> None:
    """Every process must see one newest checkpoint before any restores: orbax restores together."""
    newest = _gather(newest_epoch)[:, 0].tolist()
    if len(set(newest)) > 1:
      raise UserError(f'the processes see different checkpoints (newest epoch '
                      f'{", ".join(map(str, newest))} for processes 0, 1, ...; 0: none): give '
                      'every process the same --workdir on storage they all share')

  def check_shared_directory(self, run_dir: RunDirectory) -> None:
    """Every process must see the run directory process 0 made: they all write one checkpoint."""
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices('run directory made')  # Process 0 made it before this.
    seen = _gather(int(run_dir.exists()))[:, 0].tolist()
    if not all(seen):
      missing = ', '.join(str(i) for i, ok in enumerate(seen) if not ok)
      raise UserError(f'process {missing} cannot see the run directory that process 0 made (here: '
                      f'{run_dir}): give every process the same --workdir on storage they all '
                      'share')

  def lost_a_peer(self, error: BaseException) -> bool:
    """Whether `error` is a collective or barrier failing for a lost process."""
    import jax  # pylint: disable=g-import-not-at-top
    return any(isinstance(cause, jax.errors.JaxRuntimeError) and bool(PEER_LOST.search(str(cause)))
               for cause in causes(error))

  def stop_for_lost_peer(self) -> None:
    """Ends this process at once, its run lock released (it writes nothing more): JAX's own exit
    would wait for the peer, then abort. Called by whichever learns of it first: the lifelines'
    thread, or the main thread's failed collective."""
    if not self._ending.acquire(blocking=False):
      threading.Event().wait()  # The other thread is ending the process.
    _hold_stderr()  # JAX, where it aborts the process now, waits for this line.
    _wait_for_saves_in_flight(self._run_dir)
    self._exits.fail_now(lost_peer_line(self._run_dir, this_command()), 1)

  def watch(self, coordinator_address: str | None) -> None:
    """Connects every process to process 0 (a collective) and ends this one in the run's line from
    a thread of its own once a lifeline closes without a goodbye. A process that cannot reach
    process 0 (its host name unknown to the others where JAX found the coordinator itself) is
    watched by JAX alone."""
    server = _listen() if self.index == 0 else None
    token = os.urandom(_TOKEN_BYTES)
    mine = (server.getsockname()[1].to_bytes(2, 'big') + token +
            socket.gethostname().encode()[:_SHARED_BYTES - 2 - _TOKEN_BYTES]) if server else b''
    shared = _broadcast(mine)
    port, token = int.from_bytes(shared[:2], 'big'), shared[2:2 + _TOKEN_BYTES]
    host = (coordinator_address.rsplit(':', 1)[0].strip('[]') if coordinator_address else
            shared[2 + _TOKEN_BYTES:].rstrip(b'\0').decode())
    watcher = _Lifelines(self.stop_for_lost_peer, token)
    if server:
      import jax  # pylint: disable=g-import-not-at-top
      watcher.serve(server, peers=jax.process_count() - 1)
    else:
      watcher.add(_connect(host, port, token))
    threading.Thread(target=watcher.run, name='lifelines', daemon=True).start()
    import atexit  # pylint: disable=g-import-not-at-top
    atexit.register(watcher.goodbye)


def _mute_native_stdout() -> None:
  """Keeps Python's stdout and sends native code's to /dev/null: gloo prints a line per connection
  ("[Gloo] Rank 0 is connected to 1 peer ranks...", on several processes garbled together)."""
  sys.stdout.flush()
  python_stdout = os.dup(1)
  nowhere(sys.stdout)
  sys.stdout = os.fdopen(python_stdout, 'w', buffering=1, encoding=sys.stdout.encoding)


def _start_relay(run_dir: RunDirectory) -> subprocess.Popen | None:
  """Sends this process's stderr through the relay from now on; stderr as it was if none starts."""
  read, write = os.pipe()
  try:  # The run directory by its absolute name: the relay runs from the project's root.
    relay_process = subprocess.Popen(
        [sys.executable, '-m', 'trainer.host.peers', run_dir.name, this_command()], stdin=read,
        stdout=subprocess.DEVNULL, cwd=ROOT)
  except OSError:
    os.close(write)
    return None
  finally:
    os.close(read)
  sys.stderr.flush()
  os.dup2(write, 2)
  os.close(write)
  return relay_process


_HOLDS: list[int] = []  # The read end of _hold_stderr()'s pipe, kept open: its writers wait.


def _hold_stderr() -> None:
  """Points file descriptor 2 at a full pipe that nobody reads, and sys.stderr at the real one.

  JAX's abort writes its fatal log there first, so it waits until the run's own line is out and
  the process ends: where JAX would end the process, the line still comes first."""
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


def _epochs_in_flight(run_dir: RunDirectory) -> set[int]:
  """Epochs whose checkpoint orbax is writing: a temporary folder on a disk, a folder without its
  commit marker in a bucket."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  names = [path.get().name for path in ocp.path.step.all_temporary_paths(run_dir.path())]
  return {int(found.group(1)) for name in names
          if (found := re.fullmatch(r'(\d+)(?:\.orbax-checkpoint-tmp.*)?', name))}


def _wait_for_saves_in_flight(run_dir: RunDirectory) -> None:
  """Gives a checkpoint being written, newer than the complete ones, a few seconds to complete: the
  line then names the checkpoint a rerun resumes from (one this process cut short is never used)."""
  deadline = time.monotonic() + SAVE_IN_FLIGHT_S
  with contextlib.suppress(*failures()):  # The storage unreachable too: the line says so.
    while time.monotonic() <= deadline:
      newest = max(run_dir.checkpoint_epochs(), default=0)
      if not any(epoch > newest for epoch in _epochs_in_flight(run_dir)):
        return
      time.sleep(0.1)


def lost_peer_line(run_dir: RunDirectory, command: str) -> str:
  """What every surviving process says: the run stopped, where it resumes, and how."""
  newest, where = None, f'the run directory {run_dir} cannot be read now'
  with contextlib.suppress(*failures()):  # The storage is unreachable too: said so.
    newest = max(run_dir.checkpoint_epochs(), default=None)
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
      line = f'{error_line(lost_line())}\n'.encode()
    out.write(line)
    out.flush()
    if line.startswith(error_line(LOST).encode()):
      break
  for _ in lines:  # The rest (a stack dump, a second report) is dropped; the writer never blocks.
    pass


def _listen() -> socket.socket:
  """A socket on every address of this host (IPv4 and IPv6 where it can), on a free port."""
  if socket.has_dualstack_ipv6():
    return socket.create_server(('', 0), family=socket.AF_INET6, dualstack_ipv6=True)
  return socket.create_server(('', 0))


def _broadcast(data: bytes) -> bytes:
  """Process 0's bytes on every process (a collective), padded with zeros."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  padded = np.frombuffer(data.ljust(_SHARED_BYTES, b'\0'), np.uint8).astype(np.int32)
  return bytes(np.asarray(multihost_utils.broadcast_one_to_all(padded)).astype(np.uint8))


def _connect(host: str, port: int, token: bytes) -> socket.socket | None:
  """A lifeline to process 0; None if it cannot be reached (JAX's own means remain)."""
  with contextlib.suppress(OSError):
    connection = socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S)
    connection.sendall(token)
    connection.settimeout(None)
    return connection
  return None


class _Lifelines:
  """Waits on the lifelines in one thread: process 0 on one per peer, a peer on one to process 0.

  A goodbye retires a lifeline; one that closes without it means its process was lost."""

  def __init__(self, on_lost: Callable[[], None], token: bytes):
    self._on_lost, self._token = on_lost, token
    self._selector = selectors.DefaultSelector()
    self._lifelines: list[socket.socket] = []
    self._ended = threading.Event()  # This process said goodbye: the others' ends are theirs.
    self._peers = 0  # Connections process 0 still accepts.

  def serve(self, server: socket.socket, peers: int) -> None:
    self._peers = peers
    self._selector.register(server, selectors.EVENT_READ, self._accept)

  def add(self, connection: socket.socket | None) -> None:
    if connection is not None:
      self._lifelines.append(connection)
      self._selector.register(connection, selectors.EVENT_READ, self._read)

  def run(self) -> None:
    while self._selector.get_map() and not self._ended.is_set():
      for key, _ in self._selector.select():
        key.data(key.fileobj)

  def _accept(self, server: socket.socket) -> None:
    connection, _ = server.accept()
    connection.settimeout(_CONNECT_TIMEOUT_S)
    with contextlib.suppress(OSError):
      if connection.recv(len(self._token), socket.MSG_WAITALL) == self._token:
        connection.settimeout(None)
        self.add(connection)
        self._peers -= 1
        if not self._peers:
          self._selector.unregister(server)
          server.close()
        return
    connection.close()  # Not a process of this run.

  def _read(self, connection: socket.socket) -> None:
    data = b''  # Also where the peer's kernel reset the connection.
    with contextlib.suppress(OSError):
      data = connection.recv(64)
    if BYE in data or self._ended.is_set():
      self._selector.unregister(connection)
    elif not data:
      self._ended.set()
      self._on_lost()

  def goodbye(self) -> None:
    """At this process's own end (atexit): its peers stop watching it, and it them."""
    self._ended.set()
    for connection in list(self._lifelines):
      with contextlib.suppress(OSError):
        connection.sendall(BYE)


def _relay_main(argv: list[str]) -> None:
  """The relay ends when the run's stderr closes: a Ctrl-C or a SIGTERM to the whole job is the
  run's to handle, and its last lines still have to reach the user."""
  on_stop_signals(signal.SIG_IGN)
  relay(sys.stdin.buffer, sys.stderr.buffer, lambda: lost_peer_line(RunDirectory(argv[1]), argv[2]))


if __name__ == '__main__':
  _relay_main(sys.argv)
