"""A TCP connection from every process of a multi-process run to process 0, so that a process that
ends without a goodbye (killed, crashed) is known to the others at once, wherever they wait.

JAX learns of a lost process at once in a collective (its connection is reset), but in a barrier of
its coordination service, where every checkpoint save waits, only when the heartbeat runs out
(60 s), and then aborts the process. The kernel of a killed process closes its connections: a
closed lifeline says so within milliseconds. A host that goes down closes nothing: JAX's heartbeat
still tells that. JAX is imported inside the functions that use it."""

import atexit
import contextlib
import os
import selectors
import socket
import threading
from collections.abc import Callable

import numpy as np

BYE = b'.'  # Sent by a process that ends of its own accord (every exit but os._exit and a kill).
_TOKEN_BYTES = 8  # Process 0 accepts only connections that send its token first.
_SHARED_BYTES = 256  # Process 0's port, token and host name, broadcast to the others.
_CONNECT_TIMEOUT_S = 10.0


def watch(coordinator_address: str | None, on_lost: Callable[[], None]) -> None:
  """Connects every process to process 0 (a collective: every process calls it) and calls
  `on_lost()` from a thread of its own once a lifeline closes without a goodbye.

  Nothing in a one-process run. A process that cannot reach process 0 (its host name unknown to
  the others where JAX found the coordinator itself) is watched by JAX alone, as before."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return
  server = _listen() if jax.process_index() == 0 else None
  token = os.urandom(_TOKEN_BYTES)
  mine = (server.getsockname()[1].to_bytes(2, 'big') + token +
          socket.gethostname().encode()[:_SHARED_BYTES - 2 - _TOKEN_BYTES]) if server else b''
  shared = _broadcast(mine)
  port, token = int.from_bytes(shared[:2], 'big'), shared[2:2 + _TOKEN_BYTES]
  host = (coordinator_address.rsplit(':', 1)[0].strip('[]') if coordinator_address else
          shared[2 + _TOKEN_BYTES:].rstrip(b'\0').decode())
  watcher = _Watcher(on_lost, token)
  if server:
    watcher.serve(server, peers=jax.process_count() - 1)
  else:
    watcher.add(_connect(host, port, token))
  threading.Thread(target=watcher.run, name='lifelines', daemon=True).start()
  atexit.register(watcher.goodbye)


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
  try:
    connection = socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S)
    connection.sendall(token)
  except OSError:
    return None
  connection.settimeout(None)
  return connection


class _Watcher:
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
    try:
      data = connection.recv(64)
    except OSError:  # Reset by the peer's kernel.
      data = b''
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
