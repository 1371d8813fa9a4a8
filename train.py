"""Trains the MNIST MLP: `python train.py --config=configs/default.py [--config.FIELD=VALUE]`."""

import functools
import os
import shlex
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if __name__ == '__main__':  # A Ctrl-C or SIGTERM, or a library missing: one line, no traceback.
  from command import start_command
  start_command('stopped by {signal} while starting; nothing was written')

import ml_collections  # pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from command import end_quietly_on_signals, fail, parse_or_help
from errors import ConfigError, UserError, say, shown
from trainer.config_file import ConfigFileFailed, ConfigFileParser, pass_a_config

if TYPE_CHECKING:
  from trainer.run_dir import RunDirectory


_CONFIG = config_flags.DEFINE_config_file(
    'config', None,
    'Config file, e.g. configs/default.py; override fields with --config.FIELD=VALUE.',
    lock_config=True)
# Flag.parser is absl's public attribute; ml_collections takes no parser of our own.
flags.FLAGS['config'].parser = ConfigFileParser(flags.FLAGS['config'].parser)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory for metrics, TensorBoard events and checkpoints '
    '(default: checkpoints/<config file name>).')
# A multi-process run: the same command on every process, named as jax.distributed.initialize's
# arguments. None of them on a single machine; only --distributed on a TPU pod slice.
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'HOST:PORT of process 0, which every process connects to.')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'How many processes the run has.', lower_bound=1)
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, 'This process: 0 to num_processes - 1; process 0 writes the outputs.',
    lower_bound=0)
_DISTRIBUTED = flags.DEFINE_bool(
    'distributed', False, 'Join a multi-process run whose settings JAX detects itself (TPU pod '
    'slice, Slurm, Open MPI); implied by --coordinator_address, --num_processes or --process_id.')
_INIT_TIMEOUT = flags.DEFINE_integer(
    'initialization_timeout', 300, 'Seconds to wait for every process to join before giving up.',
    lower_bound=1)
_LOCK_STALE_AFTER = flags.DEFINE_float(
    'lock_stale_after', 120, 'With a gs:// --workdir: seconds after which the run lock of a run '
    'that stopped refreshing it (killed, or its VM deleted) is taken over.', lower_bound=1)
_PRINT_CONFIG = flags.DEFINE_bool(
    'print_config', False, 'Print every field of the config, with the overrides applied, as the '
    'flags that set them, then exit without training.')
