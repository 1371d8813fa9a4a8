"""What a benchmark trains, shared by its scripts.

The flags, config, images, the trainer's epoch and the MLP's matmuls alone."""

import functools
import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from configs import default
from data.mnist import Examples, load_split
from data.splits import SPLIT_SIZES
from command import parse_tool_flags
from errors import UsageError, UserError
from mlp import batches, passes
from mlp import steps
from trainer.plan import resolve
from trainer import reporting
from trainer.programs import compile_programs

ROOT = pathlib.Path(__file__).resolve().parent.parent

BATCH_SIZE = flags.DEFINE_integer('batch_size', 128, 'Global batch size.')
DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'],
                          'Compute dtype of activations and matmuls (config.dtype).')
PARALLEL = flags.DEFINE_enum('parallel', 'jit', ['jit', 'mesh', 'pmap'],
                             'How the trainer runs the epoch (mesh and pmap use every device).')
NUM_IMAGES = flags.DEFINE_integer(
    'num_images', 8000, 'Images per epoch. idx: the first N of MNIST\'s training set (repeated '
    'past 60,000); synthetic: N random images of MNIST\'s shape.')
DATA = flags.DEFINE_enum('data', 'idx', ['idx', 'synthetic'],
                         'idx: real MNIST from --data_dir; synthetic: random uint8 images.')
DATA_DIR = flags.DEFINE_string('data_dir', str(ROOT / 'data' / 'mnist'),
                               'Folder of the canonical MNIST .gz files.')
DROPOUT_RATE = flags.DEFINE_float('dropout_rate', None,
                                  'Overrides model.dropout_rate (default: the config\'s).')


def matmul_flops_per_image(hidden_sizes: tuple[int, ...], num_inputs: int = 784,
                           num_classes: int = 10) -> int:
  """Forward, weight-gradient and input-gradient matmuls; the pixels need no gradient.

  A [B, m] x [m, n] layer costs 2mn FLOPs per image for each of the three products, except that
  the first layer has no input gradient to compute.
  """
  widths = [num_inputs, *hidden_sizes, num_classes]
  layers = [2 * m * n for m, n in zip(widths[:-1], widths[1:])]
  return 2 * sum(layers) + sum(layers[1:])


def benchmark_config() -> ml_collections.ConfigDict:
  """configs/default.py with the flags' batch size and, if given, dropout rate; no pixel shifts.

  The conventional loop (flax examples/mnist) feeds host batches without augmentation, so both sides
  train on the images as they are.
  """
  config = default.get_config()
  config.data.max_shift = 0
  config.batch_size = BATCH_SIZE.value
  config.parallel = PARALLEL.value
  config.dtype = DTYPE.value
  if DROPOUT_RATE.value is not None:
    config.model.dropout_rate = DROPOUT_RATE.value
  if not 1 <= config.batch_size <= NUM_IMAGES.value:
    raise UserError(f'--batch_size={config.batch_size} needs 1 <= batch_size <= --num_images '
                    f'({NUM_IMAGES.value}); lower --batch_size or raise --num_images')
  if not 0 <= config.model.dropout_rate < 1:
    raise UserError(f'--dropout_rate must be in [0, 1), got {config.model.dropout_rate!r}')
  return config


def check_data_dir(without: str | None = '--data=synthetic') -> str:
  """The MNIST folder, or a UserError naming the flag that sets it (and `without`, the flags that
  run this script without it, if any)."""
  if not pathlib.Path(DATA_DIR.value).expanduser().is_dir():
    alternative = f', or {without} to run without them' if without else ''
    raise UserError(f'data folder {DATA_DIR.value} does not exist; pass --data_dir=FOLDER of the '
                    f'canonical MNIST .gz files{alternative}')
  return str(pathlib.Path(DATA_DIR.value).expanduser())


