"""What num_models costs, side by side in one run: an epoch of N members against one model's, and
one launch of N members from start to exit against N launches of one seed each.

  python -m benchmarks.members [--num_models=3] [--repeats=5] [--launch_epochs=2] [--nolaunches]
      [--max_shift=0]
      [--batch_size=128] [--num_images=8000] [--data=idx|synthetic] [--parallel=jit|mesh|pmap]

The epochs: the trainer's compiled epoch (benchmarks/workload.py's TrainerRun) of configs/default.py
with one model and with --num_models, each warmed up by an epoch, then timed in turn per
repetition, so load from other processes hits both alike. The launches: `python train.py
--config=configs/default.py` (60,000 training images, 10,000 scored) for --launch_epochs epochs,
without a compilation cache: once with num_models=N, and N times with seeds 0 to N - 1, one after
another as benchmarks.recipes runs them; wall-clock seconds of each from process start to exit.
Prints a table, then one JSON line.
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

from benchmarks import workload
from benchmarks.workload import ROOT
from errors import UserError
from trainer.host.boundary import Host

_NUM_MODELS = flags.DEFINE_integer('num_models', 3, 'Members of the side-by-side run (2 or more).')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed epochs of each (at least 3).')
_LAUNCH_EPOCHS = flags.DEFINE_integer('launch_epochs', 2, 'Epochs of each launch of train.py.')
_MAX_SHIFT = flags.DEFINE_integer('max_shift', 0, 'The epochs\' pixel shifts '
                                  '(configs/default.py: 1; benchmark_config: 0).')
_LAUNCHES = flags.DEFINE_bool('launches', True, 'Also time the launches of train.py.')


def time_epochs(num_models: int, repeats: int) -> dict:
  """Median [min, max] ms of one model's epoch and of num_models members', taking turns."""
  examples, description = workload.load_images()
  runs = {}
  for count in (1, num_models):
    config = workload.benchmark_config()
    config.num_models, config.data.max_shift = count, _MAX_SHIFT.value
    runs[count] = workload.TrainerRun(config, examples)
    runs[count].epoch(1)  # Warm-up.
  milliseconds: dict[int, list[float]] = {count: [] for count in runs}
  for epoch in range(2, repeats + 2):
    for count, trainer in runs.items():
      milliseconds[count].append(1e3 * trainer.epoch(epoch)[0])
  medians = {count: statistics.median(values) for count, values in milliseconds.items()}
  return {'data': description, 'max_shift': _MAX_SHIFT.value,
          'images_per_epoch': runs[1].images_per_epoch,
          'placement': runs[num_models].placement,
          'epoch_ms': {str(count): {'median': medians[count], 'min': min(values),
                                    'max': max(values)} for count, values in milliseconds.items()},
          'members_over_one': medians[num_models] / medians[1]}


def launch(overrides: dict, epochs: int) -> float:
  """Seconds from starting `python train.py` of the default config to its exit, in a new folder."""
  fields = {'num_epochs': epochs, **overrides}
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, 'train.py', '--config=configs/default.py',
                           *[f'--config.{k}={v}' for k, v in fields.items()],
                           f'--workdir={workdir}', '--compilation_cache=off'], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
  if done.returncode != 0:
    lines = done.stderr.strip().splitlines()
    raise UserError(f'a launch of train.py failed ({lines[-1] if lines else "no output"})')
  return seconds


def time_launches(num_models: int, epochs: int) -> dict:
  """Seconds of one launch of num_models members, and of num_models launches of a seed each."""
  together = launch({'num_models': num_models}, epochs)
  apart = [launch({'seed': seed}, epochs) for seed in range(num_models)]
  return {'epochs': epochs, 'members_launch_s': together, 'separate_launches_s': apart,
          'members_over_separate': together / sum(apart)}


def report(epochs: dict, launches: dict | None, num_models: int) -> str:
  """The table, then the JSON object as the last line."""
  ms = epochs['epoch_ms']
  lines = [f'{epochs["data"]}; {epochs["images_per_epoch"]:,} images per epoch, shifts of up to '
           f'{epochs["max_shift"]} pixels; {epochs["placement"]}', '',
           f'epoch of 1 model:          {ms["1"]["median"]:9.1f} ms  '
           f'[{ms["1"]["min"]:.1f} .. {ms["1"]["max"]:.1f}]',
           f'epoch of {num_models} members:        {ms[str(num_models)]["median"]:9.1f} ms  '
           f'[{ms[str(num_models)]["min"]:.1f} .. {ms[str(num_models)]["max"]:.1f}]',
           f'members / one model:       {epochs["members_over_one"]:9.2f}x']
  if launches:
    lines += [f'1 launch of {num_models} members:     {launches["members_launch_s"]:9.1f} s',
              f'{num_models} launches of 1 seed:    {sum(launches["separate_launches_s"]):9.1f} s  '
              f'({", ".join(f"{s:.1f}" for s in launches["separate_launches_s"])})',
              f'one launch / {num_models} launches:     {launches["members_over_separate"]:9.2f}x']
  return '\n'.join(lines + ['', json.dumps({'num_models': num_models, 'epochs': epochs,
                                            'launches': launches})])


def main(argv: list[str]) -> None:
  del argv
  if _NUM_MODELS.value < 2 or _REPEATS.value < 3 or _LAUNCH_EPOCHS.value < 1:
    raise UserError('--num_models must be 2 or more, --repeats 3 or more and --launch_epochs 1 '
                    'or more; e.g. --num_models=3 --repeats=5 --launch_epochs=2')
  epochs = time_epochs(_NUM_MODELS.value, _REPEATS.value)
  launches = (time_launches(_NUM_MODELS.value, _LAUNCH_EPOCHS.value) if _LAUNCHES.value
              else None)
  print(report(epochs, launches, _NUM_MODELS.value), flush=True)


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
