"""The learning curves picture (curves.png) of synthetic records: where its lines and bands land."""

import subprocess
import sys

import matplotlib
import numpy as np
from matplotlib.collections import FillBetweenPolyCollection, LineCollection
from matplotlib.colors import to_hex

from tests.conftest import ROOT
from trainer import pictures
from trainer.pictures import PALETTE

SWEEP = [{'learning_rate': lr, 'seed': seed} for lr in (0.001, 0.002) for seed in (0, 1)]
NAMES = [name for name, _, _ in pictures.FIGURES]


def single(*figures: list[float]) -> list[dict]:
  """Records of one model: train loss, eval loss and eval accuracy, each by epoch."""
  return [{'epoch': e + 1, **dict(zip(NAMES, values))} for e, values in enumerate(zip(*figures))]


def side_by_side(figures: dict[str, np.ndarray], members: list[dict] | None = None) -> list[dict]:
  """Records of models trained side by side from figures[name][epoch, member]; means as logged."""
  records = []
  for e in range(len(next(iter(figures.values())))):
    record = {'epoch': e + 1, **({'members': members} if members else {})}
    for name, values in figures.items():
      record |= {name: float(values[e].mean()), f'{name}_by_member': values[e].tolist()}
    records.append(record)
  return records


def sweep(epochs: int = 5) -> dict[str, np.ndarray]:
  """2 recipes x 2 seeds (SWEEP's order): recipe 0's seeds far apart, recipe 1's far from it."""
  e = np.arange(1, epochs + 1)[:, None]
  train = np.hstack([2.2 - 0.2 * e, 1.8 - 0.2 * e, 0.6 - 0.05 * e, 0.5 - 0.05 * e])
  accuracy = np.hstack([0.5 + 0.05 * e, 0.4 + 0.05 * e, 0.9 + 0.01 * e, 0.88 + 0.01 * e])
  return {'train_loss': train, 'eval_loss': train + 0.1, 'eval_accuracy': accuracy}


def drawn(records: list[dict], title: str = 'a run') -> tuple[list, np.ndarray]:
  """The three plots (matplotlib Axes) of the curves picture, and its pixels as drawn."""
  figure = pictures.curves_figure(records, title)
  return figure.axes, pictures.render(figure)


def lines(plot, colour) -> list:
  """The plot's lines of `colour`: each a recipe's mean by epoch."""
  return [line for line in plot.get_lines() if to_hex(line.get_color()) == colour]


def bands(plot, colour) -> list:
  """The plot's bands of `colour`: min..max shaded between epochs, or a bar at a lone epoch."""
  return [shade for shade in plot.collections
          if isinstance(shade, (FillBetweenPolyCollection, LineCollection))
          and len(shade.get_paths()) and to_hex(shade.get_edgecolor()[0]
                                                if isinstance(shade, LineCollection)
                                                else shade.get_facecolor()[0]) == colour]


def span_at(band, epoch: float) -> tuple[float, float]:
  """The lowest and highest value a band covers at an epoch."""
  points = np.vstack([path.vertices for path in band.get_paths()])
  at = points[np.isclose(points[:, 0], epoch), 1]
  return float(at.min()), float(at.max())


def pixel(pixels: np.ndarray, plot, epoch: float, value: float) -> tuple[int, int]:
  """The (row, column) of the picture's pixel where a value at an epoch lands."""
  x, y = plot.transData.transform((epoch, value))
  return int(len(pixels) - y), int(x)


def matches(pixels: np.ndarray, colour) -> np.ndarray:
  """[H, W]: whether each pixel is `colour`, within the rounding of Agg's antialiasing."""
  rgb = np.array(matplotlib.colors.to_rgb(colour)) * 255
  return (np.abs(pixels.astype(int) - rgb) <= 2).all(axis=-1)


def inside(pixels: np.ndarray, plot) -> np.ndarray:
  """The part of the picture inside a plot's frame."""
  left, bottom, right, top = np.round(plot.bbox.extents).astype(int)
  return pixels[len(pixels) - top + 1:len(pixels) - bottom - 1, left + 1:right - 1]


def test_the_picture_is_as_large_as_curves_size_says_and_readable_at_about_1200_by_450():
  records = side_by_side(sweep(60), SWEEP)
  plots, pixels = drawn(records)
  width, height = pictures.curves_size(records)
  assert pixels.shape == (height, width, 3) and pixels.dtype == np.uint8
  assert 1100 <= width <= 1250 and 400 <= height <= 500
  assert [plot.get_title() for plot in plots] == ['train loss', 'eval loss', 'eval accuracy (%)']
  for plot in plots:
    assert (inside(pixels, plot) != 255).any(axis=-1).mean() > 0.05  # Lines, not blank.
    assert plot.get_xlabel() == 'epoch'
    low, high = plot.get_xlim()
    ticks = [t for t in plot.get_xticks() if low <= t <= high]  # Whole epochs, none before 1.
    assert len(ticks) >= 3 and all(t == int(t) for t in ticks) and 0 < low < 1 and high >= 60


