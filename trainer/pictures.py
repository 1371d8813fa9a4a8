"""A run's pictures, drawn with matplotlib: what a model gets wrong, its confusion matrix, curves.

Pure functions: predictions or records in, uint8 RGB pixels [H, W, 3] out (PNG files and TensorBoard
images). matplotlib is imported when a picture is drawn, not when a run starts; each picture is a
Figure of a fixed size and dpi drawn by Agg in matplotlib's default style and bundled DejaVu fonts,
so that the same data draws the same pixels on every machine, whatever a user's matplotlibrc says.
"""

import functools
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypeVar

import numpy as np

from trainer.members import label

if TYPE_CHECKING:
  from matplotlib.axes import Axes
  from matplotlib.figure import Figure

DPI = 100  # Pixels an inch: every size below is in pixels.
MAX_MISTAKES, COLUMNS = 100, 10  # The mistakes shown, first in evaluation order, 10 per row.
ZOOM, LABEL, PAD = 2, 16, 4  # Each digit at 2x, its label below it, space around.
TILE_W, TILE_H = 28 * ZOOM + 2 * PAD, 28 * ZOOM + LABEL + 2 * PAD
HEADER = 40  # Title lines above each picture.
CONFUSION_SIZE = (460, 500)  # (width, height)
# Learning curves: three plots side by side, the legend's rows under them.
CURVES_WIDTH, PLOTS_HEIGHT, LEGEND_ROW = 1200, 404, 20
FIGURES = (('train_loss', 'train loss', 1.0), ('eval_loss', 'eval loss', 1.0),
           ('eval_accuracy', 'eval accuracy (%)', 100.0))  # (record key, plot name, scale)
PALETTE = ('#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
           '#17becf')  # One colour a recipe, cycling: matplotlib's own, less its grey and olive.
GREY = '#5a5a5a'  # The mean of several recipes' models, where records lack each model's.
BAND_ALPHA = 0.25  # A recipe's min..max band over what lies below it: overlapping bands both show.
MARKERS_UP_TO = 30  # Epochs; a longer run's points would blur its line.
TRIALS_SIZE = (800, 560)  # A search's trials, (width, height): one plot.
Drawn = TypeVar('Drawn')


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


def _default_style(draw: Callable[..., Drawn]) -> Callable[..., Drawn]:
  """Runs `draw` in matplotlib's default style: a user's matplotlibrc changes no picture."""
  @functools.wraps(draw)
  def drawn(*args: Any) -> Drawn:
    import matplotlib.style  # pylint: disable=g-import-not-at-top
    with matplotlib.style.context('default'):
      return draw(*args)
  return drawn


def _figure(size: tuple[int, int], title: str) -> 'Figure':
  """A white Figure of `size` pixels (width, height), its title lines at the top left."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figure = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
  figure.text(PAD / size[0], 1 - PAD / size[1], title, ha='left', va='top')
  return figure


def _axes(figure: 'Figure', box: tuple[float, float, float, float]) -> 'Axes':
  """Axes at (left, top, width, height) pixels from the figure's top left."""
  width, height = figure.bbox.width, figure.bbox.height
  left, top, w, h = box
  return figure.add_axes((left / width, 1 - (top + h) / height, w / width, h / height))


