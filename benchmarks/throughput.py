"""Training throughput side by side in one process: the trainer, the per-batch loop, the hardware.

  python -m benchmarks.throughput [--batch_size=128] [--num_images=8000] [--data=idx|synthetic]
      [--parallel=jit|mesh|pmap] [--dtype=float32|bfloat16]
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python -m benchmarks.throughput --compare_modes=jit,mesh,pmap [--batch_size=128]
  python -m benchmarks.throughput --only_startup

Times (1) the trainer's own epoch (the run set-up's compiled scan over device-resident data),
(2) the conventional loop of google/flax examples/mnist (a jitted step per batch, fed host numpy
batches) on the same config, model, optimizer, batches and dropout keys, (3) the MLP's matmuls
alone at the same shapes, and (4) a large matmul in the compute dtype, turned into a ceiling on
images/s by the MLP's matmul FLOPs per image. Both training loops first run one untimed epoch from
the same state, compared to prove they do the same training. Then each repetition times one epoch of
(1) to (3) and one matmul, interleaved, so load from other processes hits all of them alike. A fresh
`python train.py` on the idx files gives the start-up time, launched twice on one new compilation
cache: first compiling, then loading the programs. Prints a table, then one JSON line.

--compare_modes instead times the trainer's epoch under each parallel mode named, in turn per
repetition, and prints each mode's median epoch time and images/s and the mesh / pmap ratio.
"""

import functools
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from absl import flags

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from data.mnist import Examples
from mlp import passes
from mlp import steps
from benchmarks import workload
from benchmarks.workload import ROOT
from errors import UserError
from mlp import batches
from trainer.host.boundary import Host

_REPEATS = flags.DEFINE_integer('repeats', 11, 'Timed epochs of each loop (at least 5).')
_MATMUL_SIZE = flags.DEFINE_integer('matmul_size', 2048, 'Side of the square ceiling matmul.')
_STARTUP = flags.DEFINE_bool('startup', True, 'Also time a fresh `python train.py` on the idx '
                             'split train[:8000] from process start to its first epoch, twice on '
                             'one new compilation cache.')
_ONLY_STARTUP = flags.DEFINE_bool('only_startup', False, 'Time only the two launches of --startup.')

_COMPARE_MODES = flags.DEFINE_list(
    'compare_modes', [], 'Instead of the table above: the trainer\'s epoch under these parallel '
    'modes (jit: one device; mesh, pmap: every device), interleaved, e.g. jit,mesh,pmap; run with '
    'several devices, e.g. XLA_FLAGS=--xla_force_host_platform_device_count=8.')

STARTUP_TRAIN_SPLIT, STARTUP_EVAL_SPLIT = 'train[:8000]', 'test[:2000]'
MIN_REPEATS = 5
MODES = ('jit', 'mesh', 'pmap')
TIMINGS = ('epoch_seconds', 'train_images_per_second')  # A record's fields that vary run to run.
WITHOUT_DATA = '--data=synthetic --nostartup'  # The flags that run this script without MNIST files.


class LoopRun:
  """The google/flax examples/mnist pattern: host numpy dataset, one jitted step call per batch."""

  def __init__(self, config: ml_collections.ConfigDict, examples: Examples,
               trainer: workload.TrainerRun):
    # The same normalized float32 pixels the trainer computes, prepared once on the host.
    everything = batches.gather(examples.images, examples.labels, jnp.arange(len(examples)))
    self._images, self._labels = np.asarray(everything['image']), np.asarray(everything['label'])
    self._plan = jax.jit(passes.epoch_plan, static_argnums=2, static_argnames='batch_size')
    self._step = jax.jit(functools.partial(passes.train_batch, spec=passes.EpochSpec(
        config.batch_size, label_smoothing=config.label_smoothing)))
    self._batch_size = config.batch_size
    self._state, self._seed_key = trainer.start_state, trainer.run_key

  def epoch(self, epoch: int) -> tuple[float, dict[str, float]]:
    """Seconds for one epoch of per-batch steps (until all metrics are on the host), its metrics."""
    start = time.perf_counter()
    plan, dropout_key = self._plan(self._seed_key, epoch, len(self._labels),
                                   batch_size=self._batch_size)
    step_metrics = []
    for indices in np.asarray(plan):
      batch = {'image': self._images[indices], 'label': self._labels[indices]}
      self._state, metrics = self._step(self._state, batch, indices, dropout_key)
      step_metrics.append(metrics)
    sums = jax.tree.map(lambda *xs: np.sum(xs), *jax.device_get(step_metrics))
    seconds = time.perf_counter() - start
    return seconds, steps.summarize(sums)

  @property
  def params(self) -> Mapping[str, Any]:
    """The parameters after the epochs run so far, to compare with the trainer's."""
    return self._state.params


