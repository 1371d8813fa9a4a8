"""JAX's backend and its devices: a plugin that is missing or a device that another process holds
(where JAX_PLATFORMS asks for it, and a TPU where JAX would fall back to the CPU), each the user's
one line rather than a traceback."""

import os

from errors import UserError
from library_errors import (BACKEND_CANNOT_START, BACKEND_HELD, BACKEND_LIBTPU, BACKEND_UNKNOWN,
                            TPU_FAILED_QUIETLY, TPU_HELD)

_PLUGIN = 'make train ACCELERATOR=cuda12, or tpu, on a fresh clone'
_UNSET = 'unset JAX_PLATFORMS to run on the devices JAX finds'
_INSTALL = f'install its plugin ({_PLUGIN}), or {_UNSET}'


def start(cpu_will_do: bool = False) -> None:
  """Starts JAX's backend on the platforms JAX_PLATFORMS names (all it finds when unset); never on
  the CPU in place of a TPU that another process holds, unless `cpu_will_do` (reading a run)."""
  import jax  # pylint: disable=g-import-not-at-top; after the flags, which need none of it
  try:
    jax.devices()
  except RuntimeError as error:
    found = BACKEND_CANNOT_START.search(' '.join(str(error).split()))
    if not found:
      raise
    backend, reason = found.groups()
    # JAX_PLATFORMS=gpu names the rocm backend it tried last.
    if known := BACKEND_UNKNOWN.search(reason):
      raise UserError(f'JAX has no backend for JAX_PLATFORMS={os.environ.get("JAX_PLATFORMS")} '
                      f'(it has {known.group(1)}); name one of those, or {_UNSET}; a GPU or TPU '
                      f'needs its plugin ({_PLUGIN})') from error
    raise UserError(f'JAX could not start its {backend} backend ({reason}); '
                    f'{_fix(reason, backend)}') from error
  except AssertionError as error:  # JAX's answer when no platform named has a plugin installed.
    platforms = os.environ.get('JAX_PLATFORMS')
    if not platforms:
      raise
    raise UserError(f'JAX has no backend for JAX_PLATFORMS={platforms}; {_INSTALL}') from error
  if not cpu_will_do and not os.environ.get('JAX_PLATFORMS') and jax.default_backend() == 'cpu':
    _refuse_a_held_tpu()


def _refuse_a_held_tpu() -> None:
  """Where another process holds this machine's TPU, JAX falls back to the CPU with a warning
  alone, and a run meant for the TPU would crawl there unnoticed."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    jax.devices('tpu')
  except RuntimeError as error:
    found = TPU_FAILED_QUIETLY.search(' '.join(str(error).split()))
    if found and TPU_HELD in found.group(1):
      fix = _fix(found.group(1), 'tpu')
      raise UserError(f"JAX could not start this machine's TPU ({found.group(1)}) and would run "
                      f'on the CPU instead; {fix}, or set JAX_PLATFORMS=cpu to run on the CPU'
                      ) from error


def _fix(reason: str, backend: str) -> str:
  """What to do about a backend that could not start, by JAX's reason."""
  if BACKEND_HELD in reason:
    return 'another process holds it: wait for that one to end, or stop it'
  if BACKEND_LIBTPU in reason:
    return _INSTALL
  check = ('check that this machine has that device and that its driver works (a GPU: '
           'nvidia-smi)')
  if backend == 'cpu':  # No driver: the CPU's devices are what XLA_FLAGS asks of it.
    check = f'check XLA_FLAGS ({os.environ.get("XLA_FLAGS", "unset")})'
  return f'{check}, or {_UNSET}' if os.environ.get('JAX_PLATFORMS') else check
