"""Training-image augmentation on the device, a function of (seed, epoch, example) only."""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax.scipy import ndimage

from mlp import randomness

SIDE = 28
Augment = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Distortion:
  """Ranges of a random affine map and an elastic field (Simard et al., 2003); zeros are off."""
  rotation: float = 0.0  # Degrees, uniform in [-rotation, rotation].
  scale: float = 0.0  # Relative, uniform in [1 - scale, 1 + scale].
  shear: float = 0.0  # Degrees, uniform in [-shear, shear].
  translate: float = 0.0  # Pixels each way, uniform in [-translate, translate].
  elastic_alpha: float = 0.0  # Strength of the smoothed random displacement field, in pixels.
  elastic_sigma: float = 4.0  # Its smoothness: the Gaussian's standard deviation, in pixels.

  def __bool__(self) -> bool:
    return any((self.rotation, self.scale, self.shear, self.translate, self.elastic_alpha))


def shift_offsets(key: jax.Array, epoch: jax.Array, indices: jax.Array,
                  max_shift: int) -> jax.Array:
  """Per-example (dy, dx) in [0, 2 * max_shift]."""
  draw = lambda k: jax.random.randint(k, (2,), 0, 2 * max_shift + 1)
  return jax.vmap(draw)(randomness.example_keys(key, epoch, indices))


def shift(pixels: jax.Array, offsets: jax.Array, max_shift: int) -> jax.Array:
  """Translates each 28x28 image by max_shift minus its offset, filling with background."""
  padded = jnp.pad(pixels.reshape(-1, SIDE, SIDE), ((0, 0), (max_shift, max_shift),
                                                    (max_shift, max_shift)))
  crop = lambda image, at: jax.lax.dynamic_slice(image, (at[0], at[1]), (SIDE, SIDE))
  return jax.vmap(crop)(padded, offsets).reshape(pixels.shape)


def _smoothing(sigma: float) -> jax.Array:
  """[28, 28] Gaussian blur as a matrix: rows of a normalized kernel, zero past the border."""
  distance = jnp.arange(SIDE)[:, None] - jnp.arange(SIDE)[None, :]
  weights = jnp.exp(-0.5 * (distance / sigma) ** 2)
  return weights / jnp.sum(jnp.exp(-0.5 * (jnp.arange(-SIDE + 1, SIDE) / sigma) ** 2))


def _affine(draws: jax.Array, d: Distortion) -> tuple[jax.Array, jax.Array]:
  """A 2x2 map and a translation from five draws in [-1, 1]: rotation, scale, shear, dy, dx."""
  angle, shear = jnp.deg2rad(draws[0] * d.rotation), jnp.deg2rad(draws[2] * d.shear)
  rotate = jnp.array([[jnp.cos(angle), -jnp.sin(angle)], [jnp.sin(angle), jnp.cos(angle)]])
  skew = jnp.array([[1.0, jnp.tan(shear)], [0.0, 1.0]])
  return rotate @ skew / (1.0 + draws[1] * d.scale), draws[3:5] * d.translate


def source_coordinates(key: jax.Array, d: Distortion) -> jax.Array:
  """[2, 28, 28]: where each output pixel reads the input image, (row, column), for one example."""
  affine_key = jax.random.fold_in(key, randomness.AFFINE)
  field_key = jax.random.fold_in(key, randomness.FIELD)
  matrix, offset = _affine(jax.random.uniform(affine_key, (5,), minval=-1.0, maxval=1.0), d)
  centre = (SIDE - 1) / 2
  grid = jnp.stack(jnp.meshgrid(jnp.arange(SIDE), jnp.arange(SIDE), indexing='ij')) - centre
  coordinates = jnp.einsum('ij,jhw->ihw', matrix, grid) + centre - offset[:, None, None]
  if d.elastic_alpha:
    field = jax.random.uniform(field_key, (2, SIDE, SIDE), minval=-1.0, maxval=1.0)
    blur = _smoothing(d.elastic_sigma)
    coordinates += d.elastic_alpha * jnp.einsum('hi,cij,wj->chw', blur, field, blur)
  return coordinates


def distort(pixels: jax.Array, keys: jax.Array, d: Distortion) -> jax.Array:
  """Each [784] image of the batch resampled (bilinear, background outside) by its key's map."""
  def one(image, key):
    image = image.reshape(SIDE, SIDE)
    return ndimage.map_coordinates(image, list(source_coordinates(key, d)), order=1,
                                   mode='constant', cval=0.0).reshape(-1)
  return jax.vmap(one)(pixels, keys)


def augmenter(seed_key: jax.Array, epoch: jax.Array, indices: jax.Array, max_shift: int,
              distortion: Distortion) -> Augment | None:
  """The batch's augmentation of [0, 1] pixels: the shift, then the distortion; None when off."""
  parts: list[Augment] = []
  if max_shift:
    shift_key = jax.random.fold_in(seed_key, randomness.SHIFT)
    offsets = shift_offsets(shift_key, epoch, indices, max_shift)
    parts.append(lambda pixels: shift(pixels, offsets, max_shift))
  if distortion:
    distortion_key = jax.random.fold_in(seed_key, randomness.DISTORTION)
    keys = randomness.example_keys(distortion_key, epoch, indices)
    parts.append(lambda pixels: distort(pixels, keys, distortion))
  if not parts:
    return None

  def augment(pixels: jax.Array) -> jax.Array:
    for part in parts:
      pixels = part(pixels)
    return pixels
  return augment
