"""Trains the MNIST MLP: `python train.py --config=configs/default.py [--config.FIELD=VALUE ...]`."""

import functools
import os
import re
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from errors import ConfigError, UserError, fail

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file, e.g. configs/default.py; override fields with --config.FIELD=VALUE.',
    lock_config=True)
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


def _unknown_field(error: Exception) -> str:
  """'lerning_rate' -> the field name and ml_collections' suggestion, on one line."""
  text = str(error.args[0]) if error.args else str(error)
  name = re.search(r"'([\w.]+)", text)
  name = name.group(1) if name else text.split()[0]
  suggestion = re.search(r'Did you mean "([^"]+)"', text)
  hint = f'did you mean {suggestion.group(1)!r}?' if suggestion else 'check the name in the config file'
  return f'the config has no field {name!r}; {hint}'


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with every mistake reported as one line instead of a traceback."""
  try:
    rest = flags.FLAGS(argv)
    if flags.FLAGS['verbosity'].using_default_value:
      # Warnings and errors only (orbax logs every save at info); --verbosity=0 shows info logs.
      # Set here: app.run raises an unset verbosity to info, and a changed default counts as unset.
      flags.FLAGS.verbosity = -1
    config = _CONFIG.value
    if config is not None:
      config.keys()  # A config file that failed to load raises on first use: make that use here.
  except flags.Error as error:
    fail(f'{error}; run python train.py --helpshort for the flags', 2)
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


def advice(error: UserError) -> str:
  """The error's one line, with a config field's fix in flag syntax."""
  if isinstance(error, ConfigError):
    return f'{error}; pass --config.{error.field}={error.fix}'
  return str(error)


def main(argv: list[str]) -> None:
  del argv
  # pylint: disable=g-import-not-at-top; after flags, so --help and flag errors stay fast
  from trainer import config_checks, processes
  config, workdir = _CONFIG.value, _WORKDIR.value or default_workdir()
  try:
    config_checks.validate(config)
    # Before any computation: jax.distributed.initialize refuses after that.
    processes.join(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                   detect=_DISTRIBUTED.value, initialization_timeout=_INIT_TIMEOUT.value,
                   # From a watchdog thread, where sys.exit would end only the thread.
                   give_up=functools.partial(fail, status=1, exit_now=os._exit))
  except UserError as error:
    fail(advice(error), 1)
  from trainer import evaluation, loop, preemption
  # SIGTERM / SIGINT: finish the epoch, save it, then stop with the command to resume.
  with preemption.StopRequest() as stop_request:
    try:
      if config.eval_only:
        evaluation.evaluate_checkpoint(config, workdir)
      else:
        loop.train_and_evaluate(config, workdir, should_stop=stop_request)
    except UserError as error:
      fail(advice(error), 1)
    except preemption.Preempted as stopped:
      print(stopped, file=sys.stderr, flush=True)
      sys.exit(stopped.exit_status)
    except KeyboardInterrupt:  # Ctrl-C twice: no wait for the epoch boundary.
      fail('interrupted before the next checkpoint; rerun the same command to resume from the '
           'newest one', 130)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
