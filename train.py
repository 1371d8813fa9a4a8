"""Trains the MNIST MLP: `python train.py --config=configs/default.py [--config.FIELD=VALUE]`."""

import contextlib
import functools
import logging
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if __name__ == '__main__':  # Ctrl-C, or a library missing, is one line, never a traceback.
  from errors import start_command
  start_command('stopped by Ctrl-C while starting; nothing was written')

import ml_collections  # pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from errors import CONFIG_FIELD_GUESS, CONFIG_FIELD_NAMED, ConfigError, UserError, fail, say

if TYPE_CHECKING:
  from trainer.run_dir import RunDirectory


class ConfigFileFailed(Exception):
  """The config file's own code raised: one line naming the exception and the file."""


class ConfigFileParser(flags.ArgumentParser):
  """ml_collections' own loader, telling an exception of the file's code from override typos."""

  def __init__(self, loader: flags.ArgumentParser):
    self.loader = loader

  def parse(self, argument: str) -> ml_collections.ConfigDict:
    file = os.path.abspath(argument.split(':', 1)[0])
    try:
      with _loader_logs_muted():  # Its warning of a get_config() that returned None: said below.
        config = self.loader.parse(argument)
    except Exception as error:  # The config file is user code: any failure in it is theirs to fix.
      # ml_collections re-raises a TypeError or ValueError with the traceback as its message.
      cause = (error.__context__ if 'Error whilst parsing' in str(error) else None) or error
      raise ConfigFileFailed(_config_file_failure(cause, file)) from None
    if config is None:
      raise ConfigFileFailed(f'get_config() of the config file {file} returned None; return the '
                             'ml_collections.ConfigDict it builds')
    return config

  def flag_type(self) -> str:
    return self.loader.flag_type()


def _config_file_failure(cause: BaseException, file: str) -> str:
  """The line for an exception of a config file's code, in its own words where it checked the
  user's argument (a UserError)."""
  if isinstance(cause, UserError):
    return str(cause)
  if isinstance(cause, AttributeError) and 'get_config' in str(cause):
    return (f'the config file {file} has no get_config(); define one that returns an '
            'ml_collections.ConfigDict, or pass --config=configs/default.py')
  lines = [f.lineno for f in traceback.extract_tb(cause.__traceback__)
           if os.path.abspath(f.filename) == file]
  where = f'{file}, line {lines[-1]}' if lines else file
  text = ' '.join(str(cause).split())
  return (f'the config file raised {type(cause).__name__}{": " + text if text else ""} ({where}); '
          'fix it, or pass --config=configs/default.py')


@contextlib.contextmanager
def _loader_logs_muted() -> Iterator[None]:
  """Drops ml_collections' log records about loading a config file, which train.py words itself."""
  muted = lambda record: not record.pathname.endswith('config_flags.py')
  absl_logger = logging.getLogger('absl')
  absl_logger.addFilter(muted)
  try:
    yield
  finally:
    absl_logger.removeFilter(muted)


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


HELP_FLAGS = {'--help', '--helpshort', '--helpfull', '-h', '-?', '--helpxml'}


def config_flag_lines(config: ml_collections.ConfigDict) -> list[str]:
  """Each field of the config as the flag that sets it to its value, for --print_config."""
  from trainer import config_rules  # pylint: disable=g-import-not-at-top
  return [f'--config.{name}={shlex.quote(value if isinstance(value, str) else repr(value))}'
          for name, value in sorted(config_rules.fields(config).items())]


