"""The members of a run: models trained side by side in one program, each as a separate run of its
own seed and, in a sweep (`--config.sweep.FIELD="(v1, v2, ...)"`), of its own values of the swept
fields would train. Member k is combination k // num_models of the swept values (each field's
values crossed, in the order of SWEEPABLE), with seed seed + k % num_models."""

import dataclasses
import itertools
import shlex
from typing import Any

import ml_collections

from errors import ConfigError

# The fields a sweep can vary inside one program: values of the optimizer's state
# (mlp/optim.py's INJECTED) or of each member's step (mlp/steps.py's Hyper). A field that shapes
# the program (the widths, batch_size, num_epochs) cannot.
SWEEPABLE = ('learning_rate', 'weight_decay', 'label_smoothing', 'model.dropout_rate')


@dataclasses.dataclass(frozen=True)
class Member:
  """One model of a run: its seed and its values of the swept fields."""
  seed: int
  values: dict[str, Any]  # Swept field -> this member's value; empty when nothing is swept.

  def as_dict(self) -> dict[str, Any]:
    """As a record keeps it: its values, then its seed."""
    return {**self.values, 'seed': self.seed}


def label(member: dict[str, Any]) -> str:
  """A member (as_dict's) as a user reads it, and TensorBoard tags it: `learning_rate=0.002
  seed=1`."""
  return ' '.join(f'{name}={value:g}' for name, value in member.items())


def _field(group: Any, name: str) -> Any:
  """The value of a dotted field name (`model.dropout_rate`) in a config or a group of it."""
  for key in name.split('.'):
    group = group[key]
  return group


def swept(config: ml_collections.ConfigDict) -> dict[str, tuple[float, ...]]:
  """The swept fields and their values, in SWEEPABLE's order; empty when nothing is swept."""
  return {name: tuple(_field(config.sweep, name)) for name in SWEEPABLE
          if _field(config.sweep, name)}


def stacked(config: ml_collections.ConfigDict) -> bool:
  """Whether the run trains members stacked side by side (several models, or a sweep)."""
  return config.num_models > 1 or bool(swept(config))


def members(config: ml_collections.ConfigDict) -> list[Member]:
  """Every member of the run, in its order: each combination of the swept values, times the seeds
  seed, seed + 1, ... seed + num_models - 1."""
  fields = swept(config)
  return [Member(config.seed + k, dict(zip(fields, combination)))
          for combination in itertools.product(*fields.values())
          for k in range(config.num_models)]


def value_of(config: ml_collections.ConfigDict, member: Member, name: str) -> Any:
  """The member's value of a field: its swept one, else the config's."""
  return member.values[name] if name in member.values else _field(config, name)


def per_member(config: ml_collections.ConfigDict, name: str) -> tuple[float, ...] | None:
  """Each member's value of a swept field, in the members' order; None if it is not swept."""
  if name not in swept(config):
    return None
  return tuple(float(value_of(config, member, name)) for member in members(config))


# The flags of a run's command that a member's own command replaces.
REPLACED = ('--config.sweep.', '--config.seed=', '--config.num_models=', '--config.eval_only',
            '--workdir=')


def command_of(member: dict[str, Any], command: str, workdir: str) -> str:
  """The command (the run's, as the shell took it) that trains the member (as_dict's) alone, as a
  separate run in `workdir`: its values and seed in place of the sweep's flags."""
  kept = [arg for arg in shlex.split(command) if not arg.startswith(REPLACED)]
  return shlex.join([*kept, *(f'--config.{name}={value!r}' for name, value in member.items()),
                     f'--workdir={workdir}'])


def check(config: ml_collections.ConfigDict) -> None:
  """A sweep's values, each as its field's own rule would take it (checked by the caller), and the
  constraints of a sweep: weight decay is adamw's; values distinct."""
  for name, values in swept(config).items():
    if len(set(values)) != len(values):
      raise ConfigError(f'sweep.{name}', 'must name each value once', values,
                        f'"{tuple(dict.fromkeys(values))}"')
  if 'weight_decay' in swept(config) and config.optimizer != 'adamw':
    raise ConfigError('sweep.weight_decay', 'varies the weight decay of optimizer=adamw alone, and '
                      f'the optimizer is {config.optimizer}', config.sweep.weight_decay, '"()"')
