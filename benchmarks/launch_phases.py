"""Where a launch's seconds go, from `python train.py` to its exit: a first launch and a relaunch.

  python -m benchmarks.launch_phases --out=/tmp/phases                  # configs/default.py
  python -m benchmarks.launch_phases --out=/tmp/phases -- --config=configs/quick.py

train.py's flags follow `--`; without a --config among them, configs/default.py runs.

Each launch is train.py in a fresh run directory, under cProfile, sharing one compilation cache
folder that starts empty: the first launch compiles, the relaunch loads. The table gives the wall
clock from spawning the process to its exit, the profile's own total (the rest is the interpreter's
start and exit), the time importing modules, starting JAX's backends, and the functions of this
project that took the longest, cumulative (they nest: a row includes the rows it calls). Each
launch's profile is kept in --out (`python -m pstats FILE`), with its output. On Python 3.12 and
later, cProfile leaves out some functions still running when train.py ends through `sys.exit`
(its `main`, the loop): read the rows one by one, never summed.
"""

import pathlib
import pstats
import subprocess
import sys
import tempfile
import time

from absl import flags

from benchmarks.workload import ROOT, parse_flags
from trainer.host.boundary import Host

_OUT = flags.DEFINE_string('out', None, 'Folder for the profiles and the output.', required=True)
_LAUNCHES = flags.DEFINE_integer('launches', 2, 'Launches, each in a fresh run directory.')
_ROWS = flags.DEFINE_integer('rows', 14, "How many of the project's functions to list.")

# Where Python and JAX spend a launch's time outside this project: (file's ending, function).
OUTSIDE = {'imports': ('<frozen importlib._bootstrap>', '_find_and_load'),
           "JAX's backends": ('xla_bridge.py', 'backends')}
OURS = ('train.py', '/trainer/', '/data/', '/mlp/', '/errors.py', '/command.py', '/native_logs.py')


def launch(args: list[str], cache: str, out: pathlib.Path, name: str) -> float:
  """One train.py in a fresh run directory under cProfile; its seconds from spawn to exit."""
  with tempfile.TemporaryDirectory() as workdir:
    command = [sys.executable, '-m', 'cProfile', '-o', str(out / f'{name}.prof'), 'train.py',
               f'--workdir={workdir}', f'--compilation_cache={cache}', *args]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
  (out / f'{name}.log').write_text(done.stdout + done.stderr)
  if done.returncode:
    sys.exit(f'error: {name} exited with {done.returncode}; its output is in {out / name}.log')
  return seconds


def phases(profile: pstats.Stats, rows: int) -> list[tuple[str, float]]:
  """The profile's total, the outside costs of OUTSIDE, then this project's longest functions."""
  stats = profile.stats.items()  # type: ignore[attr-defined]
  found = {where: entry[3] for where, entry in stats}  # Cumulative seconds.
  named = [(what, sum(seconds for (file, _, function), seconds in found.items()
                      if file.endswith(ending) and function == name))
           for what, (ending, name) in OUTSIDE.items()]
  ours = sorted(((f'{pathlib.Path(file).name}:{function}', seconds)
                 for (file, _, function), seconds in found.items()
                 if any(part in file for part in OURS) and function != '<module>'),
                key=lambda row: -row[1])
  return [('profile total', profile.total_tt), *named, *ours[:rows]]  # type: ignore[attr-defined]


def main(argv: list[str]) -> None:
  out = pathlib.Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as cache:
    names = [f'launch{i + 1}' for i in range(_LAUNCHES.value)]
    args = argv[1:] if any(arg.startswith('--config=') for arg in argv) else [
        '--config=configs/default.py', *argv[1:]]
    walls = [launch(args, cache, out, name) for name in names]
  tables = [dict(phases(pstats.Stats(str(out / f'{name}.prof')), _ROWS.value)) for name in names]
  keys = list(dict.fromkeys(key for table in tables for key in table))
  print(f'{"seconds":<44}' + ''.join(f'{name:>10}' for name in names))
  print(f'{"wall clock, spawn to exit":<44}' + ''.join(f'{wall:>10.2f}' for wall in walls))
  for key in keys:
    print(f'{key[:44]:<44}' + ''.join(f'{table.get(key, 0.0):>10.2f}' for table in tables))


if __name__ == '__main__':
  Host().run(main, parse_flags)
