"""The default config's epoch with the model's dropout against jax.random.bernoulli, side by side.

  python -m benchmarks.dropout_bits [--batch_size=128] [--num_images=8000] [--repeats=11]

The model's dropout (mlp/model.py) compares the bytes of threefry words, one word per four units.
Flax's Dropout calls jax.random.bernoulli: under threefry keys a word per unit; under `rbg` keys
(jax_default_prng_impl, which then keys the whole run) XLA's RngBitGenerator. Every variant runs
the trainer's epoch (the run set-up) over the same data and state, timed in turn, so load from
other processes hits all alike.
"""

import dataclasses
import json
import statistics
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import ml_collections
from absl import flags
from flax import nnx

from benchmarks import workload
from configs import default
from data.mnist import Examples
from mlp.model import MLP
from trainer import programs as devices
from trainer.host.boundary import Host

_REPEATS = flags.DEFINE_integer('repeats', 11, 'Timed epochs of each variant.', lower_bound=1)
BYTES, THREEFRY, RBG = ('model dropout (bytes, a word per 4 units)',
                        'bernoulli, threefry (a word per unit)',
                        'bernoulli, rbg keys')


class BernoulliDropoutMLP(MLP):
  """The same MLP, its masks drawn as Flax's Dropout draws them: with jax.random.bernoulli."""

  def __call__(self, x: jax.Array, dropout_key: jax.Array | None = None,
               dropout_rate: jax.Array | None = None) -> jax.Array:
    del dropout_rate  # The model's own: no sweep here.
    x = x.reshape((x.shape[0], -1))
    for index, layer in enumerate(self.hidden):
      x = nnx.relu(layer(x))
      if dropout_key is not None:
        keep = jax.random.bernoulli(jax.random.fold_in(dropout_key, index),
                                    1 - self.dropout_rate, x.shape)
        x = jnp.where(keep, x / (1 - self.dropout_rate), 0)
    logits = self.out(x)
    return logits if self.compute_dtype is None else logits.astype(jnp.float32)


def make_runs(config: ml_collections.ConfigDict,
              examples: Examples) -> dict[str, workload.TrainerRun]:
  """The three variants, compiled from the same fresh state; the rbg one keyed by rbg throughout."""
  model_dropout = workload.TrainerRun(config, examples)
  model = BernoulliDropoutMLP(tuple(config.model.hidden_sizes),
                              dropout_rate=config.model.dropout_rate, dtype=config.dtype,
                              rngs=nnx.Rngs(params=0))
  start = dataclasses.replace(model_dropout.start_state, graphdef=nnx.graphdef(model))
  # A copy each: an epoch donates the state it starts from.
  mesh = model_dropout.mesh
  fresh = lambda: workload.TrainerRun(config, examples, devices.replicate(start, mesh))
  runs = {BYTES: model_dropout, THREEFRY: fresh()}
  previous = jax.config.values['jax_default_prng_impl']
  jax.config.update('jax_default_prng_impl', 'rbg')  # The run's key, so every key derived from it.
  try:
    runs[RBG] = fresh()
  finally:
    jax.config.update('jax_default_prng_impl', previous)
  return runs


def interleaved(runs: dict[str, workload.TrainerRun], repeats: int) -> Iterator[tuple[str, float]]:
  """(variant, seconds) of each timed epoch, the variants taking turns; epoch 0 warms up."""
  for number in range(repeats + 1):
    for name, run in runs.items():
      seconds = run.epoch(number)[0]
      if number:
        yield name, seconds


def main(argv: list[str]) -> None:
  del argv
  config = workload.benchmark_config()
  config.data.max_shift = default.get_config().data.max_shift  # The default's epoch, with shifts.
  examples, description = workload.load_images()
  runs = make_runs(config, examples)
  seconds: dict[str, list[float]] = {name: [] for name in runs}
  for name, value in interleaved(runs, _REPEATS.value):
    seconds[name].append(value)
  medians = {name: statistics.median(values) for name, values in seconds.items()}
  print(f'dropout {config.model.dropout_rate}, batch {config.batch_size}, shifts '
        f'{config.data.max_shift}, {description}; median of {_REPEATS.value} interleaved epochs')
  for name, median in medians.items():
    print(f'{name:42s} {median:8.4f}s per epoch')
  ratios = {f'{RBG} / {BYTES}': medians[RBG] / medians[BYTES],
            f'{BYTES} / {THREEFRY}': medians[BYTES] / medians[THREEFRY]}
  for name, ratio in ratios.items():
    print(f'{name}: {ratio:.3f}')
  print(json.dumps({'epoch_seconds': medians, 'ratios': ratios}))


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
