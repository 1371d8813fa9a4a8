"""Where the trainer's epoch spends its time: a jax.profiler trace of compiled epochs, op by op.

  python -m benchmarks.profile_epoch [--batch_size=128] [--dropout_rate=0.2] [--epochs=3] [--top=15]
      [--parallel=jit|mesh] [--data=idx|synthetic] [--ablate [--repeats=11]]
      [--num_models=3 [--max_shift=1]]

Traces the trainer's epoch (the run set-up's compiled program the throughput benchmark times), adds
up the time of each XLA op over the traced epochs, and groups the ops by what they do, read from the
op names of the compiled program: the MLP's matmuls, the dropout (random bits and masks), the
optimizer update (`jax.named_scope('optimizer')` in mlp/steps.py), the rest of the model, and the
loss, metrics, batch gather and loop bookkeeping. The trace is kept with --trace_dir for
TensorBoard's profile plugin or Perfetto.

Op times overlap when XLA runs ops side by side on several threads, and they leave out what an op
does to the next one's caches. --ablate then also times the epoch's wall clock as configured,
without dropout, with plain SGD in place of the optimizer, with neither, and the MLP's matmuls
alone (as benchmarks.throughput does), interleaved: what each part adds to an epoch as it runs.
--num_models profiles the epoch of that many models side by side (the groups' times against one
model's show what vmap costs), without --ablate.
"""

import collections
import functools
import glob
import re
import statistics
import tempfile
from collections.abc import Callable
from typing import NamedTuple

from absl import flags

import jax
import ml_collections

from data.mnist import Examples
from benchmarks import workload
from errors import UserError
from mlp import batches
from trainer.host.boundary import Host

_EPOCHS = flags.DEFINE_integer('epochs', 3, 'Epochs to trace (after one untraced warm-up).')
_TOP = flags.DEFINE_integer('top', 15, 'Ops to list individually.')
_ABLATE = flags.DEFINE_bool('ablate', False, 'After the trace: wall time per epoch with parts of '
                             'the step removed, interleaved.')
_REPEATS = flags.DEFINE_integer('repeats', 11, 'With --ablate: timed epochs of each variant.')
_NUM_MODELS = flags.DEFINE_integer('num_models', 1, 'Models side by side in the profiled epoch.')
_MAX_SHIFT = flags.DEFINE_integer('max_shift', 0,
                                  "The epoch's pixel shifts (configs/default.py: 1).")
_TRACE_DIR = flags.DEFINE_string('trace_dir', '',
                                 'Keep the trace here (default: a temporary folder).')

# The variants --ablate times: config overrides that remove a part of the step.
ABLATIONS = {'as configured': {}, 'dropout off': {'model.dropout_rate': 0.0},
             'SGD for the optimizer': {'optimizer': 'sgd'},
             'dropout off, SGD': {'model.dropout_rate': 0.0, 'optimizer': 'sgd'}}
MATMULS_ALONE = "the MLP's matmuls alone"  # The row every variant is compared with.

# Ops that only hold other ops: their children are counted instead.
CONTAINERS = ('while', 'conditional', 'call')


def compiled_ops(trainer: workload.TrainerRun) -> dict[str, tuple[str, str]]:
  """Instruction name -> (opcode, op_name) of the trainer's compiled epoch, the program it runs."""
  return _named_ops(trainer.compiled_text())


def _named_ops(hlo_text: str) -> dict[str, tuple[str, str]]:
  """Parses instructions per computation. Copies and other ops XLA adds carry no op_name: they
  take their computation's, when all its named ops fall in one group (a loop inside dropout)."""
  computations: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
  current = ''
  for line in hlo_text.splitlines():
    if line and not line.startswith(' ') and line.rstrip().endswith('{'):
      current = line.split(' ')[0]
      continue
    match = re.match(r'^\s*(?:ROOT )?%?([\w.\-]+) = \S+ ([a-z][\w\-]*)\(', line)
    if not match and ' = (' in line:  # A tuple-shaped result: (s32[], f32[...]) while(...)
      match = re.match(r'^\s*(?:ROOT )?%?([\w.\-]+) = \(.*?\) ([a-z][\w\-]*)\(', line)
    if match:
      found = re.search(r'op_name="([^"]*)"', line)
      computations[current].append((match.group(1), match.group(2),
                                    found.group(1) if found else ''))
  ops = {}
  for instructions in computations.values():
    named = [op_name for _, opcode, op_name in instructions if op_name]
    shared = named[0] if named and len({category('', n) for n in named}) == 1 else ''
    for name, opcode, op_name in instructions:
      ops[name] = (opcode, op_name or shared)
  return ops


