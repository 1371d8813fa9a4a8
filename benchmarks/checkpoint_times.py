"""Checkpoint costs, side by side in one process: save, restore, fingerprint, and epochs with and without saves.

  python -m benchmarks.checkpoint_times [--data_dir=data/mnist] [--repeats=10]

Trains the default config (784-512-512-10, AdamW: an 8 MB state) on the first 8,000 real test
images. Times are medians over --repeats; the epoch comparison alternates blocks of plain epochs
and epochs each followed by a save (timed until the last write is on disk), so both see the same
machine load.
"""

import os
import pathlib
import statistics
import tempfile
import time


# pylint: disable=g-import-not-at-top,wrong-import-position; the project root must be on the path.
from absl import app
from absl import flags
from absl import logging
import jax

from benchmarks import workload
from configs import default
from data.mnist import load_split
from errors import UserError, fail
from trainer import checkpoints as checkpoint
from trainer.run_setup import make_mesh, set_up_run, state_template

REPEATS = flags.DEFINE_integer('repeats', 10, 'Measurements per figure (the median is shown).')
BLOCK = 3  # Epochs per block of the with/without-saves comparison.


def _ms(seconds: list[float]) -> str:
  return f'{1000 * statistics.median(seconds):7.1f} ms'


def _folder_bytes(folder: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def main(argv: list[str]) -> None:
  del argv
  try:
    if not os.path.isdir(workload.DATA_DIR.value):
      raise UserError(f'data folder {workload.DATA_DIR.value} does not exist; pass '
                      '--data_dir=FOLDER of the canonical MNIST .gz files')
    measure(workload.DATA_DIR.value)
  except UserError as error:
    fail(str(error), 1)


def measure(data_dir: str) -> None:
  """Prints the checkpoint costs for the default config trained on the idx files in `data_dir`."""
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save and restore at info.
  config = default.get_config()
  config.data.source, config.data.dir = 'idx', data_dir
  config.data.train_split, config.data.eval_split = 'test[:8000]', 'test[8000:]'
  config.max_checkpoints_to_keep = 2
  examples = load_split(config.data, config.data.train_split)
  mesh = make_mesh(config)
  run = set_up_run(config, mesh, examples, load_split(config.data, config.data.eval_split))
  state, run_key, epoch = run.state, run.run_key, 0

  def train_epoch() -> None:
    nonlocal state, epoch
    epoch += 1
    state, _ = run.train_epoch(state, epoch)  # Waits for the device's metrics.

  train_epoch()  # Warm-up.
  with tempfile.TemporaryDirectory() as workdir:
    with checkpoint.Checkpoints(workdir, config) as checkpoints:
      pauses, whole_saves = [], []
      for _ in range(REPEATS.value):
        start = time.perf_counter()
        checkpoints.save(epoch + len(pauses), state, run_key)
        pauses.append(time.perf_counter() - start)
        checkpoints.wait()
        whole_saves.append(time.perf_counter() - start)
      epoch += REPEATS.value

      plain, saving = [], []  # Seconds per epoch of each block, background writes included.
      for _ in range(REPEATS.value):
        start = time.perf_counter()
        for _ in range(BLOCK):
          train_epoch()
        plain.append((time.perf_counter() - start) / BLOCK)
        start = time.perf_counter()
        for _ in range(BLOCK):
          train_epoch()
          checkpoints.save(epoch, state, run_key)
        checkpoints.wait()
        saving.append((time.perf_counter() - start) / BLOCK)

      template = state_template(config, mesh, len(examples) // config.batch_size)
      restores, fingerprints = [], []
      for _ in range(REPEATS.value):
        start = time.perf_counter()
        restored = checkpoints.restore(template)
        restores.append(time.perf_counter() - start)
        start = time.perf_counter()
        checkpoint.fingerprint(jax.device_get(
            checkpoint.saved_tree(restored.state, jax.random.key_data(run_key))))
        fingerprints.append(time.perf_counter() - start)
      size = _folder_bytes(os.path.join(workdir, str(restored.epoch)))

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
