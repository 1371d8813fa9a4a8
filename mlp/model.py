"""The Flax NNX MLP classifier, computing in float32 or bfloat16 over float32 parameters."""

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

DTYPES = {'float32': None, 'bfloat16': jnp.bfloat16}  # None: Flax's default, float32 throughout.


def dropout(x: jax.Array, rate: float | jax.Array, rng: jax.Array) -> jax.Array:
  """Inverted dropout at a quarter of threefry's cost: each random 32-bit word decides four units.

  A unit is kept when its byte is below round(256 * (1 - rate)), so the applied rate is a multiple
  of 1/256: 0.2 drops 51/256 = 0.19921875 of units. Kept units are scaled by the exact inverse.
  `rate` may be traced (members of a sweep, each its own): the same kept units, to float rounding
  of the scale.
  """
  # Not jax.random.bernoulli: a word per unit under threefry; under rbg keys 7-18% slower here and,
  # vmapped over per-example keys, every mask drawn from the first key (docs/performance.md).
  keep = (round(256 * (1 - rate)) if isinstance(rate, (int, float)) else
          jnp.round(256 * (1 - rate)).astype(jnp.uint32))
  with jax.named_scope('dropout'):  # Labels its ops in profiles (benchmarks/profile_epoch.py).
    words = jax.random.bits(rng, (-(-x.size // 4), 1), jnp.uint32)
    # Shifts, not a bitcast: the same bytes on every backend, whatever its byte order.
    draws = (words >> jnp.array([0, 8, 16, 24], jnp.uint32)) & 0xFF
    draws = draws.reshape(-1)[:x.size].reshape(x.shape)
    return jnp.where(draws < keep, x * (256 / keep), jnp.zeros((), x.dtype))


class MLP(nnx.Module):
  """ReLU layers of the given widths, optional dropout after each, then float32 class logits."""

  def __init__(self, hidden_sizes: Sequence[int] = (512, 512), *, dropout_rate: float = 0.0,
               dtype: str = 'float32', num_classes: int = 10, rngs: nnx.Rngs):
    widths = (784, *hidden_sizes)
    dense = functools.partial(nnx.Linear, dtype=DTYPES[dtype], param_dtype=jnp.float32, rngs=rngs)
    self.hidden = nnx.List([dense(n, m) for n, m in zip(widths, widths[1:])])
    self.out = dense(widths[-1], num_classes)
    self.dropout_rate = dropout_rate
    self.compute_dtype = DTYPES[dtype]  # Of activations and matmuls; parameters stay float32.

  def __call__(self, x: jax.Array, dropout_key: jax.Array | None = None,
               dropout_rate: jax.Array | None = None) -> jax.Array:
    """Logits of a batch; with a `dropout_key` (training), each layer's mask drawn from it, at the
    model's own rate or, given (a sweep's member), at `dropout_rate`."""
    rate = self.dropout_rate if dropout_rate is None else dropout_rate
    dropping = dropout_rate is not None or self.dropout_rate > 0
    with jax.named_scope('mlp'):  # Names its ops in profiles (benchmarks/profile_epoch.py).
      x = x.reshape((x.shape[0], -1))
      for index, layer in enumerate(self.hidden):
        with jax.named_scope('dense'):
          x = layer(x)
        x = nnx.relu(x)
        if dropping and dropout_key is not None:
          x = dropout(x, rate, jax.random.fold_in(dropout_key, index))
      with jax.named_scope('dense'):
        logits = self.out(x)
    return logits if self.compute_dtype is None else logits.astype(jnp.float32)
