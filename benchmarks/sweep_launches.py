"""A sweep of learning rates in one launch of train.py beside a launch per rate, side by side:
launch to exit, taking turns, on the validation split.

  python -m benchmarks.sweep_launches [--config=configs/quick.py] [--rates=1e-3,2e-3,4e-3]
      [--repeats=1] [--overrides=num_epochs=30]

Each repeat runs the sweep's launch, then each rate's own launch, compiling everything (no cache),
so that a machine's changing load falls on both arms alike. Prints each launch's seconds and eval
accuracy, then the launches' total over the sweep's, and the members' accuracies beside their own
launches'.
"""

import statistics
import tempfile

from absl import flags

from benchmarks.workload import launch_train, parse_flags
from trainer.host.boundary import Host

_CONFIG = flags.DEFINE_string('config', 'configs/quick.py', 'The config file, on :validation.')
_RATES = flags.DEFINE_list('rates', ['1e-3', '2e-3', '4e-3'], 'The learning rates.')
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Rounds of both arms.', lower_bound=1)
_OVERRIDES = flags.DEFINE_list('overrides', [], 'More FIELD=VALUE for every run.')


def launch(*fields: str) -> tuple[dict, float]:
  """One train.py launch with these --config fields: its last record, and seconds launch to exit."""
  with tempfile.TemporaryDirectory() as workdir:
    return launch_train([f'--config={_CONFIG.value}:validation', f'--workdir={workdir}',
                         '--compilation_cache=off',
                         *(f'--config.{field}' for field in (*fields, *_OVERRIDES.value))],
                        f'the launch with {", ".join(fields)}')


def main(argv: list[str]) -> None:
  del argv  # parse_flags refused any.
  sweep: list[float] = []
  alone: dict[str, list[float]] = {rate: [] for rate in _RATES.value}
  for _ in range(_REPEATS.value):
    record, seconds = launch(f'sweep.learning_rate=({",".join(_RATES.value)},)')
    sweep.append(seconds)
    print(f'sweep of {len(_RATES.value)} rates  {seconds:7.1f} s  ' + '  '.join(
        f'{rate}: {100 * accuracy:.2f}%' for rate, accuracy in
        zip(_RATES.value, record['eval_accuracy_by_member'])), flush=True)
    for rate in _RATES.value:
      own, seconds = launch(f'learning_rate={rate}')
      alone[rate].append(seconds)
      print(f'launch of {rate:<9}  {seconds:7.1f} s  {100 * own["eval_accuracy"]:.2f}%', flush=True)
  launches = statistics.median(sum(times) for times in zip(*alone.values()))
  print(f'{_CONFIG.value} {",".join(_OVERRIDES.value) or "as it is"}: {len(_RATES.value)} '
        f'launches {launches:.1f} s, one sweep {statistics.median(sweep):.1f} s (median of '
        f'{_REPEATS.value}): launches / sweep {launches / statistics.median(sweep):.2f}x',
        flush=True)


if __name__ == '__main__':
  Host().run(main, parse_flags)
