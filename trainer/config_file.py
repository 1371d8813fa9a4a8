"""The config file a command line names, loaded as ml_collections' config_flags would (its
`get_config()`, with the text after a colon as its argument, the config locked) but by importlib's
exec_module, not the deprecated load_module: a file that cannot be read, its code's failures, its
fields and the overrides' typos are one line each, in paths that work from the user's folder."""

import ast
import contextlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import traceback
from typing import Any

import ml_collections
from absl import flags

from errors import UsageError, UserError, shown
from trainer.config_fields import close_field, field_problem, fields, unsweepable, value_at

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(PROJECT_ROOT, 'configs')
MODULE_NAME = 'config_config'  # The name ml_collections gives the module of a --config file.


class ConfigFileFailed(UsageError):
  """The config file, or an override of its fields, gives no config: one line naming the fix."""


class ConfigFileParser(flags.ArgumentParser):
  """The parser of --config (ml_collections applies the overrides next): what it would leave to a
  traceback is one line: a file that cannot be read, the file's code failing, a field it lacks, an
  override naming no field."""

  def parse(self, argument: str) -> ml_collections.ConfigDict:
    file = os.path.abspath(argument.split(':', 1)[0])
    config = _load(argument, file)
    if problem := (field_problem(config, f'the config file {file}') or
                   override_problem(config, self.overridden())):
      raise ConfigFileFailed(problem)
    return config

  def overridden(self) -> list[tuple[str, str | None]]:
    """Each override on the command line, a field with the text of its value where one is given
    (`--config.model.dropout_rate=0.1`: model.dropout_rate, '0.1'), found in sys.argv as
    ml_collections finds them there; a field set twice, twice (a tuple's values join)."""
    arguments = flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False)
    pattern = re.compile(r'-{1,2}(?:no)?config\.([^=]+)(?:=(.*))?', re.S)
    given = []
    for argument, following in zip(arguments, [*arguments[1:], None]):
      if found := pattern.fullmatch(argument):  # `--config.FIELD VALUE`: the value follows.
        name, text = found.groups()
        given.append((name, text if text is not None or str(following).startswith('-')
                      else following))
    return given

  def flag_type(self) -> str:
    return 'config object'


def _load(argument: str, file: str) -> ml_collections.ConfigDict:
  """The config the file's get_config() returns, locked, or its one line as ConfigFileFailed."""
  if unreadable := _unreadable(argument):
    raise ConfigFileFailed(unreadable)
  path, *splits = argument.split(':', 1)
  loader = importlib.machinery.SourceFileLoader(MODULE_NAME, path)
  spec = importlib.util.spec_from_loader(MODULE_NAME, loader)
  assert spec is not None, 'a source file loader gives a spec'
  module = importlib.util.module_from_spec(spec)
  try:
    loader.exec_module(module)
    config = module.get_config(*splits)
  except Exception as error:  # The config file is user code: any failure in it is theirs to fix.
    raise ConfigFileFailed(_config_file_failure(error, file)) from None
  if config is None:
    raise ConfigFileFailed(f'get_config() of the config file {file} returned None; return the '
                           'ml_collections.ConfigDict it builds')
  if isinstance(config, ml_collections.ConfigDict):
    config.lock()
  return config


def _unreadable(argument: str) -> str | None:
  """The line for a config file that cannot be read from where the user is (None if it can), its
  fix a path that works from there."""
  path, colon, splits = argument.partition(':')
  if not path:
    return f'--config names no file; {pass_a_config()}'
  in_project = os.path.join(PROJECT_ROOT, path)
  if not os.path.isabs(path) and not os.path.exists(path) and os.path.isfile(in_project):
    return f'{path} is not in {os.getcwd()}; pass --config={shown(in_project)}{colon}{splits}'
  try:
    with open(path, 'rb'):
      return None
  except OSError as error:
    return (f'cannot read the config file {os.path.abspath(path)} ({error.strerror or error}); '
            f'{pass_a_config()}')


def default_config_flag() -> str:
  """The flag that names the default config, in a path the user may type from where they are."""
  return f'--config={shown(os.path.join(CONFIGS, "default.py"))}'


def pass_a_config() -> str:
  """The fix of a command line without a config it can use, in paths that work from here."""
  return f'pass {default_config_flag()} or another file in {shown(CONFIGS)}/'


def _config_file_failure(cause: BaseException, file: str) -> str:
  """The line for an exception of a config file's code, in its own words where it checked the
  user's argument (a UserError)."""
  if isinstance(cause, UserError):
    return str(cause)
  if isinstance(cause, AttributeError) and 'get_config' in str(cause):
    return (f'the config file {file} has no get_config(); define one that returns an '
            f'ml_collections.ConfigDict, or pass {default_config_flag()}')
  if isinstance(cause, SyntaxError):  # Raised before any of the code ran: Python names the place.
    text, where = cause.msg, f'{os.path.abspath(cause.filename or file)}, line {cause.lineno}'
  else:
    lines = [f.lineno for f in traceback.extract_tb(cause.__traceback__)
             if os.path.abspath(f.filename) == file]
    text, where = str(cause), f'{file}, line {lines[-1]}' if lines else file
  text = ' '.join(text.split())
  return (f'the config file raised {type(cause).__name__}{": " + text if text else ""} ({where}); '
          f'fix it, or pass {default_config_flag()}')


def override_problem(config: ml_collections.ConfigDict,
                     overridden: list[tuple[str, str | None]]) -> str | None:
  """The line for an override that names no field of the config, or a group of fields, or gives a
  tuple field a dict or set (which ml_collections would take as its keys, silently); None if each
  names a field."""
  for name, text in overridden:
    value = value_at(config, name, absent := object())
    if value is absent and (said := unsweepable(name)):
      return said
    if value is absent:
      close = close_field(name, list(fields(config)))
      return (f'the config has no field {name!r}; '
              f'{f"did you mean {close!r}?" if close else "see them all with --print_config"}')
    if isinstance(value, ml_collections.ConfigDict):
      inside = ', '.join(f'{name}.{key}' + ('.*' if isinstance(field, ml_collections.ConfigDict)
                                            else '') for key, field in value.items())
      return (f'{name} is a group of fields ({inside}), not one; set each on its own: '
              f'--config.{name}.FIELD=VALUE')
    if isinstance(value, tuple) and isinstance(given := _literal(text), (dict, set)):
      return (f'--config.{name}={text} is a {type(given).__name__} where a tuple goes; '
              f'write the tuple itself, e.g. --config.{name}="{value!r}"')
  return None


def _literal(text: str | None) -> Any:
  """The Python literal an override's text writes, or None where it writes none."""
  with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return ast.literal_eval(text) if text is not None else None
  return None
