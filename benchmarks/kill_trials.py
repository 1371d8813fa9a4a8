"""kill -9 a real run at random moments, then rerun the same command: does each end exactly?

  python -m benchmarks.kill_trials [--trials=20] [--seed=0]

Runs a short real-data training once uninterrupted, then, per trial, starts it in a fresh run
directory and SIGKILLs it at a random time: in two trials of three drawn over its epochs (timed
from its first epoch line), where the background saves and their finalize happen, else over its
start-up. Every other trial kills the rerun too, during its restore, set-up or TensorBoard
rebuild; then the same command runs to the end. Each final metrics.jsonl (timings aside) and the
final checkpoint's state fingerprint must equal the uninterrupted run's.
"""

import json
import pathlib
import random
import subprocess
import sys
import tempfile
import time

from absl import flags

from benchmarks import workload
from trainer.host.boundary import Host

_TRIALS = flags.DEFINE_integer('trials', 20, 'Runs to kill and resume.', lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the kill times.')
EPOCHS = 12
OVERRIDES = {'data.source': 'idx', 'data.train_split': 'train[:4096]',
             'data.eval_split': 'test[:2000]', 'num_epochs': EPOCHS,
             'model.hidden_sizes': '(64, 64)', 'max_checkpoints_to_keep': 2,
             # Every epoch saved, so that kills land in saves: what the trials are after.
             'checkpoint_min_seconds': 0}


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


def kill_after(workdir: pathlib.Path, seconds: float, from_first_epoch: bool) -> str:
  """Starts the run, SIGKILLs it `seconds` after its start or its first epoch line; its phase then.

  Timing from the first epoch line keeps the kill inside the epochs whatever the machine's load.
  """
  with subprocess.Popen(_command(workdir), cwd=workload.ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True) as process:
    seen = ''
    for line in (process.stdout or ()) if from_first_epoch else ():
      seen += line
      if line.startswith('epoch '):
        break
    try:
      process.wait(timeout=seconds)
      return 'finished first'
    except subprocess.TimeoutExpired:
      where = phase(workdir, '')
      process.kill()
      stdout = seen + process.communicate()[0]
      return where if where == 'during a save' else phase(workdir, stdout)


def timed_run(workdir: pathlib.Path) -> tuple[float, float]:
  """An uninterrupted run: seconds to its first epoch line, and to its end."""
  start, first_epoch = time.perf_counter(), None
  with subprocess.Popen(_command(workdir), cwd=workload.ROOT, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, text=True) as process:
    for line in process.stdout or ():
      if first_epoch is None and line.startswith('epoch '):
        first_epoch = time.perf_counter() - start
  if process.returncode or first_epoch is None:
    raise SystemExit(f'error: the uninterrupted run failed (exit status {process.returncode})')
  return first_epoch, time.perf_counter() - start


def trial(root: pathlib.Path, number: int, window: tuple[float, float], rng: random.Random,
          reference: tuple[list[dict], str]) -> str:
  """One killed run (two kills in odd trials), then a rerun to the end: its table row."""
  workdir = root / f'trial{number}'
  first_epoch, duration = window
  in_epochs = number % 3 != 0  # Two trials in three: a kill among the epochs and their saves.
  at = rng.uniform(0, duration - first_epoch if in_epochs else first_epoch)
  where = kill_after(workdir, at, from_first_epoch=in_epochs)
  if number % 2:
    # During the rerun's restore, set-up or TensorBoard rebuild.
    again = rng.uniform(0, first_epoch)
    where += f'; rerun killed at {again:.1f}s: {kill_after(workdir, again, False)}'

  finished = subprocess.run(_command(workdir), cwd=workload.ROOT, capture_output=True, text=True)
  same = finished.returncode == 0 and outcome(workdir) == reference
  when = f'{"epoch 1 +" if in_epochs else "start +"}{at:5.2f}s'
  return f'{number:5d}  {when:15s}  {where:60s}  {"identical" if same else "DIFFERENT"}'


def main(argv: list[str]) -> None:
  del argv
  rng = random.Random(_SEED.value)
  with tempfile.TemporaryDirectory() as folder:
    root = pathlib.Path(folder)
    window = timed_run(root / 'reference')
    reference = outcome(root / 'reference')
    print(f'uninterrupted run: {window[1]:.1f}s, its first epoch line at {window[0]:.1f}s; kills '
          'drawn over the epochs (from the first epoch line) in two trials of three, else over '
          f'the start-up\ntrial  killed at         phase{"":55s}  outcome')
    rows = [trial(root, n, window, rng, reference) for n in range(1, _TRIALS.value + 1)]
    print('\n'.join(rows))
  same = sum(row.endswith('identical') for row in rows)
  print(f'{same} of {len(rows)} resumed to identical metrics and fingerprint')
  sys.exit(0 if same == len(rows) else 1)


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