class MatmulRun:
  """The machine's matmul rate on one large square product, in the config's compute dtype."""

  def __init__(self, size: int, dtype: str = 'float32'):
    a, b = jax.random.normal(jax.random.key(0), (2, size, size), jnp.dtype(dtype))
    self._operands = (a, b)
    self._matmul = jax.jit(jnp.matmul).lower(a, b).compile()
    self._flops = 2 * size ** 3
    jax.block_until_ready(self._matmul(a, b))

  def flops_per_second(self) -> float:
    start = time.perf_counter()
    jax.block_until_ready(self._matmul(*self._operands))
    return self._flops / (time.perf_counter() - start)


def _launch(command: list[str], workdir: str) -> dict:
  """One `python train.py` from process start: seconds to its first epoch line, its compile
  seconds, its stderr lines and its metrics records."""
  stderr_path = pathlib.Path(workdir) / 'stderr.txt'
  seconds, compiled = None, None
  with open(stderr_path, 'w', encoding='utf-8') as stderr:
    start = time.perf_counter()
    with subprocess.Popen([*command, f'--workdir={workdir}'], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=stderr, text=True) as process:
      for line in process.stdout or ():
        compiled = compiled or re.search(r'compiled in ([\d.]+)s', line)
        if seconds is None and line.startswith('epoch 1/1'):
          seconds = time.perf_counter() - start
  lines = stderr_path.read_text(encoding='utf-8').splitlines()
  if process.returncode != 0 or seconds is None:
    errors = [l for l in lines if not l.startswith('import time:')]
    raise UserError(f'the start-up run of train.py failed ({errors[-1] if errors else "no output"})'
                    '; check --data_dir, or pass --nostartup')
  records = (pathlib.Path(workdir) / 'metrics.jsonl').read_text(encoding='utf-8').splitlines()
  return {'seconds': seconds, 'compile_seconds': float(compiled.group(1)) if compiled else None,
          'stderr': lines, 'records': [json.loads(r) for r in records]}


def measure_startup(batch_size: int, data_dir: str) -> dict[str, float | bool]:
  """Seconds from launching `python train.py` on idx data to its first epoch line, twice on one
  fresh compilation cache (the second launch loads what the first compiled), whether both trained
  the same numbers, and the modules the first imported (`python -X importtime`): TensorFlow must
  not be one."""
  overrides = {'data.source': 'idx', 'data.dir': data_dir, 'data.train_split': STARTUP_TRAIN_SPLIT,
               'data.eval_split': STARTUP_EVAL_SPLIT, 'num_epochs': 1, 'batch_size': batch_size}
  with tempfile.TemporaryDirectory() as folder:
    command = [sys.executable, '-X', 'importtime', 'train.py', '--config=configs/default.py',
               *[f'--config.{k}={v}' for k, v in overrides.items()],
               f'--compilation_cache={folder}/cache']
    first, second = (_launch(command, tempfile.mkdtemp(dir=folder)) for _ in range(2))
    entries = len(list(pathlib.Path(folder, 'cache').glob('*-cache')))
  modules = {l.rsplit('|', 1)[-1].strip() for l in first['stderr'] if l.startswith('import time:')}
  modules.discard('imported package')  # The column header.
  timeless = lambda launch: [{k: v for k, v in r.items() if k not in TIMINGS}
                             for r in launch['records']]
  return {'seconds': first['seconds'], 'modules_imported': len(modules),
          'compile_seconds': first['compile_seconds'], 'cached_seconds': second['seconds'],
          'cached_compile_seconds': second['compile_seconds'], 'cache_entries': entries,
          'cached_over_first': second['seconds'] / first['seconds'],
          'same_numbers_cached': timeless(first) == timeless(second),
          'tensorflow_imported': any(m.split('.')[0] == 'tensorflow' for m in modules)}


def spread(values: list[float]) -> dict[str, float]:
  return {'median': statistics.median(values), 'min': min(values), 'max': max(values)}


