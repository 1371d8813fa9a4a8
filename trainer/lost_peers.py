"""A multi-process run that loses a process: each survivor ends in one line, never in JAX's abort.

JAX aborts a process whose coordination service reports a lost peer (a C++ fatal log, a stack dump,
exit 134), from a thread of its own and with no hook Python can use (`missed_heartbeat_callback`
cannot be given a Python function: the call fails to convert its status). So on several processes
the run's stderr passes through a relay process, `python -m trainer.lost_peers`, which outlives
the abort and turns it into the run's one line; once that line is out, nothing else follows.
"""

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import BinaryIO

from errors import JAX_ABORT, PEER_LOST

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOST = 'a process of the run was lost'


def lost_a_peer(error: BaseException | None) -> bool:
  """Whether `error` is a multi-process run's collective or barrier failing for a lost process."""
  import jax  # pylint: disable=g-import-not-at-top; the relay never imports JAX
  if jax.process_count() == 1:
    return False
  while error is not None:
    if isinstance(error, jax.errors.JaxRuntimeError) and PEER_LOST.search(str(error)):
      return True
    error = error.__cause__ or error.__context__
  return False


def newest_saved_epoch(directory: str) -> int | None:
  """The newest complete checkpoint's epoch, from the folder names alone (no orbax, no peers).

  Orbax writes a save into a temporary folder and renames it to the epoch once complete, so an
  unfinished save is never counted.
  """
  try:
    epochs = [int(name) for name in os.listdir(directory) if name.isdigit()
              and os.path.isdir(os.path.join(directory, name))]
  except OSError:
    return None
  return max(epochs, default=None)


def message(workdir: str, command: str) -> str:
  """What every surviving process says: the run stopped, where it resumes, and how."""
  newest = newest_saved_epoch(workdir)
  where = (f'the newest checkpoint is epoch {newest} in {workdir}' if newest is not None else
           f'no checkpoint was saved yet in {workdir}')
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


def start_relay(workdir: str, command: str) -> None:
  """Sends this process's stderr through the relay from now on; stderr as it was if none starts."""
  read, write = os.pipe()
  try:
    subprocess.Popen([sys.executable, '-m', 'trainer.lost_peers', workdir, command], stdin=read,
                     stdout=subprocess.DEVNULL, cwd=ROOT)
  except OSError:
    os.close(write)
    return
  finally:
    os.close(read)
  sys.stderr.flush()
  os.dup2(write, 2)
  os.close(write)


def _main(workdir: str, command: str) -> None:
  # The relay ends when the run's stderr closes: a Ctrl-C or a SIGTERM to the whole job is the
  # run's to handle, and its last lines still have to reach the user.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  relay(sys.stdin.buffer, sys.stderr.buffer, lambda: message(workdir, command))


if __name__ == '__main__':
  _main(*sys.argv[1:3])
