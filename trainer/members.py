"""The members of a run: models trained side by side in one program, each as a separate run of its
own seed and values would train. A sweep (`--config.sweep.FIELD="(v1, v2, ...)"`) is one source of
members: its grid's member k is combination k // num_models of the swept values (each field's values
crossed, in the order of VARIABLE), with seed seed + k % num_models."""

import dataclasses
import itertools
import shlex
from typing import Any

import ml_collections

from errors import ConfigError
from trainer.config_fields import VARIABLE, value_at


@dataclasses.dataclass(frozen=True)
class Member:
  """One model of a run: its seed and its own values of the fields that members vary."""
  seed: int
  values: dict[str, Any]  # Field -> this member's value; empty when the members vary no field.

  def as_dict(self) -> dict[str, Any]:
    """As a record keeps it: its values, then its seed."""
    return {**self.values, 'seed': self.seed}


def label(member: dict[str, Any], separator: str = ' ') -> str:
  """A member (as_dict's, or some of its values) as a user reads it, and TensorBoard tags it:
  `learning_rate=0.002 seed=1`."""
  return separator.join(f'{name}={value:g}' for name, value in member.items())


def swept(config: ml_collections.ConfigDict) -> dict[str, tuple[float, ...]]:
  """The swept fields and their values, in VARIABLE's order; empty when nothing is swept."""
  return {name: tuple(value_at(config.sweep, name)) for name in VARIABLE
          if value_at(config.sweep, name)}


def grid(config: ml_collections.ConfigDict) -> tuple[Member, ...]:
  """A config's members: each combination of the swept values, times the seeds seed, seed + 1, ...
  seed + num_models - 1; none for one model alone."""
  fields = swept(config)
  if config.num_models == 1 and not fields:
    return ()
  return tuple(Member(config.seed + k, dict(zip(fields, combination)))
               for combination in itertools.product(*fields.values())
               for k in range(config.num_models))


# The flags of a run's command that a member's own command replaces.
# member_shards too: it spreads a run's several models, and a member alone is one.
REPLACED = ('--config.sweep.', '--config.seed=', '--config.num_models=', '--config.eval_only',
            '--workdir=', '--config.search.', '--search_storage=', '--search_study=',
            '--config.member_shards=')


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
