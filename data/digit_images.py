"""Any picture of one digit as an MNIST image, the way MNIST's own images were made.

MNIST's digits were scaled to fit a 20x20 box keeping their aspect ratio, then placed in 28x28 with
their centre of mass at the centre, light ink on a dark background. Pure functions: an image in,
uint8 pixels out.
"""

import numpy as np
from PIL import Image, ImageOps

from errors import UserError

SIDE, BOX = 28, 20  # MNIST's image side and the box its digits are scaled to fit.
CENTRE = 14.0  # Where MNIST's centres of mass lie (row and column index, measured on its images).
INK = 0.3  # Ink is darker than the page by this fraction of the picture's contrast, at least.
MIN_CONTRAST = 32  # Grey levels between page and ink below which a picture holds no digit.


class NoDigit(UserError):
  """A picture with no ink to read: blank, or too faint."""


class NotFinite(UserError):
  """A float picture (a TIFF of measurements, say) with pixels that are NaN or infinite: no grey
  level can be made of them, and one would turn every other pixel into NaN."""


def grayscale(image: Image.Image) -> np.ndarray:
  """float32 [H, W] grey levels 0-255 of any Pillow image; transparency counts as white paper.

  Raises NotFinite for a float picture with NaN or infinite pixels.
  """
  image = ImageOps.exif_transpose(image)  # Phone photos store their rotation apart.
  if image.mode in ('I', 'I;16', 'I;16B', 'I;16L', 'F'):  # 16-bit and float: scaled to 0-255.
    pixels: np.ndarray = np.asarray(image, np.float32)
    if bad := int(np.size(pixels) - np.count_nonzero(np.isfinite(pixels))):
      raise NotFinite(f'{bad} of its {np.size(pixels)} pixels are NaN or infinite')
    return pixels * np.float32(255.0 / max(float(np.max(pixels)), 1.0))
  if 'A' in image.getbands() or 'transparency' in image.info:
    image = Image.alpha_composite(Image.new('RGBA', image.size, 'white'), image.convert('RGBA'))
  return np.asarray(image.convert('L'), np.float32)


def light_on_dark(pixels: np.ndarray) -> tuple[np.ndarray, float]:
  """MNIST's polarity, and the page's grey level: a light page (the median grey) turns dark."""
  page = float(np.median(pixels))
  return (255.0 - pixels, 255.0 - page) if page > 127.5 else (pixels, page)


def _ink_box(mask: np.ndarray) -> tuple[slice, slice]:
  rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
  return slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1)


def centre_of_mass(pixels: np.ndarray) -> tuple[float, float]:
  """(row, column) of the pixels' intensity-weighted mean position."""
  rows, cols = np.indices(pixels.shape)
  total = float(pixels.sum())
  return float((rows * pixels).sum()) / total, float((cols * pixels).sum()) / total


def looks_like_mnist(pixels: np.ndarray) -> bool:
  """28x28 light-on-dark ink that fits 20x20 and is centred as MNIST's own digits are."""
  if pixels.shape != (SIDE, SIDE) or not (pixels > 0).any():
    return False
  rows, cols = _ink_box(pixels > 0)
  row, col = centre_of_mass(pixels)
  return (rows.stop - rows.start <= BOX and cols.stop - cols.start <= BOX
          and abs(row - CENTRE) <= 1 and abs(col - CENTRE) <= 1)


def ink_levels(pixels: np.ndarray, page: float) -> np.ndarray:
  """Light-on-dark pixels as ink 0-1: the page, its texture and shading 0, the darkest ink 1."""
  peak = float(pixels.max())
  if peak - page < MIN_CONTRAST:
    raise NoDigit(f'no digit found: the picture is blank or too faint (contrast {peak - page:.0f} '
                  f'of 255 grey levels)')
  return np.clip(((pixels - page) / (peak - page) - INK) / (1 - INK), 0.0, 1.0)


def fit_box(ink: np.ndarray) -> np.ndarray:
  """The ink's bounding box scaled so its longer side is 20 pixels, aspect ratio kept; peak 1."""
  rows, cols = _ink_box(ink > 0)
  crop = ink[rows, cols]
  scale = BOX / max(crop.shape)
  size = (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale)))
  resized = Image.fromarray(crop.astype(np.float32), 'F').resize(size, Image.Resampling.LANCZOS)
  scaled = np.clip(np.asarray(resized), 0.0, None)
  return scaled / scaled.max()


def centred(digit: np.ndarray) -> np.ndarray:
  """The digit in a 28x28 page with its centre of mass at MNIST's centre (kept whole inside)."""
  row, col = centre_of_mass(digit)
  top = min(max(round(CENTRE - row), 0), SIDE - digit.shape[0])
  left = min(max(round(CENTRE - col), 0), SIDE - digit.shape[1])
  page = np.zeros((SIDE, SIDE))
  page[top:top + digit.shape[0], left:left + digit.shape[1]] = digit
  return page


def to_mnist(image: Image.Image) -> np.ndarray:
  """uint8 [28, 28] MNIST pixels of a picture of one digit; an MNIST-like image is kept as it is.

  Raises NoDigit for a picture without ink, NotFinite for one with pixels that are no numbers.
  """
  pixels, page = light_on_dark(grayscale(image))
  if looks_like_mnist(pixels):
    return pixels.astype(np.uint8)
  return np.round(255 * centred(fit_box(ink_levels(pixels, page)))).astype(np.uint8)
