"""A search with pruning against a grid of as many points and against a launch per grid point, on
the validation split: the best validation accuracy each finds, the epochs it trains, launch to exit.

  python -m benchmarks.search_vs_grid [--config=configs/fast.py] [--trials=16] [--side_by_side=8]
      [--num_epochs=13] [--train_examples=50000] [--eval_examples=10000]

Three ways to spend `trials` trials over learning_rate (1e-4, 1e-2), log scale, and
model.dropout_rate (0.0, 0.5), each as the user's commands of train.py on the config's
`:validation` recipe (train[:N] trains, train[50000:50000+M] scores; never the test set), one after
another in this one process, every program compiled (no cache), so that their times compare as
ratios: (1) one launch of the search (TPE, Hyperband), `side_by_side` trials per program; (2) one
launch of the sweep of a grid of as many points (16: 4 x 4; 32: 8 learning rates x 4 dropout
rates), log-spaced learning rates and linear dropout rates, all its points side by side in one
program; (3) a launch of train.py per grid point, one after another. Prints each way's command
and figures as it ends, then a markdown table with the date and machine (docs/search-benchmark.md).
The defaults, fast's recipe with 16 trials, are sized to end within 20 minutes on 2 CPU cores; a
try in about a minute and a half (2 to 3 with other jobs beside it): --trials=4 --side_by_side=2
--num_epochs=3 --train_examples=2000 --eval_examples=2000.
"""

import dataclasses
import datetime
import itertools
import math
import os
import platform
import shlex
import subprocess
import tempfile

from absl import flags
import jax
import numpy as np

from benchmarks.workload import SEARCH_RANGES, launch_train, parse_flags, run_train, search_args
from data.splits import SPLIT_SIZES
from errors import UsageError
from trainer import reporting
from trainer.config_rules import LOG_SCALED
from trainer.host.boundary import Host
from trainer.members import label
from trainer.search import import_optuna

_CONFIG = flags.DEFINE_string('config', 'configs/fast.py', 'The config file, on :validation.')
_TRIALS = flags.DEFINE_integer('trials', 16, 'Trials of each way, and the grid\'s points.')
_SIDE_BY_SIDE = flags.DEFINE_integer('side_by_side', 8, 'The search\'s trials per program.',
                                     lower_bound=1)
_NUM_EPOCHS = flags.DEFINE_integer('num_epochs', None, 'Epochs of every trial (default: the '
                                   'config\'s).', lower_bound=1)
_TRAIN_EXAMPLES = flags.DEFINE_integer('train_examples', 50000, 'Trains on train[:N].',
                                       lower_bound=1)
_EVAL_EXAMPLES = flags.DEFINE_integer('eval_examples', 10000, 'Scores on train[50000:50000+M].',
                                      lower_bound=1)

VALIDATION_START = 50000  # train[:50000] trains and train[50000:] scores in `:validation`.
STUDY = 'search'  # The search's run directory, and so its study's name.


@dataclasses.dataclass
class Way:
  """What one way of spending the trials found, and what it cost."""
  name: str
  launches: int
  trials: str  # How many, and how they ended.
  best: float  # The best validation accuracy found, of a trial that trained every epoch.
  values: str  # The best one's.
  epochs: int  # Epochs trained, all trials together.
  seconds: float  # Launch to exit, all launches together.


def check_flags() -> tuple[int, ...]:
  """The grid's count of values of each field of the ranges: --trials as the product of two
  factors as near as can be, the larger for the learning rate; or the UsageError of a flag."""
  fewer = max(k for k in range(1, math.isqrt(_TRIALS.value) + 1) if _TRIALS.value % k == 0)
  if fewer < 2:
    raise UsageError(f'--trials={_TRIALS.value} is no product of two numbers of 2 or more, and '
                     'the grid takes values of each field that multiply to it; pass e.g. '
                     '--trials=16 (4 x 4) or --trials=32 (8 x 4)')
  eval_most = SPLIT_SIZES['train'] - VALIDATION_START
  if _TRAIN_EXAMPLES.value > VALIDATION_START or _EVAL_EXAMPLES.value > eval_most:
    raise UsageError(f'--train_examples={_TRAIN_EXAMPLES.value} and --eval_examples='
                     f'{_EVAL_EXAMPLES.value} must stay within the validation split\'s '
                     f'{VALIDATION_START} and {eval_most}; pass at most those')
  return _TRIALS.value // fewer, fewer


def common_args(workdir: str) -> list[str]:
  """The flags every launch shares: the recipe, its splits and epochs, no compilation cache."""
  stop = VALIDATION_START + _EVAL_EXAMPLES.value
  epochs = [] if _NUM_EPOCHS.value is None else [f'--config.num_epochs={_NUM_EPOCHS.value}']
  return [f'--config={_CONFIG.value}:validation', f'--workdir={workdir}',
          f'--config.data.train_split=train[:{_TRAIN_EXAMPLES.value}]',
          f'--config.data.eval_split=train[{VALIDATION_START}:{stop}]', *epochs,
          '--compilation_cache=off']


def said(what: str, args: list[str]) -> None:
  """The command of a way, as a user would type it again."""
  print(f'{what}: python train.py {shlex.join(args)}', flush=True)


