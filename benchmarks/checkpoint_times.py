"""Checkpoint costs side by side in one process, then the save cadence in real runs of train.py.

  python -m benchmarks.checkpoint_times [--data_dir=data/mnist] [--repeats=10] [--launches=5]
      [--min_seconds=0.5,2] [--part=all|costs|cadence]

The costs: save, restore, fingerprint, and epochs with and without saves. Trains the default config
(784-512-512-10, AdamW: an 8 MB state) on the first 8,000 real test images. Times are medians over
--repeats; the epoch comparison alternates blocks of plain epochs and epochs each followed by a save
(timed until the last write is on disk), so both see the same machine load. The cadence comparison
launches train.py (the default config, 40 epochs of 2,048 images) with the default cadence, saving
once (at the end) and saving every epoch, plus any --min_seconds, in turn --launches times, and
shows each one's time from launch to exit (median and fastest: on a shared machine the fastest is
the least disturbed) and its CPU time (user + system).
"""

import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags
import jax

from benchmarks import workload
from configs import default
from data.mnist import load_split
from errors import UserError
from mlp import steps
from trainer import checkpoints as checkpoint
from trainer import config_rules
from trainer.host.boundary import Host
from trainer.host.run_dir import RunDirectory
from trainer.plan import resolve

REPEATS = flags.DEFINE_integer('repeats', 10, 'Measurements per figure (the median is shown).')
LAUNCHES = flags.DEFINE_integer('launches', 5, 'train.py runs per cadence (the median is shown).',
                                lower_bound=1)
MIN_SECONDS = flags.DEFINE_list('min_seconds', [], 'Further checkpoint_min_seconds to time.')
PART = flags.DEFINE_enum('part', 'all', ['all', 'costs', 'cadence'], 'What to measure.')
BLOCK = 3  # Epochs per block of the with/without-saves comparison.
# The cadence runs: the default config, fast epochs (a saving every epoch costs the most).
CADENCE_RUN = ('--config=configs/default.py', '--config.num_epochs=40',
               '--config.data.train_split=train[:2048]')


def _ms(seconds: list[float]) -> str:
  return f'{1000 * statistics.median(seconds):7.1f} ms'


