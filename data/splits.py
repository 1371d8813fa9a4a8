"""TFDS split syntax (`test[:8000]`, `train[10%:]`) parsed once, so both sources slice alike."""

# Not TFDS's parser (from_spec: 0.1-0.3 s import, no TensorFlow): reads [10%:-100] as [10%:-100%].

import dataclasses
import re

from errors import UserError

# Example counts of MNIST's canonical splits (the same for the TFDS and IDX sources).
SPLIT_SIZES = {'train': 60_000, 'test': 10_000}

_SPLIT_RE = re.compile(r'^\s*(\w+)\s*(?:\[\s*([^:\]]*)\s*:\s*([^\]]*)\s*\])?\s*$')


@dataclasses.dataclass(frozen=True)
class Split:
  """A named split and the half-open example range [start, stop) taken from it."""
  name: str
  start: int
  stop: int

  @property
  def size(self) -> int:
    return self.stop - self.start


def _bound(text: str, total: int, default: int, spec: str) -> int:
  text = text.strip()
  if not text:
    return default
  match = re.fullmatch(r'(-?\d+)(%?)', text)
  if not match:
    raise UserError(f'split {spec!r}: bound {text!r} is not an integer or a percentage; '
                    'write it like test[:8000] or train[10%:]')
  value = int(match.group(1))
  if match.group(2):
    # TFDS rounds percentage bounds to the nearest example.
    value = round(total * value / 100)
  if value < 0:
    value += total
  return min(max(value, 0), total)


def parse_split(spec: str) -> Split:
  """Resolves a split string to absolute example indices, or names the fix."""
  match = _SPLIT_RE.match(spec or '')
  if not match:
    raise UserError(f'split {spec!r} is not TFDS split syntax; write it like test, test[:8000] '
                    'or train[10%:]')
  name, start, stop = match.group(1), match.group(2), match.group(3)
  if name not in SPLIT_SIZES:
    raise UserError(f'split {spec!r}: MNIST has no split {name!r}; use one of '
                    f'{", ".join(sorted(SPLIT_SIZES))}')
  total = SPLIT_SIZES[name]
  if start is None:
    return Split(name, 0, total)
  first = _bound(start, total, 0, spec)
  last = _bound(stop, total, total, spec)
  if last <= first:
    raise UserError(f'split {spec!r} selects no examples; pick a range with start < stop')
  return Split(name, first, last)