def _in_scope(scope: str, op_name: str) -> bool:
  """Whether JAX named the op inside `jax.named_scope(scope)`: 'a/scope/b', 'vmap(scope)/b'."""
  return re.search(rf'(^|[/(]){scope}[/)]', op_name) is not None


def category(opcode: str, op_name: str) -> str:
  """What an op is for, from its opcode and the name JAX gave it (the model's named scopes)."""
  if _in_scope('optimizer', op_name):
    return 'optimizer update'
  if _in_scope('dropout', op_name):
    return 'dropout: random bits and masks'
  if opcode == 'dot' or (_in_scope('dense', op_name)
                         and op_name.endswith(('/dot_general', '/transpose'))):
    return 'matmuls (forward and backward)'
  if _in_scope('mlp', op_name):
    return 'rest of the model: bias, ReLU, their gradients'
  return 'loss, metrics, gather, loop bookkeeping'


def trace_epochs(trainer: workload.TrainerRun, epochs: int, trace_dir: str) -> list[float]:
  """Seconds of each traced epoch; the trace lands in trace_dir."""
  trainer.epoch(1)  # Warm-up, untraced.
  seconds = []
  with jax.profiler.trace(trace_dir):
    for epoch in range(2, epochs + 2):
      seconds.append(trainer.epoch(epoch)[0])
  return seconds


def op_times(trace_dir: str, ops: dict[str, tuple[str, str]]) -> collections.Counter:
  """Total nanoseconds per compiled op over the trace, containers left out; '?' for XLA events
  that name no instruction of the program."""
  paths = glob.glob(f'{trace_dir}/**/*.xplane.pb', recursive=True)
  if not paths:
    raise UserError(f'the profiler wrote no trace under {trace_dir}; check that folder is writable')
  totals: collections.Counter[str] = collections.Counter()
  for plane in jax.profiler.ProfileData.from_file(paths[0]).planes:
    for line in plane.lines:
      for event in line.events:
        if event.name in ops and ops[event.name][0] not in CONTAINERS:
          totals[event.name] += event.duration_ns
        elif re.fullmatch(r'[a-z][\w\-]*\.\d+', event.name) and event.name not in ops:
          totals['?'] += event.duration_ns
  return totals


class Trace(NamedTuple):
  """What the traced epochs measured."""
  totals: collections.Counter  # Nanoseconds per op, from op_times.
  ops: dict[str, tuple[str, str]]  # The program's ops, from compiled_ops.
  seconds: list[float]  # Each traced epoch's.
  untraced: float  # The fastest untraced epoch's seconds.


def report(trace: Trace, config: ml_collections.ConfigDict, examples: Examples, description: str,
           top: int) -> str:
  """Op time per epoch by group, then the costliest ops."""
  totals, ops, seconds, untraced = trace
  epochs = len(seconds)
  per_epoch_ms = lambda ns: ns / epochs / 1e6
  op_total = sum(totals.values())
  groups: collections.Counter[str] = collections.Counter()
  for name, ns in totals.items():
    groups[category(*ops[name]) if name in ops else 'not matched to the program'] += ns
  lines = [
      f'{config.optimizer}, dropout {config.model.dropout_rate}, batch {config.batch_size}, '
      f'shifts {config.data.max_shift}, {config.num_models} model(s); {description}; '
      f'{jax.devices()[0].device_kind}',
      f'epoch: {untraced * 1e3:.1f} ms untraced, {sum(seconds) / epochs * 1e3:.1f} ms traced; '
      f'XLA op time {per_epoch_ms(op_total):.1f} ms per epoch (summed over threads)',
      '', f'{"ms/epoch":>9s} {"share":>6s}  group']
  for group, ns in groups.most_common():
    lines.append(f'{per_epoch_ms(ns):9.1f} {ns / op_total:6.1%}  {group}')
  matmul_ns = groups['matmuls (forward and backward)']
  images = batches.whole_batches(len(examples), config.batch_size) * config.batch_size
  flops = (workload.matmul_flops_per_image(tuple(config.model.hidden_sizes)) * images * epochs
           * config.num_models)
  if matmul_ns:  # Zero where the backend's trace names kernels, not the program's ops (GPU).
    lines.append(f'matmuls run at {flops / matmul_ns:.1f} GFLOP/s while they run '
                 f'({flops / epochs / 1e9:.1f} GFLOP per epoch)')
  lines += ['', f'{"ms/epoch":>9s} {"share":>6s}  {"op":26s} what (op_name)']
  for name, ns in totals.most_common(top):
    opcode, op_name = ops.get(name, ('?', ''))
    where = op_name.replace('jit(train_epoch)/while/body/closed_call/', '') or opcode
    lines.append(f'{per_epoch_ms(ns):9.1f} {ns / op_total:6.1%}  {name:26s} {where[-70:]}')
  return '\n'.join(lines)


