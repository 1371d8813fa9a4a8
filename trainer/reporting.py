"""Every line a run prints and every record it writes: metrics.jsonl, eval.jsonl, TensorBoard. The
records are built and read here alone: an epoch's `train_*` and `eval_*` figures (of members, also
each one's `*_by_member` and their `eval_ensemble_*`), its timings and learning rate."""

import contextlib
import io
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from PIL import Image
# TensorBoard's own event protos and TFRecord framing (length, masked CRC32C): they import neither
# TensorFlow nor PyTorch (tensorboardX imports PyTorch wherever it is installed: seconds at start).
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

from data.splits import parse_split
from trainer import pictures
from trainer.host.boundary import Host
from trainer.host.exits import this_command
from trainer.host.run_dir import RunDirectory
from trainer.members import command_of, label
from trainer.plan import AXIS, MEMBERS, Plan
from trainer.programs import Epoch, Programs

METRICS_FILE = 'metrics.jsonl'
# TensorBoard tags: a record's field with its first _ as a /, grouping train/ and eval/, or these.
TAGS = {'learning_rate': 'train/learning_rate'}
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


def _prefixed(split: str, figures: dict[str, Any]) -> dict[str, Any]:
  """A pass's figures as a record names them: `eval_loss`, `eval_ensemble_accuracy`."""
  return {f'{split}_{name}': value for name, value in figures.items()}


def evaluated_again(recorded: dict[str, Any], evaluated: dict[str, Any]) -> dict[str, Any]:
  """A recorded epoch with the eval figures of an evaluation now (of this run's eval split)."""
  return {**recorded, **{name: value for name, value in evaluated.items()
                         if name in recorded and name.startswith('eval_')}}


def members_part(record: dict[str, Any], split: str = 'eval') -> str:
  """After a split's figures of members (which are their means): their range, the best of a
  sweep's, and the ensemble's accuracy; '' for a lone model."""
  each = record.get(f'{split}_accuracy_by_member')
  if not each:
    return ''
  best = f'; best {label(best_member(record))}' if 'members' in record else ''
  return (f' (mean of {len(each)} models, {100 * min(each):.2f}-{100 * max(each):.2f}%{best}; '
          f'ensemble {100 * record[f"{split}_ensemble_accuracy"]:.2f}%)')


def ranked(record: dict[str, Any]) -> list[int]:
  """The members' indices by their eval accuracy, best first (the earlier member of a tie)."""
  each = record['eval_accuracy_by_member']
  return sorted(range(len(each)), key=lambda k: (-each[k], k))


def best_member(record: dict[str, Any]) -> dict[str, Any]:
  """The sweep's member (its values and seed) of the best eval accuracy in the record."""
  return record['members'][ranked(record)[0]]


def members_table(record: dict[str, Any], split: str) -> list[str]:
  """A sweep's members by eval accuracy, a line each, best first."""
  each = record['eval_accuracy_by_member']
  return [f'members by eval accuracy on {split}, epoch {record["epoch"]}:', *(
      f'  {100 * each[k]:6.2f}%  eval loss {record["eval_loss_by_member"][k]:.4f}  member {k}: '
      f'{label(record["members"][k])}' for k in ranked(record))]


def members_summary(record: dict[str, Any], seed: int) -> str:
  """The end of a run of members: their eval accuracies' mean and spread, and the ensemble's."""
  each = np.array(record['eval_accuracy_by_member'])
  return (f'{len(each)} models (seeds {seed} to {seed + len(each) - 1}): eval accuracy '
          f'{100 * each.mean():.2f}% ± {100 * each.std(ddof=1):.2f}% (mean ± standard deviation); '
          f'their ensemble (mean probabilities) {100 * record["eval_ensemble_accuracy"]:.2f}%')


def format_line(record: dict[str, Any], num_epochs: int, eta_seconds: float) -> str:
  """The one log line of an epoch, with the same figures as its metrics.jsonl record."""
  width = len(str(num_epochs))
  return (f'epoch {record["epoch"]:>{width}}/{num_epochs}  '
          f'train loss {record["train_loss"]:.4f} acc {100 * record["train_accuracy"]:6.2f}%  '
          f'eval loss {record["eval_loss"]:.4f} acc {100 * record["eval_accuracy"]:6.2f}%'
          f'{members_part(record)}  {record["epoch_seconds"]:.2f}s  '
          f'{record["train_images_per_second"]:,.0f} img/s  '
          f'ETA {format_duration(eta_seconds)}')


