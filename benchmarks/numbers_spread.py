"""How far the default config's numbers move across seeds and CPUs: where the recorded-numbers
test's tolerances come from (docs/reproducibility.md).

  python -m benchmarks.numbers_spread                     # the spread of the recorded runs
  python -m benchmarks.numbers_spread --record --cpu=NAME --seeds=0,1,2   # record this CPU first

A recorded run is `configs/default.py`, 30 epochs on train[:8000], scored on test[:2000], its
metrics.jsonl without timings, one file per seed and instruction-set level
(`tests/golden/default_train8000/seed{S}_{CPU}_{LEVEL}.jsonl`; levels giving the same bits as one
already there are not written again). The spread: epoch 1's largest difference between runs of one
seed, and the last epoch's mean, standard deviation and range over every run; `--changed` adds how
far runs of a changed recipe land from them, in standard deviations.
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable

from absl import flags

from benchmarks.workload import ROOT, parse_flags
from errors import UsageError, UserError
from trainer.host.boundary import Host

RUNS = ROOT / 'tests' / 'golden' / 'default_train8000'
TIMINGS = ('epoch_seconds', 'train_images_per_second')
LOSSES, ACCURACIES = ('train_loss', 'eval_loss'), ('train_accuracy', 'eval_accuracy')

_RECORD = flags.DEFINE_bool('record', False, 'Train and record this CPU\'s runs before printing.')
_CPU = flags.DEFINE_string('cpu', None, 'With --record: a short name of this CPU, e.g. zen4.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'With --record: the seeds to train.')
_LEVELS = flags.DEFINE_list('levels', ['native', 'AVX512', 'AVX2', 'AVX', 'SSE4_2'],
                            'With --record: --xla_cpu_max_isa levels (native: no flag).')
_OVERRIDES = flags.DEFINE_list('overrides', [], 'With --record: more FIELD=VALUE for every run.')
_FOLDER = flags.DEFINE_string('folder', str(RUNS), 'Where the recorded runs are.')
_CHANGED = flags.DEFINE_string('changed', None, 'A folder of runs of a changed recipe to place.')


def read_runs(folder: pathlib.Path) -> dict[str, list[dict]]:
  """Every recorded run in the folder, by file name."""
  return {path.name: [json.loads(line) for line in path.read_text().splitlines()]
          for path in sorted(folder.glob('*.jsonl'))}


def seed_of(name: str) -> str:
  return name.split('_', 1)[0]


def train(seed: str, level: str) -> list[dict]:
  """One recorded-split run of the default config, compiled for the level: its figures."""
  flags_ = os.environ.get('XLA_FLAGS', '') + ('' if level == 'native' else
                                                f' --xla_cpu_max_isa={level}')
  with tempfile.TemporaryDirectory() as workdir:
    out = subprocess.run(
        [sys.executable, 'train.py', '--config=configs/default.py', f'--workdir={workdir}',
         '--compilation_cache=off', '--config.data.train_split=train[:8000]',
         '--config.data.eval_split=test[:2000]', f'--config.seed={seed}',
         *(f'--config.{field}' for field in _OVERRIDES.value)],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, 'XLA_FLAGS': flags_.strip()})
    if out.returncode != 0:
      raise UserError(f'seed {seed} at {level} failed: {out.stderr.strip().splitlines()[-1:]}')
    lines = pathlib.Path(workdir, 'metrics.jsonl').read_text().splitlines()
  return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


def record(folder: pathlib.Path, cpu: str) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  for seed in _SEEDS.value:
    for level in _LEVELS.value:
      records, runs = train(seed, level), read_runs(folder)
      same = [name for name, recorded in runs.items() if recorded == records]
      name = f'seed{seed}_{cpu}_{level.lower()}.jsonl'
      if not same:
        (folder / name).write_text(''.join(json.dumps(r) + '\n' for r in records))
      print(f'{name}: {"the same bits as " + same[0] if same else "recorded"}', flush=True)


def difference(name: str, value: float, reference: float) -> float:
  """How far a figure is from a recorded one: relative for losses, absolute for accuracies."""
  return abs(value - reference) / (abs(reference) if name in LOSSES else 1.0)


def first_epoch_differences(runs: dict[str, list[dict]]) -> dict[str, float]:
  """Per figure, the largest difference at epoch 1 between two runs of one seed."""
  return {name: max(difference(name, runs[a][0][name], runs[b][0][name])
                    for a in runs for b in runs if seed_of(a) == seed_of(b))
          for name in LOSSES + ACCURACIES}


def last_epoch_spread(runs: Iterable[list[dict]]) -> dict[str, tuple[float, ...]]:
  """Per figure over the runs' last epochs: (mean, standard deviation, min, max)."""
  lasts = [records[-1] for records in runs]
  return {name: (statistics.mean(values := [r[name] for r in lasts]), statistics.stdev(values),
                 min(values), max(values)) for name in LOSSES + ACCURACIES}


def main(argv: list[str]) -> None:
  del argv  # parse_flags refused any.
  folder = pathlib.Path(_FOLDER.value)
  unused = [f'--{flag.name}' for flag in (_CPU, _SEEDS, _LEVELS, _OVERRIDES)
            if flags.FLAGS[flag.name].present]
  if unused and not _RECORD.value:
    raise UsageError(f'{", ".join(unused)} only {"says" if len(unused) == 1 else "say"} how to '
                     'record; add --record to record this CPU\'s runs, or leave them out to print '
                     'the recorded spread')
  if _RECORD.value:
    if not _CPU.value:
      raise UsageError('--record needs --cpu=NAME, a short name of this CPU for the file names')
    record(folder, str(_CPU.value))
  runs = read_runs(folder)
  if len(runs) < 2:
    raise UsageError(f'{folder} holds {len(runs)} recorded runs; record some with --record')
  print(f'{len(runs)} runs in {folder}, seeds {sorted({seed_of(n) for n in runs})}')
  for name, gap in first_epoch_differences(runs).items():
    print(f'epoch 1, one seed: {name:<15} largest difference {gap:.3g}')
  spread = last_epoch_spread(runs.values())
  for name, (mean, sd, low, high) in spread.items():
    print(f'last epoch, all:   {name:<15} mean {mean:.5f} sd {sd:.5f} range {low:.5f}..{high:.5f}')
  for name, records in read_runs(pathlib.Path(_CHANGED.value)).items() if _CHANGED.value else ():
    gaps = ' '.join(f'{n} {(records[-1][n] - spread[n][0]) / spread[n][1]:+.1f}' for n in spread)
    print(f'changed {name}: last epoch in sd from the mean: {gaps}')


if __name__ == '__main__':
  Host().run(main, parse_flags)