@_default_style
def render(figure: 'Figure') -> np.ndarray:
  """The figure drawn by Agg: uint8 [H, W, 3]."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  canvas = FigureCanvasAgg(figure)
  canvas.draw()
  return np.array(canvas.buffer_rgba())[..., :3]


def mistakes_size(count: int) -> tuple[int, int]:
  """(width, height) of the mistakes picture showing `count` wrong images (at most 100 drawn)."""
  rows = -(-min(count, MAX_MISTAKES) // COLUMNS)
  return COLUMNS * TILE_W + 2 * PAD, HEADER + rows * TILE_H + PAD


@_default_style
def mistakes_figure(images: np.ndarray, labels: np.ndarray, predicted: np.ndarray,
                    title: str) -> 'Figure':
  """Up to 100 wrongly predicted images as MNIST shows them, each labelled `true as predicted`:
  one image of them all, in tiles of TILE_W x TILE_H pixels at 1 / ZOOM."""
  wrong = np.flatnonzero(predicted != labels)
  shown = f', the first {MAX_MISTAKES} shown' if len(wrong) > MAX_MISTAKES else ''
  figure = _figure(mistakes_size(len(wrong)), f'{title}\n{len(wrong):,} of {len(labels):,} wrong'
                   f'{shown}; each labelled "true digit as predicted digit"')
  if not wrong.size:
    return figure
  tile_w, tile_h, inset = TILE_W // ZOOM, TILE_H // ZOOM, PAD // ZOOM  # In the images' pixels.
  rows = -(-min(len(wrong), MAX_MISTAKES) // COLUMNS)
  mosaic = np.full((rows * tile_h, COLUMNS * tile_w), 255, np.uint8)
  axes = _axes(figure, (PAD, HEADER, COLUMNS * TILE_W, rows * TILE_H))
  for slot, index in enumerate(wrong[:MAX_MISTAKES]):
    top, left = (slot // COLUMNS) * tile_h + inset, (slot % COLUMNS) * tile_w + inset
    mosaic[top:top + 28, left:left + 28] = images[index].reshape(28, 28)
    axes.text(left + 13.5, top + 28.5, f'{labels[index]} as {predicted[index]}', ha='center',
              va='top')
  axes.imshow(mosaic, cmap='gray', vmin=0, vmax=255, interpolation='nearest', aspect='auto')
  axes.set_axis_off()
  return figure


def draw_mistakes(images: np.ndarray, labels: np.ndarray, predicted: np.ndarray,
                  title: str) -> np.ndarray:
  """Up to 100 wrongly predicted images as MNIST shows them, each labelled `true as predicted`."""
  return render(mistakes_figure(images, labels, predicted, title))


def confusion_shares(matrix: np.ndarray) -> np.ndarray:
  """[10, 10] in 0..1: how deep each cell's colour is; on the diagonal the row's share right, off it
  the share of the worst wrong cell; square roots, so that a few errors still show."""
  worst = int((matrix - np.diag(np.diag(matrix))).max())
  most = np.where(np.eye(10, dtype=bool), matrix.sum(axis=1, keepdims=True), worst)
  return np.sqrt(np.divide(matrix, most, out=np.zeros((10, 10)), where=most > 0))


@_default_style
def confusion_figure(matrix: np.ndarray, title: str) -> 'Figure':
  """The 10x10 confusion matrix with its counts: rows the true digit, columns the predicted one;
  right in blue, wrong in red, none in white."""
  figure = _figure(CONFUSION_SIZE, f'{title}\nrows: true digit, columns: predicted digit')
  axes = _axes(figure, (50, HEADER + 36, 400, 400))
  shares, diagonal = confusion_shares(matrix), np.eye(10, dtype=bool)
  for cells, colours in ((diagonal, 'Blues'), (~diagonal, 'Reds')):
    axes.imshow(np.ma.masked_where(~cells | (matrix == 0), shares), cmap=colours, vmin=0, vmax=1.25)
  for (row, col), count in np.ndenumerate(matrix):
    ink = 'white' if shares[row, col] > 0.7 else 'black' if count else '#bebebe'
    axes.text(col, row, str(count), ha='center', va='center', color=ink)
  for axis in (axes.xaxis, axes.yaxis):  # The digits, and lines between the cells.
    axis.set_ticks(range(10))
    axis.set_ticks(np.arange(-0.5, 10), minor=True)
  axes.grid(which='minor', color='#dcdcdc')
  axes.tick_params(which='both', length=0, top=True, labeltop=True, bottom=False,
                   labelbottom=False, labelsize=12)
  return figure


def draw_confusion(matrix: np.ndarray, title: str) -> np.ndarray:
  """The 10x10 confusion matrix with its counts: rows the true digit, columns the predicted one."""
  return render(confusion_figure(matrix, title))


class Recipe(NamedTuple):
  """Models that differ only in their seed: one line (their mean), one band (their min..max)."""
  label: str
  members: list[int]
  colour: str


def curve_recipes(records: list[dict[str, Any]]) -> list[Recipe]:
  """The run's models grouped by their values other than seed, in first-seen order, coloured."""
  values = next((r['members'] for r in records if 'members' in r), None)
  if values is None:
    lists = [records[0][f'{name}_by_member'] for name, _, _ in FIGURES
             if f'{name}_by_member' in records[0]]
    values = [{'seed': k} for k in range(len(lists[0]))] if lists else [{}]
  groups: dict[str, list[int]] = {}
  for k, member in enumerate(values):
    recipe = {key: value for key, value in member.items() if key != 'seed'}
    groups.setdefault(label(recipe, ', '), []).append(k)
  recipes = []
  for index, (said, members) in enumerate(groups.items()):
    if not said:
      said = 'one model' if len(values) == 1 else f'{len(members)} seeds'
    recipes.append(Recipe(said, members, PALETTE[index % len(PALETTE)]))
  return recipes


