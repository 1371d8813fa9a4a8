"""How this process speaks and ends, which the host and the other processes' watch both use: its
lines, the handler of its stop signals, and its exits at once (its run locks released, its last
lines through the relay). Only the standard library: a command starts here, before its libraries
load."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

from errors import During

STOP_SIGNALS = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}  # A user's, a preempted VM's.
Handler = Any  # signal.signal's: a callable of (number, frame), or SIG_IGN.


def say(line: str, stream: TextIO) -> None:
  """Prints a line; a reader that has gone (`python train.py | head -1`) never stops the program,
  and output that cannot be written (redirected to a full disk) is the user's one line."""
  with During('writing the output'):
    try:
      print(line, file=stream, flush=True)
    except OSError as error:
      nowhere(stream)  # Its later lines, and its flush at exit, go nowhere instead of raising.
      if not isinstance(error, BrokenPipeError):  # A reader that has gone read what it wanted.
        raise


def error_line(text: str) -> str:
  """The one form of an error's line: `error: ` and its text, its spaces as one."""
  return f'error: {" ".join(text.split())}'


def print_error(text: str) -> None:
  """Prints the line of an error on stderr."""
  print(error_line(text), file=sys.stderr, flush=True)


def nowhere(stream: TextIO) -> None:
  """Points a stream's file descriptor at /dev/null."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, stream.fileno())
  os.close(devnull)


def this_command() -> str:
  """The command line that started this process, as a shell would take it back."""
  return shlex.join([sys.executable, *sys.argv])


def on_stop_signals(handler: Handler | dict[int, Handler]) -> dict[int, Handler]:
  """`handler` for a Ctrl-C and a SIGTERM from now on (SIG_IGN: a helper process that must outlive
  its command's, the relay), or for each its own (those replaced before); the handlers replaced."""
  return {number: signal.signal(number, handler[number] if isinstance(handler, dict) else handler)
          for number in STOP_SIGNALS}


class Exits:
  """This process's ends at once (os._exit), from a signal handler or a thread: the run locks it
  holds released first, its last lines through the relay where there is one."""

  def __init__(self) -> None:
    self._releases: list[Callable[[], None]] = []  # Run locks held: released before os._exit.
    # The relay this process's stderr goes through, if any (peers.join): the last line waits for it.
    self.relay: subprocess.Popen | None = None

  def hold(self, release: Callable[[], None]) -> None:
    """Until let go, an abrupt exit calls `release` first: a run lock left behind would make the
    rerun wait for it to go stale."""
    self._releases.append(release)

  def let_go(self, release: Callable[[], None]) -> None:
    self._releases.remove(release)

  def release_all(self) -> None:
    for release in list(self._releases):
      release()

  def exit_now(self, status: int) -> NoReturn:
    """Ends the process at once, once its last lines are out (through the relay, where there is
    one): orbax's threads, or a peer that is gone, would hold a normal exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    if self.relay is not None:
      nowhere(sys.stderr)  # The relay's pipe closes: it writes what it has, ends.
      with contextlib.suppress(subprocess.TimeoutExpired):
        self.relay.wait(timeout=5)
    os._exit(status)

  def fail_now(self, line: str, status: int) -> NoReturn:
    """Says the line and ends at once: locks released first."""
    self.release_all()
    print_error(line)
    self.exit_now(status)