def _unknown_field(error: Exception) -> str:
  """'lerning_rate' -> the field name and ml_collections' suggestion, on one line."""
  text = str(error.args[0]) if error.args else str(error)
  found = CONFIG_FIELD_NAMED.search(text)
  name = found.group(1) if found else text.split()[0]
  suggestion = CONFIG_FIELD_GUESS.search(text)
  hint = (f'did you mean {suggestion.group(1)!r}?' if suggestion
          else 'check the name in the config file')
  return f'the config has no field {name!r}; {hint}'


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with every mistake reported as one line instead of a traceback."""
  try:
    try:
      rest = flags.FLAGS(argv)
    except SystemExit as done:  # absl's --help, --helpshort and --helpfull exit 1 once printed.
      sys.exit(0 if set(argv) & HELP_FLAGS else done.code)
    if flags.FLAGS['verbosity'].using_default_value:
      # Warnings and errors only (orbax logs every save at info); --verbosity=0 shows info logs.
      # Set here: app.run raises an unset verbosity to info, and a changed default counts as unset.
      flags.FLAGS.verbosity = -1  # type: ignore[assignment]
    config = _CONFIG.value
    if config is not None:
      config.keys()  # A config file that failed to load raises on first use: make that use here.
  except flags.Error as error:
    fail(f'{error}; run python train.py --helpshort for the flags', 2)
  except ConfigFileFailed as error:
    fail(str(error), 2)
  except (AttributeError, KeyError) as error:
    fail(_unknown_field(error), 2)
  except OSError as error:
    fail(f'cannot load the config file ({str(error).splitlines()[-1].strip()}); pass '
          '--config=configs/default.py or another file in configs/', 2)
  except Exception as error:  # The config file is user code: any failure in it is theirs to fix.
    fail(f'the config could not be built ({type(error).__name__}: {error})', 2)
  if len(rest) > 1:
    fail(f'unexpected arguments {rest[1:]}; flags look like --config.FIELD=VALUE', 2)
  if config is None:
    fail('no config given; pass --config=configs/default.py (or another file in configs/)', 2)
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
  release = getattr(sys.modules.get('trainer.run_dir'), 'release_held_locks', None)
  if release:
    release()
  fail(f'interrupted before the next checkpoint; resume from the newest one with: {this_command()}',
       130, exit_now=os._exit)


def advice(error: UserError) -> str:
  """The error's one line, with a config field's fix in flag syntax."""
  if isinstance(error, ConfigError):
    return f'{error}; pass --config.{error.field}={error.fix}'
  return str(error)


_ENDING = threading.Lock()  # Held by the first thread to end the process for a lost peer.
ABANDONED_GRACE_S = 5.0  # How long an error's exit waits for threads still running.


def exit_past_abandoned_work(status: int) -> None:
  """sys.exit, or at once where threads outlive the run: a save that failed before its folder was
  made leaves orbax's threads waiting minutes for that folder, which would hold the exit, then print
  their tracebacks. (The run closed its checkpoints first: every save that could end has ended.)
  The error's line is out: what threads that the error stranded report after it is not shown."""
  from trainer import processes, run_dir as run_dirs  # pylint: disable=g-import-not-at-top
  processes.quiet_stderr()
  others = [thread for thread in threading.enumerate()
            if not thread.daemon and thread is not threading.current_thread()]
  deadline = time.monotonic() + ABANDONED_GRACE_S  # Polled: orbax's threads' join() may raise.
  while any(thread.is_alive() for thread in others) and time.monotonic() < deadline:
    time.sleep(0.05)
  if any(thread.is_alive() for thread in others):
    run_dirs.release_held_locks()
    processes.end_now(status)
  sys.exit(status)


def _stop_for_lost_peer(run_dir: 'RunDirectory') -> None:
  """Ends a process whose peer is gone at once, its run lock released (it writes nothing more):
  JAX's own exit would wait for the peer, then abort. Called by whichever learns of it first: the
  lifelines' thread, or the main thread's failed collective."""
  if not _ENDING.acquire(blocking=False):
    threading.Event().wait()  # The other thread is ending the process.
  from trainer import processes, run_dir as run_dirs  # pylint: disable=g-import-not-at-top
  processes.hold_stderr()  # JAX, where it aborts the process now, waits for this line.
  line = processes.lost_peer_line(run_dir, this_command())
  run_dirs.release_held_locks()  # Before the line: a warning of its release is not cut off.
  sys.stdout.flush()
  fail(line, 1, exit_now=processes.end_now)


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
  compile_cache.enable(_COMPILATION_CACHE.value, warn)
  return warn


def main(argv: list[str]) -> None:
  del argv
  signal.signal(signal.SIGINT, lambda *_: interrupted())  # The run's from here on.
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    try:
      say('\n'.join(config_flag_lines(config)), sys.stdout)  # `| head` is fine.
    except UserError as error:
      fail(advice(error), 1)
    return
  # gs:// run directories through gcsfs (fsspec), the tested path, not tf.io.gfile: no TensorFlow.
  os.environ.setdefault('EPATH_USE_TF', 'false')
  from trainer.run_dir import RunDirectory  # pylint: disable=g-import-not-at-top
  run_dir = RunDirectory(_WORKDIR.value or default_workdir())  # The one place --workdir is read.
  warn = prepare(config, run_dir)
  # pylint: disable=g-import-not-at-top
  from trainer import compile_cache, loop
  # SIGTERM / SIGINT: finish the epoch, save it, then stop with the command to resume; a second
  # Ctrl-C is interrupted().
  stop_request = loop.StopRequest(interrupt=interrupted)
  try:
    with stop_request, compile_cache.one_warning(warn):
      _run(config, run_dir, stop_request)
  finally:
    if stop_request.signal_name:  # Its line is out: a Ctrl-C while Python exits ends it silently.
      signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def _run(config: ml_collections.ConfigDict, run_dir: 'RunDirectory',
         stop_request: Callable[[], str | None]) -> None:
  """Trains or evaluates; a user's mistake, a signal's stop or a lost peer ends in one line."""
  from trainer import evaluation, lifelines, loop, processes  # pylint: disable=g-import-not-at-top
  try:
    lifelines.watch(_COORDINATOR.value, functools.partial(_stop_for_lost_peer, run_dir))
    if config.eval_only:
      evaluation.evaluate_checkpoint(config, run_dir)
    else:
      loop.train_and_evaluate(config, run_dir, should_stop=stop_request,
                              lock_stale_after=_LOCK_STALE_AFTER.value)
  except UserError as error:
    fail(advice(error), 1, exit_now=exit_past_abandoned_work)
  except loop.Preempted as stopped:
    print(f'{stopped}; resume with: {this_command()}', file=sys.stderr, flush=True)
    sys.exit(stopped.exit_status)
  except Exception as error:  # pylint: disable=broad-except; only a lost process is handled
    if not processes.lost_a_peer(error):
      raise
    _stop_for_lost_peer(run_dir)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
