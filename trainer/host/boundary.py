"""The process a command runs in, decided once: whether it speaks and writes for its run (process
0), the phase the command is in (what a Ctrl-C or a SIGTERM does there), and how it ends: every
fault a user can act on in one line (trainer/host/faults.py words it), never a traceback. Only the
standard library at import: a command starts here, before its libraries load."""

from __future__ import annotations

import contextlib
import enum
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TextIO

from errors import Stopped, UserError
from trainer.host import faults
from trainer.host.exits import (STOP_SIGNALS, Exits, nowhere, on_stop_signals, print_error,
                                say, this_command)

if TYPE_CHECKING:
  from trainer.host.peers import Launch, Peers
  from trainer.host.run_dir import RunDirectory

ABANDONED_GRACE_S = 5.0  # How long an error's exit waits for threads still running.
INTERRUPTED = ('interrupted before the next checkpoint; the same command resumes from the newest '
               'one, or starts afresh where none was saved: {command}')


class Phase(enum.Enum):
  """Where a command is, which decides what a Ctrl-C or a SIGTERM does."""
  # It ends the command at once in the phase's line (a KeyboardInterrupt would end in a traceback
  # of whatever it met, an import among them).
  STARTING = 'starting'
  # A Ctrl-C ends the run where it is, its locks released, to be resumed (an exception raised there
  # could abandon orbax's writing threads mid-save, and the exit would wait on them forever); a
  # SIGTERM as while starting.
  RUNNING = 'running'
  # The first is recorded (the run saves at its epoch's end and stops); a second Ctrl-C ends the
  # run at once.
  EPOCHS = 'running the epochs'
  # It unwinds as a Ctrl-C does (staged files are removed), then ends the command in the line.
  FINISHING = 'finishing'
  # It waits (files moving into place) until the command's lines are out, then ends it.
  COMMITTING = 'committing'
  # The command's lines are out: it ends the command at once and says no more (a line of being
  # stopped would belie the ones before it).
  ENDING = 'ending'


class Unwound(KeyboardInterrupt):
  """A Ctrl-C or a SIGTERM met where the work must unwind (its staged files removed): its line."""

  def __init__(self, number: int, line: str):
    super().__init__(line.format(signal=STOP_SIGNALS[signal.Signals(number)]))
    self.exit_status = 128 + number


