"""A config's fields by their dotted names, the one flattening of a config (its flags, the form
saved with each checkpoint, and back), and the fields a config must have, by the default
config's: which are missing, which no part of the project reads, and the one a mistyped name
meant. Plain ml_collections, no JAX: a config file is checked as it loads, before the flags' errors
are said."""

import difflib
import json
import shlex
from typing import Any

import ml_collections

from configs import default

NAMED_AT_MOST = 4  # Fields a line names before it counts the rest.
# The fields that members of one program may each set their own (trainer/members.py): values of
# the optimizer's state (mlp/optim.py's INJECTED) or of each member's step (mlp/steps.py's Hyper).
# A field that shapes the program (the widths, batch_size, num_epochs) cannot vary.
VARIABLE = ('learning_rate', 'weight_decay', 'label_smoothing', 'model.dropout_rate')
ABSENT: Any = object()  # value_at's default: no such field.


def fields(config: ml_collections.ConfigDict, prefix: str = '') -> dict[str, Any]:
  """Each field by its dotted name, as a flag names it (`data.distort.rotation`), in order."""
  flat: dict[str, Any] = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      flat.update(fields(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def value_at(config: ml_collections.ConfigDict, name: str, default: Any = ABSENT) -> Any:
  """The value of a dotted field name (`model.dropout_rate`) in a config or a group of it; `default`
  where there is no such field (ABSENT: a KeyError)."""
  value: Any = config
  for key in name.split('.'):
    if not (isinstance(value, ml_collections.ConfigDict) and key in value):
      if default is ABSENT:
        raise KeyError(name)
      return default
    value = value[key]
  return value


def flag_lines(config: ml_collections.ConfigDict) -> list[str]:
  """Each field of the config as the flag that sets it to its value, for --print_config."""
  return [f'--config.{name}={shlex.quote(value if isinstance(value, str) else repr(value))}'
          for name, value in sorted(fields(config).items())]


def flat_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Dotted field names to JSON values, the form stored with each checkpoint."""
  return json.loads(json.dumps(fields(config)))


def config_from_flat(flat: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config a checkpoint was saved with, rebuilt from its flat form (lists back to tuples)."""
  config = ml_collections.ConfigDict()
  for name, value in flat.items():
    *groups, leaf = name.split('.')
    group = config
    for key in groups:
      if key not in group:
        group[key] = ml_collections.ConfigDict()
      group = group[key]
    group[leaf] = tuple(value) if isinstance(value, list) else value
  return config


def with_values(config: ml_collections.ConfigDict,
                values: dict[str, Any]) -> ml_collections.ConfigDict:
  """A copy of the config with these fields (by dotted name) at these values."""
  return config_from_flat({**flat_config(config), **json.loads(json.dumps(values))})


def field_problem(config: ml_collections.ConfigDict, what: str = 'the config') -> str | None:
  """The line for a config whose fields are not the default's (None if they are): a field missing
  fails the run where it is first read, a field of its own is never read."""
  expected = list(fields(default.get_config()))
  present = fields(config)
  if missing := [name for name in expected if name not in present]:
    return (f'{what} lacks {_listed(missing)}; build it as every config in configs/ does: '
            '`from configs import default`, `config = default.get_config()`, then change fields')
  unread = [name for name in present if name not in expected]
  if not unread:
    return None
  if said := unsweepable(unread[0]):
    return said
  guessed = [f'{name} (did you mean {close}?)' if (close := close_field(name, expected)) else name
             for name in unread]
  return (f'{what} has {_listed(guessed)}, which no part of this project reads; rename or remove '
          f'{"them" if len(unread) > 1 else "it"}')


# The groups whose fields name fields that vary, and what each gives a value of its own to.
VARYING_GROUPS = {'sweep': 'run', 'search': 'search'}


def unsweepable(name: str) -> str | None:
  """The line for a sweep or a search of a field that neither can vary (None for any other name,
  and for the search's own settings, which a config has)."""
  group, _, field = name.partition('.')
  if group not in VARYING_GROUPS or not field or field in VARIABLE:
    return None
  if group == 'search' and field not in fields(default.get_config()):
    return None  # A typo of a search setting (search.trails): the config's line names the field.
  return (f'{field} cannot vary inside one program: a {group} varies {", ".join(VARIABLE)}; give '
          f'each value of {field} its own {VARYING_GROUPS[group]} (--config.{field}=VALUE '
          '--workdir=...)')


def close_field(name: str, names: list[str]) -> str | None:
  """The field of `names` the user may have meant by `name` (None if none is close)."""
  return next(iter(difflib.get_close_matches(name, names, n=1)), None)


def _listed(names: list[str]) -> str:
  """'the field a', 'the fields a, b and c', 'the fields a, b, c, d and 9 more'."""
  if len(names) == 1:
    return f'the field {names[0]}'
  head, rest = names[:NAMED_AT_MOST], names[NAMED_AT_MOST:]
  last = f'{len(rest)} more' if rest else head.pop()
  return f'the fields {", ".join(head)} and {last}'