def same_training(trainer: workload.TrainerRun, loop: LoopRun, epoch: int) -> dict[str, float]:
  """One untimed epoch of each from the same state (also their warm-up): the metrics and weights
  must agree up to float rounding, or the loop is not the same training."""
  _, trainer_metrics = trainer.epoch(epoch)
  _, loop_metrics = loop.epoch(epoch)
  weight_gap = max(float(jnp.max(jnp.abs(a - b)))
                   for a, b in zip(jax.tree.leaves(trainer.params), jax.tree.leaves(loop.params)))
  return {'trainer_loss': trainer_metrics['loss'], 'loop_loss': loop_metrics['loss'],
          'trainer_accuracy': trainer_metrics['accuracy'],
          'loop_accuracy': loop_metrics['accuracy'], 'max_weight_difference': weight_gap}


def run(config: ml_collections.ConfigDict, examples: Examples, repeats: int,
        matmul_size: int) -> dict:
  """The interleaved measurements: per repetition one epoch of the trainer, the loop and the
  matmuls alone, and one square matmul."""
  steps_per_epoch = batches.whole_batches(len(examples), config.batch_size)
  trainer = workload.TrainerRun(config, examples)
  loop = LoopRun(config, examples, trainer)
  matmuls_alone = workload.MatmulsAloneRun(config, examples, trainer)
  matmul = MatmulRun(matmul_size, config.dtype)
  check = same_training(trainer, loop, epoch=1)

  flops_per_image = workload.matmul_flops_per_image(tuple(config.model.hidden_sizes))
  images = steps_per_epoch * config.batch_size
  trainer_rates, loop_rates, alone_rates, ceilings = [], [], [], []
  for epoch in range(2, repeats + 2):
    trainer_rates.append(images / trainer.epoch(epoch)[0])
    loop_rates.append(images / loop.epoch(epoch)[0])
    alone_rates.append(images / matmuls_alone.epoch(epoch))
    ceilings.append(matmul.flops_per_second() / flops_per_image)
  return {
      'trainer': spread(trainer_rates), 'loop': spread(loop_rates), 'ceiling': spread(ceilings),
      'matmuls_alone': spread(alone_rates),
      'fraction_of_matmuls_alone': spread([t / a for t, a in zip(trainer_rates, alone_rates)]),
      'matmuls_alone_fraction_of_ceiling': spread([a / c for a, c in zip(alone_rates, ceilings)]),
      'ratio_vs_loop': spread([t / l for t, l in zip(trainer_rates, loop_rates)]),
      'fraction_of_ceiling': spread([t / c for t, c in zip(trainer_rates, ceilings)]),
      'loop_overhead_ms': 1e3 * statistics.median(
          (images / l - images / t) / steps_per_epoch for t, l in zip(trainer_rates, loop_rates)),
      'check': check, 'flops_per_image': flops_per_image, 'images_per_epoch': images,
      'steps_per_epoch': steps_per_epoch,
  }


def _range(values: dict[str, float], fmt: str) -> str:
  return f'{values["median"]:{fmt}} [{values["min"]:{fmt}} .. {values["max"]:{fmt}}]'


class Setting(NamedTuple):
  """What a table reports on, beside its figures."""
  config: ml_collections.ConfigDict
  description: str  # Of the images, for the table's first line.
  loads: tuple[float, float]  # The load average before and after.
  repeats: int
  matmul_size: int


def _table(figures: dict, setting: Setting) -> list[str]:
  """The rows of images/s, then the ratios that explain them."""
  config, description, loads, repeats, matmul_size = setting
  widths = '-'.join(str(w) for w in (784, *config.model.hidden_sizes, 10))
  device, check = jax.devices()[0], figures['check']
  epoch = lambda rates: figures['images_per_epoch'] / rates['median']
  rows = (('trainer', 'trainer (scan over device-resident data)'),
          ('loop', 'conventional loop (jit step, numpy batches)'),
          ('matmuls_alone', 'the MLP\'s matmuls alone, same shapes'),
          ('ceiling', 'ceiling (matmul rate / FLOPs per image)'))
  return [
      f'MLP {widths}, {config.optimizer}, dropout {config.model.dropout_rate}, batch '
      f'{config.batch_size}, {figures["images_per_epoch"]:,} images per epoch '
      f'({figures["steps_per_epoch"]} steps); {description}',
      f'{jax.device_count()} {device.platform} device(s) ({device.device_kind}), '
      f'{os.cpu_count()} CPU cores, load average {loads[0]:.2f} before, {loads[1]:.2f} after; '
      f'median [min .. max] of {repeats} interleaved repetitions',
      '',
      f'{"":44s} {"images/s":>30s}  {"epoch":>8s}',
      *[f'{label:44s} {_range(figures[key], ",.0f"):>30s}  {epoch(figures[key]):7.3f}s'
        for key, label in rows],
      '',
      f'trainer / loop:    {_range(figures["ratio_vs_loop"], ".2f")}; the loop spends '
      f'{figures["loop_overhead_ms"]:.3f} ms more per step (dispatch, host batch, copy to device)',
      f'trainer / ceiling: {_range(figures["fraction_of_ceiling"], ".1%")} = '
      f'trainer / matmuls alone {figures["fraction_of_matmuls_alone"]["median"]:.1%} x '
      f'matmuls alone / ceiling {figures["matmuls_alone_fraction_of_ceiling"]["median"]:.1%}',
      f'ceiling: {figures["ceiling"]["median"] * figures["flops_per_image"] / 1e9:,.1f} GFLOP/s on '
      f'a {matmul_size}x{matmul_size} {config.dtype} matmul, {figures["flops_per_image"]:,} matmul '
      'FLOPs per trained image',
      f'same training: after one epoch from the same state, train loss {check["trainer_loss"]:.6f} '
      f'(trainer) vs {check["loop_loss"]:.6f} (loop), largest weight difference '
      f'{check["max_weight_difference"]:.1e}',
  ]


