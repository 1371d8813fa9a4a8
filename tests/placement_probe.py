"""Run as `python -m tests.placement_probe OUT_DIR` with 8 simulated devices, not in pytest.

Trains one sweep of 8 members on one device and spread over the 8 (member_shards 8 and 4), resumes
a checkpoint of each placement under another, and reads the collectives of the compiled training
epochs; writes what it saw to OUT_DIR/probe.json for tests/test_member_placement.py.
"""

import json
import pathlib
import shutil
import sys

import jax

from benchmarks.collectives import collectives
from data.mnist import load_split
from tests.conftest import make_config
from tests.parallel_probe import RESUMABLE
from trainer import loop
from trainer.plan import resolve
from trainer.programs import compile_programs
from trainer.host.run_dir import RunDirectory

# 8 members: 2 learning rates x 2 label smoothings (each member's own optimizer and loss values)
# x seeds 1 and 2, on the parallel tests' small model and data. Seeds 1 and 2, as the parallel
# tests' seed 1 (tests/parallel_probe.py): on an AMD EPYC (2026-11-29) under JAX 0.12, the member
# of seed 0, learning rate 2e-3 and no smoothing, vmapped with 7 others on one device, parted from
# its 1 or 2 per device by 1.4e-5 in epoch 1 and 1.3e-3 by epoch 2, the other 7 within 3e-7;
# under JAX 0.10.2 all 8 agreed within 3e-7.
SWEEP = {**RESUMABLE, 'seed': 1, 'num_models': 2, 'sweep__learning_rate': (2e-3, 4e-3),
         'sweep__label_smoothing': (0.0, 0.1)}
# Each run by its name: parallel=jit on one device, and members over the mesh's `members` axis.
PLACEMENTS = {'one-device': {'parallel': 'jit'}, 'shards-8': {'member_shards': 8},
              'shards-4': {'member_shards': 4}}
# A placement's run cut back to its epoch-1 checkpoint and resumed under another: OUT/<a>-<b>/.
RESUMES = (('shards-8', 'one-device'), ('one-device', 'shards-8'),
           ('shards-4', 'members-over-data'))
RESUME_MARK = 'probe: resuming '


def config_of(name: str):
  """The sweep's config placed as `name` says (members-over-data: member_shards=1 under mesh)."""
  return make_config(**SWEEP, **PLACEMENTS.get(name, {'parallel': 'mesh'}))


def programs_collectives() -> dict:
  """Each placement's training epoch compiled for 8 devices: its collectives, and the gradients'
  shape, as XLA's optimized program holds them."""
  found = {}
  for name, shards in (('members-over-data', 1), ('shards-8', 8)):
    config = make_config(**SWEEP, parallel='mesh', member_shards=shards)
    train = load_split(config.data, config.data.train_split)
    program = compile_programs(resolve(config), train, train).train_program
    found[name] = collectives(program.as_text())  # type: ignore[union-attr]
  return found


def main(out_dir: str) -> None:
  out = pathlib.Path(out_dir)
  for name in PLACEMENTS:
    loop.train_and_evaluate(resolve(config_of(name)), RunDirectory(out / name))
  for first, then in RESUMES:
    workdir = out / f'{first}-{then}'
    shutil.copytree(out / first, workdir)
    shutil.rmtree(workdir / '2')
    print(f'{RESUME_MARK}{first}-{then}', flush=True)  # Its lines follow, to the next mark.
    loop.train_and_evaluate(resolve(config_of(then)), RunDirectory(workdir))
  report = {'device_count': jax.device_count(), 'collectives': programs_collectives()}
  (out / 'probe.json').write_text(json.dumps(report))


if __name__ == '__main__':
  main(sys.argv[1])
