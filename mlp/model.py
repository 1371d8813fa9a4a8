"""The Flax MLP classifier."""

from collections.abc import Sequence

import flax.linen as nn
import jax


class MLP(nn.Module):
  """ReLU layers of the given widths, optional dropout after each, then class logits."""
  hidden_sizes: Sequence[int] = (512, 512)
  num_classes: int = 10
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    x = x.reshape((x.shape[0], -1))
    for width in self.hidden_sizes:
      x = nn.relu(nn.Dense(width)(x))
      if self.dropout_rate > 0:
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)
