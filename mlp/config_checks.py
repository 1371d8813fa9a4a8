"""Config validation before any data or disk is touched: every mistake becomes one actionable line."""

import math
import numbers

import ml_collections

from data.mnist import check_source
from data.splits import parse_split
from mlp.errors import UserError
from mlp.optim import OPTIMIZERS, SCHEDULES
from mlp.parallel import PARALLEL_MODES


def _is_int(value) -> bool:
  """An integer proper: True and False are ints to Python, never to a config."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _whole_number(config: ml_collections.ConfigDict, name: str, minimum: int = 1) -> None:
  value = config[name]
  if not _is_int(value) or value < minimum:
    kind = 'a positive integer' if minimum == 1 else f'an integer >= {minimum}'
    raise UserError(f'{name} must be {kind}, got {value!r}; '
                    f'set --config.{name}=N with N >= {minimum}')


def _one_of(value: str, choices: tuple[str, ...], name: str) -> None:
  if value not in choices:
    raise UserError(f'unknown {name} {value!r}; use one of {", ".join(choices)}')


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises UserError naming the first bad field and how to fix it."""
  for name in ('num_epochs', 'batch_size', 'eval_batch_size', 'checkpoint_every_epochs',
               'max_checkpoints_to_keep'):
    _whole_number(config, name)
  if not config.learning_rate > 0:
    raise UserError(f'learning_rate must be positive, got {config.learning_rate!r}')
  for name in ('warmup_epochs', 'weight_decay'):
    if not (math.isfinite(config[name]) and config[name] >= 0):
      raise UserError(f'{name} must be a finite number >= 0, got {config[name]!r}')
  _one_of(config.optimizer, OPTIMIZERS, 'optimizer')
  _one_of(config.schedule, SCHEDULES, 'schedule')
  _one_of(config.parallel, PARALLEL_MODES, 'parallel mode')
  _whole_number(config, 'num_devices', minimum=0)
  widths = config.model.hidden_sizes
  if not all(_is_int(w) and w > 0 for w in widths):
    raise UserError(f'model.hidden_sizes must be positive integers, got {widths!r}; '
                    'write it like --config.model.hidden_sizes="(512, 512)"')
  if not 0 <= config.model.dropout_rate < 1:
    raise UserError(f'model.dropout_rate must be in [0, 1), got {config.model.dropout_rate!r}')
  check_source(config.data.source)
  shift = config.data.max_shift
  if not _is_int(shift) or not 0 <= shift <= 8:
    raise UserError(f'data.max_shift must be an integer from 0 to 8 pixels, got {shift!r}')
  train_size = parse_split(config.data.train_split).size
  parse_split(config.data.eval_split)
  if config.batch_size > train_size:
    raise UserError(f'batch_size {config.batch_size} is larger than the training split '
                    f'{config.data.train_split!r} ({train_size} examples); lower --config.batch_size '
                    'or widen --config.data.train_split')
