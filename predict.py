"""Classifies pictures of digits with a trained run: `python predict.py --workdir=RUN IMAGES...`."""

import json
import os
import sys
import warnings

if __name__ == '__main__':  # A Ctrl-C or SIGTERM, or a library missing: one line, no traceback.
  from trainer.host import boundary
  HOST = boundary.start('stopped by {signal}; rerun the same command to classify the images')

# pylint: disable=wrong-import-position
import numpy as np
from absl import flags

from command import define_member_flag, parse_tool_flags
from errors import During, UsageError, UserError, shown
from trainer.host.boundary import Host, Phase
from trainer.host.exits import error_line, say

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory of a trained run (train.py\'s --workdir); its newest '
    'checkpoint that restores and verifies classifies the images, with the config saved with it.')
_JSON = flags.DEFINE_bool('json', False, 'One JSON object per image instead of a line of text.')
_MEMBER = define_member_flag()
USAGE = f'python {shown(__file__)} --workdir=RUN IMAGE_OR_FOLDER...'  # A path from here.


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with every mistake raised as the UsageError of its one line."""
  rest = parse_tool_flags(argv, USAGE)
  if not _WORKDIR.value:
    raise UsageError(f'no run given; pass the run directory of a trained run: {USAGE}')
  if len(rest) < 2:
    raise UsageError(f'no images given; pass image files or folders of them: {USAGE}')
  if sys.stdout is None:  # Started with it closed (`>&-`): print() would drop every line.
    raise UserError('standard output is closed (>&-), so the classifications would go nowhere; '
                    'send it to a file or a pipe (> digits.txt), then rerun the same command')
  return rest


def image_files(paths: list[str]) -> list[str]:
  """The files named, and each folder's image files (by the extensions Pillow reads), in order."""
  from PIL import Image  # pylint: disable=g-import-not-at-top; after flags, so --help stays fast
  extensions = Image.registered_extensions()
  files = []
  for path in paths:
    if os.path.isdir(path):
      with During('listing the images', path):
        names = os.listdir(path)
      found = sorted(os.path.join(path, name) for name in names
                     if os.path.splitext(name)[1].lower() in extensions
                     and os.path.isfile(os.path.join(path, name)))
      if not found:
        raise UserError(f'the folder {path} holds no image files; pass a folder of PNG, JPEG or '
                        'other pictures, or the image files themselves')
      files.extend(found)
    elif os.path.isfile(path):
      files.append(path)
    elif os.path.exists(path):  # A pipe or a device: Pillow would wait on it, or read without end.
      raise UserError(f'{path} is neither a file nor a folder; pass image files or folders of them')
    else:
      raise UserError(f'{_missing(path)}; pass image files or folders of them')
  return files


def _missing(path: str) -> str:
  """Words for a path that names nothing: a pattern the shell found no match for, kept as typed."""
  if not path:
    return "an empty path ('') names no file"
  if any(sign in path for sign in '*?['):
    return f'no file matches {path}'
  return f'{path} does not exist'


def read_digit(path: str) -> np.ndarray:
  """uint8 [784]: the file as an MNIST image, or a UserError that names it and says why not."""
  from PIL import Image, UnidentifiedImageError  # pylint: disable=g-import-not-at-top
  from data import digit_images  # pylint: disable=g-import-not-at-top
  try:
    with warnings.catch_warnings():  # Pillow's warning of a huge picture: refused as its error is.
      warnings.simplefilter('error', Image.DecompressionBombWarning)
      with Image.open(path) as image:
        return digit_images.to_mnist(image).reshape(-1)
  except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
    raise UserError(f'{path} is too large a picture to read ({error}); pass a picture of one '
                    'digit, a few hundred pixels across') from error
  except UnidentifiedImageError as error:
    raise UserError(f'{path} is not an image Pillow can read; pass PNG, JPEG or another picture '
                    'format') from error
  except digit_images.NotFinite as error:
    raise UserError(f'{path}: {error}; pass a picture whose pixels are all numbers, such as an '
                    '8-bit PNG or JPEG of it') from error
  except digit_images.NoDigit as error:
    raise UserError(f'{path}: {error}; pass a picture of one dark digit on a light page, or the '
                    'reverse') from error
  except (OSError, ValueError) as error:
    raise UserError(f'{path} cannot be read ({error}); pass a complete image file that this user '
                    'can read') from error


def read_digits(files: list[str]) -> tuple[list[str], np.ndarray, list[str]]:
  """The files that are pictures of digits and their MNIST images (uint8 [N, 784]), and a line for
  each file that is not: one bad file in a folder leaves the others to classify."""
  read, digits, unread = [], [], []
  for path in files:
    try:
      digits.append(read_digit(path))
      read.append(path)
    except UserError as error:
      unread.append(str(error))
  return read, np.array(digits, np.uint8).reshape(-1, 784), unread


def report(files: list[str], probabilities: np.ndarray, as_json: bool) -> None:
  """One line per image: the digit, its probability and the runner-up."""
  width = max(len(path) for path in files)
  for path, row in zip(files, probabilities):
    first, second = (int(d) for d in row.argsort()[::-1][:2])
    say(json.dumps({'file': path, 'digit': first, 'probability': float(row[first]),
                    'runner_up': second, 'runner_up_probability': float(row[second])}) if as_json
        else f'{path:<{width}}  {first}  {row[first]:6.1%}   runner-up {second} {row[second]:6.1%}',
        sys.stdout)


def main(argv: list[str], host: Host) -> None:
  """Reads the images, restores the run's newest good checkpoint, says each image's digit."""
  files, digits, unread = read_digits(image_files(argv[1:]))
  if not files:  # Nothing to classify: said at once, before JAX loads.
    for line in unread[:-1]:
      say(error_line(line), sys.stderr)
    raise UserError(unread[-1])
  os.environ.setdefault('EPATH_USE_TF', 'false')  # gs:// through gcsfs, as train.py reads it.
  # pylint: disable=g-import-not-at-top; after the flags and the images, which need none of it
  from trainer import evaluation
  # --workdir is given: parse_flags checked.
  workdir, plan, restored, which = evaluation.classifier(str(_WORKDIR.value), host, _MEMBER.value)
  report(files, evaluation.probabilities(plan, restored, digits), _JSON.value)
  host.phase(Phase.ENDING)  # Every image is classified and said: a signal now only ends it.
  for line in unread:
    say(error_line(line), sys.stderr)
  left_out = f'; left out {len(unread)} that could not be read, each said above' if unread else ''
  print(f'classified {len(files)} image{"s" if len(files) > 1 else ""} with the checkpoint of '
        f'epoch {restored.epoch} in {workdir}{which}{left_out}', file=sys.stderr)
  sys.exit(1 if unread else 0)


if __name__ == '__main__':
  HOST.run(lambda argv: main(argv, HOST), parse_flags)
