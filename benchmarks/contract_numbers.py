"""The numbers a refactor must keep, bit for bit on one machine: three real runs, timings aside.

  python -m benchmarks.contract_numbers --out=/tmp/before     # record, before the change
  python -m benchmarks.contract_numbers --out=/tmp/after --compare=/tmp/before

The runs: configs/quick.py, alone, as 3 models side by side, and as a sweep of two learning rates
times two seeds for 2 epochs; configs/default.py for 3 epochs;
configs/tpu_v3_8.py under pmap on 8 simulated devices, 1 epoch of 8,192 images. Each writes
RUN.jsonl (metrics.jsonl without its timing fields) into --out; --compare prints each run's first
differing record, and exits 1 if any differs.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from absl import flags

from benchmarks.workload import ROOT, parse_flags
from trainer.host.boundary import Host

_OUT = flags.DEFINE_string('out', None, 'Folder for the runs\' records.', required=True)
_COMPARE = flags.DEFINE_string('compare', None, 'A folder of earlier records to compare with.')

TIMINGS = ('epoch_seconds', 'train_images_per_second')
EIGHT_DEVICES = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8', 'JAX_PLATFORMS': 'cpu'}
RUNS = {
    'quick': (['--config=configs/quick.py'], {}),
    'quick-3-models': (['--config=configs/quick.py', '--config.num_models=3'], {}),
    'default-3-epochs': (['--config=configs/default.py', '--config.num_epochs=3'], {}),
    'quick-sweep': (['--config=configs/quick.py', '--config.sweep.learning_rate=(1e-3, 2e-3)',
                     '--config.num_models=2', '--config.num_epochs=2'], {}),
    'tpu_v3_8-8-devices': (['--config=configs/tpu_v3_8.py', '--config.num_epochs=1',
                            '--config.data.train_split=train[:8192]'], EIGHT_DEVICES),
}


def record(name: str, out: pathlib.Path) -> list[dict]:
  """Runs one of RUNS in a fresh run directory; its records without timings, also saved."""
  args, env = RUNS[name]
  with tempfile.TemporaryDirectory() as workdir:
    subprocess.run([sys.executable, 'train.py', *args, f'--workdir={workdir}',
                    '--compilation_cache=off'], cwd=ROOT, check=True, env={**os.environ, **env})
    lines = pathlib.Path(workdir, 'metrics.jsonl').read_text().splitlines()
  records = [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]
  (out / f'{name}.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  return records


def main(argv: list[str]) -> None:
  del argv
  out = pathlib.Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  differ = 0
  for name in RUNS:
    records = record(name, out)
    if _COMPARE.value:
      earlier = [json.loads(line) for line in
                 pathlib.Path(_COMPARE.value, f'{name}.jsonl').read_text().splitlines()]
      wrong = [(a, b) for a, b in zip(records, earlier) if a != b]
      if wrong or len(records) != len(earlier):
        differ += 1
        print(f'{name}: differs: {wrong[:1] or (len(records), len(earlier))}')
      else:
        print(f'{name}: {len(records)} records bit-identical')
  sys.exit(1 if differ else 0)


if __name__ == '__main__':
  Host().run(main, parse_flags)
