"""How far a member of a run ends from its separate run: a seed of num_models, and a learning rate
of a sweep, on configs/quick.py's model over 2 epochs of 60,000 images, scored on test[:1000].

  python -m benchmarks.member_drift [--rates=2e-3,4e-3]

For each rate: num_models=2 at that rate against seed 1's own run, and a sweep of (1e-3, rate)
against that rate's own run; the last epoch's relative differences of the losses and the eval
accuracy's difference in examples. In-process runs (one compilation cache of their own).
"""

import pathlib
import tempfile

from absl import flags

from benchmarks.workload import ROOT, parse_flags
from trainer.plan import resolve
from trainer import loop
from trainer.host.boundary import Host
from trainer.reporting import read_records
from trainer.host.run_dir import RunDirectory

_RATES = flags.DEFINE_list('rates', ['2e-3', '4e-3'], 'The learning rates compared.')
QUICK = {'num_epochs': 2, 'batch_size': 256, 'data.eval_split': 'test[:1000]'}


def run(workdir: pathlib.Path, **fields: object) -> list[dict]:
  """configs/quick.py with these fields (dotted names as keys of `fields` with __), its records."""
  from configs import quick  # pylint: disable=g-import-not-at-top
  config = quick.get_config()
  config.data.dir = str(ROOT / 'data' / 'mnist')
  for name, value in {**QUICK, **{k.replace('__', '.'): v for k, v in fields.items()}}.items():
    *groups, leaf = name.split('.')
    group = config
    for key in groups:
      group = group[key]
    group[leaf] = value
  loop.train_and_evaluate(resolve(config), RunDirectory(workdir), Host())
  return read_records(RunDirectory(workdir))


def row(what: str, member: dict, alone: dict) -> None:
  """The last epoch's differences of a member (its figures picked) from its separate run."""
  said = '  '.join(f'{name} {100 * abs(member[name] - alone[name]) / abs(alone[name]):.2f}%'
                   for name in ('train_loss', 'eval_loss'))
  print(f'{what:<48}{said}  eval accuracy '
        f'{round(1000 * abs(member["eval_accuracy"] - alone["eval_accuracy"]))} of 1,000',
        flush=True)


def member(record: dict, k: int) -> dict:
  return {name: record[f'{name}_by_member'][k]
          for name in ('train_loss', 'eval_loss', 'eval_accuracy')}


def main(argv: list[str]) -> None:
  del argv  # parse_flags refused any.
  for rate in map(float, _RATES.value):
    with tempfile.TemporaryDirectory() as folder:
      seeds = run(pathlib.Path(folder, 'seeds'), num_models=2, learning_rate=rate)[-1]
      seed_1 = run(pathlib.Path(folder, 'seed-1'), seed=1, learning_rate=rate)[-1]
      row(f'seed 1 of num_models=2 (learning rate {rate:g})', member(seeds, 1), seed_1)
      sweep = run(pathlib.Path(folder, 'sweep'), sweep__learning_rate=(1e-3, rate))[-1]
      alone = run(pathlib.Path(folder, 'alone'), learning_rate=rate)[-1]
      row(f'learning rate {rate:g} of a sweep (1e-3, {rate:g})', member(sweep, 1), alone)


if __name__ == '__main__':
  Host().run(main, parse_flags)
