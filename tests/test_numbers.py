"""The numbers a config produces: identical on one machine, near the recorded ones on any CPU.

XLA:CPU compiles for the processor it runs on, so another CPU sums floats in other orders and a run
drifts from the recorded one as training goes on, the way a change of seed does. The recorded run
is therefore checked within tolerances (docs/reproducibility.md), and determinism bit for bit
between two runs on the machine at hand.
"""

import json

import jax
import numpy as np
import pytest

from tests.conftest import ROOT, make_config, override_flags, read_metrics, run_train
from tests.conftest import without_timings
from trainer import loop

pytestmark = pytest.mark.numeric

GOLDEN = ROOT / 'tests' / 'golden' / 'default_seed0_train8000.jsonl'
EVAL_IMAGES = 2000  # test[:2000], the eval split of override_flags().
# Epoch 1 ends before the orders of float sums have compounded: close on every CPU.
FIRST_EPOCH_LOSS_REL, FIRST_EPOCH_ACCURACY = 0.01, 0.005
# The last epoch: within what a change of CPU moves it (about what a change of seed moves it).
LAST_EVAL_ACCURACY, LAST_TRAIN_LOSS_REL, LAST_EVAL_LOSS_REL = 0.005, 0.10, 0.15


def assert_near_recorded(records: list[dict], recorded: list[dict]) -> None:
  """Every epoch present; epoch 1 and the last epoch within the tolerances above."""
  assert [r['epoch'] for r in records] == [r['epoch'] for r in recorded]
  first, first_recorded = records[0], recorded[0]
  for name in ('train_loss', 'eval_loss'):
    assert first[name] == pytest.approx(first_recorded[name], rel=FIRST_EPOCH_LOSS_REL), name
  for name in ('train_accuracy', 'eval_accuracy'):
    assert abs(first[name] - first_recorded[name]) <= FIRST_EPOCH_ACCURACY, name
  last, last_recorded = records[-1], recorded[-1]
  assert abs(last['eval_accuracy'] - last_recorded['eval_accuracy']) <= LAST_EVAL_ACCURACY
  assert last['train_loss'] == pytest.approx(last_recorded['train_loss'], rel=LAST_TRAIN_LOSS_REL)
  assert last['eval_loss'] == pytest.approx(last_recorded['eval_loss'], rel=LAST_EVAL_LOSS_REL)


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != 'cpu',
                    reason='the recorded numbers are XLA:CPU\'s; an accelerator sums in other orders')
def test_the_default_config_stays_near_its_recorded_numbers(tmp_path, mnist_dir):
  """configs/default.py, seed 0, 30 epochs on train[:8000], scored on test[:2000]."""
  out = run_train('--config=configs/default.py', f'--workdir={tmp_path}', *override_flags())
  assert out.returncode == 0, out.stderr
  recorded = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
  assert_near_recorded(read_metrics(tmp_path), recorded)


def test_the_tolerances_catch_a_run_that_learned_less():
  recorded = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
  assert_near_recorded(recorded, recorded)
  worse = [dict(r) for r in recorded]
  worse[-1]['eval_accuracy'] -= 11 / EVAL_IMAGES  # 11 more of 2,000 test images wrong: 0.55 points.
  with pytest.raises(AssertionError):
    assert_near_recorded(worse, recorded)


def _params(workdir) -> list[np.ndarray]:
  """The final checkpoint's parameters and optimizer state, as host arrays."""
  from tests.test_checkpoint import restore  # pylint: disable=g-import-not-at-top
  config = make_config(num_epochs=2, data__train_split='train[:2000]')
  restored = restore(workdir, config)
  return [np.asarray(x) for x in jax.tree.leaves((restored.state.params, restored.state.opt_state))]


def test_the_same_config_and_seed_give_identical_numbers_twice(tmp_path, mnist_dir):
  """Two runs on this machine: every figure and every parameter bit for bit."""
  config = make_config(num_epochs=2, data__train_split='train[:2000]')
  for name in ('first', 'second'):
    loop.train_and_evaluate(config, str(tmp_path / name))
  first, second = (without_timings(read_metrics(tmp_path / n)) for n in ('first', 'second'))
  assert len(first) == 2 and first == second
  for a, b in zip(_params(tmp_path / 'first'), _params(tmp_path / 'second'), strict=True):
    assert a.dtype == b.dtype and np.array_equal(a, b)