class Host:
  """This process: process 0 of its run or another, its phases, its exits and its one boundary."""

  def __init__(self, exits: Exits | None = None) -> None:
    self.primary = True  # Process 0 speaks and writes for the run; decided once, by join().
    self.exits = exits or Exits()
    self._peers: Peers | None = None  # The run's other processes, once joined.
    self.alone = True  # Whether this process is its run's only one.
    self._phase, self._line = Phase.STARTING, ''  # `line`: a signal's end there, if any.
    self._listening = False  # Whether the stop signals come to _heard.
    self._signal: str | None = None  # The first stop signal of a run that finishes its epoch.
    self._waiting: list[int] = []  # Signals that came while committing.

  # --- Lines: process 0's alone -------------------------------------------------------------------

  def say(self, line: str, stream: TextIO | None = None) -> None:
    if self.primary:
      say(line, stream or sys.stdout)

  def warn(self, message: str) -> None:
    """Something the user should know that does not stop the run: one line on stderr."""
    self.say(f'warning: {message}', sys.stderr)

  # --- The other processes of a multi-process run -------------------------------------------------

  def join(self, launch: Launch, run_dir: RunDirectory) -> None:
    """Joins the run's other processes when `launch` names several; process 0 decided here."""
    if launch.several():
      from trainer.host import peers  # pylint: disable=g-import-not-at-top; only for several
      self._peers = peers.join(launch, self.exits, run_dir)
      self.primary, self.alone = self._peers.index == 0, False

  def check_same_checkpoints(self, newest_epoch: int) -> None:
    """Every process must see one newest checkpoint before any restores: orbax restores together."""
    if self._peers:
      self._peers.check_same_checkpoints(newest_epoch)

  def check_shared_directory(self, run_dir: RunDirectory) -> None:
    """Every process must see the run directory process 0 made."""
    if self._peers:
      self._peers.check_shared_directory(run_dir)

  def on_every_process(self, ok: bool) -> bool:
    """Whether `ok` holds on every process (a collective where there are several)."""
    return self._peers.true_everywhere(ok) if self._peers else ok

  def agree_at_epoch_end(self, lock_lost: bool) -> tuple[str | None, bool]:
    """The stop signal any process got, and whether process 0's run lock was taken over."""
    if self._peers is None:
      return self._signal, lock_lost
    return self._peers.agree_at_epoch_end(self._signal, lock_lost)

  def lost_a_peer(self, error: BaseException) -> bool:
    """Whether `error` is a collective or barrier failing for a lost process of the run."""
    return self._peers is not None and self._peers.lost_a_peer(error)

  # --- Phases: what a Ctrl-C or a SIGTERM does ----------------------------------------------------

  def phase(self, phase: Phase, line: str = '') -> contextlib.ExitStack:
    """The command is in `phase` from now on; `line`, its `{signal}` the one met, is how a signal
    ends it there (starting or finishing). As a context, the phase before comes back on leaving,
    and the handlers before the host's own where it put its own first."""
    before = self._phase, self._line
    # Put back each time: a library may have put its own there since (JAX's preemption notice).
    replaced, first = on_stop_signals(self._heard), not self._listening
    self._phase, self._line, self._listening = phase, line or self._line, True

    def leave() -> None:
      self._phase, self._line = before
      if first:
        on_stop_signals(replaced)
        self._listening = False
    on_leaving = contextlib.ExitStack()
    on_leaving.callback(leave)
    return on_leaving

  def _heard(self, number: int, _: types.FrameType | None) -> None:
    """A Ctrl-C or a SIGTERM, as the phase says."""
    phase = self._phase
    if phase is Phase.ENDING:
      self.exits.exit_now(128 + number)
    elif phase is Phase.COMMITTING:
      self._waiting.append(number)
    elif phase is Phase.EPOCHS and self._signal is None:
      self._signal = signal.Signals(number).name
    elif phase in (Phase.RUNNING, Phase.EPOCHS) and number == signal.SIGINT:
      self.exits.fail_now(INTERRUPTED.format(command=this_command()), 128 + number)
    elif phase is Phase.FINISHING:
      raise Unwound(number, self._line)
    elif phase is not Phase.EPOCHS:  # A second SIGTERM while an epoch finishes: recorded already.
      self.exits.fail_now(self._line.format(signal=STOP_SIGNALS[signal.Signals(number)]),
                          128 + number)

  # --- The boundary -------------------------------------------------------------------------------

  def run(self, main: Callable[[list[str]], None],
          parse_flags: Callable[[list[str]], list[str]]) -> None:
    """absl's app.run of the command inside its one boundary: a fault the user can act on is one
    line (trainer/host/faults.py), a signal's stop the command to resume, a fault of the code its
    traceback."""
    from absl import app  # pylint: disable=g-import-not-at-top
    try:
      app.run(lambda argv: self._completed(main, argv), flags_parser=parse_flags)
    except Stopped as stopped:
      self.phase(Phase.ENDING)  # The line is the command's last: a second Ctrl-C only ends it.
      print(f'{stopped}; resume with: {this_command()}', file=sys.stderr, flush=True)
      sys.exit(stopped.exit_status)
    except Unwound as stopped:
      self._fail(str(stopped), stopped.exit_status)
    except Exception as error:  # pylint: disable=broad-except; the one boundary: said, or raised
      self._end(error)

  def _completed(self, main: Callable[[list[str]], None], argv: list[str]) -> None:
    """Runs the command; its work done and said, a signal from now on only ends it, and one that
    waited ends it now."""
    main(argv)
    self.phase(Phase.ENDING)
    if self._waiting:
      self.exits.exit_now(128 + self._waiting[0])

  def _end(self, error: BaseException) -> NoReturn:
    """Ends the command for `error`: a lost peer as every survivor says it, a fault the user can act
    on in its line, anything else in its traceback."""
    if self._peers and self._peers.lost_a_peer(error):
      self._peers.stop_for_lost_peer()
    said = faults.line(error)
    if said is None:
      raise error
    self._fail(said, error.exit_status if isinstance(error, UserError) else 1)

  def _fail(self, line: str, status: int = 1) -> NoReturn:
    """Says the error's line and exits; threads the error stranded (orbax's, waiting minutes for a
    folder a failed save never made) are given a few seconds, then left with os._exit: what they
    report after the line is not shown."""
    self.phase(Phase.ENDING)  # The line is the command's last: a signal from now on only ends it.
    print_error(line)
    nowhere(sys.stderr)
    others = [thread for thread in threading.enumerate()
              if not thread.daemon and thread is not threading.current_thread()]
    deadline = time.monotonic() + ABANDONED_GRACE_S  # Polled: orbax's threads' join() may raise.
    while any(thread.is_alive() for thread in others) and time.monotonic() < deadline:
      time.sleep(0.05)
    if any(thread.is_alive() for thread in others):
      self.exits.release_all()
      self.exits.exit_now(status)
    sys.exit(status)


def start(stopped_line: str) -> Host:
  """A command's first step, before its imports: a Ctrl-C or a SIGTERM ends it at once in
  `stopped_line`; a module this Python lacks, a library the system will not load, or a machine out
  of memory or threads, met where no part of the command said so, is one line too."""
  host = Host()
  host.phase(Phase.STARTING, stopped_line)
  default_hook = sys.excepthook

  def one_line_for_the_set_up_or_the_machine(kind, error, trace) -> None:
    said = faults.line(error) if isinstance(error, Exception) else None
    if said is None:
      default_hook(kind, error, trace)
    else:
      print_error(said)  # Python's exit status: 1.
  sys.excepthook = one_line_for_the_set_up_or_the_machine
  return host
