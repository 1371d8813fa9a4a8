"""Pictures of an evaluation, drawn with Pillow: what a model gets wrong, its confusion matrix.

Pure functions: predictions in, uint8 RGB pixels [H, W, 3] out (PNG files and TensorBoard images).
"""

import numpy as np
from PIL import Image, ImageDraw, ImageFont

MAX_MISTAKES, COLUMNS = 100, 10  # The mistakes shown, first in evaluation order, 10 per row.
ZOOM, LABEL, PAD = 2, 16, 4  # Each digit at 2x, its label below it, space around.
TILE_W, TILE_H = 28 * ZOOM + 2 * PAD, 28 * ZOOM + LABEL + 2 * PAD
HEADER = 40  # Title lines above each picture.
CELL, AXIS = 40, 56  # Confusion matrix: cell side, room for the digits along each axis.
CONFUSION_SIZE = (AXIS + 10 * CELL + PAD, HEADER + AXIS + 10 * CELL + PAD)  # (width, height)
BLUE, RED = np.array([33, 102, 172]), np.array([178, 24, 43])


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray) -> np.ndarray:
  """int64 [10, 10]: row the true digit, column the predicted one."""
  return np.bincount(10 * labels.astype(np.int64) + predicted, minlength=100).reshape(10, 10)


def per_digit_accuracy(matrix: np.ndarray) -> list[float | None]:
  """Each digit's share of its examples predicted right; None (JSON's null), not a 0 that reads as
  all wrong, for a digit a small eval split holds none of."""
  totals = matrix.sum(axis=1)
  return [float(matrix[d, d] / totals[d]) if totals[d] else None for d in range(10)]


def per_digit_text(matrix: np.ndarray) -> str:
  """Each digit's accuracy as printed; n/a for a digit the eval split holds none of."""
  return '  '.join(f'{digit} n/a' if share is None else f'{digit} {100 * share:.1f}%'
                   for digit, share in enumerate(per_digit_accuracy(matrix)))


def mistakes_size(count: int) -> tuple[int, int]:
  """(width, height) of the mistakes picture showing `count` wrong images (at most 100 drawn)."""
  rows = -(-min(count, MAX_MISTAKES) // COLUMNS)
  return COLUMNS * TILE_W + 2 * PAD, HEADER + rows * TILE_H + PAD


def _font(size: int = 13) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
  return ImageFont.load_default(size=size)


def draw_mistakes(images: np.ndarray, labels: np.ndarray, predicted: np.ndarray,
                  title: str) -> np.ndarray:
  """Up to 100 wrongly predicted images as MNIST shows them, each labelled `true as predicted`."""
  wrong = np.flatnonzero(predicted != labels)
  page = Image.new('RGB', mistakes_size(len(wrong)), 'white')
  draw = ImageDraw.Draw(page)
  shown = f', the first {MAX_MISTAKES} shown' if len(wrong) > MAX_MISTAKES else ''
  draw.text((PAD, PAD), f'{title}\n{len(wrong):,} of {len(labels):,} wrong{shown}; each labelled '
            '"true digit as predicted digit"', fill='black', font=_font())
  for slot, index in enumerate(wrong[:MAX_MISTAKES]):
    left = PAD + (slot % COLUMNS) * TILE_W + PAD
    top = HEADER + (slot // COLUMNS) * TILE_H + PAD
    digit = Image.fromarray(images[index].reshape(28, 28)).resize((28 * ZOOM, 28 * ZOOM),
                                                                Image.Resampling.NEAREST)
    page.paste(digit.convert('RGB'), (left, top))
    draw.text((left + 28 * ZOOM // 2, top + 28 * ZOOM + 2),
              f'{labels[index]} as {predicted[index]}', fill='black', font=_font(), anchor='ma')
  return np.asarray(page)


def _cell_colour(count: int, most: int, diagonal: bool) -> tuple[tuple[int, ...], str]:
  """Blue for right (deeper with the row's share), red for wrong (deeper towards the worst cell)."""
  share = np.sqrt(count / most) if most else 0.0  # Square root: a few errors still show.
  colour = 255 - share * (255 - (BLUE if diagonal else RED))
  return tuple(int(c) for c in colour), 'white' if share > 0.6 else 'black'


def draw_confusion(matrix: np.ndarray, title: str) -> np.ndarray:
  """The 10x10 confusion matrix with its counts: rows the true digit, columns the predicted one."""
  page = Image.new('RGB', CONFUSION_SIZE, 'white')
  draw = ImageDraw.Draw(page)
  font = _font()
  draw.text((PAD, PAD), f'{title}\nrows: true digit, columns: predicted digit', fill='black',
            font=font)
  top = HEADER + AXIS
  for d in range(10):
    middle = AXIS + d * CELL + CELL // 2
    draw.text((middle, HEADER + AXIS // 2), str(d), fill='black', font=_font(16), anchor='mm')
    draw.text((AXIS // 2, top + d * CELL + CELL // 2), str(d), fill='black', font=_font(16),
              anchor='mm')
  worst = int((matrix - np.diag(np.diag(matrix))).max())
  for row, col in np.ndindex(10, 10):
    most = int(matrix[row].sum()) if row == col else worst
    fill, ink = _cell_colour(int(matrix[row, col]), most, row == col)
    box = (AXIS + col * CELL, top + row * CELL, AXIS + (col + 1) * CELL, top + (row + 1) * CELL)
    draw.rectangle(box, fill=fill, outline=(220, 220, 220))
    draw.text((box[0] + CELL // 2, box[1] + CELL // 2), str(matrix[row, col]),
              fill=ink if matrix[row, col] else (190, 190, 190), font=font, anchor='mm')
  return np.asarray(page)