def load_images(without: str = '--data=synthetic') -> tuple[Examples, str]:
  """The flags' examples and the table's description of them; `without` as in check_data_dir."""
  num_images = NUM_IMAGES.value
  if DATA.value == 'synthetic':
    rng = np.random.default_rng(0)
    return (Examples(images=rng.integers(0, 256, (num_images, 784), dtype=np.uint8),
                     labels=rng.integers(0, 10, num_images, dtype=np.int32)),
            f'synthetic: {num_images:,} random uint8 images of MNIST\'s shape')
  data_config = ml_collections.ConfigDict({'source': 'idx', 'dir': check_data_dir(without)})
  available = SPLIT_SIZES['train']
  if num_images <= available:
    return (load_split(data_config, f'train[:{num_images}]'),
            f'real MNIST train[:{num_images}] (idx files)')
  full = load_split(data_config, 'train')
  rows = np.arange(num_images) % available
  return (Examples(images=full.images[rows], labels=full.labels[rows]),
          f'real MNIST training set ({available:,}) repeated to {num_images:,} (idx files)')


class TrainerRun:
  """The trainer's epoch exactly as `train_and_evaluate` runs it: the run set-up, compiled ahead."""

  def __init__(self, config: ml_collections.ConfigDict, examples: Examples,
               state: steps.TrainState | None = None):
    """`state`: global arrays on the config's mesh to start from, instead of the fresh state."""
    self._run = compile_programs(resolve(config), examples, examples)
    self._state = self._run.fresh_state() if state is None else state
    # The fresh state on the host, before the first epoch consumes the devices' copy: other loops
    # start from it to train exactly what the trainer trains.
    self.start_state: steps.TrainState = jax.device_get(self._state)
    self.run_key: jax.Array = self._run.run_key  # Drives every epoch's order and dropout.
    self.template: steps.TrainState = self._run.template  # What a checkpoint restores into.
    self.placement: str = reporting.placement(self._run.plan)
    self.mesh: Mesh = self._run.plan.mesh
    self.images_per_epoch: int = batches.whole_batches(len(examples),
                                                       config.batch_size) * config.batch_size

  def epoch(self, epoch: int) -> tuple[float, dict[str, float]]:
    """Seconds for one epoch (until the state and metrics are on the host), and its metrics."""
    start = time.perf_counter()
    self._state, metrics = self._run.train_epoch(self._state, epoch)
    jax.block_until_ready(self._state)
    return time.perf_counter() - start, metrics

  @property
  def state(self) -> steps.TrainState:
    """The state after the epochs run so far, global arrays on the mesh (what a save takes)."""
    return self._state

  @property
  def params(self) -> Mapping[str, Any]:
    """The parameters after the epochs run so far, to compare with another loop's."""
    return self._state.params

  def compiled_text(self) -> str:
    """The compiled training epoch as XLA text, for reading its ops' names."""
    train = self._run.train_program
    if train is None or not hasattr(train, 'as_text'):
      raise UserError(f'{self.placement}: pmap keeps its compiled program to itself; '
                      'use --parallel=jit or --parallel=mesh')
    return train.as_text()


def epochs_in_turn(configs: dict[Any, ml_collections.ConfigDict], examples: Examples,
                   repeats: int) -> tuple[dict[Any, TrainerRun], dict[Any, list[float]]]:
  """Each config's TrainerRun, warmed up by an epoch, and the ms of its `repeats` epochs after,
  timed in turn so that load from other processes hits each alike."""
  runs = {}
  for key, config in configs.items():
    runs[key] = TrainerRun(config, examples)
    runs[key].epoch(1)  # Warm-up.
  milliseconds: dict[Any, list[float]] = {key: [] for key in runs}
  for epoch in range(2, repeats + 2):
    for key, trainer in runs.items():
      milliseconds[key].append(1e3 * trainer.epoch(epoch)[0])
  return runs, milliseconds


