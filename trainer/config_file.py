"""The config file a command line names, loaded by ml_collections: its code's failures and the
overrides' typos are one line each, and a config goes back to the flags that would set it."""

import contextlib
import logging
import os
import shlex
import traceback
from collections.abc import Iterator

import ml_collections
from absl import flags

from errors import CONFIG_FIELD_GUESS, CONFIG_FIELD_NAMED, UserError


class ConfigFileFailed(Exception):
  """The config file's own code raised: one line naming the exception and the file."""


class ConfigFileParser(flags.ArgumentParser):
  """ml_collections' own loader, telling an exception of the file's code from override typos."""

  def __init__(self, loader: flags.ArgumentParser):
    self.loader = loader

  def parse(self, argument: str) -> ml_collections.ConfigDict:
    file = os.path.abspath(argument.split(':', 1)[0])
    try:
      with _loader_logs_muted():  # Its warning of a get_config() that returned None: said below.
        config = self.loader.parse(argument)
    except Exception as error:  # The config file is user code: any failure in it is theirs to fix.
      # ml_collections re-raises a TypeError or ValueError with the traceback as its message.
      cause = (error.__context__ if 'Error whilst parsing' in str(error) else None) or error
      raise ConfigFileFailed(_config_file_failure(cause, file)) from None
    if config is None:
      raise ConfigFileFailed(f'get_config() of the config file {file} returned None; return the '
                             'ml_collections.ConfigDict it builds')
    return config

  def flag_type(self) -> str:
    return self.loader.flag_type()


def _config_file_failure(cause: BaseException, file: str) -> str:
  """The line for an exception of a config file's code, in its own words where it checked the
  user's argument (a UserError)."""
  if isinstance(cause, UserError):
    return str(cause)
  if isinstance(cause, AttributeError) and 'get_config' in str(cause):
    return (f'the config file {file} has no get_config(); define one that returns an '
            'ml_collections.ConfigDict, or pass --config=configs/default.py')
  lines = [f.lineno for f in traceback.extract_tb(cause.__traceback__)
           if os.path.abspath(f.filename) == file]
  where = f'{file}, line {lines[-1]}' if lines else file
  text = ' '.join(str(cause).split())
  return (f'the config file raised {type(cause).__name__}{": " + text if text else ""} ({where}); '
          'fix it, or pass --config=configs/default.py')


@contextlib.contextmanager
def _loader_logs_muted() -> Iterator[None]:
  """Drops ml_collections' log records about loading a config file, which train.py words itself."""
  muted = lambda record: not record.pathname.endswith('config_flags.py')
  absl_logger = logging.getLogger('absl')
  absl_logger.addFilter(muted)
  try:
    yield
  finally:
    absl_logger.removeFilter(muted)


def unknown_field(error: Exception) -> str:
  """'lerning_rate' -> the field name and ml_collections' suggestion, on one line."""
  text = str(error.args[0]) if error.args else str(error)
  found = CONFIG_FIELD_NAMED.search(text)
  name = found.group(1) if found else text.split()[0]
  suggestion = CONFIG_FIELD_GUESS.search(text)
  hint = (f'did you mean {suggestion.group(1)!r}?' if suggestion
          else 'check the name in the config file')
  return f'the config has no field {name!r}; {hint}'


def flag_lines(config: ml_collections.ConfigDict) -> list[str]:
  """Each field of the config as the flag that sets it to its value, for --print_config."""
  from trainer import config_rules  # pylint: disable=g-import-not-at-top; it imports JAX
  return [f'--config.{name}={shlex.quote(value if isinstance(value, str) else repr(value))}'
          for name, value in sorted(config_rules.fields(config).items())]
