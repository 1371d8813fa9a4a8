"""The config's rules: checked at the edge, before any data or disk is touched (the first bad field,
named), and the fields a resumed run may change; the flat form saved with each checkpoint."""

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any

import ml_collections

from data.mnist import SOURCES
from data.splits import parse_split
from errors import ConfigError, UserError
from mlp.augment import Distortion
from mlp.model import DTYPES
from mlp.optim import OPTIMIZERS, SCHEDULES
from trainer import members
from trainer.config_fields import VARIABLE, field_problem, fields, value_at

PARALLEL_MODES = ('auto', 'jit', 'mesh', 'pmap')
MATMUL_PRECISIONS = ('default', 'high', 'highest')  # jax.default_matmul_precision's names.
# Optuna's samplers and pruners a search may name (trainer/search.py builds them), default first.
SAMPLERS = ('tpe', 'gp', 'random')
PRUNERS = ('hyperband', 'median', 'none')
CHOICES = {'optimizer': OPTIMIZERS, 'schedule': SCHEDULES, 'parallel': PARALLEL_MODES,
           'dtype': tuple(DTYPES), 'matmul_precision': MATMUL_PRECISIONS, 'data.source': SOURCES,
           'search.sampler': SAMPLERS, 'search.pruner': PRUNERS}
# Fields that take an integer, or a finite number (nan and inf fail only once compiled, or never):
# what each must be, as words and as a test of a value of that kind, and a value to suggest.
INTEGERS = {
    **{name: ('a positive integer', lambda n: n >= 1, 'N') for name in (
        'num_epochs', 'num_models', 'batch_size', 'eval_batch_size', 'checkpoint_every_epochs',
        'max_checkpoints_to_keep', 'member_shards')},
    # jax.random.key keeps a seed's low 32 bits (64-bit integers off): 2**32 would rerun seed 0.
    'seed': (f'an integer from 0 to {2**32 - 1} (a JAX key holds 32 bits)',
             lambda n: 0 <= n < 2**32, '0'),
    'num_devices': ('an integer >= 0', lambda n: n >= 0, 'N'),
    'search.trials': ('an integer >= 0 (0: no search)', lambda n: n >= 0, '32'),
    'search.side_by_side': ('a positive integer', lambda n: n >= 1, '8'),
    'profile_epoch': ('an integer >= 0', lambda n: n >= 0, 'N'),
    'data.max_shift': ('an integer from 0 to 8 pixels', lambda n: 0 <= n <= 8, '1')}


def _between(low: float, high: float) -> Callable[[float], bool]:
  """A range's test with its own ends (a lambda made in a loop would see the loop's last)."""
  return lambda x: low <= x <= high


# Each distortion range's bounds (inclusive) and a value to suggest.
DISTORTION_RANGES = {'rotation': (0, 180, 15), 'scale': (0, 0.9, 0.1), 'shear': (0, 80, 10),
                     'translate': (0, 8, 2), 'elastic_alpha': (0, 100, 34),
                     'elastic_sigma': (0.5, 28, 4)}
NUMBERS = {
    'learning_rate': ('a finite number > 0', lambda x: x > 0, '1e-3'),
    'momentum': ('a number in [0, 1)', lambda x: 0 <= x < 1, '0.9'),
    'warmup_epochs': ('a finite number >= 0', lambda x: x >= 0, '0'),
    'weight_decay': ('a finite number >= 0', lambda x: x >= 0, '0'),
    'checkpoint_min_seconds': ('a finite number >= 0', lambda x: x >= 0, '0'),
    'label_smoothing': ('a number in [0, 1)', lambda x: 0 <= x < 1, '0.1'),
    'model.dropout_rate': ('a number in [0, 1)', lambda x: 0 <= x < 1, '0.2'),
    **{f'data.distort.{name}': (f'a number from {low} to {high}', _between(low, high), str(example))
       for name, (low, high, example) in DISTORTION_RANGES.items()}}
# A search's fields searched on a log scale (the others on a linear one), and a range to suggest.
LOG_SCALED = ('learning_rate', 'weight_decay')
EXAMPLE_RANGES = {'learning_rate': (1e-4, 1e-2), 'weight_decay': (1e-5, 1e-1),
                  'label_smoothing': (0.0, 0.2), 'model.dropout_rate': (0.0, 0.5)}
# Fields that take a string: what it names, and a value to suggest (a split's syntax: parse_split).
STRINGS = {'data.dir': ("a folder, or '' for the copy in data/mnist", "''"),
           'data.tfds_data_dir': ("a folder, or '' for TFDS's default", "''"),
           'data.train_split': ('a split in TFDS syntax', 'train'),
           'data.eval_split': ('a split in TFDS syntax', 'test')}

