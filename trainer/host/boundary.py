"""The process a command runs in, decided once: whether it speaks and writes for its run (process
0), what a Ctrl-C or a SIGTERM does, and how it ends: every fault a user can act on in one line
(trainer/faults.py words it), never a traceback. Only the standard library at import: a command
starts here, before its libraries load."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from errors import During, UserError
from trainer.host import faults

if TYPE_CHECKING:
  from trainer.host.peers import Peers
  from trainer.host.run_dir import RunDirectory

STOP_SIGNALS = {signal.SIGINT: 'Ctrl-C', signal.SIGTERM: 'SIGTERM'}  # A user's, a preempted VM's.
ABANDONED_GRACE_S = 5.0  # How long an error's exit waits for threads still running.


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


class Stopped(Exception):
  """A run that a signal stopped at an epoch's end, once that epoch's checkpoint is saved."""

  def __init__(self, signal_name: str, epoch: int, directory: str):
    super().__init__(f'stopped by {signal_name} after epoch {epoch}, whose checkpoint is saved in '
                     f'{directory}')
    self.exit_status = 128 + signal.Signals[signal_name].value  # The shell's status for it.


class Unwound(KeyboardInterrupt):
  """A Ctrl-C or a SIGTERM met where the work must unwind (its staged files removed): its line."""

  def __init__(self, number: int, line: str):
    super().__init__(line.format(signal=STOP_SIGNALS[signal.Signals(number)]))
    self.exit_status = 128 + number


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


def nowhere(stream: TextIO) -> None:
  """Points a stream's file descriptor at /dev/null."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, stream.fileno())
  os.close(devnull)


def this_command() -> str:
  """The command line that started this process, as a shell would take it back."""
  return shlex.join([sys.executable, *sys.argv])


def print_error(line: str) -> None:
  """The one line of an error, its spaces as one."""
  print(f'error: {" ".join(line.split())}', file=sys.stderr, flush=True)


Handler = Any  # signal.signal's: a callable of (number, frame), or SIG_IGN.


def _on_stop_signals(handler: Handler) -> dict[int, Handler]:
  """`handler` for a Ctrl-C and a SIGTERM from now on; the handlers it replaced."""
  return {number: signal.signal(number, handler) for number in STOP_SIGNALS}


class _Handled:
  """A handler of the stop signals while entered; the handlers before it, back on exit."""

  def __init__(self, handler: Handler):
    self._handler = handler

  def __enter__(self) -> None:
    self._previous = _on_stop_signals(self._handler)

  def __exit__(self, *exc_info: Any) -> None:
    for number, handler in self._previous.items():
      signal.signal(number, handler)