def _values(records: list[dict[str, Any]], name: str, scale: float) -> np.ndarray:
  """[epoch, member] of a figure, nan where not finite (a diverged model's); [epoch, 1] of the
  mean where a record lacks its members'."""
  if all(f'{name}_by_member' in r for r in records):
    values = scale * np.array([r[f'{name}_by_member'] for r in records], dtype=float)
  else:
    values = scale * np.array([[r[name]] for r in records], dtype=float)
  return np.where(np.isfinite(values), values, np.nan)


def curve_values(records: list[dict[str, Any]]) -> list[np.ndarray]:
  """The three plots' figures, each [epoch, member] (or [epoch, 1] of their mean)."""
  return [_values(records, name, scale) for name, _, scale in FIGURES]


def curves(values: np.ndarray, recipes: list[Recipe]) -> list[tuple[np.ndarray, str]]:
  """A plot's figures [epoch, seed] and colour for each recipe; or the mean alone, grey where it
  mixes recipes (a record without its members' figures)."""
  if values.shape[1] > max(max(r.members) for r in recipes):
    return [(values[:, r.members], r.colour) for r in recipes]
  return [(values, recipes[0].colour if len(recipes) == 1 else GREY)]


def curve_notes(values: list[np.ndarray], recipes: list[Recipe]) -> list[str]:
  """What the legend's entries leave unsaid: what a band spans, what a grey line is."""
  drawn = [(seeds, colour) for figures in values for seeds, colour in curves(figures, recipes)]
  notes = []
  if seeds := sorted({s.shape[1] for s, _ in drawn if s.shape[1] > 1}):
    notes.append(f'band: min to max over {" or ".join(map(str, seeds))} seeds')
  if any(colour == GREY for _, colour in drawn):
    models = sum(len(r.members) for r in recipes)
    notes.append(f'grey: the mean of all {models} models, where records lack each model\'s')
  return notes