_COMPILATION_CACHE = flags.DEFINE_string(
    'compilation_cache', None, 'Folder of compiled programs that later launches load instead of '
    'compiling (default: $JAX_COMPILATION_CACHE_DIR if set, else '
    '$XDG_CACHE_HOME/mnist-mlp/jax-compilation-cache, XDG_CACHE_HOME defaulting to ~/.cache); '
    'off: compile every program.')


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with every mistake reported as one line instead of a traceback."""
  try:
    rest = parse_or_help(argv)
    config = _CONFIG.value
  except flags.Error as error:
    fail(f'{error}; run python {shown(__file__)} --helpshort for the flags', 2)
  except ConfigFileFailed as error:  # The config file's own failures, each worded there.
    fail(str(error), 2)
  if len(rest) > 1:
    fail(f'unexpected arguments {rest[1:]}; flags look like --config.FIELD=VALUE', 2)
  if config is None:
    fail(f'no config given; {pass_a_config()}', 2)
  return rest


def default_workdir() -> str:
  """checkpoints/<config file name without .py>[-<its argument>], beside this file."""
  config_file, _, argument = config_flags.get_config_filename(flags.FLAGS['config']).partition(':')
  name = os.path.splitext(os.path.basename(config_file))[0] + (f'-{argument}' if argument else '')
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'checkpoints', name)


def this_command() -> str:
  """The command line that started this process, as a shell would take it back."""
  return shlex.join([sys.executable, *sys.argv])


def interrupted() -> None:
  """Ends the process where it is: an exception raised there could abandon orbax's writing threads
  mid-save, and the exit would wait on them forever. Every complete checkpoint stays, and the run
  lock is released: nothing more is written."""
  # Not imported yet, or only partly (a Ctrl-C during its import): no lock is held.
  release = getattr(sys.modules.get('trainer.run_lock'), 'release_held_locks', None)
  if release:
    release()
  fail('interrupted before the next checkpoint; the same command resumes from the newest one, or '
       f'starts afresh where none was saved: {this_command()}', 130, exit_now=os._exit)


def advice(error: UserError) -> str:
  """The error's one line, with a config field's fix in flag syntax."""
  if isinstance(error, ConfigError):
    return f'{error}; pass --config.{error.field}={error.fix}'
  return str(error)


def prepare(config: ml_collections.ConfigDict, run_dir: 'RunDirectory') -> Callable[[str], None]:
  """Checks the config, joins the other processes and sets up the compilation cache, before any
  computation (jax.distributed.initialize refuses after that); returns how to warn the user."""
  # pylint: disable=g-import-not-at-top; after flags, so --help and flag errors stay fast
  from trainer import backend, compile_cache, config_rules, processes, reporting
  try:
    config_rules.validate(config)
    launch = processes.Launch(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                              _DISTRIBUTED.value, _INIT_TIMEOUT.value)
    # From a watchdog thread, where sys.exit would end only the thread.
    joined = processes.join_run(launch,
                                give_up=functools.partial(fail, status=1, exit_now=os._exit))
    backend.start()  # After joining: JAX joins no run once its backend has started.
  except UserError as error:
    fail(advice(error), 1)
  if joined:
    processes.mute_native_stdout()
    processes.start_relay(run_dir, this_command())
  warn = functools.partial(reporting.warn, enabled=processes.is_primary())
  for note in config_rules.settings_to_warn_of(config):
    warn(note)
  compile_cache.enable(_COMPILATION_CACHE.value, warn)
  return warn


def main(argv: list[str]) -> None:
  del argv
  signal.signal(signal.SIGINT, lambda *_: interrupted())  # The run's from here on.
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    try:
      from trainer import config_rules  # pylint: disable=g-import-not-at-top; it imports JAX
      say('\n'.join(config_rules.flag_lines(config)), sys.stdout)  # `| head` is fine.
    except UserError as error:
      fail(advice(error), 1)
    return
  # gs:// run directories through gcsfs (fsspec), the tested path, not tf.io.gfile: no TensorFlow.
  os.environ.setdefault('EPATH_USE_TF', 'false')
  from trainer.run_dir import RunDirectory  # pylint: disable=g-import-not-at-top
  try:
    run_dir = RunDirectory(_WORKDIR.value or default_workdir())  # The one place it is read.
  except UserError as error:  # An s3:// or https:// --workdir.
    fail(advice(error), 1)
  warn = prepare(config, run_dir)
  # pylint: disable=g-import-not-at-top
  from trainer import compile_cache, loop
  # SIGTERM / SIGINT: finish the epoch, save it, then stop with the command to resume; a second
  # Ctrl-C is interrupted().
  stop_request = loop.StopRequest(interrupt=interrupted)
  try:
    with stop_request, compile_cache.one_warning(warn):
      _run(config, run_dir, stop_request)
  finally:  # The run's lines are out: a signal while Python exits ends it silently.
    end_quietly_on_signals()


def _run(config: ml_collections.ConfigDict, run_dir: 'RunDirectory',
         stop_request: Callable[[], str | None]) -> None:
  """Trains or evaluates; a user's mistake, a signal's stop or a lost peer ends in one line."""
  from trainer import evaluation, lifelines, loop, processes  # pylint: disable=g-import-not-at-top
  try:
    lifelines.watch(_COORDINATOR.value,
                   functools.partial(processes.stop_for_lost_peer, run_dir, this_command()))
    if config.eval_only:
      evaluation.evaluate_checkpoint(config, run_dir)
    else:
      loop.train_and_evaluate(config, run_dir, should_stop=stop_request,
                              lock_stale_after=_LOCK_STALE_AFTER.value)
  except UserError as error:
    fail(advice(error), 1, exit_now=processes.exit_past_abandoned_work)
  except loop.Preempted as stopped:
    print(f'{stopped}; resume with: {this_command()}', file=sys.stderr, flush=True)
    sys.exit(stopped.exit_status)
  except Exception as error:  # pylint: disable=broad-except; only a lost process is handled
    if not processes.lost_a_peer(error):
      raise
    processes.stop_for_lost_peer(run_dir, this_command())


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