def _folder_bytes(folder: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def check_min_seconds() -> None:
  """--min_seconds: each a finite number of seconds, 0 or more, and only where cadences are timed:
  else train.py would refuse it after the minutes of --part=costs."""
  kind, within, _ = config_rules.NUMBERS['checkpoint_min_seconds']  # As train.py checks it.
  for text in MIN_SECONDS.value:
    try:
      seconds = float(text)
    except ValueError:
      seconds = math.nan
    if not (math.isfinite(seconds) and within(seconds)):
      raise UserError(f'--min_seconds={",".join(MIN_SECONDS.value)}: {text!r} is not {kind} of '
                      'seconds; pass e.g. --min_seconds=0.5,5')
  if MIN_SECONDS.value and PART.value == 'costs':
    raise UserError('--min_seconds adds cadences to time, which --part=costs leaves out; pass '
                    '--part=all or --part=cadence, or leave --min_seconds out')


def main(argv: list[str]) -> None:
  del argv
  check_min_seconds()
  data_dir = workload.check_data_dir(without=None)
  if PART.value != 'cadence':
    measure(data_dir)
  if PART.value != 'costs':
    print_cadences(data_dir)


class _Training:
  """The trainer's epochs, numbered on from where the last one (or the last save) left off."""

  def __init__(self, trainer: workload.TrainerRun):
    self.trainer, self.epoch = trainer, 0

  def train(self) -> None:
    """One more epoch, as the trainer runs it."""
    self.epoch += 1
    self.trainer.epoch(self.epoch)


def time_saves(checkpoints: checkpoint.Checkpoints,
               training: _Training) -> tuple[list[float], list[float]]:
  """Seconds each save holds training up, and until it is on disk, saving one state repeatedly."""
  pauses, whole_saves = [], []
  for _ in range(REPEATS.value):
    training.epoch += 1
    start = time.perf_counter()
    checkpoints.save(training.epoch, training.trainer.state, force=True)
    pauses.append(time.perf_counter() - start)
    checkpoints.wait()
    whole_saves.append(time.perf_counter() - start)
  return pauses, whole_saves


def time_epochs(checkpoints: checkpoint.Checkpoints,
                training: _Training) -> tuple[list[float], list[float]]:
  """Seconds per epoch of alternating blocks without and with a save after every epoch."""
  plain, saving = [], []  # Background writes included.
  for _ in range(REPEATS.value):
    start = time.perf_counter()
    for _ in range(BLOCK):
      training.train()
    plain.append((time.perf_counter() - start) / BLOCK)
    start = time.perf_counter()
    for _ in range(BLOCK):
      training.train()
      checkpoints.save(training.epoch, training.trainer.state, force=True)
    checkpoints.wait()
    saving.append((time.perf_counter() - start) / BLOCK)
  return plain, saving


def time_restores(checkpoints: checkpoint.Checkpoints, template: steps.TrainState,
                  run_key: jax.Array) -> tuple[list[float], list[float], int]:
  """Seconds per verified restore and per fingerprint of the restored state, and its epoch."""
  restores, fingerprints = [], []
  for _ in range(REPEATS.value):
    start = time.perf_counter()
    restored = checkpoints.restore(template)
    assert restored is not None, 'the checkpoint just saved'
    restores.append(time.perf_counter() - start)
    start = time.perf_counter()
    checkpoint.fingerprint(jax.device_get(
        checkpoint.saved_tree(restored.state, jax.random.key_data(run_key))))
    fingerprints.append(time.perf_counter() - start)
    epoch = restored.epoch
  return restores, fingerprints, epoch


def measure(data_dir: str) -> None:
  """Prints the checkpoint costs for the default config trained on the idx files in `data_dir`."""
  config = default.get_config()
  config.data.source, config.data.dir = 'idx', data_dir
  config.data.train_split = 'train[:8000]'
  config.max_checkpoints_to_keep = 2
  examples = load_split(config.data, config.data.train_split)
  training = _Training(workload.TrainerRun(config, examples))
  training.train()  # Warm-up.
  template = training.trainer.template
  with tempfile.TemporaryDirectory() as workdir:
    with checkpoint.Checkpoints(RunDirectory(workdir), resolve(config), Host()) as checkpoints:
      pauses, whole_saves = time_saves(checkpoints, training)
      plain, saving = time_epochs(checkpoints, training)
      restores, fingerprints, epoch = time_restores(checkpoints, template,
                                                    training.trainer.run_key)
      size = _folder_bytes(os.path.join(workdir, str(epoch)))

  print(f'{jax.device_count()} {jax.default_backend()} device(s); state {size / 2**20:.1f} MiB on '
        f'disk; medians of {REPEATS.value}')
  print(f'save, training held up (copy to host, orbax start):            {_ms(pauses)}')
  print(f'save, until complete on disk:                                  {_ms(whole_saves)}')
  print(f'restore + verify (metadata, state, fingerprint):               {_ms(restores)}')
  print(f'  of which the fingerprint (SHA-256 of the state):             {_ms(fingerprints)}')
  share = statistics.median(fingerprints) / statistics.median(pauses)
  print(f'  the fingerprint, if hashed in the save pause (orbax custom_metadata): +{share:.0%}')
  ratio = statistics.median(saving) / statistics.median(plain)
  print(f'epoch time, saving after every epoch / not saving: {_ms(saving)} / {_ms(plain)} = '
        f'{ratio:.3f}')



def cadences() -> dict[str, list[str]]:
  """Each cadence to time, by name: the flags that set it."""
  every = default.get_config().checkpoint_min_seconds
  named = {f'default cadence (checkpoint_min_seconds={every:g})': [],
           'saving once (checkpoint_every_epochs=1000)': ['--config.checkpoint_every_epochs=1000'],
           'every epoch (checkpoint_min_seconds=0)': ['--config.checkpoint_min_seconds=0']}
  for seconds in MIN_SECONDS.value:
    named[f'checkpoint_min_seconds={seconds}'] = [f'--config.checkpoint_min_seconds={seconds}']
  return named


def _cpu_seconds() -> float:
  """User and system seconds of the ended child processes so far."""
  used = resource.getrusage(resource.RUSAGE_CHILDREN)
  return used.ru_utime + used.ru_stime


def time_cadences(data_dir: str) -> dict[str, list[tuple[float, float]]]:
  """(Seconds from launch to exit, CPU seconds) of each train.py run per cadence; each round
  launches every one, in an order that turns, so all see the same machine load."""
  named = cadences()
  seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in named}
  with tempfile.TemporaryDirectory() as root:
    for launch in range(LAUNCHES.value + 1):  # The first round fills the compilation cache.
      order = list(named)[launch % len(named):] + list(named)[:launch % len(named)]
      for number, name in enumerate(order):
        command = [sys.executable, 'train.py', *CADENCE_RUN, f'--config.data.dir={data_dir}',
                   *named[name], f'--workdir={os.path.join(root, f"{launch}-{number}")}']
        start, cpu = time.perf_counter(), _cpu_seconds()
        done = subprocess.run(command, cwd=workload.ROOT, capture_output=True, text=True)
        if done.returncode:
          raise UserError(f'train.py failed ({name}): {done.stderr.strip()[-300:]}')
        if launch:
          seconds[name].append((time.perf_counter() - start, _cpu_seconds() - cpu))
  return seconds


def print_cadences(data_dir: str) -> None:
  """The cadence table: each one's launch-to-exit and CPU seconds, and ratios to saving once."""
  runs = time_cadences(data_dir)
  figures = {name: (statistics.median(w for w, _ in times), min(w for w, _ in times),
                    statistics.median(c for _, c in times)) for name, times in runs.items()}
  once = next(value for name, value in figures.items() if 'once' in name)
  print(f'train.py {" ".join(CADENCE_RUN[1:])}, {LAUNCHES.value} launches each, in turn; seconds '
        '(and ratio to saving once):')
  print(f'  {"":48s} {"launch to exit, median":>24s} {"fastest":>16s} {"CPU, median":>16s}')
  for name, value in figures.items():
    cells = ''.join(f'{v:8.2f} ({v / o:5.3f}x)' for v, o in zip(value, once))
    print(f'  {name:48s}        {cells}')
    print(f'  {"":48s} each: {", ".join(f"{w:.2f}" for w, _ in runs[name])}')


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
