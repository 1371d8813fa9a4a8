"""The Flax MLP classifier, computing in float32 or bfloat16 over float32 parameters."""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

DTYPES = {'float32': None, 'bfloat16': jnp.bfloat16}  # None: Flax's default, float32 throughout.


def dropout(x: jax.Array, rate: float, rng: jax.Array) -> jax.Array:
  """Inverted dropout at a quarter of threefry's cost: each random 32-bit word decides four units.

  A unit is kept when its byte is below round(256 * (1 - rate)), so the applied rate is a multiple
  of 1/256: 0.2 drops 51/256 = 0.19921875 of units. Kept units are scaled by the exact inverse.
  """
  # Not jax.random.bernoulli: a word per unit under threefry; under rbg keys 7-18% slower here and,
  # vmapped over per-example keys, every mask drawn from the first key (docs/performance.md).
  keep = round(256 * (1 - rate))
  with jax.named_scope('dropout'):  # Labels its ops in profiles (benchmarks/profile_epoch.py).
    words = jax.random.bits(rng, (-(-x.size // 4), 1), jnp.uint32)
    # Shifts, not a bitcast: the same bytes on every backend, whatever its byte order.
    draws = (words >> jnp.array([0, 8, 16, 24], jnp.uint32)) & 0xFF
    draws = draws.reshape(-1)[:x.size].reshape(x.shape)
    return jnp.where(draws < keep, x * (256 / keep), jnp.zeros((), x.dtype))


class MLP(nn.Module):
  """ReLU layers of the given widths, optional dropout after each, then float32 class logits."""
  hidden_sizes: Sequence[int] = (512, 512)
  num_classes: int = 10
  dropout_rate: float = 0.0
  dtype: str = 'float32'  # Of activations and matmuls; parameters stay float32.

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    dtype = DTYPES[self.dtype]
    x = x.reshape((x.shape[0], -1))
    for width in self.hidden_sizes:
      x = nn.relu(nn.Dense(width, dtype=dtype, param_dtype=jnp.float32)(x))
      if self.dropout_rate > 0 and train:
        x = dropout(x, self.dropout_rate, self.make_rng('dropout'))
    logits = nn.Dense(self.num_classes, dtype=dtype, param_dtype=jnp.float32)(x)
    return logits if dtype is None else logits.astype(jnp.float32)