def _startup_line(startup: dict[str, float | bool]) -> str:
  """How long a user waits for `python train.py`'s first epoch, first and second launch."""
  compiled = lambda key: (f', {startup[key]:.1f}s of it compiling'
                          if startup[key] is not None else '')
  return (f'start-up: {startup["seconds"]:.2f}s from launching `python train.py` (idx, '
          f'{STARTUP_TRAIN_SPLIT}) to its first epoch line{compiled("compile_seconds")}, on a '
          f'fresh compilation cache; relaunched on the {startup["cache_entries"]} programs cached, '
          f'{startup["cached_seconds"]:.2f}s{compiled("cached_compile_seconds")} '
          f'({startup["cached_over_first"]:.0%} of the first), numbers '
          f'{"bit-identical" if startup["same_numbers_cached"] else "DIFFERENT"}; '
          f'{startup["modules_imported"]:,} modules imported, TensorFlow '
          f'{"among them" if startup["tensorflow_imported"] else "not"}')


def _summary(figures: dict, setting: Setting, startup: dict[str, float | bool] | None) -> dict:
  """The table's medians and spreads as one JSON object, for scripts comparing runs."""
  config, description, loads, repeats, _ = setting
  from_startup = lambda key: startup[key] if startup else None
  return {
      'trainer_images_per_second': figures['trainer']['median'],
      'loop_images_per_second': figures['loop']['median'],
      'ratio_vs_loop': figures['ratio_vs_loop']['median'],
      'ceiling_images_per_second': figures['ceiling']['median'],
      'fraction_of_ceiling': figures['fraction_of_ceiling']['median'],
      'startup_seconds': from_startup('seconds'),
      'tensorflow_imported_at_startup': from_startup('tensorflow_imported'),
      'modules_imported_at_startup': from_startup('modules_imported'),
      'startup_compile_seconds': from_startup('compile_seconds'),
      'startup_seconds_cached': from_startup('cached_seconds'),
      'startup_cached_over_first': from_startup('cached_over_first'),
      'startup_cache_entries': from_startup('cache_entries'),
      'startup_same_numbers_cached': from_startup('same_numbers_cached'),
      'matmuls_alone_images_per_second': figures['matmuls_alone']['median'],
      'spread': {k: figures[k] for k in ('trainer', 'loop', 'matmuls_alone', 'ceiling',
                                         'ratio_vs_loop', 'fraction_of_ceiling',
                                         'fraction_of_matmuls_alone',
                                         'matmuls_alone_fraction_of_ceiling')},
      'loop_overhead_ms_per_step': figures['loop_overhead_ms'],
      'matmul_gflops': figures['ceiling']['median'] * figures['flops_per_image'] / 1e9,
      'flops_per_image': figures['flops_per_image'],
      'same_training': figures['check'],
      'batch_size': config.batch_size, 'images_per_epoch': figures['images_per_epoch'],
      'data': description, 'dropout_rate': config.model.dropout_rate, 'dtype': config.dtype,
      'optimizer': config.optimizer, 'repeats': repeats, 'device': jax.devices()[0].device_kind,
      'load_average': list(loads),
  }


def report(figures: dict, setting: Setting, startup: dict[str, float | bool] | None) -> str:
  """The table and, as its last line, the JSON object."""
  lines = _table(figures, setting)
  if startup is not None:
    lines.append(_startup_line(startup))
  summary = _summary(figures, setting, startup)
  return '\n'.join(lines + ['', json.dumps(summary)])


