"""Every random key a run draws, from its seed alone: (seed, purpose, epoch or step, example).

Keyed by the example, never its batch or device, so any device count trains the same numbers and a
resumed run replays them exactly.
"""

import jax
import jax.numpy as jnp

# Each purpose's key is jax.random.fold_in(its parent key, the purpose's number), never a split.
# fold_in(key, i) is split(key)[i] under JAX's default jax_threefry_partitionable: keys as before.
ORDER, DROPOUT, SHIFT, DISTORTION = range(4)  # Purposes of the run's key.
AFFINE, FIELD = range(2)  # Purposes of an example's distortion key.


def run_keys(seed: int | jax.Array) -> tuple[jax.Array, jax.Array]:
  """The two keys a run derives from its seed: one initializes the model, one drives every epoch."""
  init_key, run_key = jax.random.split(jax.random.key(seed))
  return init_key, run_key


def member_keys(seeds: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Members' keys stacked [M], of uint32 seeds [M]: member k's are its seed's run keys, so it
  trains as that seed's run."""
  # In one vectorized call: a key at a time took minutes for thousands of members.
  return jax.vmap(run_keys)(seeds.astype(jnp.uint32))


def example_keys(key: jax.Array, time: jax.Array | int, indices: jax.Array) -> jax.Array:
  """One key per example of the batch, (key, epoch or step, example): whatever batch or device."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.fold_in(key, time), indices)
