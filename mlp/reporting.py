"""Per-epoch results to their three homes: metrics.jsonl, TensorBoard events and a readable log line."""

import json
import os
import sys
from typing import TextIO

from tensorboardX import SummaryWriter

METRICS_FILE = 'metrics.jsonl'


def format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  minutes, seconds = divmod(seconds, 60)
  if minutes < 60:
    return f'{minutes}m{seconds:02d}s'
  hours, minutes = divmod(minutes, 60)
  return f'{hours}h{minutes:02d}m'


def format_line(record: dict[str, float], num_epochs: int, eta_seconds: float) -> str:
  """The one log line of an epoch, with the same figures as its metrics.jsonl record."""
  width = len(str(num_epochs))
  return (f'epoch {record["epoch"]:>{width}}/{num_epochs}  '
          f'train loss {record["train_loss"]:.4f} acc {100 * record["train_accuracy"]:6.2f}%  '
          f'eval loss {record["eval_loss"]:.4f} acc {100 * record["eval_accuracy"]:6.2f}%  '
          f'{record["epoch_seconds"]:.2f}s  {record["train_images_per_second"]:,.0f} img/s  '
          f'ETA {format_duration(eta_seconds)}')


class Reporter:
  """Writes each epoch's record; append-only, so a rerun extends the same files.

  In a multi-process run only process 0 reports (`enabled`): the others compute the same records
  and write nothing, so there is one set of files and one log.
  """

  def __init__(self, workdir: str, num_epochs: int, stream: TextIO | None = None,
               enabled: bool = True):
    self._workdir = workdir
    self._num_epochs = num_epochs
    self._stream = stream or sys.stdout
    self._enabled = enabled
    self._writer = SummaryWriter(workdir) if enabled else None
    self._seconds: list[float] = []

  def write(self, record: dict[str, float]) -> None:
    if not self._enabled:
      return
    with open(os.path.join(self._workdir, METRICS_FILE), 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
    for name, value in record.items():
      if name != 'epoch':
        self._writer.add_scalar(name.replace('_', '/', 1), value, int(record['epoch']))
    self._writer.flush()
    self._seconds.append(record['epoch_seconds'])
    remaining = self._num_epochs - int(record['epoch'])
    eta = remaining * sum(self._seconds) / len(self._seconds)
    print(format_line(record, self._num_epochs, eta), file=self._stream, flush=True)

  def log(self, message: str) -> None:
    if self._enabled:
      print(message, file=self._stream, flush=True)

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
