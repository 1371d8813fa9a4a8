"""JAX's backend, started once before any work: a plugin that is missing or a device that another
process holds, where JAX_PLATFORMS asks for it, is the user's one line rather than JAX's traceback."""

import os
import re

from errors import UserError

# JAX's words for a backend that JAX_PLATFORMS names and that cannot start: "Unable to initialize
# backend 'tpu': ABORTED: The TPU is already in use by process with pid 2718. ... (set
# JAX_PLATFORMS='' to automatically choose an available backend)".
_CANNOT_START = re.compile(r"Unable to initialize backend '([^']+)': (.*?)(?: \(set JAX_PLATFORMS=.*)?$",
                           re.S)
_INSTALL = ('install its plugin (make train ACCELERATOR=cuda12, or tpu, on a fresh clone), or unset '
            'JAX_PLATFORMS to run on the devices JAX finds')


def start() -> None:
  """Starts JAX's backend on the platforms JAX_PLATFORMS names (all it finds when unset)."""
  import jax  # pylint: disable=g-import-not-at-top; after the flags, which need none of it
  platforms = os.environ.get('JAX_PLATFORMS', '')
  try:
    jax.devices()
  except RuntimeError as error:
    found = _CANNOT_START.search(' '.join(str(error).split()))
    if not found:
      raise
    backend, reason = found.groups()
    fix = ('another process holds it: wait for that one to end, or stop it' if 'in use' in reason
           else _INSTALL)
    raise UserError(f'JAX could not start its {backend} backend ({reason}); {fix}') from error
  except AssertionError as error:  # JAX's answer when no platform named has a plugin installed.
    if not platforms:
      raise
    raise UserError(f'JAX has no backend for JAX_PLATFORMS={platforms}; {_INSTALL}') from error
