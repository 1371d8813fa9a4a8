"""SIGTERM and SIGINT become a request to stop at the next epoch boundary, after a checkpoint.

Preemptible machines (TPU VMs, spot instances) get a SIGTERM shortly before they go away.
"""

import signal
import types
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """Raised once a signal-stopped run's checkpoint is on disk; train.py adds how to resume."""

  def __init__(self, signal_name: str, epoch: int, directory: str):
    super().__init__(f'stopped by {signal_name} after epoch {epoch}, whose checkpoint is saved in '
                     f'{directory}')
    self.exit_status = 128 + signal.Signals[signal_name].value  # The shell's status for the signal.


class StopRequest:
  """While entered, records the first SIGTERM or SIGINT instead of dying; call it to poll.

  A second Ctrl-C interrupts at once, as usual.
  """

  def __init__(self) -> None:
    self.signal_name: str | None = None
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> 'StopRequest':
    for signum in STOP_SIGNALS:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def __call__(self) -> str | None:
    """The name of the signal that asked to stop, or None."""
    return self.signal_name

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    if self.signal_name is None:
      self.signal_name = signal.Signals(signum).name
      signal.signal(signal.SIGINT, signal.default_int_handler)
