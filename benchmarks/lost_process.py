"""kill -9 of one process of a two-process run during a checkpoint save: how soon does the other say
the run's one line and end, and does the same command, rerun at once, end as if never stopped?

  python -m benchmarks.lost_process --workdir=gs://BUCKET/trials [--victim=1] [--trials=3]

Two processes of two simulated CPU devices each train configs/default.py on train[:8192] for 8
epochs (an epoch saved after each); process --victim is killed a random 0 to 0.3 s after epoch 2's
line reaches metrics.jsonl, during that epoch's save. Each trial times the survivor's last stderr
line and its exit from the kill, then reruns the same command at once and compares its
metrics.jsonl (timings aside) with an uninterrupted run's. --workdir may be a local folder; for a
Cloud Storage emulator, export what tests/conftest.py's gcs_emulator sets.
"""

import os
import random
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from benchmarks import workload
from trainer.reporting import read_records
from trainer.host.run_dir import RunDirectory
from trainer.host.boundary import Host

_WORKDIR = flags.DEFINE_string('workdir', None, 'Folder or gs:// prefix for the trials\' runs.',
                               required=True)
_VICTIM = flags.DEFINE_integer('victim', 1, 'The process killed: 0 or 1.', lower_bound=0,
                               upper_bound=1)
_TRIALS = flags.DEFINE_integer('trials', 3, 'Runs to kill and rerun.', lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the kill times.')
OVERRIDES = ('--config.data.train_split=train[:8192]', '--config.num_epochs=8')
TIMINGS = ('epoch_seconds', 'train_images_per_second')


def launch(workdir: str) -> list[subprocess.Popen]:
  """The two processes of one run, as a user would start them on one machine."""
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  return [subprocess.Popen(
      [sys.executable, 'train.py', '--config=configs/default.py', *OVERRIDES,
       f'--workdir={workdir}', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
       f'--process_id={i}'],
      cwd=workload.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
          for i in range(2)]


def metrics(workdir: str) -> list[dict]:
  """The run's metrics.jsonl records, timings aside."""
  return [{k: v for k, v in r.items() if k not in TIMINGS}
          for r in read_records(RunDirectory(workdir))]


def finish(processes: list[subprocess.Popen]) -> list[str]:
  """Each process's last stderr line, once both have ended."""
  return [(p.communicate()[1].strip().splitlines() or [''])[-1] for p in processes]


def kill_in_the_save(processes: list[subprocess.Popen], workdir: str, delay: float) -> float:
  """kill -9 of the victim `delay` s after epoch 2's line reaches metrics.jsonl; when."""
  while len(metrics(workdir)) < 2:
    if any(p.poll() is not None for p in processes):
      raise SystemExit(f'error: the run ended before epoch 2: {finish(processes)}')
    time.sleep(0.01)
  time.sleep(delay)
  processes[_VICTIM.value].kill()
  return time.monotonic()


def survivor_times(survivor: subprocess.Popen, killed: float) -> tuple[float, float, str]:
  """Seconds from the kill to the survivor's last stderr line and to its exit; that line."""
  lines: list[tuple[float, str]] = []
  reader = threading.Thread(target=lambda: lines.extend(
      (time.monotonic() - killed, line.strip()) for line in survivor.stderr or ()))
  reader.start()
  survivor.wait()
  exited = time.monotonic() - killed
  reader.join()
  said, last = lines[-1] if lines else (float('nan'), '')
  return said, exited, last


def trial(number: int, rng: random.Random, reference: list[dict]) -> str:
  """One run killed in a save, then rerun at once: its table row."""
  workdir = f'{_WORKDIR.value.rstrip("/")}/trial{number}'
  processes = launch(workdir)
  delay = rng.uniform(0, 0.3)
  killed = kill_in_the_save(processes, workdir, delay)
  said, exited, line = survivor_times(processes[1 - _VICTIM.value], killed)
  processes[_VICTIM.value].wait()
  status = processes[1 - _VICTIM.value].returncode
  rerun = launch(workdir)
  last = finish(rerun)
  outcome = ('identical' if metrics(workdir) == reference else 'DIFFERENT') if not any(
      p.returncode for p in rerun) else f'rerun refused: {last[0][:60]}'
  return (f'{number:5d}  +{delay:.2f}s  {said:6.1f}s  {exited:6.1f}s  {status:6d}  '
          f'{line[:40]:40s}  {outcome}')


def main(argv: list[str]) -> None:
  del argv
  reference_dir = f'{_WORKDIR.value.rstrip("/")}/uninterrupted'
  processes = launch(reference_dir)
  last = finish(processes)
  if any(p.returncode for p in processes):
    raise SystemExit(f'error: the uninterrupted run failed: {last}')
  reference = metrics(reference_dir)
  print(f'process {_VICTIM.value} killed 0-0.3 s after epoch 2\'s line; times from the kill\n'
        f'trial  killed  line     exit     status  survivor\'s line{"":26s}  rerun at once')
  rng = random.Random(_SEED.value)
  for number in range(1, _TRIALS.value + 1):
    print(trial(number, rng, reference), flush=True)


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
