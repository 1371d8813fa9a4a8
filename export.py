"""Exports a trained run's classifier for serving: `python export.py --workdir=RUN --out=DIR`."""

import os
import sys

if __name__ == '__main__':  # A Ctrl-C or SIGTERM, or a library missing: one line, no traceback.
  from trainer.host import boundary
  HOST = boundary.start('stopped by {signal}; nothing was exported')

# pylint: disable=wrong-import-position
from absl import flags

from command import define_member_flag, parse_tool_flags
from errors import UsageError, shown
from serving.folder import FILES, MANIFEST, OutFolder
from trainer.host.boundary import Host, Phase
from trainer.host.exits import say

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory of a trained run (train.py\'s --workdir); its newest '
    'checkpoint that restores and verifies is exported, as predict.py chooses it.')
_OUT = flags.DEFINE_string('out', None, 'Local folder to write the export to (made if missing).')
_FORMATS = flags.DEFINE_list(
    'formats', ['stablehlo'], f'Comma-separated, of {", ".join(FILES)}: StableHLO by jax.export '
    '(runs with JAX alone), a TensorFlow SavedModel in TensorFlow\'s own ops (needs the '
    'TensorFlow extra), an ONNX model (needs the ONNX extra).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace an export already in --out.')
_MEMBER = define_member_flag()
FORMAT_CHOICE = f'one or more of {",".join(FILES)} to --formats'
USAGE = (f'python {shown(__file__)} --workdir=RUN --out=DIR '
         '[--formats=stablehlo,savedmodel,onnx] [--overwrite]')  # A path from here.


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with every mistake reported as one line instead of a traceback."""
  rest = parse_tool_flags(argv, USAGE)
  unknown = ', '.join(name for name in _FORMATS.value if name not in FILES)
  for mistake, why in ((not _WORKDIR.value, 'no run given; pass the directory of a trained run'),
                       (not _OUT.value, 'no --out given; pass a folder to export to'),
                       (len(rest) > 1, f'unexpected arguments {" ".join(rest[1:])}'),
                       (not _FORMATS.value, f'--formats is empty; pass {FORMAT_CHOICE}'),
                       (unknown, f'no format named {unknown}; pass {FORMAT_CHOICE}')):
    if mistake:
      raise UsageError(f'{why}: {USAGE}')
  return rest


def report(out: OutFolder, sizes: dict[str, int], epoch: int, workdir: str, ensemble: str) -> None:
  """One line per file written, then what was exported from where."""
  width = max(len(os.path.join(out.path, name)) for name in (*sizes, MANIFEST))
  for name, count in sizes.items():
    say(f'{os.path.join(out.path, name):<{width}}  {count / 1e6:6.2f} MB', sys.stdout)
  say(f'{os.path.join(out.path, MANIFEST):<{width}}  what was exported, from where, and its '
      'inputs and outputs', sys.stdout)
  print(f'exported the checkpoint of epoch {epoch} in {workdir}{ensemble}: uint8 images '
        '[N, 28, 28] in, class probabilities [N, 10] out', file=sys.stderr)


def main(argv: list[str], host: Host) -> None:
  """Checks --out, restores the run's newest good checkpoint, writes each format, says them."""
  del argv  # parse_flags has checked there is nothing else, and that both folders are given.
  given = str(_WORKDIR.value)
  out = OutFolder(str(_OUT.value), _OVERWRITE.value)
  out.check(given)  # Before JAX loads: a mistake about the folder is reported at once.
  formats = list(dict.fromkeys(_FORMATS.value))
  os.environ.setdefault('EPATH_USE_TF', 'false')  # gs:// through gcsfs, as train.py reads it.
  # pylint: disable=g-import-not-at-top; after the flags, for --help
  from serving import artifacts
  artifacts.require_extras(formats)  # Before the checkpoint is read.
  from trainer import evaluation
  workdir, plan, restored, which = evaluation.classifier(given, host, _MEMBER.value)
  # From here a signal unwinds, so that the staged copy is removed and an export there stays.
  host.phase(Phase.FINISHING, 'stopped by {signal} while writing the export; rerun the same '
             'command to export the run')
  with out.staged() as staging:
    sizes = artifacts.write(restored.state, plan.precision, formats, staging,
                            {'run': str(workdir), 'epoch': restored.epoch,
                             'models': int(restored.state.step.size), 'config': restored.config,
                             'classifier': which.removeprefix(', ') or 'the run\'s one model'})
    # A signal waits while the files move into --out (a stop there would leave an old export part
    # gone, the new one part there); then the export, whole, is said, and the signal ends it.
    host.phase(Phase.COMMITTING)
  host.phase(Phase.ENDING)
  report(out, sizes, restored.epoch, str(workdir), which)


if __name__ == '__main__':
  HOST.run(lambda argv: main(argv, HOST), parse_flags)
