"""The learning curves picture (curves.png) of synthetic records: where its lines and bands land."""

import numpy as np

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


def matches(pixels: np.ndarray, colour) -> np.ndarray:
  """[H, W]: whether each pixel is `colour`, within Pillow's rounding of a blend."""
  return (np.abs(pixels.astype(int) - np.array(colour)) <= 2).all(axis=-1)


def band(pixels: np.ndarray, colour) -> np.ndarray:
  """[H, W]: whether each pixel is a band of `colour`, over white or over a grid line."""
  over = lambda under: np.array(under) + pictures.BAND_ALPHA / 255 * (np.array(colour) - under)
  return matches(pixels, over(255)) | matches(pixels, over(np.array(pictures.GRID)))


def within(mask: np.ndarray, box) -> np.ndarray:
  """The part of a [H, W] mask inside a plot's frame."""
  left, top, right, bottom = box
  return mask[top:bottom + 1, left:right + 1]


def rows_at(mask: np.ndarray, panel: pictures.Panel, x: int) -> np.ndarray:
  """The y of each True pixel of a mask in column x, inside the panel's frame."""
  _, top, _, bottom = panel.box
  return top + np.flatnonzero(mask[top:bottom + 1, x])


def test_the_picture_is_as_large_as_curves_size_says_and_readable_at_about_1200_by_450():
  records = side_by_side(sweep(60), SWEEP)
  pixels = pictures.draw_curves(records, 'a run')
  width, height = pictures.curves_size(records)
  assert pixels.shape == (height, width, 3) and pixels.dtype == np.uint8
  assert 1100 <= width <= 1250 and 400 <= height <= 500
  for panel in pictures.curve_panels(records):
    assert (within(pixels, panel.box) != 255).any(axis=-1).mean() > 0.05  # Lines, not blank.


def test_one_model_draws_one_line_in_each_panel_through_its_points_and_no_band():
  records = single([2.0, 1.0, 0.5], [2.1, 1.2, 0.7], [0.5, 0.8, 0.9])
  pixels = pictures.draw_curves(records, 'one model')
  line = matches(pixels, PALETTE[0])
  for panel, name, scale in zip(pictures.curve_panels(records), NAMES, (1, 1, 100)):
    for record in records:
      x, y = panel.point(record['epoch'], scale * record[name])
      assert line[y - 1:y + 2, x - 1:x + 2].any(), (name, record)
  assert not band(pixels, PALETTE[0]).any()
  assert not any(matches(pixels, colour).any() for colour in PALETTE[1:])
  assert [r.label for r in pictures.curve_recipes(records)] == ['one model']


def test_a_sweep_draws_each_recipe_in_its_colour_over_a_band_from_its_seeds_min_to_max():
  figures = sweep()
  records = side_by_side(figures, SWEEP)
  pixels = pictures.draw_curves(records, 'a sweep')
  panels = pictures.curve_panels(records)
  for panel in panels:
    for colour in PALETTE[:2]:
      assert within(matches(pixels, colour), panel.box).any()
      assert within(band(pixels, colour), panel.box).any()
  for panel, name, scale in zip(panels, NAMES, (1, 1, 100)):
    (x, y0), (_, y1) = (panel.point(3, scale * figures[name][2, k]) for k in (0, 1))
    top, bottom = sorted((y0, y1))
    shaded = rows_at(band(pixels, PALETTE[0]), panel, x)
    assert shaded.min() >= top - 2 and shaded.max() <= bottom + 2, name  # Not outside min..max,
    assert len(shaded) >= bottom - top - 8, name  # and all of it but the mean's line and dot.
  recipes = pictures.curve_recipes(records)
  assert [(r.label, r.members) for r in recipes] == [
      ('learning_rate=0.001', [0, 1]), ('learning_rate=0.002', [2, 3])]
  assert pictures.curve_notes(panels, recipes) == ['band: min to max over 2 seeds']


def line_y(pixels: np.ndarray, panel: pictures.Panel, epoch: int) -> float:
  """The middle y of the first colour's line at an epoch's column."""
  return rows_at(matches(pixels, PALETTE[0]), panel, panel.point(epoch, 0)[0]).mean()


