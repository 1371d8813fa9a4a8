"""The fields a config must have, by the default config's: which are missing, which no part of the
project reads, and the one a mistyped name meant. Plain ml_collections, no JAX: a config file is
checked as it loads, before the flags' errors are said."""

import difflib

import ml_collections

from configs import default

NAMED_AT_MOST = 4  # Fields a line names before it counts the rest.


def field_names(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
  """Each field's dotted name, as a flag names it (`data.distort.rotation`); no JAX to import."""
  names = []
  for key, value in config.items():
    is_group = isinstance(value, ml_collections.ConfigDict)
    names += field_names(value, f'{prefix}{key}.') if is_group else [f'{prefix}{key}']
  return names


def field_problem(config: ml_collections.ConfigDict, what: str = 'the config') -> str | None:
  """The line for a config whose fields are not the default's (None if they are): a field missing
  fails the run where it is first read, a field of its own is never read."""
  expected = field_names(default.get_config())
  present = field_names(config)
  missing = [name for name in expected if name not in present]
  if missing:
    return (f'{what} lacks {_listed(missing)}; build it as every config in configs/ does: '
            '`from configs import default`, `config = default.get_config()`, then change fields')
  unread = [name for name in present if name not in expected]
  if not unread:
    return None
  guessed = [f'{name} (did you mean {close}?)' if (close := close_field(name, expected)) else name
             for name in unread]
  return (f'{what} has {_listed(guessed)}, which no part of this project reads; rename or remove '
          f'{"them" if len(unread) > 1 else "it"}')


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
