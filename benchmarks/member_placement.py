"""Where the members of a run go on several devices: over the `data` axis (member_shards=1, every
device holds every member and a piece of every batch) or over a `members` axis (member_shards=N,
each device its members and every batch whole): the collectives of the compiled training epoch, per
step and per epoch (count and bytes, read from its HLO), and the epoch's time, side by side.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.member_placement \\
      [--num_models=8] [--repeats=3] [--batch_size=128] [--num_images=8000] [--data=idx|synthetic]

The trainer's compiled epoch (benchmarks/workload.py's TrainerRun) of configs/default.py under
parallel=mesh, each placement warmed up by an epoch, then timed in turn per repetition. A
collective counts per step where it sits in the step loop (its HLO op_name runs through a while
body), per epoch otherwise; its bytes are its result's. Prints a table, then one JSON line.
"""

import json
import statistics

import jax
from absl import flags

from benchmarks import workload
from benchmarks.collectives import collectives
from errors import UserError
from trainer.host.boundary import Host

_NUM_MODELS = flags.DEFINE_integer('num_models', 8, 'Members (a multiple of the device count).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed epochs of each placement (at least 1).')

def measure(num_models: int, repeats: int) -> dict:
  """Each placement's collectives and epoch times (median, min, max ms), taking turns."""
  examples, description = workload.load_images()
  configs = {}
  for shards in (1, jax.device_count()):
    configs[shards] = workload.benchmark_config()
    configs[shards].parallel, configs[shards].num_models = 'mesh', num_models
    configs[shards].member_shards = shards
  runs, milliseconds = workload.epochs_in_turn(configs, examples, repeats)
  return {'data': description, 'images_per_epoch': runs[1].images_per_epoch,
          'placements': {str(shards): {
              'placement': trainer.placement, 'collectives': collectives(trainer.compiled_text()),
              'epoch_ms': {'median': statistics.median(milliseconds[shards]),
                           'min': min(milliseconds[shards]), 'max': max(milliseconds[shards])}}
                         for shards, trainer in runs.items()}}


def report(measured: dict, num_models: int) -> str:
  """The table, then the JSON object as the last line."""
  lines = [f'{measured["data"]}; {measured["images_per_epoch"]:,} images per epoch; '
           f'{num_models} members on {jax.device_count()} {jax.default_backend()} devices', '',
           f'{"member_shards":<15}{"per step":>22}{"per epoch":>22}{"epoch ms":>12}']
  for shards, placed in measured['placements'].items():
    step, epoch = placed['collectives']['per_step'], placed['collectives']['per_epoch']
    lines.append(f'{shards:<15}{step["count"]:>6} ({step["bytes"]:>11,} B){epoch["count"]:>6} '
                 f'({epoch["bytes"]:>11,} B){placed["epoch_ms"]["median"]:>12.1f}')
  lines += [f'  {shards}: {placed["placement"]}' for shards, placed in
            measured['placements'].items()]
  return '\n'.join(lines + ['', json.dumps({'num_models': num_models, **measured})])


def main(argv: list[str]) -> None:
  del argv
  devices = jax.device_count()
  if devices < 2 or _NUM_MODELS.value % devices or _REPEATS.value < 1:
    raise UserError(f'--num_models must be a multiple of the {devices} device(s) and --repeats 1 '
                    'or more, on several devices; e.g. XLA_FLAGS=--xla_force_host_platform_'
                    'device_count=8 python -m benchmarks.member_placement --num_models=8')
  print(report(measure(_NUM_MODELS.value, _REPEATS.value), _NUM_MODELS.value), flush=True)


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