class Host:
  """This process: process 0 of its run or another, its signals, its exits and its one boundary."""

  def __init__(self) -> None:
    self.primary = True  # Process 0 speaks and writes for the run; decided once, by join().
    self.peers: Peers | None = None  # The run's other processes, once joined.
    self._releases: list[Callable[[], None]] = []  # Run locks held: released before os._exit.
    self._signal: str | None = None  # The first stop signal of a run that finishes its epoch.

  # --- Lines: process 0's alone -------------------------------------------------------------------

  def say(self, line: str, stream: TextIO | None = None) -> None:
    if self.primary:
      say(line, stream or sys.stdout)

  def warn(self, message: str) -> None:
    """Something the user should know that does not stop the run: one line on stderr."""
    self.say(f'warning: {message}', sys.stderr)

  # --- Joining the other processes of a multi-process run -----------------------------------------

  def join(self, launch: Launch, run_dir: RunDirectory) -> None:
    """Joins the run's other processes when `launch` names several; process 0 decided here."""
    if launch.several():
      from trainer.host import peers as processes  # pylint: disable=g-import-not-at-top; only for several
      self.peers = processes.join(launch, self, run_dir)
      self.primary = self.peers.index == 0

  def check_same_checkpoints(self, newest_epoch: int) -> None:
    """Every process must see one newest checkpoint before any restores: orbax restores together."""
    if self.peers:
      self.peers.check_same_checkpoints(newest_epoch)

  def check_shared_directory(self, run_dir: RunDirectory) -> None:
    """Every process must see the run directory process 0 made."""
    if self.peers:
      self.peers.check_shared_directory(run_dir)

  def on_every_process(self, ok: bool) -> bool:
    """Whether `ok` holds on every process (a collective where there are several)."""
    return self.peers.true_everywhere(ok) if self.peers else ok

  def agree_at_epoch_end(self, lock_lost: bool) -> tuple[str | None, bool]:
    """The stop signal any process got, and whether process 0's run lock was taken over."""
    if self.peers is None:
      return self._signal, lock_lost
    return self.peers.agree_at_epoch_end(self._signal, lock_lost)

  # --- Signals ------------------------------------------------------------------------------------

  def stop_at_once(self, line: str) -> None:
    """From now on a Ctrl-C or a SIGTERM ends the command at once in `line`, its `{signal}` the one
    met (a KeyboardInterrupt would end in a traceback of whatever it met, an import among them)."""
    _on_stop_signals(lambda number, _: self.fail_now(
        line.format(signal=STOP_SIGNALS[signal.Signals(number)]), 128 + number))

  def interrupt_at_once(self) -> None:
    """A Ctrl-C ends the run where it is, its locks released: an exception raised there could
    abandon orbax's writing threads mid-save, and the exit would wait on them forever."""
    signal.signal(signal.SIGINT, lambda *_: self.interrupted())

  def interrupted(self) -> NoReturn:
    self.fail_now('interrupted before the next checkpoint; the same command resumes from the '
                  f'newest one, or starts afresh where none was saved: {this_command()}', 130)

  def finishing_epochs(self) -> _Handled:
    """While entered, the first SIGTERM or Ctrl-C is recorded (the run saves at its epoch's end and
    stops); a second Ctrl-C ends the run at once."""
    def record(number: int, _: types.FrameType | None) -> None:
      if self._signal is None:
        self._signal = signal.Signals(number).name
      elif number == signal.SIGINT:
        self.interrupted()
    return _Handled(record)

  def stop_requested(self) -> str | None:
    """The name of the signal that asked this process to stop, or None."""
    return self._signal

  def unwind_on_signals(self, line: str) -> None:
    """A Ctrl-C or a SIGTERM from now on unwinds as a Ctrl-C does (staged files are removed), then
    ends the command in `line`, its `{signal}` the one met."""
    def unwind(number: int, _: types.FrameType | None) -> None:
      raise Unwound(number, line)
    _on_stop_signals(unwind)

  def hold_signals(self) -> list[int]:
    """A signal waits from now on (files moving into place); the list holds those that came."""
    waiting: list[int] = []
    _on_stop_signals(lambda number, _: waiting.append(number))
    return waiting

  def end_quietly(self) -> None:
    """The command's lines are out: a Ctrl-C or a SIGTERM from now on ends it at once and says no
    more (a line of being stopped would belie the ones before it)."""
    _on_stop_signals(lambda number, _: self.exit_now(128 + number))

  def end_if_signalled(self, waiting: list[int]) -> None:
    """Ends the command now, as the first signal that waited asked."""
    if waiting:
      self.exit_now(128 + waiting[0])

  @staticmethod
  def ignore_signals() -> None:
    """A helper process that must outlive its command's Ctrl-C or SIGTERM (the relay)."""
    _on_stop_signals(signal.SIG_IGN)

  # --- Exits --------------------------------------------------------------------------------------

  def hold(self, release: Callable[[], None]) -> None:
    """Until let go, an abrupt exit (os._exit) calls `release` first: a run lock left behind would
    make the rerun wait for it to go stale."""
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
    if self.peers:
      self.peers.let_the_relay_finish()
    os._exit(status)

  def fail_now(self, line: str, status: int) -> NoReturn:
    """Says the line and ends at once, from a signal handler or a thread: locks released first."""
    self.release_all()
    print_error(line)
    self.exit_now(status)

  def fail(self, line: str, status: int = 1) -> NoReturn:
    """Says the error's line and exits; threads the error stranded (orbax's, waiting minutes for a
    folder a failed save never made) are given a few seconds, then left with os._exit: what they
    report after the line is not shown."""
    self.end_quietly()  # The line is the command's last: a signal from now on only ends it.
    print_error(line)
    nowhere(sys.stderr)
    others = [thread for thread in threading.enumerate()
              if not thread.daemon and thread is not threading.current_thread()]
    deadline = time.monotonic() + ABANDONED_GRACE_S  # Polled: orbax's threads' join() may raise.
    while any(thread.is_alive() for thread in others) and time.monotonic() < deadline:
      time.sleep(0.05)
    if any(thread.is_alive() for thread in others):
      self.release_all()
      self.exit_now(status)
    sys.exit(status)

  # --- The boundary -------------------------------------------------------------------------------

  def run(self, main: Callable[[list[str]], None],
          parse_flags: Callable[[list[str]], list[str]]) -> None:
    """absl's app.run of the command inside its one boundary: a fault the user can act on is one
    line (trainer/faults.py), a signal's stop the command to resume, a fault of the code its
    traceback."""
    from absl import app  # pylint: disable=g-import-not-at-top
    try:
      app.run(main, flags_parser=parse_flags)
    except Stopped as stopped:
      self.end_quietly()  # The line is the command's last: a second Ctrl-C only ends it.
      print(f'{stopped}; resume with: {this_command()}', file=sys.stderr, flush=True)
      sys.exit(stopped.exit_status)
    except Unwound as stopped:
      self.fail(str(stopped), stopped.exit_status)
    except Exception as error:  # pylint: disable=broad-except; the one boundary: said, or raised
      self.end(error)

  def end(self, error: BaseException) -> NoReturn:
    """Ends the command for `error`: a lost peer as every survivor says it, a fault the user can act
    on in its line, anything else in its traceback."""
    if self.peers and self.peers.lost_a_peer(error):
      self.peers.stop_for_lost_peer()
    said = faults.line(error)
    if said is None:
      raise error
    self.fail(said, error.exit_status if isinstance(error, UserError) else 1)


def start(stopped_line: str) -> Host:
  """A command's first step, before its imports: a Ctrl-C or a SIGTERM ends it at once in
  `stopped_line`; a module this Python lacks, a library the system will not load, or a machine out
  of memory or threads, met where no part of the command said so, is one line too."""
  host = Host()
  host.stop_at_once(stopped_line)
  default_hook = sys.excepthook

  def one_line_for_the_set_up_or_the_machine(kind, error, trace) -> None:
    said = faults.line(error) if isinstance(error, Exception) else None
    if said is None:
      default_hook(kind, error, trace)
    else:
      print_error(said)  # Python's exit status: 1.
  sys.excepthook = one_line_for_the_set_up_or_the_machine
  return host