def test_a_falling_loss_draws_down_and_a_rising_accuracy_up_from_left_to_right():
  records = single([2.0, 1.5, 1.0, 0.6, 0.3, 0.2], [2.0, 1.6, 1.2, 0.9, 0.8, 0.8],
                   [0.3, 0.6, 0.8, 0.9, 0.95, 0.97])
  pixels = pictures.draw_curves(records, 'falling')
  train, _, accuracy = pictures.curve_panels(records)
  assert line_y(pixels, train, 6) - line_y(pixels, train, 1) > 0.8 * pictures.PLOT_H
  assert line_y(pixels, accuracy, 1) - line_y(pixels, accuracy, 6) > 0.8 * pictures.PLOT_H
  assert abs(line_y(pixels, train, 1) - train.point(1, 2.0)[1]) <= 2


def test_a_run_of_one_epoch_draws_a_dot_for_each_recipe_in_each_panel():
  figures = {name: values[:1] for name, values in sweep().items()}
  records = side_by_side(figures, SWEEP)
  pixels = pictures.draw_curves(records, 'one epoch')
  assert pixels.shape[:2] == pictures.curves_size(records)[::-1]
  for panel, name, scale in zip(pictures.curve_panels(records), NAMES, (1, 1, 100)):
    for colour, seeds in zip(PALETTE, (figures[name][0, :2], figures[name][0, 2:])):
      x, y = panel.point(1, scale * seeds.mean())
      assert matches(pixels[y - 2:y + 3, x - 2:x + 3], colour).sum() >= 9, (name, colour)
  one = single([0.4], [0.5], [0.9])
  assert matches(pictures.draw_curves(one, 'one epoch'), PALETTE[0]).sum() >= 3 * 9


def test_records_without_each_models_figures_draw_their_means_instead():
  figures = sweep()
  records = side_by_side(figures, SWEEP)
  for record in records:  # As an older metrics.jsonl: no eval accuracy of each model.
    del record['eval_accuracy_by_member']
  pixels = pictures.draw_curves(records, 'older')
  panels = pictures.curve_panels(records)
  for panel in panels[:2]:
    assert within(band(pixels, PALETTE[1]), panel.box).any()
  accuracy = within(pixels, panels[2].box)
  assert matches(accuracy, pictures.GREY).any()  # All recipes' mean: no one recipe's colour.
  assert not any(matches(accuracy, colour).any() for colour in PALETTE[:2])
  assert pictures.curve_notes(panels, pictures.curve_recipes(records))[1].startswith('grey:')
  seeds = side_by_side(figures)  # Seeds of one recipe: the mean in its colour, no band.
  for record in seeds:
    del record['eval_accuracy_by_member']
  pixels, panels = pictures.draw_curves(seeds, 'older'), pictures.curve_panels(seeds)
  assert within(matches(pixels, PALETTE[0]), panels[2].box).any()
  assert not within(band(pixels, PALETTE[0]), panels[2].box).any()
  assert within(band(pixels, PALETTE[0]), panels[0].box).any()


def test_a_diverged_model_ends_its_recipes_line_where_its_figures_stop_being_numbers():
  figures = sweep()
  figures['train_loss'][3:, 1] = np.nan
  records = side_by_side(figures, SWEEP)
  pixels = pictures.draw_curves(records, 'diverged')
  panel = pictures.curve_panels(records)[0]
  assert panel.low < 0.25 and panel.high < 2.2  # The range from the numbers alone.
  line = matches(pixels, PALETTE[0])
  assert len(rows_at(line, panel, panel.point(2, 0)[0])) > 0
  assert len(rows_at(line, panel, panel.point(5, 0)[0])) == 0


def test_recipes_are_named_by_their_values_other_than_seed_and_colours_cycle():
  assert [r.label for r in pictures.curve_recipes(side_by_side(sweep()))] == ['4 seeds']
  members = [{'learning_rate': 0.001 * (k + 1), 'batch_size': 64, 'seed': 0} for k in range(9)]
  figures = {name: np.ones((2, 9)) for name in NAMES}
  recipes = pictures.curve_recipes(side_by_side(figures, members))
  assert recipes[1].label == 'learning_rate=0.002, batch_size=64'
  assert [r.colour for r in recipes] == [*PALETTE, PALETTE[0]]
  assert pictures.curve_notes(pictures.curve_panels(side_by_side(figures, members)), recipes) == []
