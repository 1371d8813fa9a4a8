"""Pictures of a run, drawn with Pillow: what a model gets wrong, its confusion matrix, its curves.

Pure functions: predictions or records in, uint8 RGB pixels [H, W, 3] out (PNG files and TensorBoard
images).
"""

import math
from typing import Any, NamedTuple

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


# Learning curves: three plots side by side, each PLOT_W x PLOT_H inside its frame, with room on its
# left for the value ticks, above for its name and below for the epochs; the legend under them.
PLOT_W, PLOT_H, INSET = 320, 280, 8  # A plot; its first and last epochs INSET inside the frame.
Y_AXIS, PANEL_GAP, PANEL_TITLE, X_AXIS = 56, 20, 22, 46
PANEL_W = Y_AXIS + PLOT_W + PANEL_GAP
LEGEND_TOP = HEADER + PANEL_TITLE + PLOT_H + X_AXIS
LEGEND_ROW, SWATCH = 20, 28
CURVES_WIDTH = 2 * PAD + 3 * PANEL_W
FIGURES = (('train_loss', 'train loss', 1.0), ('eval_loss', 'eval loss', 1.0),
           ('eval_accuracy', 'eval accuracy (%)', 100.0))  # (record key, plot name, scale)
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (23, 190, 207))  # One colour a recipe, cycling.
GREY, GRID, FRAME = (90, 90, 90), (232, 232, 232), (150, 150, 150)
BAND_ALPHA = 64  # Of 255: a recipe's min..max band, its colour this much over what lies below.
MARKERS_UP_TO = 30  # Epochs; a longer run's points would blur its line.


class Recipe(NamedTuple):
  """Models that differ only in their seed: one line (their mean), one band (their min..max)."""
  label: str
  members: list[int]
  colour: tuple[int, int, int]


class Panel(NamedTuple):
  """One plot: its frame in pixels (inclusive), its value range, its figures [epoch, member]."""
  box: tuple[int, int, int, int]
  low: float
  high: float
  values: np.ndarray  # [epoch, member], or [epoch, 1] of their mean where members' are missing.

  def point(self, epoch: float, value: float) -> tuple[int, int]:
    """The pixel (x, y) of a value at an epoch (1 to the last): drawing and tests share it."""
    left, top, right, bottom = self.box
    epochs = len(self.values)
    share = 0.5 if epochs == 1 else (epoch - 1) / (epochs - 1)
    x = left + INSET + share * (right - left - 2 * INSET)
    return round(x), round(bottom - (value - self.low) / (self.high - self.low) * (bottom - top))


def _value_text(value: Any) -> str:
  return f'{value:g}' if isinstance(value, float) else str(value)


def curve_recipes(records: list[dict[str, Any]]) -> list[Recipe]:
  """The run's models grouped by their values other than seed, in first-seen order, coloured."""
  values = next((r['members'] for r in records if 'members' in r), None)
  if values is None:
    lists = [records[0][f'{name}_by_member'] for name, _, _ in FIGURES
             if f'{name}_by_member' in records[0]]
    values = [{'seed': k} for k in range(len(lists[0]))] if lists else [{}]
  groups: dict[str, list[int]] = {}
  for k, member in enumerate(values):
    groups.setdefault(', '.join(f'{key}={_value_text(v)}' for key, v in member.items()
                                if key != 'seed'), []).append(k)
  recipes = []
  for index, (label, members) in enumerate(groups.items()):
    if not label:
      label = 'one model' if len(values) == 1 else f'{len(members)} seeds'
    recipes.append(Recipe(label, members, PALETTE[index % len(PALETTE)]))
  return recipes


def _figure(records: list[dict[str, Any]], name: str, scale: float) -> np.ndarray:
  """[epoch, member] of a figure; [epoch, 1] of the mean where a record lacks its members'."""
  if all(f'{name}_by_member' in r for r in records):
    return scale * np.array([r[f'{name}_by_member'] for r in records], dtype=float)
  return scale * np.array([[r[name]] for r in records], dtype=float)


def curve_panels(records: list[dict[str, Any]]) -> list[Panel]:
  """The three plots' geometry and figures; their value ranges the data's with a small margin."""
  panels = []
  for k, (name, _, scale) in enumerate(FIGURES):
    values = _figure(records, name, scale)
    finite = values[np.isfinite(values)]  # A diverged model's nan or inf is left out.
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    margin = 0.06 * (high - low) or max(0.05 * abs(high), 0.01)
    left, top = PAD + k * PANEL_W + Y_AXIS, HEADER + PANEL_TITLE
    panels.append(Panel((left, top, left + PLOT_W, top + PLOT_H), low - margin, high + margin,
                        values))
  return panels