def scalars(record: dict[str, Any]) -> list[tuple[str, float]]:
  """A record's TensorBoard scalars by tag; a list of members' figures, one per member, tagged by
  its values in a sweep (`/learning_rate=0.002 seed=0`), else by its place (`/0`...)."""
  tagged: list[tuple[str, float]] = []
  members = [label(m) for m in record.get('members', [])]
  for name, value in record.items():
    tag = TAGS.get(name, name.replace('_', '/', 1))
    if isinstance(value, list) and name != 'members':
      tagged.extend((f'{tag}/{members[k] if members else k}', each)
                    for k, each in enumerate(value))
    elif not isinstance(value, list) and name != 'epoch':
      tagged.append((tag, value))
  return tagged


def read_records(run_dir: RunDirectory, name: str = METRICS_FILE) -> list[dict]:
  """A JSON-lines file's records; none if there is no such file."""
  return _parse_records(run_dir.read_bytes(name) or b'')


def _parse_records(data: bytes) -> list[dict]:
  """The records of JSON lines; a line that holds no JSON object is skipped, as one torn by a kill
  mid-write (older runs appended) or damaged (a byte that is not UTF-8)."""
  records = []
  for line in data.splitlines():
    try:
      record = json.loads(line.decode('utf-8'))
    except ValueError:  # Not JSON, or not UTF-8 (UnicodeDecodeError).
      continue
    if isinstance(record, dict):
      records.append(record)
  return records


def keep_records_through(run_dir: RunDirectory, epoch: int) -> list[dict]:
  """metrics.jsonl without its records past `epoch`, so a resumed run writes no epoch twice."""
  data = run_dir.read_bytes(METRICS_FILE)  # Read once: on a bucket, each read is a download.
  kept = [r for r in _parse_records(data or b'') if int(r.get('epoch', 0)) <= epoch]
  if data is not None:
    _write_records(run_dir, METRICS_FILE, kept)
  return kept


def _write_records(run_dir: RunDirectory, name: str, records: list[dict]) -> None:
  """The whole file anew: an object store cannot append, and a reader never sees half a line."""
  run_dir.write(name, ''.join(json.dumps(r) + '\n' for r in records))


def write_picture(run_dir: RunDirectory, name: str, pixels: np.ndarray) -> bytes:
  """A picture (uint8 [H, W, 3]) as NAME.png in the run directory, written whole (a viewer never
  sees half a file); returns the PNG's bytes."""
  png = io.BytesIO()
  Image.fromarray(pixels).save(png, format='PNG')
  run_dir.write(f'{name}.png', png.getvalue())
  return png.getvalue()


class _EventsFile:
  """TensorBoard's events, written as they come with no thread or queue (unlike SummaryWriter): a
  refused write is then the user's one line, never a thread's traceback or a blocked run."""

  def __init__(self, run_dir: RunDirectory, suffix: str):
    self._run_dir, self._whole = run_dir, b''
    self._name = f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}'
    self.write(Event(file_version='brain.Event:2'))

  def write(self, event: Event) -> None:
    """Appended on a disk, where a live TensorBoard reads on from where it stopped; a bucket's
    object cannot be appended to, so it is uploaded whole."""
    event.wall_time = time.time()
    framed = io.BytesIO()
    RecordWriter(framed).write(event.SerializeToString())
    if self._run_dir.remote:
      self._whole += framed.getvalue()
      self._run_dir.write(self._name, self._whole)
    else:
      self._run_dir.append(self._name, framed.getvalue())


