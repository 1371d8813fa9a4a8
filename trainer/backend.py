"""JAX's backend and its devices: a plugin that is missing or a device that another process holds
(where JAX_PLATFORMS asks for it, and a TPU where JAX would fall back to the CPU), and a machine's
limits met (memory, threads), each the user's one line rather than a traceback."""

import contextlib
import os
import re
from collections.abc import Iterator

from errors import UserError, error_reason, first_cause, host_out_of_memory, thread_refused
from library_errors import DEVICE_ALLOCATION, DEVICE_OUT_OF_MEMORY

# JAX's words for a backend that JAX_PLATFORMS names and that cannot start: "Unable to initialize
# backend 'tpu': ABORTED: The TPU is already in use by process with pid 2718. ... (set
# JAX_PLATFORMS='' to automatically choose an available backend)"; where it is unset, "(you may need
# to uninstall the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)".
_CANNOT_START = re.compile(
    r"Unable to initialize backend '([^']+)': (.*?)"
    r"(?: \((?:set JAX_PLATFORMS=|you may need to uninstall the failing plugin).*)?$", re.S)
# Its words when the TPU failed where JAX_PLATFORMS is unset (JAX then runs on the CPU, saying so
# in a warning only) and `jax.devices('tpu')` asks for it: "Backend 'tpu' failed to initialize:
# ABORTED: The TPU is already in use by process with pid 2718. Not attempting to load libtpu.so in
# this process.. Available backends are ['cpu']".
_FAILED_QUIETLY = re.compile(
    r"Backend 'tpu' failed to initialize: (.*?)\.*\s*Available backends")
# And for a backend it has no plugin for: "Backend 'rocm' is not in the list of known backends:
# ['cpu', 'tpu']."
_KNOWN = re.compile(r"not in the list of known backends: \[([^\]]*)\]")
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
    found = _CANNOT_START.search(' '.join(str(error).split()))
    if not found:
      raise
    backend, reason = found.groups()
    if known := _KNOWN.search(reason):  # JAX_PLATFORMS=gpu names the rocm backend it tried last.
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
    found = _FAILED_QUIETLY.search(' '.join(str(error).split()))
    if found and 'already in use' in found.group(1):
      fix = _fix(found.group(1), 'tpu')
      raise UserError(f"JAX could not start this machine's TPU ({found.group(1)}) and would run "
                      f'on the CPU instead; {fix}, or set JAX_PLATFORMS=cpu to run on the CPU'
                      ) from error


def _fix(reason: str, backend: str) -> str:
  """What to do about a backend that could not start, by JAX's reason."""
  if 'in use' in reason:
    return 'another process holds it: wait for that one to end, or stop it'
  if 'libtpu' in reason:
    return _INSTALL
  check = ('check that this machine has that device and that its driver works (a GPU: '
           'nvidia-smi)')
  if backend == 'cpu':  # No driver: the CPU's devices are what XLA_FLAGS asks of it.
    check = f'check XLA_FLAGS ({os.environ.get("XLA_FLAGS", "unset")})'
  return f'{check}, or {_UNSET}' if os.environ.get('JAX_PLATFORMS') else check


def out_of_memory(error: BaseException) -> BaseException | None:
  """The error among `error`'s causes that says memory ran out (None if none does): XLA's when it
  could not allocate a buffer, or Python's MemoryError; a config too big for the machine, not damage
  or a fault of the storage."""
  import jax  # pylint: disable=g-import-not-at-top
  return first_cause(error, lambda cause: isinstance(cause, MemoryError) or (
      isinstance(cause, jax.errors.JaxRuntimeError)
      and bool(DEVICE_OUT_OF_MEMORY.search(str(cause)))))


# The fix when the device's memory runs out, by what it was doing (None: not known).
_FIXES = {
    'training': 'lower batch_size, num_models or model.hidden_sizes in a new --workdir',
    'evaluating': 'lower eval_batch_size (the same command then resumes)',
    'classifying': 'classify on the CPU (JAX_PLATFORMS=cpu; the run sets the batch)',
    None: 'lower eval_batch_size (the same command then resumes), or batch_size, num_models or '
          'model.hidden_sizes in a new --workdir'}


class DeviceOutOfMemory(UserError):
  """The device's memory ran out, said with the fix for what it was doing: said once."""


def _device_ran_out(error: BaseException, doing: str | None) -> DeviceOutOfMemory:
  """The line for the device out of memory while `doing`: what to lower, or a bigger device."""
  import jax  # pylint: disable=g-import-not-at-top
  backend = jax.default_backend()
  device = 'this machine' if backend == 'cpu' else f'the {backend.upper()}'
  fix = _FIXES[doing]
  if doing == 'classifying' and backend == 'cpu':  # On the CPU already: only freed memory helps.
    fix = 'free memory (close other programs)'
  doing_words = f' {doing}' if doing else ''
  return DeviceOutOfMemory(f'{device} ran out of memory{doing_words} ({_memory_reason(error)}); '
                           f'{fix}, or use a device with more memory')


def _memory_reason(error: BaseException) -> str:
  """XLA's words for the memory that ran out; the allocation, where the first line does not name
  it (a GPU's compiler's)."""
  reason = error_reason(error)
  allocation = DEVICE_ALLOCATION.search(str(error))
  return allocation.group(0) if allocation and not DEVICE_ALLOCATION.search(reason) else reason


@contextlib.contextmanager
def device_memory_for(doing: str) -> Iterator[None]:
  """The device's memory run out while `doing` (training, evaluating or classifying) as that one's
  line: evaluation's fix (a smaller eval_batch_size) does nothing for training's."""
  try:
    yield
  except Exception as error:  # pylint: disable=broad-except; re-raised unless memory ran out
    memory_error = out_of_memory(error)
    if memory_error is None or isinstance(memory_error, MemoryError):  # The host's: said outside.
      raise
    raise _device_ran_out(memory_error, doing) from error


@contextlib.contextmanager
def machine_limits_said() -> Iterator[None]:
  """Memory that ran out, on the device or the host, or a thread the OS would not start, as the
  user's one line: what to lower or free. Orbax's threads that such a failure stranded are the
  exit's to end (train.py)."""
  try:
    yield
  except DeviceOutOfMemory:  # Said already, where it was met (device_memory_for).
    raise
  except Exception as error:  # pylint: disable=broad-except; re-raised unless a limit was met
    if line := thread_refused(error):
      raise UserError(line) from error
    memory_error = out_of_memory(error)
    if memory_error is None:
      raise
    if isinstance(memory_error, MemoryError):
      raise UserError(host_out_of_memory(memory_error)) from error
    raise _device_ran_out(memory_error, None) from error