class MatmulsAloneRun:
  """Only the MLP's matmuls, forward and backward, at the batch's shapes, scanned over an epoch:
  what the trainer would reach if the bias, ReLU, loss, dropout and optimizer cost nothing."""

  def __init__(self, config: ml_collections.ConfigDict, examples: Examples,
               trainer: TrainerRun):
    model = trainer.start_state.model()  # Its layers in order; kernels in the compute dtype.
    self._kernels = [layer.kernel.value.astype(config.dtype)
                     for layer in (*model.hidden, model.out)]
    self._images = jax.device_put(examples.images)
    self._epoch = jax.jit(functools.partial(self._matmuls, batch_size=config.batch_size))
    self._seed_key = trainer.run_key
    jax.block_until_ready(self._epoch(self._kernels, self._images, self._seed_key, 0))

  @staticmethod
  def _matmuls(kernels: list[jax.Array], images: jax.Array, seed_key: jax.Array, epoch: jax.Array,
               *, batch_size: int) -> jax.Array:
    plan, _ = passes.epoch_plan(seed_key, epoch, images.shape[0], batch_size=batch_size)

    def body(carry, indices):
      # The carry (a scalar of the last step's gradients) keeps XLA from hoisting any step.
      activations = [jnp.take(images, indices, axis=0).astype(kernels[0].dtype) + carry]
      for kernel in kernels:
        activations.append(activations[-1] @ kernel)
      delta, total = activations.pop(), 0.0
      for layer in reversed(range(len(kernels))):
        total += jnp.sum(activations[layer].T @ delta)  # Weight gradient.
        if layer:
          delta = delta @ kernels[layer].T  # Input gradient, not needed for the pixels.
      return 1e-30 * total, None

    return jax.lax.scan(body, jnp.zeros((), kernels[0].dtype), plan)[0]

  def epoch(self, epoch: int) -> float:
    start = time.perf_counter()
    jax.block_until_ready(self._epoch(self._kernels, self._images, self._seed_key, epoch))
    return time.perf_counter() - start


def parse_flags(argv: list[str]) -> list[str]:
  """A benchmark's flags: a mistake is one line naming the command that lists them."""
  command = f'python -m benchmarks.{pathlib.Path(argv[0]).stem}'
  rest = parse_tool_flags(argv, f'{command} [--FLAG=VALUE ...] (--helpshort lists the flags)')
  if len(rest) > 1:
    raise UsageError(f'unexpected arguments {rest[1:]}; flags look like --FLAG=VALUE')
  return rest


# The ranges of docs/search.md's command, which the benchmarks of the search search.
SEARCH_RANGES = {'learning_rate': (1e-4, 1e-2), 'model.dropout_rate': (0.0, 0.5)}


def search_args(trials: int, side_by_side: int) -> list[str]:
  """train.py's flags of a search over SEARCH_RANGES: `trials` trials, `side_by_side` a program."""
  return [f'--config.search.trials={trials}', f'--config.search.side_by_side={side_by_side}',
          *(f'--config.search.{name}={bounds}' for name, bounds in SEARCH_RANGES.items())]


def run_train(args: list[str], what: str) -> float:
  """train.py with `args`, as a user launches it: the seconds from launch to exit; its failure a
  UserError naming `what` failed."""
  start = time.perf_counter()
  out = subprocess.run([sys.executable, 'train.py', *args], cwd=ROOT, capture_output=True,
                       text=True, check=False)
  seconds = time.perf_counter() - start
  if out.returncode != 0:
    said = (out.stderr.strip().splitlines() or [f'exit status {out.returncode}'])[-1]
    raise UserError(f'{what} failed: {said.removeprefix("error: ")}')
  return seconds


def launch_train(args: list[str], what: str) -> tuple[dict, float]:
  """train.py with `args` (among them its --workdir), as a user launches it: its last metrics.jsonl
  record, and the seconds from launch to exit; its failure a UserError naming `what` failed."""
  seconds = run_train(args, what)
  workdir = next(arg.split('=', 1)[1] for arg in args if arg.startswith('--workdir='))
  with open(f'{workdir}/metrics.jsonl', encoding='utf-8') as metrics:
    return json.loads(metrics.read().splitlines()[-1]), seconds