class Reporter:
  """The run's one voice: log lines, and the run directory's metrics and events.

  metrics.jsonl is the record of truth: `start(epoch)` drops its lines past `epoch`, and has
  TensorBoard drop its events past `epoch` too, the way SummaryWriter(purge_step=) does.
  In a multi-process run process 0 alone says and writes (the host decides): the others compute
  the same records, so there is one set of files and one log.
  """

  def __init__(self, run_dir: RunDirectory, plan: Plan, host: Host):
    self._run_dir, self._num_epochs, self._host = run_dir, plan.num_epochs, host
    self._split, self._writes, self._seed = plan.data.eval_split, host.primary, plan.seed
    self._profile_epoch = plan.profile_epoch
    # Members that vary fields, as each record names them (a run of seeds alone needs no names).
    self._members = [member.as_dict() for member in plan.members] if plan.varied else None
    self._records: list[dict] = []
    self._seconds: list[float] = []
    self._events: _EventsFile | None = None

  def evaluation_record(self, epoch: int, evaluated: dict[str, Any],
                        per_digit: list[float | None]) -> dict[str, Any]:
    """A checkpoint scored on the eval split: a record of eval.jsonl (a sweep's members named)."""
    return {'epoch': epoch, 'eval_split': self._split, **_prefixed('eval', evaluated),
            'eval_accuracy_per_digit': per_digit, **self._named_members()}

  def epoch_record(self, epoch: Epoch) -> dict[str, Any]:
    """An epoch's record: its figures, its timing, its learning rate (in a sweep of it, each
    member's), a sweep's members."""
    seconds, train_seconds, images = epoch.timing
    return {'epoch': epoch.number, **_prefixed('train', epoch.trained),
            **_prefixed('eval', epoch.evaluated), 'epoch_seconds': seconds,
            'train_images_per_second': images / train_seconds,
            'learning_rate': epoch.learning_rate, **self._named_members()}

  def _named_members(self) -> dict[str, Any]:
    """A sweep's record's names of its members (a run of seeds alone needs none)."""
    return {'members': self._members} if self._members else {}

  def start(self, start_epoch: int) -> None:
    """Opens the files for epochs after `start_epoch`, dropping any record past it."""
    if not self._writes:
      return
    self._records = keep_records_through(self._run_dir, start_epoch)
    # The suffix keeps a run resumed in the same second from overwriting the last one's events.
    self._events = _EventsFile(self._run_dir, f'.from-epoch-{start_epoch}')
    # SummaryWriter(purge_step=start_epoch + 1)'s restart event: TensorBoard drops the events of
    # the steps from there on that earlier files hold.
    self._events.write(Event(step=start_epoch + 1, session_log=SessionLog(status=SessionLog.START)))

  def write(self, record: dict[str, Any]) -> None:
    """An epoch's record: to metrics.jsonl, TensorBoard and the log, with the run's ETA."""
    self._seconds.append(record['epoch_seconds'])
    eta = (self._num_epochs - int(record['epoch'])) * sum(self._seconds) / len(self._seconds)
    if self._writes:
      self._records.append(record)
      _write_records(self._run_dir, METRICS_FILE, self._records)
      assert self._events is not None, 'written after start()'
      self._events.write(Event(step=int(record['epoch']), summary=Summary(value=[
          Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(record)])))
    self.log(format_line(record, self._num_epochs, eta))

  def pictures(self, pictures: dict[str, np.ndarray], epoch: int) -> None:
    """Each picture (uint8 [H, W, 3]) as NAME.png in the run directory and a TensorBoard image."""
    if not self._writes:
      return
    images = []
    for name, pixels in pictures.items():
      png = write_picture(self._run_dir, name, pixels)
      height, width, channels = pixels.shape
      images.append(Summary.Value(tag=name, image=Summary.Image(
          height=height, width=width, colorspace=channels, encoded_image_string=png)))
    if self._events is None:  # An evaluation alone (eval_only) has no events file open.
      self._events = _EventsFile(self._run_dir, f'.eval-epoch-{epoch}')
    self._events.write(Event(step=epoch, summary=Summary(value=images)))

  def draw_curves(self) -> None:
    """curves.png, from every epoch's record (a resumed run's earlier ones too), and its
    TensorBoard image."""
    if self._records:
      title = f'learning curves, evaluated on {self._split}'
      self.pictures({'curves': pictures.draw_curves(self._records, title)},
                    int(self._records[-1]['epoch']))

  @contextlib.contextmanager
  def traced(self, epoch: int) -> Iterator[None]:
    """Traces what runs inside, if `epoch` is the plan's profile_epoch, with jax.profiler into the
    run directory (TensorBoard, Perfetto)."""
    if not (epoch == self._profile_epoch and self._writes):
      yield
      return
    with self._run_dir.during('writing'), jax.profiler.trace(str(self._run_dir),
                                                             create_perfetto_trace=True):
      yield
    traces = sorted(self._run_dir.path().glob('plugins/profile/*'))
    self.log(f'traced epoch {epoch} into {traces[-1]} (TensorBoard\'s profile tab with '
             f'--logdir={self._run_dir}, once pip install -r requirements/profile.txt has added '
             'it; or its perfetto_trace.json.gz in ui.perfetto.dev)')

  def log(self, message: str) -> None:
    self._host.say(message)

  def recorded(self, epoch: int) -> dict | None:
    """The newest metrics.jsonl record of `epoch` (kept by start()), if there is one."""
    matches = [r for r in self._records if r.get('epoch') == epoch]
    return matches[-1] if matches else None

  def evaluation(self, record: dict) -> None:
    """An evaluated checkpoint: one line in eval.jsonl and one on the console."""
    if self._writes:
      _write_records(self._run_dir, EVAL_FILE, [*read_records(self._run_dir, EVAL_FILE), record])
    self.log(f'checkpoint of epoch {record["epoch"]} on {record["eval_split"]}: '
             f'eval loss {record["eval_loss"]:.4f} acc {100 * record["eval_accuracy"]:6.2f}%'
             f'{members_part(record)}')
    if 'members' in record:
      self.sweep_table(record)

  def finished(self, record: dict[str, Any], save_pauses: list[float]) -> None:
    """The end of a run: its members' summary, or a sweep's table, where the last checkpoint is,
    and how long saves held training up."""
    if 'members' in record:
      self.sweep_table(record)
    elif 'eval_accuracy_by_member' in record:
      self.log(members_summary(record, self._seed))
    pauses = sorted(save_pauses)
    self.log(f'saved the checkpoint of epoch {self._num_epochs} in {self._run_dir} (training '
             f'paused a median {1000 * pauses[len(pauses) // 2]:.0f} ms per save; orbax writes in '
             'the background)')


  def sweep_table(self, record: dict[str, Any]) -> None:
    """A sweep's members by eval accuracy, the best one's command to train it alone, and a warning
    where they were scored on the test set: a recipe chosen there has no honest test score."""
    for line in members_table(record, self._split):
      self.log(line)
    best = ranked(record)[0]
    member = record['members'][best]
    self.log(f'best: member {best}, {label(member)}; trains alone with: '
             f'{command_of(member, this_command(), f"{self._run_dir}-member{best}")}')
    if parse_split(self._split).name == 'test':
      self._host.warn(f'the members were scored on the test set ({self._split}): a recipe chosen '
                      'there has no honest test score; choose on the validation split '
                      '(--config=FILE:validation), then score the chosen recipe on test')


