"""The optax optimizers and learning-rate schedules this app trains with, from plain values."""

import jax.numpy as jnp
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


# The optimizer's hyperparameters a member of a sweep may set: values of its state.
INJECTED = ('learning_rate', 'weight_decay')


def make_injected_optimizer(name: str, unit_rate: optax.Schedule,
                            momentum: float = 0.9) -> optax.GradientTransformation:
  """One of OPTIMIZERS whose peak learning rate (scaling `unit_rate`, a schedule peaking at 1) and
  weight decay are values of its state (optax's inject_hyperparams), not constants of the program:
  members of a sweep, stacked, each update with their own. Set them in the state it initializes
  (with_injected); until then they are 1 and 0."""
  def factory(learning_rate: float, weight_decay: float) -> optax.GradientTransformation:
    return make_optimizer(name, lambda count: learning_rate * unit_rate(count), weight_decay,
                          momentum)
  return optax.inject_hyperparams(factory)(learning_rate=1.0, weight_decay=0.0)


def with_injected(opt_state: optax.OptState, values: dict[str, object]) -> optax.OptState:
  """An injected optimizer's state with these values of its hyperparameters (arrays [M] for
  members stacked), in the dtype it keeps them in: optax's own setter of a state's values."""
  return optax.tree_utils.tree_set(opt_state, **{
      name: jnp.asarray(value, optax.tree_utils.tree_get(opt_state, name).dtype)
      for name, value in values.items()})


def plain_state(opt_state: optax.OptState) -> optax.OptState:
  """The state of make_optimizer's optimizer inside an injected optimizer's state (its values set
  aside): what the run of one member's values keeps, whose optimizer takes them as constants."""
  return opt_state.inner_state


def _check_choice(field: str, value: str, choices: tuple[str, ...]) -> None:
  """A name outside `choices` is refused: it would train with the last one instead."""
  if value not in choices:
    raise ValueError(f'{field} must be one of {", ".join(choices)}, got {value!r}')