def mode_runs(config: ml_collections.ConfigDict, examples: Examples,
              modes: list[str]) -> dict[str, workload.TrainerRun]:
  """The trainer's run set-up under each mode, warmed up by one epoch; a UserError for modes this
  process cannot compare."""
  if not modes or set(modes) - set(MODES):
    raise UserError(f'--compare_modes={",".join(modes)}: name modes among {",".join(MODES)}, '
                    'e.g. --compare_modes=jit,mesh,pmap')
  if jax.device_count() == 1 and set(modes) - {'jit'}:
    raise UserError('--compare_modes: mesh and pmap split each batch over several devices and '
                    'this process has one; on CPU, simulate 8 with '
                    'XLA_FLAGS=--xla_force_host_platform_device_count=8')
  runs = {}
  for mode in dict.fromkeys(modes):  # In the order asked, each once.
    mode_config = config.copy_and_resolve_references()
    mode_config.parallel = mode
    runs[mode] = workload.TrainerRun(mode_config, examples)
    runs[mode].epoch(1)  # Warm-up.
  return runs


def time_modes(runs: dict[str, workload.TrainerRun], repeats: int) -> dict:
  """Each mode's epoch milliseconds and images/s, the modes taking turns each repetition so load
  from other processes hits all alike."""
  milliseconds: dict[str, list[float]] = {mode: [] for mode in runs}
  for epoch in range(2, repeats + 2):
    for mode, trainer in runs.items():
      milliseconds[mode].append(1e3 * trainer.epoch(epoch)[0])
  modes: dict[str, dict[str, Any]] = {
      mode: {'placement': trainer.placement, 'epoch_ms': spread(milliseconds[mode]),
             'images_per_second': 1e3 * trainer.images_per_epoch /
                                  statistics.median(milliseconds[mode])}
      for mode, trainer in runs.items()}
  ratio = (modes['mesh']['epoch_ms']['median'] / modes['pmap']['epoch_ms']['median']
           if {'mesh', 'pmap'} <= set(modes) else None)
  return {'modes': modes, 'mesh_over_pmap': ratio, 'devices': jax.device_count(),
          'images_per_epoch': next(iter(runs.values())).images_per_epoch, 'repeats': repeats}


def modes_report(figures: dict, config: ml_collections.ConfigDict, description: str) -> str:
  """One row per mode, the mesh / pmap ratio, and, as the last line, the JSON object."""
  lines = [f'batch {config.batch_size}, {figures["images_per_epoch"]:,} images per epoch; '
           f'{description}; median [min .. max] of {figures["repeats"]} interleaved epochs', '',
           f'{"":50s} {"epoch ms":>26s} {"images/s":>10s}']
  for mode in figures['modes'].values():
    lines.append(f'{mode["placement"]:50s} {_range(mode["epoch_ms"], ".2f"):>26s} '
                 f'{mode["images_per_second"]:>10,.0f}')
  if figures['mesh_over_pmap'] is not None:
    lines.append(f'mesh / pmap epoch time: {figures["mesh_over_pmap"]:.3f}')
  return '\n'.join(lines + ['', json.dumps({**figures, 'batch_size': config.batch_size,
                                            'data': description, 'dtype': config.dtype})])


def main(argv: list[str]) -> None:
  del argv
  if _REPEATS.value < MIN_REPEATS:
    raise UserError(f'--repeats={_REPEATS.value} is too few for a median with a spread; '
                    f'use --repeats={MIN_REPEATS} or more')
  config = workload.benchmark_config()
  if _COMPARE_MODES.value:
    examples, description = workload.load_images()
    figures = time_modes(mode_runs(config, examples, _COMPARE_MODES.value), _REPEATS.value)
    print(modes_report(figures, config, description), flush=True)
    return
  load_before = os.getloadavg()[0]
  startup = (measure_startup(config.batch_size, workload.check_data_dir(WITHOUT_DATA))
             if _STARTUP.value or _ONLY_STARTUP.value else None)
  if _ONLY_STARTUP.value and startup:
    print(_startup_line(startup), json.dumps(startup), sep='\n\n', flush=True)
    return
  examples, description = workload.load_images(WITHOUT_DATA)
  figures = run(config, examples, _REPEATS.value, _MATMUL_SIZE.value)
  setting = Setting(config, description, (load_before, os.getloadavg()[0]), _REPEATS.value,
                    _MATMUL_SIZE.value)
  print(report(figures, setting, startup), flush=True)


if __name__ == '__main__':
  Host().run(main, workload.parse_flags)