def _legend_columns(recipes: list[Recipe]) -> int:
  """As many columns of the widest entry as fit across under the plots."""
  from matplotlib.font_manager import FontProperties  # pylint: disable=g-import-not-at-top
  from matplotlib.textpath import text_to_path  # pylint: disable=g-import-not-at-top
  font = FontProperties(family='DejaVu Sans', size=10)  # The legend's.
  widest = max(text_to_path.get_text_width_height_descent(r.label, font, ismath=False)[0]
               for r in recipes) * DPI / 72
  return max(1, int((CURVES_WIDTH - 60) // (widest + 70)))


def _legend(records: list[dict[str, Any]]) -> tuple[list[Recipe], list[str], int, int]:
  """The recipes, the notes, and the columns and rows of the legend that names them."""
  recipes = curve_recipes(records)
  notes = curve_notes(curve_values(records), recipes)
  columns = _legend_columns(recipes)
  return recipes, notes, columns, -(-len(recipes) // columns) + bool(notes)


def curves_size(records: list[dict[str, Any]]) -> tuple[int, int]:
  """(width, height) of the curves picture: its legend's rows decide the height."""
  return CURVES_WIDTH, PLOTS_HEIGHT + _legend(records)[3] * LEGEND_ROW + 2 * PAD


def _plot(axes: 'Axes', seeds: np.ndarray, colour: str) -> None:
  """A recipe's mean by epoch over the band of its seeds' min..max; a dot at each epoch where
  there are few, and at each epoch that has no finite neighbour."""
  epochs, means = np.arange(1, len(seeds) + 1), seeds.mean(axis=1)
  finite = np.isfinite(means)
  lone = finite & ~np.convolve(np.pad(finite, 1), [1, 0, 1], 'valid').astype(bool)
  if seeds.shape[1] > 1:
    lows, highs = seeds.min(axis=1), seeds.max(axis=1)
    axes.fill_between(epochs, lows, highs, where=finite & ~lone, color=colour, alpha=BAND_ALPHA,
                      linewidth=0)
    axes.vlines(epochs[lone], lows[lone], highs[lone], color=colour, alpha=BAND_ALPHA,
                linewidth=6)
  axes.plot(epochs, means, color=colour, linewidth=1.5, marker='o', markersize=4,
            markevery=lone | (len(epochs) <= MARKERS_UP_TO))


def _by_epoch(axes: 'Axes', epochs: int) -> None:
  """The x axis of a plot by epoch, epochs 1 to `epochs` (epoch 0 out of view), over a grid."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  inset = 0.5 if epochs == 1 else min(0.9, 0.025 * (epochs - 1))
  axes.set_xlabel('epoch')
  axes.set_xlim(1 - inset, epochs + inset)
  axes.xaxis.set_major_locator(MaxNLocator(6, steps=[1, 2, 5, 10], integer=True, min_n_ticks=1))
  axes.grid(color='#e8e8e8')
  axes.set_axisbelow(True)


def _curves_plots(figure: 'Figure', records: list[dict[str, Any]],
                  recipes: list[Recipe]) -> None:
  """The three plots: each figure by epoch, one line and band a recipe."""
  for k, ((_, name, _), values) in enumerate(zip(FIGURES, curve_values(records))):
    axes = _axes(figure, (k * CURVES_WIDTH / 3 + 60, HEADER + 28, 320, 280))
    for seeds, colour in curves(values, recipes):
      _plot(axes, seeds, colour)
    axes.set_title(name)
    _by_epoch(axes, len(records))


@_default_style
def curves_figure(records: list[dict[str, Any]], title: str) -> 'Figure':
  """A run's train loss, eval loss and eval accuracy by epoch; one line a recipe (its seeds'
  mean) over a band of its seeds' min..max; the legend, then its notes, below."""
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  from matplotlib.patches import Patch  # pylint: disable=g-import-not-at-top
  recipes, notes, columns, _ = _legend(records)
  models = sum(len(r.members) for r in recipes)
  who = 'one model' if models == 1 else f'{models} models' + (
      f' in {len(recipes)} recipes' if len(recipes) > 1 else ', seeds of one recipe')
  width, height = curves_size(records)
  figure = _figure((width, height), f'{title}\n{len(records)} epoch'
                   f'{"s" if len(records) != 1 else ""}; {who}')
  _curves_plots(figure, records, recipes)
  banded = bool(notes) and notes[0].startswith('band')
  lines = [Line2D([], [], color=r.colour, linewidth=1.5) for r in recipes]
  handles: list[Any] = [(Patch(color=r.colour, alpha=BAND_ALPHA), line)  # The line over its band.
                        if banded and len(r.members) > 1 else line
                        for r, line in zip(recipes, lines)]
  figure.legend(handles, [r.label for r in recipes], ncols=columns, frameon=False,
                loc='upper left', bbox_to_anchor=(56 / width, 1 - PLOTS_HEIGHT / height),
                borderaxespad=0, borderpad=0, columnspacing=2.5)
  if notes:
    figure.text(60 / width, 1.5 * PAD / height, ';  '.join(notes), ha='left', va='bottom')
  return figure


def draw_curves(records: list[dict[str, Any]], title: str) -> np.ndarray:
  """A run's train loss, eval loss and eval accuracy by epoch: how it learned, for curves.png; one
  line a recipe (its seeds' mean) over a band of its seeds' min..max."""
  return render(curves_figure(records, title))


class TrialCurve(NamedTuple):
  """A trial of a search: its eval accuracy after each epoch it trained, from epoch 1, and whether
  the pruner stopped it after the last."""
  number: int
  accuracy: list[float]
  pruned: bool


@_default_style
def trials_figure(trials: list[TrialCurve], num_epochs: int, title: str) -> 'Figure':
  """A search's trials' eval accuracy by epoch, a line each (its number at its end); a pruned
  trial's line ends where the pruner stopped it, with a cross."""
  figure = _figure(TRIALS_SIZE, title)
  axes = _axes(figure, (60, HEADER + 28, TRIALS_SIZE[0] - 90, TRIALS_SIZE[1] - HEADER - 90))
  for k, trial in enumerate(trials):
    colour = PALETTE[k % len(PALETTE)]
    values = 100 * np.array(trial.accuracy, dtype=float)[:, None]
    _plot(axes, np.where(np.isfinite(values), values, np.nan), colour)
    end = (len(trial.accuracy), values[-1, 0])
    if trial.pruned:
      axes.plot(*end, color=colour, marker='x', markersize=10, markeredgewidth=2)
    axes.annotate(str(trial.number), end, xytext=(6, 0), textcoords='offset points',
                  color=colour, va='center')
  axes.set_ylabel('eval accuracy (%)')
  _by_epoch(axes, num_epochs)
  return figure


def draw_trials(trials: list[TrialCurve], num_epochs: int, title: str) -> np.ndarray:
  """A search's trials' eval accuracy by epoch, for its curves.png."""
  return render(trials_figure(trials, num_epochs, title))
