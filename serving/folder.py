"""The folder an export is written to: checked before any work, filled whole or not at all.

No JAX here: every mistake about the folder is reported before the checkpoint is read.
"""

import contextlib
import os
import shutil
import time
from collections.abc import Iterator

from errors import During, UserError

STABLEHLO, SAVED_MODEL, ONNX = 'stablehlo', 'savedmodel', 'onnx'
FILES = {STABLEHLO: 'model.jax_export', SAVED_MODEL: 'saved_model',
         ONNX: 'model.onnx'}  # Format -> its name in DIR.
MANIFEST = 'export.json'  # What was exported, from where: written last, so it marks a whole export.
EXPORT_NAMES = (*FILES.values(), MANIFEST)


class OutFolder:
  """A local folder of exports: refuses to replace one without `overwrite`, or to write in a run."""

  def __init__(self, out: str, overwrite: bool = False):
    if '://' in out:
      raise UserError(f'--out={out} is not a local folder; export to one, then copy it where it '
                      'serves (gcloud storage cp -r DIR gs://BUCKET/PATH)')
    self.path = os.path.abspath(out)
    self._overwrite = overwrite

  def check(self, workdir: str) -> None:
    """UserError when the folder cannot take an export: a file, inside the run, holding one."""
    if os.path.exists(self.path) and not os.path.isdir(self.path):
      raise UserError(f'--out={self.path} is a file; pass a folder to export to')
    above = os.path.dirname(self.path)
    while not os.path.lexists(above):  # The nearest folder on the way that is there.
      above = os.path.dirname(above)
    if not os.path.isdir(above):
      raise UserError(f'--out={self.path} cannot be made: {above} is a file; move it out of the '
                      'way, or pass another folder to export to')
    if '://' not in workdir:
      run = os.path.realpath(workdir)
      if os.path.commonpath([os.path.realpath(self.path), run]) == run:
        raise UserError(f'--out={self.path} is inside the run directory {run}, which export '
                        'never changes; pass a folder outside it')
    held = [name for name in EXPORT_NAMES if os.path.lexists(os.path.join(self.path, name))]
    if held and not self._overwrite:
      raise UserError(f'{self.path} already holds an export ({", ".join(held)}); pass '
                      '--overwrite to replace it, or another --out')

  @contextlib.contextmanager
  def staged(self) -> Iterator[str]:
    """A new folder beside the export to write it in, moved into place if the block succeeds.

    On any failure it is removed, and an export already there is left as it was.
    """
    parent, name = os.path.split(self.path)
    with During('writing', self.path):
      os.makedirs(parent, exist_ok=True)
      staging = os.path.join(parent, f'.{name}.partial-{os.getpid()}-{time.monotonic_ns()}')
      os.mkdir(staging)  # Not mkdtemp: its mode, 700, would follow the folder into place.
    with contextlib.ExitStack() as cleanup, During('writing', self.path):
      cleanup.callback(shutil.rmtree, staging, ignore_errors=True)
      yield staging
      self._move_in(staging)

  def _move_in(self, staging: str) -> None:
    """Replaces every file of an earlier export (other files stay); the manifest moves last."""
    if not os.path.exists(self.path):
      os.replace(staging, self.path)  # One rename: the folder appears whole.
      return
    for name in EXPORT_NAMES:
      old = os.path.join(self.path, name)
      if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old)
      elif os.path.lexists(old):
        os.remove(old)
    for name in sorted(os.listdir(staging), key=lambda n: n == MANIFEST):
      os.replace(os.path.join(staging, name), os.path.join(self.path, name))
