"""Configs' recipes beside the conventional one, each a real `train.py` run on the same split.

  python -m benchmarks.recipes [--config=configs/default.py] [--also=configs/fast.py,...]
      [--seeds=0,1,2] [--splits=test]

`conventional` is Adam 1e-3 with no regularization, the common baseline: the same MLP, Adam at a
constant 1e-3, no dropout, no augmentation, the config's epochs and batch. (The frameworks' own
MNIST examples train otherwise: google/flax's with SGD 0.1 and momentum 0.9, 10 epochs of 128;
pytorch/examples' with Adadelta 1.0 and StepLR(gamma 0.7), 14 epochs of 64.) `--also` adds more
config files, each as it is. Seed by seed, every run takes its turn, so a machine's changing load
falls on all of them alike. Prints each run's final eval accuracy and its time from launch to exit,
then each recipe's mean. Choose recipes with --splits=validation (train[:50000], scored on
train[50000:]). --one_launch trains each recipe's seeds (consecutive ones) in one launch of
`num_models`, each seed's model as its own launch would train it, and adds their ensemble.
--sweep=FIELD=(V1, V2, ...) (repeatable) compares each recipe's sweep in one launch, its seeds as
`num_models`: a row per member, best first:

  python -m benchmarks.recipes --splits=validation --recipes=config --seeds=0 \
      --sweep="learning_rate=(1e-3, 2e-3, 4e-3)"
"""

import statistics
import tempfile

from absl import flags

from benchmarks.workload import ROOT, launch_train, parse_flags
from errors import UsageError
from trainer import reporting
from trainer.host.boundary import Host
from trainer.members import label

_CONFIG = flags.DEFINE_string('config', 'configs/default.py', 'The config file of the recipe.')
_ALSO = flags.DEFINE_list('also', [], 'More config files, each trained as it is.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds to train each recipe with.')
_SPLITS = flags.DEFINE_enum('splits', 'test', ['test', 'validation'],
                            'test: train on train, score test; validation: the held-out split.')
_RECIPES = flags.DEFINE_list('recipes', ['config', 'conventional'],
                             'config: the config as it is; conventional: see the docstring.')
_ONE_LAUNCH = flags.DEFINE_bool('one_launch', False, 'Each recipe\'s seeds in one launch with '
                                 'num_models, not a launch per seed; the seeds must be '
                                 'consecutive.')
_SWEEP = flags.DEFINE_multi_string(
    'sweep', [], 'FIELD=(V1, V2, ...): the values of a field to sweep, each recipe in one launch '
    '(repeat it to cross several fields).')
_OVERRIDES = flags.DEFINE_list('overrides', [],
                               'More FIELD=VALUE for every run, e.g. num_epochs=2.')

RECIPES = {
    'config': [],
    'conventional': ['optimizer=adam', 'learning_rate=0.001', 'schedule=constant',
                     'warmup_epochs=0', 'model.dropout_rate=0', 'data.max_shift=0'],
}


def train(config_file: str, recipe: str, seed: str, workdir: str,
          num_models: int = 1) -> tuple[dict, float]:
  """One run of the recipe as a user launches it: (its last metrics record, seconds launch to
  exit); with num_models, of that many seeds from `seed` on."""
  members = [f'num_models={num_models}'] if num_models > 1 else []
  swept = [f'sweep.{field}' for field in _SWEEP.value]
  fields = [*RECIPES[recipe], f'seed={seed}', *members, *swept, *_OVERRIDES.value]
  return launch_train([f'--config={config_file}:{_SPLITS.value}', f'--workdir={workdir}',
                       *(f'--config.{field}' for field in fields)],
                      f'{config_file} {recipe} seed {seed}')


def row(config_file: str, recipe: str, seed: str, accuracy: float, seconds: str) -> None:
  """One line of the table."""
  print(f'{config_file:<22}{recipe:<14}{seed:>9}{100 * accuracy:>15.2f}%{seconds:>10}', flush=True)


def consecutive(seeds: list[str]) -> bool:
  """Whether the seeds are two or more integers s, s + 1, ...: what one launch of members trains."""
  return (len(seeds) > 1 and all(seed.isdigit() for seed in seeds)
          and [int(seed) for seed in seeds] == list(range(int(seeds[0]),
                                                          int(seeds[0]) + len(seeds))))


