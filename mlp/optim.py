"""The optax optimizer and learning-rate schedule named by a config."""

import ml_collections
import optax

OPTIMIZERS = ('sgd', 'momentum', 'adam', 'adamw')
SCHEDULES = ('constant', 'cosine')


def learning_rate_schedule(config: ml_collections.ConfigDict, steps_per_epoch: int) -> optax.Schedule:
  """Linear warmup over `warmup_epochs`, then constant or cosine decay to zero at the last step."""
  total = max(config.num_epochs * steps_per_epoch, 1)
  warmup = min(int(round(config.warmup_epochs * steps_per_epoch)), total - 1)
  if config.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, warmup, total, end_value=0.0)
  if warmup == 0:
    return optax.constant_schedule(config.learning_rate)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, config.learning_rate, warmup),
       optax.constant_schedule(config.learning_rate)], [warmup])


def make_optimizer(config: ml_collections.ConfigDict,
                   steps_per_epoch: int) -> optax.GradientTransformation:
  """Builds the config's optimizer over its schedule; weight decay applies to adamw only."""
  rate = learning_rate_schedule(config, steps_per_epoch)
  if config.optimizer == 'sgd':
    return optax.sgd(rate)
  if config.optimizer == 'momentum':
    return optax.sgd(rate, momentum=config.momentum, nesterov=True)
  if config.optimizer == 'adam':
    return optax.adam(rate)
  return optax.adamw(rate, weight_decay=config.weight_decay)
