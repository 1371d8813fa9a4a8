"""Per-epoch results to their three homes: metrics.jsonl, TensorBoard events and a readable log line."""

import json
import os
import sys
from typing import TextIO

from tensorboardX import SummaryWriter

METRICS_FILE = 'metrics.jsonl'
EVAL_FILE = 'eval.jsonl'  # Results of --config.eval_only=True runs.


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


def warn(message: str) -> None:
  """Something the user should know that does not stop the run: one line on stderr."""
  print(f'warning: {message}', file=sys.stderr, flush=True)


def read_records(workdir: str) -> list[dict]:
  """metrics.jsonl's records; a line torn by a kill mid-write is skipped, as it was never finished."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records


def keep_records_through(workdir: str, epoch: int) -> list[dict]:
  """Drops metrics.jsonl lines past `epoch`, so a resumed run appends no epoch twice; returns the rest."""
  path = os.path.join(workdir, METRICS_FILE)
  kept = [r for r in read_records(workdir) if int(r.get('epoch', 0)) <= epoch]
  if os.path.exists(path):
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      f.writelines(json.dumps(r) + '\n' for r in kept)
    os.replace(path + '.tmp', path)
  return kept


def record_evaluation(workdir: str, record: dict, stream: TextIO | None = None) -> None:
  """An eval-only result: one line in eval.jsonl and one on the console."""
  with open(os.path.join(workdir, EVAL_FILE), 'a', encoding='utf-8') as f:
    f.write(json.dumps(record) + '\n')
  print(f'checkpoint of epoch {record["epoch"]} on {record["eval_split"]}: '
        f'eval loss {record["eval_loss"]:.4f} acc {100 * record["eval_accuracy"]:6.2f}%',
        file=stream or sys.stdout, flush=True)


class Reporter:
  """Writes each epoch's record, appending to the run directory's files after `start_epoch`.

  metrics.jsonl is the record of truth: a (re)started run drops its lines past `start_epoch`, and
  rebuilds the TensorBoard scalars from the rest in a new events file that purges all older ones.
  (tensorboardX writes from a background thread, so a killed run can lose its last events.)
  In a multi-process run only process 0 reports (`enabled`): the others compute the same records
  and write nothing, so there is one set of files and one log.
  """

  def __init__(self, workdir: str, num_epochs: int, stream: TextIO | None = None, *,
               start_epoch: int = 0, enabled: bool = True):
    self._workdir = workdir
    self._num_epochs = num_epochs
    self._stream = stream or sys.stdout
    self._enabled = enabled
    self._seconds: list[float] = []
    self._writer = None
    if not enabled:
      return
    kept = keep_records_through(workdir, start_epoch)
    # The suffix keeps a run resumed within the same second from overwriting the last one's events.
    self._writer = SummaryWriter(workdir, purge_step=1,
                                 filename_suffix=f'.from-epoch-{start_epoch}')
    for record in kept:
      self._add_scalars(record)

  def write(self, record: dict[str, float]) -> None:
    if not self._enabled:
      return
    with open(os.path.join(self._workdir, METRICS_FILE), 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
    self._add_scalars(record)
    self._seconds.append(record['epoch_seconds'])
    remaining = self._num_epochs - int(record['epoch'])
    eta = remaining * sum(self._seconds) / len(self._seconds)
    print(format_line(record, self._num_epochs, eta), file=self._stream, flush=True)

  def _add_scalars(self, record: dict[str, float]) -> None:
    for name, value in record.items():
      if name != 'epoch':
        self._writer.add_scalar(name.replace('_', '/', 1), value, int(record['epoch']))
    self._writer.flush()

  def log(self, message: str) -> None:
    if self._enabled:
      print(message, file=self._stream, flush=True)

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
