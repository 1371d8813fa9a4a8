"""The config's rules: checked at the edge, before any data or disk is touched (the first bad field,
named), and the fields a resumed run may change; the flat form saved with each checkpoint."""

import dataclasses
import json
import math
import numbers
from typing import Any

import ml_collections
from flax import traverse_util

from data.mnist import SOURCES
from data.splits import parse_split
from errors import ConfigError, UserError
from mlp.augment import Distortion
from mlp.model import DTYPES
from mlp.optim import OPTIMIZERS, SCHEDULES

PARALLEL_MODES = ('auto', 'jit', 'mesh', 'pmap')
MATMUL_PRECISIONS = ('default', 'high', 'highest')  # jax.default_matmul_precision's names.
POSITIVE_INTEGERS = ('num_epochs', 'num_models', 'batch_size', 'eval_batch_size',
                     'checkpoint_every_epochs', 'max_checkpoints_to_keep')
CHOICES = {'optimizer': OPTIMIZERS, 'schedule': SCHEDULES, 'parallel': PARALLEL_MODES,
           'dtype': tuple(DTYPES), 'matmul_precision': MATMUL_PRECISIONS, 'data.source': SOURCES}

# Config fields a resumed run may change: how long to train (num_epochs also stretches the
# learning-rate schedule), how to run and evaluate, where the data lives. The rest decide the
# trained numbers; data.source among them, as TFDS stores MNIST's examples in another order.
FREE_FIELDS = frozenset({
    'num_epochs', 'eval_batch_size', 'eval_only', 'checkpoint_every_epochs',
    'checkpoint_min_seconds', 'max_checkpoints_to_keep', 'parallel', 'num_devices',
    'profile_epoch', 'data.dir', 'data.tfds_data_dir', 'data.eval_split'})
# Fields newer than some checkpoints, with the value those checkpoints were trained with.
DEFAULTS_OF_NEWER_FIELDS = {
    'dtype': 'float32', 'label_smoothing': 0.0, 'num_models': 1,
    **{f'data.distort.{name}': value for name, value in dataclasses.asdict(Distortion()).items()}}


def _is_int(value) -> bool:
  """An integer proper: True and False are ints to Python, never to a config."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_numbers(config: ml_collections.ConfigDict) -> None:
  for name in POSITIVE_INTEGERS:
    if not _is_int(config[name]) or config[name] < 1:
      raise ConfigError(name, 'must be a positive integer', config[name], 'N')
  # jax.random.key keeps a seed's low 32 bits (64-bit integers off): 2**32 would rerun seed 0.
  if not _is_int(config.seed) or not 0 <= config.seed < 2**32:
    raise ConfigError('seed', f'must be an integer from 0 to {2**32 - 1} (a JAX key holds 32 '
                      'bits)', config.seed, '0')
  if config.seed + config.num_models > 2**32:
    raise ConfigError('num_models', f'must leave seed + num_models - 1 at most {2**32 - 1} '
                      f'(model k trains with seed + k; seed is {config.seed})', config.num_models,
                      str(2**32 - config.seed))
  for name in ('num_devices', 'profile_epoch'):
    if not _is_int(config[name]) or config[name] < 0:
      raise ConfigError(name, 'must be an integer >= 0', config[name], 'N')
  if config.profile_epoch > config.num_epochs:
    raise ConfigError('profile_epoch', f'must be an epoch of the run (1 to num_epochs='
                      f'{config.num_epochs}), or 0 for no trace', config.profile_epoch,
                      str(config.num_epochs))
  if not config.learning_rate > 0:
    raise ConfigError('learning_rate', 'must be positive', config.learning_rate, '1e-3')
  for name in ('warmup_epochs', 'weight_decay', 'checkpoint_min_seconds'):
    if not (math.isfinite(config[name]) and config[name] >= 0):
      raise ConfigError(name, 'must be a finite number >= 0', config[name], '0')
  widths = config.model.hidden_sizes
  if not all(_is_int(w) and w > 0 for w in widths):
    raise ConfigError('model.hidden_sizes', 'must be positive integers', widths, '"(512, 512)"')
  if not 0 <= config.label_smoothing < 1:
    raise ConfigError('label_smoothing', 'must be in [0, 1)', config.label_smoothing, '0.1')
  if not 0 <= config.model.dropout_rate < 1:
    raise ConfigError('model.dropout_rate', 'must be in [0, 1)', config.model.dropout_rate, '0.2')
  shift = config.data.max_shift
  if not _is_int(shift) or not 0 <= shift <= 8:
    raise ConfigError('data.max_shift', 'must be an integer from 0 to 8 pixels', shift, '1')
  _check_distortion(config.data.distort)


# Each distortion range's bounds (inclusive) and a value to suggest.
DISTORTION_RANGES = {'rotation': (0, 180, 15), 'scale': (0, 0.9, 0.1), 'shear': (0, 80, 10),
                     'translate': (0, 8, 2), 'elastic_alpha': (0, 100, 34),
                     'elastic_sigma': (0.5, 28, 4)}


def _check_distortion(distort: ml_collections.ConfigDict) -> None:
  for name, (low, high, example) in DISTORTION_RANGES.items():
    value = distort[name]
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and
            low <= value <= high):
      raise ConfigError(f'data.distort.{name}', f'must be a number from {low} to {high}', value,
                        str(example))


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError (or the split parser's UserError) for the first field that cannot work."""
  _check_numbers(config)
  flat = fields(config)
  for field, choices in CHOICES.items():
    if flat[field] not in choices:
      raise ConfigError(field, f'must be one of {", ".join(choices)}', flat[field], choices[0])
  train_size = parse_split(config.data.train_split).size
  parse_split(config.data.eval_split)
  if config.batch_size > train_size:
    raise ConfigError('batch_size', f'must be at most the training split '
                      f'{config.data.train_split!r} has ({train_size} examples)',
                      config.batch_size, str(train_size))


def fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Each field by its dotted name, as a flag names it: `data.distort.rotation`."""
  return traverse_util.flatten_dict(config.to_dict(), sep='.')


def flat_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Dotted field names to JSON values, the form stored with each checkpoint."""
  return json.loads(json.dumps(fields(config)))


def config_from_flat(flat: dict[str, Any]) -> ml_collections.ConfigDict:
  """The config a checkpoint was saved with, rebuilt from its flat form (lists back to tuples)."""
  return ml_collections.ConfigDict(traverse_util.unflatten_dict(
      {name: tuple(v) if isinstance(v, list) else v for name, v in flat.items()}, sep='.'))


def config_mismatches(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
  """The fields, other than FREE_FIELDS, whose values differ; absent fields count as different."""
  absent = object()
  saved = {**DEFAULTS_OF_NEWER_FIELDS, **saved}
  return [name for name in sorted((saved.keys() | current.keys()) - FREE_FIELDS)
          if saved.get(name, absent) != current.get(name, absent)]


def check_resumable(saved: dict[str, Any], current: dict[str, Any], checkpoint: str) -> None:
  """Refuses to resume a checkpoint (named by `checkpoint`) trained with other numbers."""
  names = config_mismatches(saved, current)
  if names:
    then = ', '.join(f'{name}={_show(saved.get(name))}' for name in names)
    now = ', '.join(f'{name}={_show(current.get(name))}' for name in names)
    raise UserError(f'{checkpoint} was saved with {then}, but this run has {now}; rerun with the '
                    'checkpoint\'s values to resume it, or pass a new --workdir to start another '
                    'run')


def _show(value: Any) -> str:
  """A stored value as the user writes it in a flag: lists back to tuples."""
  return repr(tuple(value)) if isinstance(value, list) else repr(value)
