"""What JAX's compilation cache lacks: a default folder, checked first, its failures one warning."""

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping

from errors import clipped
from library_errors import JAX_CACHE_TROUBLE

OFF = 'off'
FOLDER = os.path.join('mnist-mlp', 'jax-compilation-cache')  # Under the user's cache folder.
# JAX options set here, each unless the environment sets it with JAX's variable (the tests do).
SETTINGS = {
    # Every program the run compiles, the small ones too: each costs a compile on a relaunch.
    'jax_persistent_cache_min_compile_time_secs': 0.0,
    # A size limit turns on JAX's file lock around the cache: runs at once, and the processes of
    # one run, never read an entry half written. Least recently used entries go first.
    'jax_compilation_cache_max_size': 2 * 2**30,
}


def default_folder(environ: Mapping[str, str]) -> str:
  """$XDG_CACHE_HOME/mnist-mlp/..., else ~/.cache/mnist-mlp/...: one folder for all run dirs."""
  home = environ.get('HOME') or os.path.expanduser('~')
  base = environ.get('XDG_CACHE_HOME') or os.path.join(home, '.cache')
  return os.path.join(base, FOLDER)


def choose_folder(flag: str | None, environ: Mapping[str, str]) -> str | None:
  """The flag's folder, else JAX's variable's, else the user's cache folder; None for `off`."""
  if flag == OFF:
    return None
  if flag:
    return os.path.abspath(os.path.expanduser(flag))
  return environ.get('JAX_COMPILATION_CACHE_DIR') or default_folder(environ)


def _unwritable(folder: str) -> str | None:
  """Why `folder` cannot hold the cache, or None when it can (created if missing)."""
  try:
    os.makedirs(folder, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix='.probe-'):
      pass
  except FileExistsError:  # makedirs' own reason, 'File exists', would not say which kind.
    return 'it is a file'
  except OSError as error:
    return error.strerror or str(error)
  return None


def enable(flag: str | None, warn: Callable[[str], None]) -> str | None:
  """Points JAX's cache at the chosen folder, before anything compiles; returns it (None: off).

  A folder that cannot be written is one warning, and the run compiles every program itself.
  """
  import jax  # pylint: disable=g-import-not-at-top; keeps --help and flag errors fast
  folder = choose_folder(flag, os.environ)
  problem = _unwritable(folder) if folder else None
  if problem:
    warn(f'the compilation cache {folder} cannot be used ({problem}); this run compiles every '
         f'program itself (pass --compilation_cache=FOLDER, or --compilation_cache={OFF})')
  if folder is None or problem:
    jax.config.update('jax_enable_compilation_cache', False)
    return None
  jax.config.update('jax_enable_compilation_cache', True)
  jax.config.update('jax_compilation_cache_dir', folder)
  for name, value in SETTINGS.items():
    if name.upper() not in os.environ:
      jax.config.update(name, value)
  return folder


@contextlib.contextmanager
def one_warning(warn: Callable[[str], None]) -> Iterator[None]:
  """JAX's warnings about cache entries it could not read or write, as one line at most."""
  import jax  # pylint: disable=g-import-not-at-top
  said: list[bool] = []
  with warnings.catch_warnings():
    show = warnings.showwarning

    def show_once(message, category, *args, **kwargs):
      if not JAX_CACHE_TROUBLE.match(str(message)):
        show(message, category, *args, **kwargs)
      elif not said:
        said.append(True)
        reason = clipped(str(message).split(': ', 1)[-1]).removeprefix('error: ')
        folder = jax.config.jax_compilation_cache_dir or ''
        warn(f'the compilation cache {folder} failed ({reason}); the run goes on, compiling what '
             f'it cannot load (delete its folder to start it afresh, or pass '
             f'--compilation_cache={OFF} to stop using it)')

    warnings.showwarning = show_once
    yield