# Config fields a resumed run may change: how long to train (num_epochs also stretches the
# learning-rate schedule), how to run and evaluate, where the data lives. The rest decide the
# trained numbers; data.source among them, as TFDS stores MNIST's examples in another order.
FREE_FIELDS = frozenset({
    'num_epochs', 'eval_batch_size', 'eval_only', 'checkpoint_every_epochs',
    'checkpoint_min_seconds', 'max_checkpoints_to_keep', 'parallel', 'num_devices',
    'member_shards', 'profile_epoch', 'data.dir', 'data.tfds_data_dir', 'data.eval_split'})
# Fields newer than some checkpoints, with the value those checkpoints were trained with.
DEFAULTS_OF_NEWER_FIELDS = {
    'dtype': 'float32', 'label_smoothing': 0.0, 'num_models': 1,
    **{f'sweep.{name}': [] for name in VARIABLE},  # As JSON saves an empty tuple.
    **{f'search.{name}': [] for name in VARIABLE},
    'search.trials': 0, 'search.side_by_side': 8, 'search.sampler': SAMPLERS[0],
    'search.pruner': PRUNERS[0],
    **{f'data.distort.{name}': value for name, value in dataclasses.asdict(Distortion()).items()}}


def _is_int(value: Any) -> bool:
  """An integer proper: True and False are ints to Python, never to a config."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  """A finite real number proper: not True or False, nan or inf."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_each_field(flat: dict[str, Any]) -> None:
  """Each field on its own: its kind first, so a value of another kind (None, a string where a
  number goes, a list) is its field's line, never a TypeError of the check."""
  for table, is_kind in ((INTEGERS, _is_int), (NUMBERS, _is_number)):
    for name, (kind, within, fix) in table.items():
      if not (is_kind(flat[name]) and within(flat[name])):
        raise ConfigError(name, f'must be {kind}', flat[name], fix)
  for name, (named, fix) in STRINGS.items():
    if not isinstance(flat[name], str):
      raise ConfigError(name, f'must be a string: {named}', flat[name], fix)
  if not isinstance(flat['eval_only'], bool):
    raise ConfigError('eval_only', 'must be True or False', flat['eval_only'], 'false')
  widths = flat['model.hidden_sizes']
  # () is deliberate: no hidden layer, a linear model (multinomial logistic regression).
  if not (isinstance(widths, (tuple, list)) and all(_is_int(w) and w > 0 for w in widths)):
    raise ConfigError('model.hidden_sizes', "must be a tuple of positive integers, the hidden "
                      "layers' widths (() for none: a linear model)", widths, '"(512, 512)"')
  for field, choices in CHOICES.items():
    if flat[field] not in choices:
      raise ConfigError(field, f'must be one of {", ".join(choices)}', flat[field], choices[0])
  _check_sweep(flat)
  for name in VARIABLE:
    _check_range(name, flat[f'search.{name}'])


def _check_sweep(flat: dict[str, Any]) -> None:
  """Each swept field's values: a tuple, each value as the field itself takes it."""
  for name in VARIABLE:
    values, (kind, within, fix) = flat[f'sweep.{name}'], NUMBERS[name]
    if not (isinstance(values, (tuple, list))
            and all(_is_number(value) and within(value) for value in values)):
      raise ConfigError(f'sweep.{name}', f'must be a tuple of values of {name}, each {kind}',
                        values, f'"({fix}, {float(fix) * 2:g})"')


def _range_text(low: float, high: float) -> str:
  """A range as a flag's quoted value: `"(0.0001, 0.01)"`."""
  return f'"({low:g}, {high:g})"'


def _check_range(name: str, bounds: Any) -> None:
  """A searched field's range: () or (low, high), low below high, above 0 on a log scale, and
  both ends values the field itself takes."""
  field, (kind, within, _) = f'search.{name}', NUMBERS[name]
  example = _range_text(*EXAMPLE_RANGES[name])
  is_tuple = isinstance(bounds, (tuple, list))
  if is_tuple and not bounds:
    return
  if not (is_tuple and len(bounds) == 2 and all(_is_number(end) for end in bounds)):
    raise ConfigError(field, f'must be () or a range (low, high) of {name}', bounds, example)
  low, high = bounds
  if low >= high:
    raise ConfigError(field, 'must run from low to high, (low, high)', bounds,
                      _range_text(high, low) if low > high else example)
  if name in LOG_SCALED and low <= 0:
    raise ConfigError(field, f'is searched on a log scale, which cannot reach {low!r}: its low '
                      'end must be above 0', bounds, _range_text(high / 100, high))
  if not (within(low) and within(high)):
    raise ConfigError(field, f'must lie within the values of {name}, each {kind}', bounds,
                      example)


def searched(config: ml_collections.ConfigDict) -> dict[str, tuple[float, float]]:
  """The searched fields and their ranges, in VARIABLE's order; empty when none is given."""
  return {name: tuple(value_at(config.search, name)) for name in VARIABLE
          if value_at(config.search, name)}