def grid(counts: tuple[int, ...]) -> list[dict[str, float]]:
  """The grid's points: `counts` values of each field of the ranges, log-spaced where the search
  searches on a log scale, else linear, crossed in the sweep's order (learning rate first)."""
  values = {name: [float(f'{value:.6g}') for value in
                   (np.geomspace if name in LOG_SCALED else np.linspace)(*bounds, count)]
            for (name, bounds), count in zip(SEARCH_RANGES.items(), counts)}
  return [dict(zip(values, point)) for point in itertools.product(*values.values())]


def by_search(root: str) -> Way:
  """The search's one launch, and its study read back: the best complete trial, epochs reported."""
  workdir = os.path.join(root, STUDY)
  side_by_side = min(_SIDE_BY_SIDE.value, _TRIALS.value)
  args = [*common_args(workdir), *search_args(_TRIALS.value, side_by_side)]
  said('search', args)
  seconds = run_train(args, 'the search')
  study = import_optuna().load_study(study_name=STUDY, storage=f'sqlite:///{workdir}/study.db')
  trials = study.get_trials(deepcopy=False)
  ended = {state: sum(trial.state.name == state for trial in trials)
           for state in ('COMPLETE', 'PRUNED')}
  return Way(f'search (TPE, Hyperband), {side_by_side} side by side', 1,
             f'{len(trials)} ({ended["COMPLETE"]} complete, {ended["PRUNED"]} pruned)',
             float(study.best_value), label(study.best_params),
             sum(len(trial.intermediate_values) for trial in trials), seconds)


def by_grid(root: str, counts: tuple[int, ...]) -> Way:
  """The sweep of the grid in one launch: its best member at the last epoch."""
  points = grid(counts)
  args = [*common_args(os.path.join(root, 'grid'))] + [
      f'--config.sweep.{name}={tuple(sorted({point[name] for point in points}))}'
      for name in points[0]]
  said('grid', args)
  record, seconds = launch_train(args, 'the grid\'s sweep')
  best = reporting.best_member(record)
  return Way(f'grid: a sweep of {" x ".join(map(str, counts))}, {len(points)} side by side', 1,
             f'{len(points)}',
             max(record['eval_accuracy_by_member']),
             label({name: best[name] for name in points[0]}),
             len(points) * record['epoch'], seconds)


def by_launches(root: str, counts: tuple[int, ...]) -> Way:
  """A launch of train.py per grid point, one after another."""
  found: list[tuple[float, str]] = []
  seconds, epochs = 0.0, 0
  points = grid(counts)
  for k, point in enumerate(points):
    args = [*common_args(os.path.join(root, f'launch{k}')),
            *(f'--config.{name}={value}' for name, value in point.items())]
    if k == 0:
      said(f'launches (the first of {len(points)})', args)
    record, took = launch_train(args, f'the launch of {label(point)}')
    found.append((record['eval_accuracy'], label(point)))
    seconds, epochs = seconds + took, epochs + record['epoch']
  best, values = max(found)
  return Way(f'launches: one per grid point, {len(points)} of train.py', len(points),
             f'{len(points)}', best, values, epochs, seconds)


def machine() -> str:
  """The machine's line: lscpu's model name (the platform's processor where there is none), its
  cores for this process, Python and JAX."""
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, check=False).stdout
  except OSError:  # No lscpu (macOS).
    out = ''
  model = next((line.split(':', 1)[1].strip() for line in out.splitlines()
                if line.startswith('Model name:')), platform.processor() or 'an unnamed CPU')
  return (f'{model}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, '
          f'JAX {jax.__version__}')


def table(ways: list[Way], loads: tuple[float, float]) -> list[str]:
  """The markdown table of the ways, with its date, machine and recipe; every trial's epochs are
  the grid's, which trains each to its last."""
  search, most = ways[0].seconds, ways[1].epochs
  today = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')
  lines = [f'{today}, {machine()}; load average {loads[0]:.2f} at the start, {loads[1]:.2f} at '
           'the end.', '', f'{_CONFIG.value}:validation, {most // _TRIALS.value} epochs of train[:'
           f'{_TRAIN_EXAMPLES.value}], scored on train[{VALIDATION_START}:'
           f'{VALIDATION_START + _EVAL_EXAMPLES.value}]; ' + ', '.join(
               f'{name} {bounds} {"log" if name in LOG_SCALED else "linear"}'
               for name, bounds in SEARCH_RANGES.items()) + '.', '',
           '| way | launches | trials | best validation accuracy | its values | epochs trained '
           '| launch to exit | time / search\'s |',
           '| --- | ---: | --- | ---: | --- | ---: | ---: | ---: |']
  return lines + [f'| {way.name} | {way.launches} | {way.trials} | {100 * way.best:.2f}% | '
                  f'{way.values} | {way.epochs} of {most} | {way.seconds:.1f} s | '
                  f'{way.seconds / search:.2f}x |' for way in ways]


def main(argv: list[str]) -> None:
  del argv  # parse_flags refused any.
  counts = check_flags()
  start_load = os.getloadavg()[0]
  ways: list[Way] = []
  with tempfile.TemporaryDirectory() as root:
    for way in (lambda: by_search(root), lambda: by_grid(root, counts),
                lambda: by_launches(root, counts)):
      ways.append(way())
      print(f'  {ways[-1].name}: best {100 * ways[-1].best:.2f}% ({ways[-1].values}), '
            f'{ways[-1].epochs} epochs, {ways[-1].seconds:.1f} s', flush=True)
  print('\n'.join(['', *table(ways, (start_load, os.getloadavg()[0]))]), flush=True)


if __name__ == '__main__':
  Host().run(main, parse_flags)