def start_line(programs: Programs, eval_count: int) -> str:
  """What trains, where and how."""
  plan = programs.plan
  assert programs.train_data is not None, 'a training run'
  return (f'training on {len(programs.train_data[1]):,} images ({plan.data.train_split}), '
          f'evaluating on {eval_count:,} ({plan.data.eval_split}); '
          f'{plan.steps_per_epoch} steps of {plan.spec.batch_size} per epoch in {plan.dtype}, '
          f'matmul precision {plan.precision}, {placement(plan)}; '
          f'compiled in {programs.compile_seconds:.1f}s')


def _members_said(plan: Plan) -> str:
  """Which members: their seeds, and the values of the fields they vary."""
  seeds = sorted({member.seed for member in plan.members})
  seeds_said = f'seeds {seeds[0]} to {seeds[-1]}' if len(seeds) > 1 else f'seed {seeds[0]}'
  said = '; '.join(f'{name} {", ".join(f"{value:g}" for value in values)}' for name, values in (
      (name, dict.fromkeys(member.values[name] for member in plan.members))
      for name in plan.varied))
  return f'{said}; each with {seeds_said}' if plan.varied else seeds_said


def placement(plan: Plan) -> str:
  """How and where the epochs run, for the log."""
  mode, mesh = plan.mode, plan.mesh
  across = f' in {jax.process_count()} processes' if jax.process_count() > 1 else ''
  per_device = (f', {plan.spec.batch_size // mesh.shape[AXIS]} per device per step'
                if mode != 'jit' else '')
  shards = mesh.shape.get(MEMBERS, 1)
  spread = (f', {len(plan.members) // shards} per device (member_shards={shards})' if shards > 1
            else '')
  members = (f'; {len(plan.members)} models side by side ({_members_said(plan)}){spread}'
             if plan.members else '')
  return (f'{mode} on {mesh.size} {jax.default_backend()} device{"s" if mesh.size > 1 else ""}'
          f'{across}{per_device}{members}')
