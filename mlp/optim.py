"""The optax optimizers and learning-rate schedules this app trains with, from plain values."""

import optax

OPTIMIZERS = ('sgd', 'momentum', 'adam', 'adamw')
SCHEDULES = ('constant', 'cosine')


def learning_rate_schedule(peak: float, shape: str, warmup_steps: int,
                           total_steps: int) -> optax.Schedule:
  """Linear warmup over `warmup_steps`, then constant or cosine decay to zero at `total_steps`."""
  _check_choice('schedule', shape, SCHEDULES)
  if shape == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup_steps, total_steps, end_value=0.0)
  if warmup_steps == 0:
    return optax.constant_schedule(peak)
  return optax.warmup_constant_schedule(0.0, peak, warmup_steps)


def make_optimizer(name: str, rate: optax.Schedule, weight_decay: float = 0.0,
                   momentum: float = 0.9) -> optax.GradientTransformation:
  """One of OPTIMIZERS over the schedule `rate`; weight decay applies to adamw only."""
  _check_choice('optimizer', name, OPTIMIZERS)
  if name == 'sgd':
    return optax.sgd(rate)
  if name == 'momentum':
    return optax.sgd(rate, momentum=momentum, nesterov=True)
  if name == 'adam':
    return optax.adam(rate)
  return optax.adamw(rate, weight_decay=weight_decay)


def _check_choice(field: str, value: str, choices: tuple[str, ...]) -> None:
  """A name outside `choices` is refused: it would train with the last one instead."""
  if value not in choices:
    raise ValueError(f'{field} must be one of {", ".join(choices)}, got {value!r}')
