"""A study's trials as a user reads them: a table of each trial's state, values, value and epochs
trained, best first, their curves, and the best trial with its run directory and the command that
trains it alone. Reads the trials' public fields (number, state, params, value,
intermediate_values, user_attrs) and imports no Optuna."""

from collections.abc import Sequence
from typing import Any

from trainer.members import command_of, label
from trainer.pictures import TrialCurve

# The order of states in the table (the finished ones first, those that ended early after them),
# and each one's word in the table's count.
STATE_WORDS = {'COMPLETE': 'complete', 'PRUNED': 'pruned', 'RUNNING': 'running',
               'WAITING': 'waiting', 'FAIL': 'failed'}
STATE_ORDER = tuple(STATE_WORDS)


def _value(trial: Any) -> float | None:
  """The trial's value: its told one, or its last reported epoch's where it was not told one."""
  if trial.value is not None:
    return trial.value
  reported = trial.intermediate_values
  return reported[max(reported)] if reported else None


def _rank(trial: Any) -> tuple[int, float, int]:
  order = STATE_ORDER.index(trial.state.name) if trial.state.name in STATE_ORDER else len(
      STATE_ORDER)
  value = _value(trial)
  return order, -value if value is not None else 0.0, trial.number


def table(trials: Sequence[Any], num_epochs: int) -> list[str]:
  """A line per trial, best first (complete, then pruned, by value): its number, state, value (the
  mean eval accuracy of its members at its last epoch), epochs trained and values."""
  counts = {state: sum(t.state.name == state for t in trials) for state in STATE_ORDER}
  said = ', '.join(f'{count} {STATE_WORDS[state]}' for state, count in counts.items() if count)
  lines = [f'trials by eval accuracy ({said}):', '  trial  state     value    epochs  values']
  for trial in sorted(trials, key=_rank):
    value = _value(trial)
    shown = f'{100 * value:6.2f}%' if value is not None else '     - '
    lines.append(f'  {trial.number:>5}  {trial.state.name:<8}  {shown}  '
                 f'{len(trial.intermediate_values):>2}/{num_epochs:<4} {label(trial.params)}')
  return lines


def curves(trials: Sequence[Any]) -> list[TrialCurve]:
  """The eval accuracy by epoch of each trial that ended (complete, or pruned), by number."""
  ended = sorted((t for t in trials if t.state.name in ('COMPLETE', 'PRUNED')),
                 key=lambda t: t.number)
  return [TrialCurve(t.number, [t.intermediate_values[e] for e in sorted(t.intermediate_values)],
                     t.state.name == 'PRUNED') for t in ended]


def curves_title(drawn: list[TrialCurve], split: str, best: Any | None) -> str:
  """The title of the trials' curves: what they show, how many ended which way, the best."""
  pruned = sum(curve.pruned for curve in drawn)
  said = f'; best: trial {best.number}, {100 * best.value:.2f}%' if best is not None else ''
  return (f"the trials' eval accuracy by epoch, on {split}\n{len(drawn)} trials: "
          f'{len(drawn) - pruned} complete, {pruned} pruned (a cross where the pruner stopped one)'
          f'{said}')


def best_line(trial: Any, member: dict[str, Any], command: str, workdir: str) -> str:
  """The best trial, its value and values, its run directory `workdir` (which predict.py and
  export.py read as any run's), and the command (the search's, as the shell took it) that trains
  `member` (its values and seed) alone there: it resumes the trial's checkpoint."""
  return (f'best: trial {trial.number}, eval accuracy {100 * trial.value:.2f}%, '
          f'{label(trial.params)}; saved in {workdir} (predict.py and export.py take '
          f'--workdir={workdir}); trains alone with: {command_of(member, command, workdir)}')
