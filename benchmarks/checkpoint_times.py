"""Checkpoint costs, side by side in one process: save, restore, fingerprint, and epochs with and without saves.

  python -m benchmarks.checkpoint_times [--data_dir=data/mnist] [--repeats=10]

Trains the default config (784-512-512-10, AdamW: an 8 MB state) on the first 8,000 real test
images. Times are medians over --repeats; the epoch comparison alternates blocks of plain epochs
and epochs each followed by a save (timed until the last write is on disk), so both see the same
machine load.
"""

import os
import statistics
import tempfile
import time

from absl import app
from absl import flags
import jax

from benchmarks import workload
from configs import default
from data.mnist import load_split
from errors import UserError, fail
from mlp import batches, steps
from trainer import checkpoints as checkpoint
from trainer.run_setup import state_template

REPEATS = flags.DEFINE_integer('repeats', 10, 'Measurements per figure (the median is shown).')
BLOCK = 3  # Epochs per block of the with/without-saves comparison.


def _ms(seconds: list[float]) -> str:
  return f'{1000 * statistics.median(seconds):7.1f} ms'


def _folder_bytes(folder: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def main(argv: list[str]) -> None:
  del argv
  try:
    measure(workload.check_data_dir(without=None))
  except UserError as error:
    fail(str(error), 1)


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
    checkpoints.save(training.epoch, training.trainer.state, training.trainer.run_key)
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
      checkpoints.save(training.epoch, training.trainer.state, training.trainer.run_key)
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
  template = state_template(config, training.trainer.mesh,
                            batches.whole_batches(len(examples), config.batch_size))
  with tempfile.TemporaryDirectory() as workdir:
    with checkpoint.Checkpoints(workdir, config) as checkpoints:
      pauses, whole_saves = time_saves(checkpoints, training)
      plain, saving = time_epochs(checkpoints, training)
      restores, fingerprints, epoch = time_restores(checkpoints, template,
                                                    training.trainer.run_key)
      size = _folder_bytes(os.path.join(workdir, str(epoch)))

  print(f'{jax.device_count()} {jax.default_backend()} device(s); state {size / 2**20:.1f} MiB on '
        f'disk; medians of {REPEATS.value}')
  print(f'save, training held up (fingerprint, copy to host, orbax start): {_ms(pauses)}')
  print(f'save, until complete on disk:                                  {_ms(whole_saves)}')
  print(f'restore + verify (metadata, state, fingerprint):               {_ms(restores)}')
  print(f'  of which the fingerprint (SHA-256 of the state):             {_ms(fingerprints)}')
  ratio = statistics.median(saving) / statistics.median(plain)
  print(f'epoch time, saving after every epoch / not saving: {_ms(saving)} / {_ms(plain)} = '
        f'{ratio:.3f}')


if __name__ == '__main__':
  app.run(main, flags_parser=workload.parse_flags)