def test_one_model_draws_one_line_in_each_panel_through_its_points_and_no_band():
  records = single([2.0, 1.0, 0.5], [2.1, 1.2, 0.7], [0.5, 0.8, 0.9])
  plots, pixels = drawn(records, 'one model')
  for plot, name, scale in zip(plots, NAMES, (1, 1, 100)):
    [line] = plot.get_lines()
    assert to_hex(line.get_color()) == PALETTE[0]
    np.testing.assert_allclose(line.get_xydata(),
                               [(r['epoch'], scale * r[name]) for r in records])
    for record in records:
      row, column = pixel(pixels, plot, record['epoch'], scale * record[name])
      assert matches(pixels[row - 1:row + 2, column - 1:column + 2], PALETTE[0]).any(), name
    assert not bands(plot, PALETTE[0])
  assert not any(matches(pixels, colour).any() for colour in PALETTE[1:])
  assert [r.label for r in pictures.curve_recipes(records)] == ['one model']
  assert pictures.curves_figure(records, 'one model').texts[0].get_text() == (
      'one model\n3 epochs; one model')


def test_a_sweep_draws_each_recipe_in_its_colour_over_a_band_from_its_seeds_min_to_max():
  figures = sweep()
  records = side_by_side(figures, SWEEP)
  plots, pixels = drawn(records, 'a sweep')
  for plot, name, scale in zip(plots, NAMES, (1, 1, 100)):
    for colour, seeds in zip(PALETTE, (figures[name][:, :2], figures[name][:, 2:])):
      [line], [band] = lines(plot, colour), bands(plot, colour)
      np.testing.assert_allclose(line.get_ydata(), scale * seeds.mean(axis=1))
      for epoch in range(1, 6):  # Not outside min..max, and all of it.
        np.testing.assert_allclose(span_at(band, epoch), scale * np.sort(seeds[epoch - 1]))
      assert band.zorder < line.zorder  # Under every line, so that no line hides.
    # Drawn where it says: the third epoch's band, between its seeds' values, in its colour.
    top, column = pixel(pixels, plot, 3, scale * figures[name][2, :2].max())
    bottom, _ = pixel(pixels, plot, 3, scale * figures[name][2, :2].min())
    shaded = pixels[top + 4:bottom - 3, column + 6].astype(int)
    assert (shaded[:, 2] > shaded[:, 0] + 20).all(), name  # Blue, over white: all of it.
  recipes = pictures.curve_recipes(records)
  assert [(r.label, r.members) for r in recipes] == [
      ('learning_rate=0.001', [0, 1]), ('learning_rate=0.002', [2, 3])]
  notes = pictures.curve_notes(pictures.curve_values(records), recipes)
  assert notes == ['band: min to max over 2 seeds']
  figure = pictures.curves_figure(records, 'a sweep')
  assert [t.get_text() for t in figure.legends[0].get_texts()] == [r.label for r in recipes]
  assert [t.get_text() for t in figure.texts] == ['a sweep\n5 epochs; 4 models in 2 recipes',
                                                   'band: min to max over 2 seeds']


def line_y(pixels: np.ndarray, plot, epoch: int) -> float:
  """The middle row of the first colour's line at an epoch's column, in the picture."""
  _, column = pixel(pixels, plot, epoch, 0)
  top = len(pixels) - round(plot.bbox.y1)
  return top + np.flatnonzero(matches(pixels[top:top + round(plot.bbox.height), column],
                                      PALETTE[0])).mean()


def test_a_falling_loss_draws_down_and_a_rising_accuracy_up_from_left_to_right():
  records = single([2.0, 1.5, 1.0, 0.6, 0.3, 0.2], [2.0, 1.6, 1.2, 0.9, 0.8, 0.8],
                   [0.3, 0.6, 0.8, 0.9, 0.95, 0.97])
  (train, _, accuracy), pixels = drawn(records, 'falling')
  assert line_y(pixels, train, 6) - line_y(pixels, train, 1) > 0.8 * train.bbox.height
  assert line_y(pixels, accuracy, 1) - line_y(pixels, accuracy, 6) > 0.8 * accuracy.bbox.height
  assert abs(line_y(pixels, train, 1) - pixel(pixels, train, 1, 2.0)[0]) <= 2


def test_a_run_of_one_epoch_draws_a_dot_for_each_recipe_in_each_panel():
  figures = {name: values[:1] for name, values in sweep().items()}
  records = side_by_side(figures, SWEEP)
  plots, pixels = drawn(records, 'one epoch')
  assert pixels.shape[:2] == pictures.curves_size(records)[::-1]
  for plot, name, scale in zip(plots, NAMES, (1, 1, 100)):
    for colour, seeds in zip(PALETTE, (figures[name][0, :2], figures[name][0, 2:])):
      row, column = pixel(pixels, plot, 1, scale * seeds.mean())
      assert matches(pixels[row - 2:row + 3, column - 2:column + 3], colour).sum() >= 9, name
      [band] = bands(plot, colour)  # A bar from the seeds' min to their max.
      np.testing.assert_allclose(span_at(band, 1), scale * np.sort(seeds))
  plots, pixels = drawn(single([0.4], [0.5], [0.9]), 'one epoch')
  assert matches(pixels, PALETTE[0]).sum() >= 3 * 9
  assert [[int(t) for t in plot.get_xticks() if 0 < t < 2] for plot in plots] == [[1]] * 3