def one_launch_each(runs: list[tuple[str, str]], seeds: list[str]) -> None:
  """Each recipe's seeds in one launch: a row per seed, the ensemble's, and the mean's with the
  launch's seconds."""
  for config_file, recipe in runs:
    with tempfile.TemporaryDirectory() as workdir:
      record, seconds = train(config_file, recipe, seeds[0], workdir, len(seeds))
    for seed, accuracy in zip(seeds, record['eval_accuracy_by_member']):
      row(config_file, recipe, seed, accuracy, '')
    row(config_file, recipe, 'ensemble', record['eval_ensemble_accuracy'], '')
    row(config_file, recipe, 'mean', record['eval_accuracy'], f'{seconds:.1f}')


def sweep_each(runs: list[tuple[str, str]], seeds: list[str]) -> None:
  """Each recipe's sweep, its seeds too, in one launch: a row per member, best first, then the
  launch's seconds beside the members' mean."""
  for config_file, recipe in runs:
    with tempfile.TemporaryDirectory() as workdir:
      record, seconds = train(config_file, recipe, seeds[0], workdir, len(seeds))
    for k in reporting.ranked(record):
      print(f'{config_file:<22}{recipe:<14}{100 * record["eval_accuracy_by_member"][k]:>8.2f}%  '
            f'{label(record["members"][k])}', flush=True)
    row(config_file, recipe, 'mean', record['eval_accuracy'], f'{seconds:.1f}')


def launch_each(runs: list[tuple[str, str]], seeds: list[str]) -> None:
  """A launch per seed and recipe, seed by seed; then each recipe's mean."""
  results: dict[tuple[str, str], list[tuple[float, float]]] = {run: [] for run in runs}
  for seed in seeds:
    for config_file, recipe in runs:
      with tempfile.TemporaryDirectory() as workdir:
        record, seconds = train(config_file, recipe, seed, workdir)
      results[config_file, recipe].append((record['eval_accuracy'], seconds))
      row(config_file, recipe, seed, record['eval_accuracy'], f'{seconds:.1f}')
  for (config_file, recipe), figures in results.items():
    accuracy, seconds = (statistics.mean(column) for column in zip(*figures))
    row(config_file, recipe, 'mean', accuracy, f'{seconds:.1f}')


def main(argv: list[str]) -> None:
  del argv  # parse_flags refused any.
  unknown = set(_RECIPES.value) - RECIPES.keys()
  if unknown:
    raise UsageError(f'--recipes: no recipe {sorted(unknown)}; use {", ".join(RECIPES)}')
  if _SWEEP.value and not (consecutive(_SEEDS.value) or len(_SEEDS.value) == 1):
    raise UsageError('--sweep trains each recipe\'s seeds s, s+1, ... in its launch, got '
                     f'--seeds={",".join(_SEEDS.value)}; pass one, or consecutive ones')
  if _ONE_LAUNCH.value and not consecutive(_SEEDS.value):
    raise UsageError('--one_launch trains seeds s, s+1, ... together, got '
                     f'--seeds={",".join(_SEEDS.value)}; pass consecutive ones, e.g. --seeds=0,1,2')
  missing = [name for name in dict.fromkeys([_CONFIG.value, *_ALSO.value])
             if not (ROOT / name).is_file()]
  if missing:  # Before any run: the table would otherwise stop at the first such file's turn.
    raise UsageError(f'no config file {", ".join(missing)} (a path from {ROOT}, or absolute); '
                     'pass files that exist, e.g. --also=configs/fast.py')
  runs = [(_CONFIG.value, recipe) for recipe in _RECIPES.value]
  runs = list(dict.fromkeys([*runs, *((config_file, 'config') for config_file in _ALSO.value)]))
  print(f'splits {_SPLITS.value}, overrides {_OVERRIDES.value or "none"}', flush=True)
  print(f'{"config":<22}{"recipe":<14}{"seed":>9}{"eval accuracy":>16}{"seconds":>10}', flush=True)
  chosen = sweep_each if _SWEEP.value else one_launch_each if _ONE_LAUNCH.value else launch_each
  chosen(runs, _SEEDS.value)


if __name__ == '__main__':
  Host().run(main, parse_flags)