def _check_search(config: ml_collections.ConfigDict) -> None:
  """A search's fields together: ranges and trials both or neither, no sweep beside it, nothing
  it cannot search or run with."""
  ranges, trials = searched(config), config.search.trials
  if ranges and not trials:
    raise ConfigError('search.trials', f'must be at least 1 to search the ranges given '
                      f'({", ".join(f"search.{name}" for name in ranges)})', trials, '32')
  if not trials:
    return
  if not ranges:
    raise UserError(f'search.trials={trials} asks for a search, and no range is given to search; '
                    'give one, e.g. --config.search.learning_rate="(1e-4, 1e-2)", or pass '
                    '--config.search.trials=0')
  if members.swept(config):
    raise UserError('a sweep and a search cannot share a run: the sweep trains the values given '
                    f'({", ".join(f"sweep.{name}" for name in members.swept(config))}), the search '
                    'the values Optuna asks for; give each its own run (--config.search.trials=0, '
                    'or --config.sweep.FIELD="()")')
  if 'weight_decay' in ranges and config.optimizer != 'adamw':
    raise ConfigError('search.weight_decay', 'searches the weight decay of optimizer=adamw alone, '
                      f'and the optimizer is {config.optimizer}', config.search.weight_decay,
                      '"()"')
  if config.eval_only:
    raise ConfigError('eval_only', 'must be False in a search, which trains its trials; each '
                      "trial's run directory (the search's trials/NUMBER) evaluates as any run's",
                      config.eval_only, 'false')


def _check_together(config: ml_collections.ConfigDict) -> None:
  """The fields that bound one another, each already of its kind."""
  if config.seed + config.num_models > 2**32:
    raise ConfigError('num_models', f'must leave seed + num_models - 1 at most {2**32 - 1} '
                      f'(model k trains with seed + k; seed is {config.seed})', config.num_models,
                      str(2**32 - config.seed))
  if config.profile_epoch > config.num_epochs:
    raise ConfigError('profile_epoch', f'must be an epoch of the run (1 to num_epochs='
                      f'{config.num_epochs}), or 0 for no trace', config.profile_epoch,
                      str(config.num_epochs))
  train_size = parse_split(config.data.train_split).size
  parse_split(config.data.eval_split)
  if config.batch_size > train_size:
    raise ConfigError('batch_size', f'must be at most the training split '
                      f'{config.data.train_split!r} has ({train_size} examples)',
                      config.batch_size, str(train_size))


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError (or UserError: the fields, the split parser's) for the first field that
  cannot work."""
  if problem := field_problem(config):
    raise UserError(problem)
  _check_each_field(fields(config))
  _check_together(config)
  members.check(config)
  _check_search(config)


def settings_to_warn_of(config: ml_collections.ConfigDict) -> list[str]:
  """Valid settings that train otherwise than their fields read: a line each to warn the user."""
  notes: list[str] = []
  if config.eval_only:  # Trains nothing.
    return notes
  if config.model.dropout_rate > 0 and not config.model.hidden_sizes:
    notes.append(f'model.dropout_rate={config.model.dropout_rate} does nothing: dropout acts on '
                 'hidden layers and model.hidden_sizes=() has none; pass '
                 '--config.model.dropout_rate=0 to say so')
  if config.warmup_epochs > config.num_epochs:  # Cut to the run (trainer/run.py's learning).
    notes.append(f'warmup_epochs={config.warmup_epochs} is longer than num_epochs='
                 f'{config.num_epochs}: the learning rate reaches learning_rate='
                 f'{config.learning_rate} only at the last step' +
                 (', and never decays' if config.schedule == 'cosine' else ''))
  return notes


def as_trained(saved: dict[str, Any]) -> dict[str, Any]:
  """A checkpoint's flat config with the fields newer than it at the values it trained with."""
  return {**DEFAULTS_OF_NEWER_FIELDS, **saved}


def config_mismatches(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
  """The fields, other than FREE_FIELDS, whose values differ; absent fields count as different."""
  absent = object()
  return [name for name in sorted((saved.keys() | current.keys()) - FREE_FIELDS)
          if saved.get(name, absent) != current.get(name, absent)]


def check_resumable(found: tuple[int, dict[str, Any]] | None, current: dict[str, Any],
                    directory: str) -> None:
  """Refuses to resume the checkpoint `found` (its epoch and flat config) trained with other
  numbers."""
  if found is None:
    return
  if names := config_mismatches(found[1], current):
    then, now = named_values(found[1], names), named_values(current, names)
    raise UserError(f'the checkpoint of epoch {found[0]} in {directory} was saved with {then}, '
                    f'but this run has {now}; rerun with the checkpoint\'s values to resume it, or '
                    'pass a new --workdir to start another run')


def named_values(flat: dict[str, Any], names: list[str]) -> str:
  """Fields of a flat config as the user writes them: `num_epochs=3, sweep.learning_rate=(0.1,)`."""
  return ', '.join(f'{name}={_show(flat.get(name))}' for name in names)


def _show(value: Any) -> str:
  """A stored value as the user writes it in a flag: lists back to tuples."""
  return repr(tuple(value)) if isinstance(value, list) else repr(value)
