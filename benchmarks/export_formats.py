"""The export formats side by side, in one run: each file's size, the seconds to load it in a fresh
process, and its latency at batch 1 and 1,000, each run by its own framework (JAX, TensorFlow,
onnxruntime) through serving/load_export.py, as a user serving it would.

  python -m benchmarks.export_formats [--workdir=RUN] [--processes=3] [--calls=50]

Without --workdir it first trains configs/quick.py in a temporary folder. Then export.py writes
every format; each format is loaded in --processes fresh `python -I` processes, each of which calls
it once per batch size (compiling included), then --calls more times, timed. Prints a Markdown table
(medians over the processes of the load and first call, and of each process's median call; the range
over the processes in brackets), then one JSON line.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import flags

from benchmarks.workload import ROOT, parse_flags
from trainer.host.boundary import Host

_WORKDIR = flags.DEFINE_string('workdir', None, 'A trained run; default: configs/quick.py trained '
                               'now in a temporary folder.')
_PROCESSES = flags.DEFINE_integer('processes', 3, 'Fresh processes that load each format.')
_CALLS = flags.DEFINE_integer('calls', 50, 'Timed calls of each batch size in each process.')
FORMATS = {'stablehlo': ('model.jax_export', 'JAX'), 'savedmodel': ('saved_model', 'TensorFlow'),
           'onnx': ('model.onnx', 'onnxruntime')}
BATCH_SIZES = (1, 1000)


def run(*command: str) -> str:
  """A command's stdout; its stderr, as the error, if it fails."""
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
  if done.returncode:
    sys.exit(f'error: {" ".join(command)} failed: {done.stderr.strip()}')
  return done.stdout


def size(path: str) -> int:
  """Bytes of a file, or of every file under a folder."""
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(folder, name))
             for folder, _, names in os.walk(path) for name in names)


def measure(out: str, form: str) -> dict[str, list[float]]:
  """Each figure of load_export.py's JSON line, one value per fresh process."""
  figures: dict[str, list[float]] = {}
  for _ in range(_PROCESSES.value):
    line = run(sys.executable, '-I', os.path.join(ROOT, 'serving', 'load_export.py'), out,
               f'--format={form}', f'--batch_sizes={",".join(map(str, BATCH_SIZES))}',
               f'--repeat={_CALLS.value}').strip().splitlines()[-1]
    for name, value in json.loads(line).items():
      if isinstance(value, float):
        figures.setdefault(name, []).append(value)
  return figures


def cell(values: list[float], unit: float = 1e3, digits: int = 1) -> str:
  """Median [min-max] in ms (or another unit)."""
  shown = [f'{v * unit:,.{digits}f}' for v in (statistics.median(values), min(values),
                                               max(values))]
  return f'{shown[0]} ({shown[1]}-{shown[2]})'


def table(sizes: dict[str, int], figures: dict[str, dict[str, list[float]]]) -> str:
  """The Markdown table: a column per format."""
  rows = [('| | ' + ' | '.join(f'`{FORMATS[f][0]}` ({FORMATS[f][1]})' for f in figures) + ' |'),
          '| --- |' + ' --- |' * len(figures),
          '| size, bytes | ' + ' | '.join(f'{sizes[f]:,}' for f in figures) + ' |',
          '| load, s: the framework\'s import and the file | '
          + ' | '.join(cell(v['load_s'], 1, 2) for v in figures.values()) + ' |']
  for batch in BATCH_SIZES:
    rows.append(f'| first call, batch {batch:,}, ms (compiling included) | '
                + ' | '.join(cell(v[f'first_call_s_batch{batch}']) for v in figures.values())
                + ' |')
    rows.append(f'| latency, batch {batch:,}, ms (median call) | '
                + ' | '.join(cell(v[f'median_s_batch{batch}'], 1e3, 3 if batch == 1 else 2)
                             for v in figures.values()) + ' |')
  return '\n'.join(rows)


def main(argv: list[str]) -> None:
  del argv
  with tempfile.TemporaryDirectory(prefix='export-formats-') as folder:
    workdir = _WORKDIR.value or os.path.join(folder, 'quick')
    if not _WORKDIR.value:
      run(sys.executable, 'train.py', '--config=configs/quick.py', f'--workdir={workdir}')
    out = os.path.join(folder, 'export')
    run(sys.executable, 'export.py', f'--workdir={workdir}', f'--out={out}',
        f'--formats={",".join(FORMATS)}')
    sizes = {form: size(os.path.join(out, FORMATS[form][0])) for form in FORMATS}
    figures = {form: measure(out, form) for form in FORMATS}
    with open(os.path.join(out, 'export.json'), encoding='utf-8') as f:
      written_by = json.load(f)['written_by']
  print(table(sizes, figures))
  print(json.dumps({'sizes': sizes, 'figures': figures, 'written_by': written_by}))


if __name__ == '__main__':
  Host().run(main, parse_flags)