def _nice_step(span: float, steps: tuple[float, ...], most: int) -> float:
  """The smallest step of 1, 2, 5... times a power of ten that cuts `span` in at most `most`."""
  power = 10.0 ** math.floor(math.log10(span / most))
  return next(m * power for m in steps if m * power * most >= span)


def _value_ticks(low: float, high: float) -> tuple[list[float], int]:
  """About five round values within [low, high], and the decimals that print them."""
  step = _nice_step(high - low, (1, 2, 2.5, 5, 10), 5)
  ticks = [k * step for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
  decimals = next(d for d in range(12) if abs(step * 10**d - round(step * 10**d)) < 1e-6)
  return ticks, decimals


def _epoch_ticks(epochs: int) -> list[int]:
  """At most about six whole epochs to label: every 1, 2, 5, 10... of them (and 1 by every 5+)."""
  if epochs == 1:
    return [1]
  step = max(1, round(_nice_step(epochs - 1, (1, 2, 5, 10), 6)))
  return ([1] if step >= 5 else []) + list(range(step, epochs + 1, step))


def _draw_axes(draw: ImageDraw.ImageDraw, panel: Panel, name: str) -> None:
  """The plot's name, frame and grid, its values' ticks on the left and the epochs' below."""
  left, top, right, bottom = panel.box
  font = _font()
  draw.text(((left + right) // 2, top - 4), name, fill='black', font=_font(14), anchor='md')
  ticks, decimals = _value_ticks(panel.low, panel.high)
  for value in ticks:
    y = panel.point(1, value)[1]
    draw.line((left, y, right, y), fill=GRID)
    draw.text((left - 4, y), f'{value:.{decimals}f}', fill='black', font=font, anchor='rm')
  for epoch in _epoch_ticks(len(panel.values)):
    x = panel.point(epoch, panel.low)[0]
    draw.line((x, top, x, bottom), fill=GRID)
    draw.text((x, bottom + 4), str(epoch), fill='black', font=font, anchor='ma')
  draw.text(((left + right) // 2, bottom + 22), 'epoch', fill='black', font=font, anchor='ma')
  draw.rectangle(panel.box, outline=FRAME)


def _finite_runs(values: np.ndarray) -> list[range]:
  """The runs of consecutive epochs (0-based) whose values are all finite: a line breaks at nan."""
  runs, start = [], None
  for epoch, finite in enumerate([*np.isfinite(values), False]):
    if finite and start is None:
      start = epoch
    elif not finite and start is not None:
      runs.append(range(start, epoch))
      start = None
  return runs


def _shade(page: Image.Image, polygon: list[tuple[int, int]], colour: tuple[int, ...]) -> None:
  """A polygon of `colour` at BAND_ALPHA over the page: overlapping bands both show."""
  mask = Image.new('L', page.size, 0)
  ImageDraw.Draw(mask).polygon(polygon, fill=BAND_ALPHA)
  page.paste(colour, (0, 0, *page.size), mask)


def _draw_band(page: Image.Image, panel: Panel, seeds: np.ndarray,
               colour: tuple[int, ...]) -> None:
  """The min..max over seeds [epoch, seed] at each epoch, joined epoch to epoch."""
  lows, highs = seeds.min(axis=1), seeds.max(axis=1)
  for run in _finite_runs(lows + highs):
    upper = [panel.point(e + 1, highs[e]) for e in run]
    lower = [panel.point(e + 1, lows[e]) for e in reversed(run)]
    if len(run) == 1:  # A lone epoch: a narrow bar.
      upper = [(upper[0][0] - 3, upper[0][1]), (upper[0][0] + 3, upper[0][1])]
      lower = [(lower[0][0] + 3, lower[0][1]), (lower[0][0] - 3, lower[0][1])]
    _shade(page, upper + lower, colour)


def _draw_line(draw: ImageDraw.ImageDraw, panel: Panel, means: np.ndarray,
               colour: tuple[int, ...]) -> None:
  """The mean at each epoch, joined; a dot at each where there are few epochs or a lone one."""
  for run in _finite_runs(means):
    points = [panel.point(e + 1, means[e]) for e in run]
    if len(points) > 1:
      draw.line(points, fill=colour, width=2, joint='curve')
    if len(points) == 1 or len(means) <= MARKERS_UP_TO:
      radius = 3 if len(points) == 1 else 2
      for x, y in points:
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour)


def _curves(panel: Panel, recipes: list[Recipe]) -> list[tuple[np.ndarray, tuple[int, ...]]]:
  """Each recipe's figures [epoch, seed] and colour; or the mean alone, grey where it mixes recipes
  (a record without its members' figures)."""
  if panel.values.shape[1] > max(max(r.members) for r in recipes):
    return [(panel.values[:, r.members], r.colour) for r in recipes]
  return [(panel.values, recipes[0].colour if len(recipes) == 1 else GREY)]


def _draw_panel(page: Image.Image, panel: Panel, name: str, recipes: list[Recipe]) -> None:
  """One plot: bands under all lines, so that no line hides."""
  draw = ImageDraw.Draw(page)
  _draw_axes(draw, panel, name)
  curves = _curves(panel, recipes)
  for seeds, colour in curves:
    if seeds.shape[1] > 1:
      _draw_band(page, panel, seeds, colour)
  for seeds, colour in curves:
    _draw_line(draw, panel, seeds.mean(axis=1), colour)


def curve_notes(panels: list[Panel], recipes: list[Recipe]) -> list[str]:
  """What the legend's entries leave unsaid: what a band spans, what a grey line is."""
  curves = [(seeds, colour) for panel in panels for seeds, colour in _curves(panel, recipes)]
  notes = []
  seeds = sorted({s.shape[1] for s, _ in curves if s.shape[1] > 1})
  if seeds:
    notes.append(f'band: min to max over {" or ".join(map(str, seeds))} seeds')
  if any(colour == GREY for _, colour in curves):
    models = sum(len(r.members) for r in recipes)
    notes.append(f'grey: the mean of all {models} models, where records lack each model\'s')
  return notes


def _legend_columns(recipes: list[Recipe]) -> tuple[int, int]:
  """(width, count) of the legend's columns: as many of its widest entry as fit across."""
  widest = max(_font().getlength(r.label) for r in recipes)
  width = SWATCH + 6 + math.ceil(widest) + 24
  return width, max(1, (CURVES_WIDTH - 2 * PAD - Y_AXIS) // width)


def _legend_rows(records: list[dict[str, Any]]) -> tuple[list[Recipe], list[str], int]:
  """The recipes, the notes and the rows of the legend that names them."""
  recipes = curve_recipes(records)
  notes = curve_notes(curve_panels(records), recipes)
  return recipes, notes, -(-len(recipes) // _legend_columns(recipes)[1]) + bool(notes)


def curves_size(records: list[dict[str, Any]]) -> tuple[int, int]:
  """(width, height) of the curves picture: its legend's rows decide the height."""
  return CURVES_WIDTH, LEGEND_TOP + _legend_rows(records)[2] * LEGEND_ROW + PAD


def _draw_legend(page: Image.Image, recipes: list[Recipe], notes: list[str]) -> None:
  """Each recipe's colour (over its band's, where bands are drawn) and name; then the notes."""
  draw = ImageDraw.Draw(page)
  width, columns = _legend_columns(recipes)
  for index, recipe in enumerate(recipes):
    left = PAD + Y_AXIS + (index % columns) * width
    middle = LEGEND_TOP + (index // columns) * LEGEND_ROW + LEGEND_ROW // 2
    if notes and notes[0].startswith('band') and len(recipe.members) > 1:
      _shade(page, [(left, middle - 6), (left + SWATCH, middle - 6), (left + SWATCH, middle + 6),
                    (left, middle + 6)], recipe.colour)
    draw.line((left, middle, left + SWATCH, middle), fill=recipe.colour, width=2)
    draw.text((left + SWATCH + 6, middle), recipe.label, fill='black', font=_font(), anchor='lm')
  if notes:
    middle = LEGEND_TOP + -(-len(recipes) // columns) * LEGEND_ROW + LEGEND_ROW // 2
    draw.text((PAD + Y_AXIS, middle), ';  '.join(notes), fill='black', font=_font(), anchor='lm')


def draw_curves(records: list[dict[str, Any]], title: str) -> np.ndarray:
  """A run's train loss, eval loss and eval accuracy by epoch: how it learned, for curves.png; one
  line a recipe (its seeds' mean) over a band of its seeds' min..max."""
  recipes, notes, _ = _legend_rows(records)
  page = Image.new('RGB', curves_size(records), 'white')
  models = sum(len(r.members) for r in recipes)
  who = 'one model' if models == 1 else f'{models} models' + (
      f' in {len(recipes)} recipes' if len(recipes) > 1 else ', seeds of one recipe')
  epochs = f'{len(records)} epoch{"s" if len(records) != 1 else ""}'
  ImageDraw.Draw(page).text((PAD, PAD), f'{title}\n{epochs}; {who}', fill='black', font=_font())
  for panel, (_, name, _) in zip(curve_panels(records), FIGURES):
    _draw_panel(page, panel, name, recipes)
  _draw_legend(page, recipes, notes)
  return np.asarray(page)