def test_records_without_each_models_figures_draw_their_means_instead():
  figures = sweep()
  records = side_by_side(figures, SWEEP)
  for record in records:  # As an older metrics.jsonl: no eval accuracy of each model.
    del record['eval_accuracy_by_member']
  plots, pixels = drawn(records, 'older')
  for plot in plots[:2]:
    assert bands(plot, PALETTE[1])
  [grey] = plots[2].get_lines()  # All recipes' mean: no one recipe's colour.
  assert to_hex(grey.get_color()) == pictures.GREY and not bands(plots[2], pictures.GREY)
  np.testing.assert_allclose(grey.get_ydata(), 100 * figures['eval_accuracy'].mean(axis=1))
  assert matches(inside(pixels, plots[2]), pictures.GREY).any()
  assert not any(matches(inside(pixels, plots[2]), colour).any() for colour in PALETTE[:2])
  notes = pictures.curve_notes(pictures.curve_values(records), pictures.curve_recipes(records))
  assert notes[1] == "grey: the mean of all 4 models, where records lack each model's"
  assert pictures.curves_figure(records, 'older').texts[-1].get_text() == ';  '.join(notes)
  seeds = side_by_side(figures)  # Seeds of one recipe: the mean in its colour, no band.
  for record in seeds:
    del record['eval_accuracy_by_member']
  plots, _ = drawn(seeds, 'older')
  assert lines(plots[2], PALETTE[0]) and not bands(plots[2], PALETTE[0])
  assert bands(plots[0], PALETTE[0])


def test_a_diverged_model_ends_its_recipes_line_where_its_figures_stop_being_numbers():
  figures = sweep()
  figures['train_loss'][3:, 1] = np.inf
  figures['train_loss'][4, 1] = np.nan
  records = side_by_side(figures, SWEEP)
  (plot, _, _), pixels = drawn(records, 'diverged')
  low, high = plot.get_ylim()
  assert low < 0.25 and high < 2.2  # The range from the numbers alone.
  [line], [band] = lines(plot, PALETTE[0]), bands(plot, PALETTE[0])
  assert np.isfinite(line.get_ydata()[:3]).all() and not np.isfinite(line.get_ydata()[3:]).any()
  assert max(path.vertices[:, 0].max() for path in band.get_paths()) == 3
  assert np.isfinite(line_y(pixels, plot, 2))
  _, column = pixel(pixels, plot, 5, 0)
  assert not matches(inside(pixels, plot), PALETTE[0])[:, column - round(plot.bbox.x0) - 1].any()


def test_recipes_are_named_by_their_values_other_than_seed_and_colours_cycle():
  assert [r.label for r in pictures.curve_recipes(side_by_side(sweep()))] == ['4 seeds']
  members = [{'learning_rate': 0.001 * (k + 1), 'batch_size': 64, 'seed': 0} for k in range(9)]
  figures = {name: np.ones((2, 9)) for name in NAMES}
  recipes = pictures.curve_recipes(side_by_side(figures, members))
  assert recipes[1].label == 'learning_rate=0.002, batch_size=64'
  assert [r.colour for r in recipes] == [*PALETTE, PALETTE[0]]
  records = side_by_side(figures, members)
  assert pictures.curve_notes(pictures.curve_values(records), recipes) == []
  figure = pictures.curves_figure(records, 'nine')  # The legend: rows of as many as fit across.
  width, height = pictures.curves_size(records)
  pictures.render(figure)
  entries = figure.legends[0].get_texts()
  assert [t.get_text() for t in entries] == [r.label for r in recipes]
  boxes = [t.get_window_extent() for t in entries]
  rows = len({round(box.y0) for box in boxes})
  assert 1 < rows < len(recipes) and max(box.x1 for box in boxes) < width
  assert height == pictures.PLOTS_HEIGHT + rows * pictures.LEGEND_ROW + 2 * pictures.PAD
  assert min(box.y0 for box in boxes) > pictures.PAD  # All inside the picture.


def test_the_same_records_draw_the_same_pixels_whatever_a_users_matplotlib_settings():
  records = side_by_side(sweep(), SWEEP)
  before = pictures.draw_curves(records, 'a sweep')
  with matplotlib.rc_context({'lines.linewidth': 5, 'font.size': 20, 'axes.grid': False,
                              'figure.facecolor': 'black', 'font.family': 'serif'}):
    assert np.array_equal(pictures.draw_curves(records, 'a sweep'), before)


def test_a_run_imports_matplotlib_only_once_it_draws_a_picture():
  imported = subprocess.run(
      [sys.executable, '-c', 'import sys; import train, trainer.loop, trainer.evaluation; '
       'print("matplotlib" in sys.modules)'],
      cwd=ROOT, capture_output=True, text=True, check=True).stdout
  assert imported.split() == ['False']
