"""kill -9 at random moments of a real run, then the same command again: does every rerun end exactly?

  python -m benchmarks.kill_trials [--trials=20] [--seed=0]

Runs a short real-data training once uninterrupted, then, per trial, starts it in a fresh run
directory and SIGKILLs it at a random time: in one trial of three drawn over the whole run
(start-up included), in the others over its epochs, where the background saves and their finalize
happen. Every other trial kills the rerun too (during its restore and TensorBoard rebuild, or
later); then the same command runs to the end. Each final metrics.jsonl
(timings aside) and the final checkpoint's state fingerprint must equal the uninterrupted run's.
"""

import json
import pathlib
import random
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from benchmarks import workload

_TRIALS = flags.DEFINE_integer('trials', 20, 'Runs to kill and resume.', lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the kill times.')
EPOCHS = 12
OVERRIDES = {'data.source': 'idx', 'data.train_split': 'test[:4096]',
             'data.eval_split': 'test[8000:]', 'num_epochs': EPOCHS,
             'model.hidden_sizes': '(64, 64)', 'max_checkpoints_to_keep': 2}


def _command(workdir: pathlib.Path) -> list[str]:
  flags_ = [f'--config.{name}={value}' for name, value in OVERRIDES.items()]
  return [sys.executable, 'train.py', '--config=configs/default.py', *flags_,
          f'--config.data.dir={workload.DATA_DIR.value}', f'--workdir={workdir}']


def outcome(workdir: pathlib.Path) -> tuple[list[dict], str]:
  """The run's metrics without timings, and its final checkpoint's fingerprint."""
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  values = [{k: v for k, v in r.items() if k not in ('epoch_seconds', 'train_images_per_second')}
            for r in records]
  meta = json.loads((workdir / str(EPOCHS) / 'meta' / 'metadata').read_text())
  return values, meta['fingerprint']


def phase(workdir: pathlib.Path, stdout: str) -> str:
  """What the killed run was doing, read off its log and the files it left."""
  if list(workdir.glob('*.orbax-checkpoint-tmp*')):
    return 'during a save'
  if 'saved the checkpoint of epoch' in stdout:
    return 'at the end'
  if 'epoch ' in stdout:
    return 'training'
  return 'restoring' if 'resumed from' in stdout else 'start-up'


def kill_after(workdir: pathlib.Path, seconds: float) -> str:
  """Starts the run, SIGKILLs it after `seconds` (if still running); the phase it was in."""
  with subprocess.Popen(_command(workdir), cwd=workload.ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True) as process:
    try:
      process.wait(timeout=seconds)
      return 'finished first'
    except subprocess.TimeoutExpired:
      where = phase(workdir, '')
      process.kill()
      stdout = process.communicate()[0]
      return where if where == 'during a save' else phase(workdir, stdout)


def timed_run(workdir: pathlib.Path) -> tuple[float, float]:
  """An uninterrupted run: seconds to its first epoch line, and to its end."""
  start, first_epoch = time.perf_counter(), None
  with subprocess.Popen(_command(workdir), cwd=workload.ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True) as process:
    for line in process.stdout:
      if first_epoch is None and line.startswith('epoch '):
        first_epoch = time.perf_counter() - start
  if process.returncode:
    raise SystemExit(f'error: the uninterrupted run failed (exit status {process.returncode})')
  return first_epoch, time.perf_counter() - start


def trial(root: pathlib.Path, number: int, window: tuple[float, float], rng: random.Random,
          reference: tuple[list[dict], str]) -> str:
  """One killed run (two kills in odd trials), then a rerun to the end: its table row."""
  workdir = root / f'trial{number}'
  first_epoch, duration = window
  at = rng.uniform(0 if number % 3 == 0 else first_epoch * 0.9, duration)
  where = kill_after(workdir, at)
  if number % 2:
    again = rng.uniform(0, duration)
    where += f'; rerun killed at {again:.1f}s: {kill_after(workdir, again)}'

  finished = subprocess.run(_command(workdir), cwd=workload.ROOT, capture_output=True, text=True)
  same = finished.returncode == 0 and outcome(workdir) == reference
  return f'{number:5d}  {at:6.1f}s  {where:60s}  {"identical" if same else "DIFFERENT"}'


def main(argv: list[str]) -> None:
  del argv
  rng = random.Random(_SEED.value)
  with tempfile.TemporaryDirectory() as folder:
    root = pathlib.Path(folder)
    window = timed_run(root / 'reference')
    reference = outcome(root / 'reference')
    print(f'uninterrupted run: {window[1]:.1f}s, {EPOCHS} epochs from {window[0]:.1f}s; kill '
          f'times drawn from 0 (every third trial) or {0.9 * window[0]:.1f}s to {window[1]:.1f}s\n'
          f'trial  killed  phase{"":55s}  outcome')
    rows = [trial(root, n, window, rng, reference) for n in range(1, _TRIALS.value + 1)]
    print('\n'.join(rows))
  same = sum(row.endswith('identical') for row in rows)
  print(f'{same} of {len(rows)} resumed to identical metrics and fingerprint')
  sys.exit(0 if same == len(rows) else 1)


if __name__ == '__main__':
  app.run(main, flags_parser=workload.parse_flags)
