"""The trainer's epoch with the model's dropout against Flax's nn.Dropout, side by side in one run.

  python -m benchmarks.dropout_bits [--batch_size=128] [--num_images=8000] [--repeats=11]

Flax's nn.Dropout draws a 32-bit threefry word per unit; the model's dropout draws one per four
units (mlp/model.py). Both variants run the trainer's epoch (the run set-up) over the same data,
state and keys, and are timed in turn, so load from other processes hits both alike.
"""

import json
import statistics

import flax.linen as nn
import jax
import ml_collections
from absl import app
from absl import flags

from benchmarks import workload
from data.mnist import Examples
from mlp.model import MLP
from trainer import devices

_REPEATS = flags.DEFINE_integer('repeats', 11, 'Timed epochs of each variant.', lower_bound=1)


class ThreefryDropoutMLP(MLP):
  """The same MLP with Flax's nn.Dropout, the model's dropout before this project replaced it."""

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    x = x.reshape((x.shape[0], -1))
    for width in self.hidden_sizes:
      x = nn.relu(nn.Dense(width)(x))
      x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


def time_variants(config: ml_collections.ConfigDict, examples: Examples,
                  repeats: int) -> dict[str, float]:
  """Median seconds per epoch of each dropout variant, epochs interleaved."""
  model_dropout = workload.TrainerRun(config, examples)
  model = ThreefryDropoutMLP(hidden_sizes=tuple(config.model.hidden_sizes),
                             dropout_rate=config.model.dropout_rate)
  # The same fresh state and run set-up, with Flax's dropout in the model the epoch applies.
  state = devices.replicate(model_dropout.start_state.replace(apply_fn=model.apply),
                            model_dropout.mesh)
  runs = {'model dropout (a word per 4 units)': model_dropout,
          'nn.Dropout (a word per unit)': workload.TrainerRun(config, examples, state)}
  seconds: dict[str, list[float]] = {name: [] for name in runs}
  for number in range(repeats + 1):
    for name, run in runs.items():
      epoch_seconds = run.epoch(number)[0]
      if number:  # Epoch 0 warms up.
        seconds[name].append(epoch_seconds)
  return {name: statistics.median(values) for name, values in seconds.items()}


def main(argv: list[str]) -> None:
  del argv
  config = workload.benchmark_config()
  examples, description = workload.load_images()
  medians = time_variants(config, examples, _REPEATS.value)
  print(f'dropout {config.model.dropout_rate}, batch {config.batch_size}, {description}; median '
        f'of {_REPEATS.value} interleaved epochs')
  for name, seconds in medians.items():
    print(f'{name:40s} {seconds:8.4f}s per epoch')
  new, old = medians.values()
  print(f'model dropout / nn.Dropout epoch time: {new / old:.3f}')
  print(json.dumps({'epoch_seconds': medians, 'ratio': new / old}))


if __name__ == '__main__':
  app.run(main, flags_parser=workload.parse_flags)
