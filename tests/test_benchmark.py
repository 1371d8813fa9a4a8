"""benchmarks/throughput.py and profile_epoch.py on a tiny setting: figures, one-line errors.

Timings here prove nothing (the sizes are tiny); the checks are on what could silently rot: the
keys, figures that must agree with each other, the same-training check and the start-up probe.
"""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import pytest

from benchmarks.profile_epoch import ABLATIONS, MATMULS_ALONE
from mlp import steps
from trainer.plan import recipe_of
from trainer.programs import create_state
from tests.conftest import ROOT, make_config, on_devices

KEYS = ('trainer_images_per_second', 'loop_images_per_second', 'ratio_vs_loop',
        'ceiling_images_per_second', 'fraction_of_ceiling', 'startup_seconds')


ROWS = {'trainer': 'trainer (scan', 'loop': 'conventional loop',
        'matmuls_alone': 'the MLP\'s matmuls', 'ceiling': 'ceiling (matmul'}
RANGE = r'([\d,.]+) \[([\d,.]+) \.\. ([\d,.]+)\]'  # How the table prints median [min .. max].


def run_benchmark(*args: str, cpu_devices: int | None = None) -> subprocess.CompletedProcess:
  """`python -m benchmarks.throughput ARGS` in the project root, on `cpu_devices` CPUs if given."""
  env = {**os.environ, **(on_devices(cpu_devices) if cpu_devices else {})}
  return subprocess.run([sys.executable, '-m', 'benchmarks.throughput', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, env=env)


def printed_range(line: str) -> tuple[float, float, float]:
  """The first median [min .. max] of a table line, as numbers."""
  return tuple(float(x.replace(',', '')) for x in re.search(RANGE, line).groups())


def dot_flops(jaxpr: jax.extend.core.Jaxpr) -> int:
  """2 * output size * contracted size for every dot_general, nested jaxprs included."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (lhs_contracting, _), _ = eqn.params['dimension_numbers']
      lhs_shape = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
          lhs_shape[d] for d in lhs_contracting)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      total += dot_flops(sub)
  return total


@pytest.fixture(scope='module')
def tiny_run(mnist_dir) -> tuple[list[str], dict]:
  """One run for the whole module: it launches train.py for the start-up figure, so it is the
  slow part (about 20 s on 2 cores)."""
  out = run_benchmark('--batch_size=32', '--num_images=640', '--repeats=5', '--matmul_size=256',
                      f'--data_dir={mnist_dir}')
  assert out.returncode == 0, out.stderr
  assert 'Traceback' not in out.stderr
  lines = out.stdout.strip().splitlines()
  return lines[:-1], json.loads(lines[-1])


@pytest.mark.slow
def test_the_headline_ratios_come_from_the_measured_speeds(tiny_run):
  """What a reader quotes: trainer over loop, and the ceiling from the measured matmul speed."""
  figures = tiny_run[1]
  assert figures['images_per_epoch'] == 640 and figures['batch_size'] == 32
  assert figures['data'] == 'real MNIST train[:640] (idx files)'
  spread = figures['spread']
  trainer, loop = spread['trainer'], spread['loop']  # Ratios of repeats timed side by side.
  assert (trainer['min'] / loop['max'] <= spread['ratio_vs_loop']['min']
          <= figures['ratio_vs_loop'] <= spread['ratio_vs_loop']['max']
          <= trainer['max'] / loop['min'])
  assert figures['ceiling_images_per_second'] == pytest.approx(
      figures['matmul_gflops'] * 1e9 / figures['flops_per_image'])


@pytest.mark.slow
def test_the_loop_trains_exactly_what_the_trainer_trains(tiny_run):
  table, figures = tiny_run
  check = figures['same_training']
  assert check['loop_loss'] == pytest.approx(check['trainer_loss'], rel=1e-4)
  assert abs(check['loop_accuracy'] - check['trainer_accuracy']) <= 2 / 640
  # Measured 2.1e-7 (JAX 0.10.2) and 3.2e-7 (0.12) on an AMD EPYC Zen 4, 2026-11-27; AdamW moves a
  # weight up to about 0.04 in this epoch, so 1e-2 (the bound before) let another training pass.
  assert check['max_weight_difference'] < 1e-4
  line = next(l for l in table if l.startswith('same training:'))
  assert (f'train loss {check["trainer_loss"]:.6f} (trainer) vs {check["loop_loss"]:.6f} (loop)'
          in line)


@pytest.mark.slow
def test_startup_is_two_real_train_py_launches_without_tensorflow(tiny_run):
  figures = tiny_run[1]
  assert 0 < figures['startup_compile_seconds'] < figures['startup_seconds']
  assert figures['modules_imported_at_startup'] > 100  # jax, flax, optax...: the list was read.
  assert figures['tensorflow_imported_at_startup'] is False
  # Relaunched on the programs the first launch cached: the same numbers (timings prove nothing).
  assert figures['startup_cache_entries'] >= 3 and figures['startup_same_numbers_cached'] is True
  assert figures['startup_cached_over_first'] == pytest.approx(
      figures['startup_seconds_cached'] / figures['startup_seconds'])


@pytest.mark.slow
def test_flops_per_image_match_the_matmuls_of_the_real_train_step(tiny_run):
  state = create_state(recipe_of(make_config(), (), steps_per_epoch=1), jax.random.key(0))
  batch = {'image': jnp.zeros((8, 784)), 'label': jnp.zeros((8,), jnp.int32)}
  keys = jax.random.split(jax.random.key(1), 8)
  jaxpr = jax.make_jaxpr(steps.train_step)(state, batch, keys).jaxpr
  assert tiny_run[1]['flops_per_image'] == dot_flops(jaxpr) // 8


@pytest.mark.slow
@pytest.mark.parametrize('args, expected', [
    (['--repeats=3'], '--repeats=3 is too few'),
    (['--batch_size=0'], 'needs 1 <= batch_size'),
    (['--data=csv'], 'one of <idx|synthetic>'),
    (['--nostartup', '--data_dir=/nonexistent/mnist'], 'does not exist; pass --data_dir'),
    (['--data=synthetic', '--data_dir=/nonexistent/mnist'], 'or --data=synthetic --nostartup'),
    (['--compare_modes=jit,gpu'], '--compare_modes=jit,gpu: name modes among jit,mesh,pmap'),
    (['--compare_modes=mesh,pmap'], 'this process has one; on CPU, simulate 8 with XLA_FLAGS'),
])
def test_bad_input_ends_in_one_line(args, expected):
  out = run_benchmark(*args, cpu_devices=1)
  assert out.returncode != 0
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and expected in lines[0], out.stderr


CPU_OPS = pytest.mark.skipif(jax.default_backend() != 'cpu',
                             reason="the op groups are named for XLA:CPU's ops")


def profile(*flags: str) -> str:
  """benchmarks.profile_epoch's output on a small epoch, its table checked: every op in a group."""
  out = subprocess.run([sys.executable, '-m', 'benchmarks.profile_epoch', '--batch_size=32',
                        '--num_images=640', '--epochs=1', *flags], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  table = out.stdout.split('group\n', 1)[1].split('\n\n', 1)[0]
  shares = {}
  for line in table.splitlines():
    match = re.match(r'\s*[\d.]+\s+([\d.]+)%\s+(.+)$', line)
    if match:
      shares[match.group(2)] = float(match.group(1))
  assert {'matmuls (forward and backward)', 'optimizer update',
          'dropout: random bits and masks'} <= set(shares)
  assert 'not matched to the program' not in shares  # Trace events all named program ops.
  assert sum(shares.values()) == pytest.approx(100, abs=0.5)
  return out.stdout


@pytest.mark.slow
@CPU_OPS
def test_profile_attributes_every_op_of_the_epoch_to_a_group_and_times_each_part(mnist_dir):
  stdout = profile('--ablate', '--repeats=1', f'--data_dir={mnist_dir}')
  assert ', 1 model(s); ' in stdout.splitlines()[0]

  # --ablate: each variant's epoch against the matmuls alone.
  rows = {match.group(3): (float(match.group(1)), float(match.group(2)))
          for match in re.finditer(r'^\s*([\d.]+) ms\s+([\d.]+)%  (.+)$', stdout, re.M)}
  assert list(rows) == [*ABLATIONS, MATMULS_ALONE]
  floor = rows[MATMULS_ALONE][0]
  for milliseconds, share in rows.values():  # Each share is the matmuls' time over the row's,
    # within what printing milliseconds to 0.1 and shares to 0.1% can round away.
    rounding = 0.06 + share * 0.05 * (1 / floor + 1 / milliseconds)
    assert share == pytest.approx(100 * floor / milliseconds, abs=rounding)


@pytest.mark.slow
@CPU_OPS
def test_profile_of_models_side_by_side_groups_every_op_and_counts_every_models_matmuls(mnist_dir):
  one = profile('--max_shift=1', f'--data_dir={mnist_dir}')
  two = profile('--num_models=2', '--max_shift=1', f'--data_dir={mnist_dir}')
  assert ', shifts 1, 2 model(s); ' in two.splitlines()[0]
  gflop = [float(re.search(r'\(([\d.]+) GFLOP per epoch\)', out).group(1)) for out in (one, two)]
  assert gflop[1] == pytest.approx(2 * gflop[0], rel=0.05)  # Printed to 0.1 GFLOP.


@pytest.mark.slow
def test_mesh_and_pmap_are_timed_side_by_side_on_8_devices():
  out = run_benchmark('--compare_modes=mesh,pmap', '--repeats=5', '--num_images=128',
                      '--batch_size=64', '--data=synthetic', cpu_devices=8)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.strip().splitlines()
  figures = json.loads(lines[-1])
  assert figures['devices'] == 8 and list(figures['modes']) == ['mesh', 'pmap']
  medians = {mode: timed['epoch_ms']['median'] for mode, timed in figures['modes'].items()}
  assert figures['modes']['mesh']['placement'].startswith('mesh on 8 cpu devices, 8 per device')
  assert figures['modes']['pmap']['placement'].startswith('pmap on 8 cpu devices, 8 per device')
  assert figures['mesh_over_pmap'] == pytest.approx(medians['mesh'] / medians['pmap'])
  assert f'mesh / pmap epoch time: {figures["mesh_over_pmap"]:.3f}' in lines


def test_launch_phases_names_imports_and_the_projects_functions(tmp_path):
  """The rows come from a real profile: a project function that ran is listed with its time."""
  import pstats  # pylint: disable=g-import-not-at-top

  from benchmarks.launch_phases import phases
  # In a process of its own, as the benchmark profiles train.py: since Python 3.12 cProfile sees
  # every thread, and a test process has other threads whose calls would mix into this one's.
  script = tmp_path / 'load.py'
  script.write_text('from data import idx\nidx.load_idx("", "test")\n')
  profile = tmp_path / 'load.prof'
  subprocess.run([sys.executable, '-m', 'cProfile', '-o', str(profile), str(script)], cwd=ROOT,
                 env={**os.environ, 'PYTHONPATH': str(ROOT)}, check=True)
  rows = dict(phases(pstats.Stats(str(profile)), rows=50))
  assert rows['profile total'] > 0
  assert 0 < rows['idx.py:load_idx'] <= rows['profile total']
  assert rows['imports'] > 0
  assert set(rows) >= {'imports', "JAX's backends"}
  assert not any(name.startswith(('pstats', 'cProfile')) for name in rows)


@pytest.mark.slow  # A benchmark script end to end, 15-20 s.
def test_members_are_timed_beside_one_model_and_the_ratio_is_of_the_medians():
  out = subprocess.run([sys.executable, '-m', 'benchmarks.members', '--data=synthetic',
                        '--num_images=512', '--batch_size=64', '--num_models=2', '--repeats=3',
                        '--max_shift=1', '--nolaunches'], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr
  figures = json.loads(out.stdout.strip().splitlines()[-1])
  epochs = figures['epochs']
  assert '2 models side by side' in epochs['placement'] and epochs['max_shift'] == 1
  assert 'shifts of up to 1 pixels' in out.stdout.splitlines()[0]
  medians = {count: epochs['epoch_ms'][count]['median'] for count in ('1', '2')}
  assert epochs['members_over_one'] == pytest.approx(medians['2'] / medians['1'])
  assert f'members / one model:       {epochs["members_over_one"]:9.2f}x' in out.stdout
  assert figures['launches'] is None


def test_members_benchmark_refuses_a_single_member_in_one_line():
  out = subprocess.run([sys.executable, '-m', 'benchmarks.members', '--num_models=1'], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode != 0
  assert out.stderr.strip().splitlines() == [
      'error: --num_models must be 2 or more, --repeats 3 or more and --launch_epochs 1 or more; '
      'e.g. --num_models=3 --repeats=5 --launch_epochs=2']


@pytest.mark.parametrize('args, said', [
    (['--min_seconds=0.5,abc'], "'abc' is not a finite number >= 0 of seconds; pass e.g. "
                                '--min_seconds=0.5,5'),
    (['--min_seconds=nan'], "'nan' is not a finite number >= 0 of seconds"),
    (['--min_seconds=5', '--part=costs'], '--min_seconds adds cadences to time, which '
                                          '--part=costs leaves out')])
def test_checkpoint_times_refuses_min_seconds_it_cannot_time_before_any_measurement(args, said):
  """Else the costs are measured for minutes first, and then train.py refuses the value (or, with
  --part=costs, the flag does nothing)."""
  out = subprocess.run([sys.executable, '-m', 'benchmarks.checkpoint_times', *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=20)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and out.stdout == '', out.stderr
  assert len(lines) == 1 and lines[0].startswith('error: --min_seconds') and said in lines[0]


def test_numbers_spread_refuses_flags_of_recording_without_record():
  """Else --cpu=zen4 alone prints the recorded spread and exits 0, recording nothing."""
  out = subprocess.run([sys.executable, '-m', 'benchmarks.numbers_spread', '--cpu=zen4',
                        '--seeds=1'], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert out.returncode == 2 and out.stdout == ''
  assert out.stderr.strip().splitlines() == [
      "error: --cpu, --seeds only say how to record; add --record to record this CPU's runs, or "
      'leave them out to print the recorded spread']


def recipes(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'benchmarks.recipes', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # A benchmark script end to end, 15-20 s.
def test_recipes_take_a_configs_seeds_from_one_launch_with_their_ensemble(mnist_dir):
  out = recipes('--one_launch', '--seeds=3,4', '--recipes=config',
                '--overrides=num_epochs=1,data.train_split=train[:512],data.eval_split=test[:500]')
  assert out.returncode == 0, out.stderr
  rows = {line.split()[2]: line.split() for line in out.stdout.splitlines()[2:]}
  assert list(rows) == ['3', '4', 'ensemble', 'mean']
  seeds = [float(rows[seed][3].rstrip('%')) for seed in ('3', '4')]
  assert float(rows['mean'][3].rstrip('%')) == pytest.approx(sum(seeds) / 2, abs=0.011)
  assert len(rows['mean']) == 5 and len(rows['3']) == 4  # The launch's seconds, once.


@pytest.mark.slow  # A benchmark script end to end, 15-20 s.
def test_recipes_compare_a_sweep_in_one_launch_best_first(mnist_dir):
  out = recipes('--sweep=learning_rate=(1e-3, 4e-3)', '--seeds=0', '--recipes=config',
                '--splits=validation', '--overrides=num_epochs=1,data.train_split=train[:512]')
  assert out.returncode == 0, out.stderr
  rows = out.stdout.splitlines()[2:]
  members = [(float(line.split()[2].rstrip('%')), line.split()[3]) for line in rows[:2]]
  assert sorted(label for _, label in members) == ['learning_rate=0.001', 'learning_rate=0.004']
  assert members[0][0] >= members[1][0]  # Best first.
  mean = float(rows[2].split()[3].rstrip('%'))
  assert mean == pytest.approx(sum(accuracy for accuracy, _ in members) / 2, abs=0.011)


def test_recipes_refuse_seeds_one_launch_cannot_train_in_one_line():
  out = recipes('--one_launch', '--seeds=0,2')
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      'error: --one_launch trains seeds s, s+1, ... together, got --seeds=0,2; pass consecutive '
      'ones, e.g. --seeds=0,1,2']


def test_recipes_refuse_a_config_file_that_is_not_there_before_any_run(tmp_path):
  out = recipes(f'--also=configs/fast.py,{tmp_path}/nope.py')
  assert out.returncode == 2 and out.stdout == ''  # Not one run, not the table's heading.
  assert out.stderr.strip().splitlines() == [
      f'error: no config file {tmp_path}/nope.py (a path from {ROOT}, or absolute); pass files '
      'that exist, e.g. --also=configs/fast.py']


@pytest.mark.parametrize('args, said', [
    (['--trials=7'], '--trials=7 is no product of two numbers of 2 or more, and the grid takes '
                     'values of each field that multiply to it; pass e.g. --trials=16 (4 x 4) or '
                     '--trials=32 (8 x 4)'),
    (['--eval_examples=10001'], '--train_examples=50000 and --eval_examples=10001 must stay within '
                                "the validation split's 50000 and 10000; pass at most those")])
def test_search_vs_grid_refuses_a_budget_it_cannot_spend_before_any_launch(args, said):
  """Else a grid of 7 trials that is no grid, or a split past the validation split's, is found
  minutes in."""
  out = subprocess.run([sys.executable, '-m', 'benchmarks.search_vs_grid', *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 2 and out.stdout == ''
  assert out.stderr.strip().splitlines() == [f'error: {said}']


@pytest.mark.skipif(importlib.util.find_spec('playwright') is not None,
                    reason='the docs extra is installed here')
def test_dashboard_screenshot_without_the_docs_extra_is_one_line_naming_it():
  out = subprocess.run([sys.executable, '-m', 'benchmarks.dashboard_screenshot'], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode != 0 and out.stdout == ''
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      'error: benchmarks.dashboard_screenshot needs optuna-dashboard and Playwright ('), lines
  assert lines[0].endswith('an extra that `make train` leaves out: pip install -r '
                           'requirements/docs.txt, or keep docs/search-dashboard.png as it is')


# The modules that are not commands: the trainer's workload, and the reader of a program's
# collectives that tests and benchmarks share.
LIBRARIES = ('workload', 'collectives')
BENCHMARKS = sorted(path.stem for path in (ROOT / 'benchmarks').glob('[!_]*.py')
                    if path.stem not in LIBRARIES)


@pytest.mark.parametrize('name', [
    name if name == 'recipes' else pytest.param(name, marks=pytest.mark.slow)
    for name in BENCHMARKS])
def test_a_benchmark_s_unknown_flag_is_one_line_naming_the_command_and_its_help_exits_0(name):
  command = [sys.executable, '-m', f'benchmarks.{name}']
  out = subprocess.run([*command, '--nosuchflag=1'], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2
  assert out.stderr.splitlines() == [
      f"error: Unknown command line flag 'nosuchflag'; usage: python -m benchmarks.{name} "
      '[--FLAG=VALUE ...] (--helpshort lists the flags)']
  helped = subprocess.run([*command, '--helpshort'], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
  assert helped.returncode == 0 and helped.stderr == '' and '--' in helped.stdout
