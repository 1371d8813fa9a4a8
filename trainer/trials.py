"""A study's trials as a user reads them: a table of each trial's state, values, value and epochs
trained, best first, and the best trial with the command that trains it alone. Reads the trials'
public fields (number, state, params, value, intermediate_values) and imports no Optuna."""

from collections.abc import Sequence
from typing import Any

from trainer.members import command_of, label

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


def best_line(trial: Any, member: dict[str, Any], command: str, workdir: str) -> str:
  """The best trial, its value and values, and the command (the search's, as the shell took it)
  that trains `member` (its values and seed) alone in `workdir`."""
  return (f'best: trial {trial.number}, eval accuracy {100 * trial.value:.2f}%, '
          f'{label(trial.params)}; trains alone with: {command_of(member, command, workdir)}')
