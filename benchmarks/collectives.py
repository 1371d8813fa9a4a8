"""The collectives of a compiled program, read from its HLO text: each one's kind and result bytes,
per step (in a while loop's body: a scan over steps) and per epoch (anywhere else). No flags: tests
and benchmarks both read programs with it."""

import re

KINDS = ('all-reduce', 'all-gather', 'reduce-scatter', 'collective-permute', 'all-to-all',
         'collective-broadcast')
# `%name = SHAPE KIND(` (an async pair counted once, at its start), then its metadata's op_name.
_COLLECTIVE = re.compile(r'= (?P<shape>.+?) (?P<kind>' + '|'.join(KINDS) +
                         r')(?:-start)?\(.*?op_name="(?P<op>[^"]*)"')
_ARRAY = re.compile(r'\b(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]')
BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'bf16': 2, 'f16': 2, 's16': 2, 'u16': 2, 'f32': 4, 's32': 4,
         'u32': 4, 'f64': 8, 's64': 8, 'u64': 8}


def shape_bytes(shape: str) -> int:
  """The bytes of an HLO result shape: an array's (`f32[8,64]{1,0}`), or a tuple's arrays'."""
  total = 0
  for array in _ARRAY.finditer(shape):
    count = 1
    for dim in filter(None, array['dims'].split(',')):
      count *= int(dim)
    total += count * BYTES[array['dtype']]
  return total


def collectives(hlo: str) -> dict[str, dict]:
  """A compiled program's collectives, per step (in a while loop's body) and per epoch: count,
  bytes, and each one's kind, result shape and bytes."""
  found: dict[str, dict] = {where: {'count': 0, 'bytes': 0, 'ops': []}
                            for where in ('per_step', 'per_epoch')}
  for line in hlo.splitlines():
    match = _COLLECTIVE.search(line)
    if match is None:
      continue
    where = found['per_step' if '/while/body/' in match['op'] else 'per_epoch']
    size = shape_bytes(match['shape'])
    where['count'] += 1
    where['bytes'] += size
    where['ops'].append({'kind': match['kind'], 'shape': match['shape'], 'bytes': size})
  return found