def ablate(trainer: workload.TrainerRun, config: ml_collections.ConfigDict, examples: Examples,
           repeats: int) -> str:
  """Each part's cost as wall time, which op times miss: they overlap across threads and leave out
  what an op does to the next one's caches. A table of median epochs, ABLATIONS then the matmuls."""
  trainers = {}  # `trainer`, of the config as it is, serves the first row.
  for name, overrides in ABLATIONS.items():
    variant = config.copy_and_resolve_references()
    variant.update_from_flattened_dict(overrides)
    trainers[name] = workload.TrainerRun(variant, examples) if overrides else trainer
  epochs: dict[str, Callable[[int], float]] = {
      name: functools.partial(lambda run, epoch: run.epoch(epoch)[0], run)
      for name, run in trainers.items()}
  epochs[MATMULS_ALONE] = workload.MatmulsAloneRun(config, examples,
                                                   trainers['as configured']).epoch
  times: dict[str, list[float]] = collections.defaultdict(list)
  for epoch in range(1, repeats + 1):  # Interleaved: load from other processes hits all alike.
    for name, run in epochs.items():
      times[name].append(run(epoch))
  medians = {name: statistics.median(seconds) for name, seconds in times.items()}
  lines = [f'{config.optimizer}, dropout {config.model.dropout_rate}, batch {config.batch_size}; '
           f'median of {repeats} interleaved epochs each', '',
           f'{"epoch":>9s} {"matmuls alone / epoch":>22s}  variant']
  for name, seconds in medians.items():
    lines.append(f'{seconds * 1e3:6.1f} ms {medians[MATMULS_ALONE] / seconds:22.1%}  {name}')
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  del argv
  if _EPOCHS.value < 1:
    raise UserError(f'--epochs={_EPOCHS.value}: trace at least one epoch')
  if _ABLATE.value and _REPEATS.value < 1:
    raise UserError(f'--repeats={_REPEATS.value}: time at least one epoch of each')
  if _NUM_MODELS.value < 1 or (_ABLATE.value and _NUM_MODELS.value > 1) or _MAX_SHIFT.value < 0:
    raise UserError(f'--num_models={_NUM_MODELS.value} --max_shift={_MAX_SHIFT.value}: profile '
                    '1 model or more, with shifts of 0 or more; --ablate takes one model')
  config = workload.benchmark_config()
  config.num_models, config.data.max_shift = _NUM_MODELS.value, _MAX_SHIFT.value
  examples, description = workload.load_images()
  trainer = workload.TrainerRun(config, examples)
  ops = compiled_ops(trainer)
  untraced = min(trainer.epoch(epoch)[0] for epoch in range(1, 4))
  with tempfile.TemporaryDirectory() as scratch:
    trace_dir = _TRACE_DIR.value or scratch
    seconds = trace_epochs(trainer, _EPOCHS.value, trace_dir)
    totals = op_times(trace_dir, ops)
  print(report(Trace(totals, ops, seconds, untraced), config, examples, description, _TOP.value),
        flush=True)
  if _ABLATE.value:
    print('', ablate(trainer, config, examples, _REPEATS.value), sep='\n', flush=True)


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
