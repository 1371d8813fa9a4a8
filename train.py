"""Trains the MNIST MLP: `python train.py --config=configs/default.py [--config.FIELD=VALUE]`."""

import os

if __name__ == '__main__':  # A Ctrl-C or SIGTERM, or a library missing: one line, no traceback.
  from trainer.host import boundary
  HOST = boundary.start('stopped by {signal} while starting; nothing was written')

# pylint: disable=wrong-import-position
from ml_collections import config_flags
from absl import flags

from command import parse_or_help
from errors import UsageError, shown
from trainer.config_file import ConfigFileParser, pass_a_config
from trainer.host.boundary import Host, Phase

_CONFIG = config_flags.DEFINE_config_file(
    'config', None,
    'Config file, e.g. configs/default.py; override fields with --config.FIELD=VALUE.',
    lock_config=True)
# Flag.parser is absl's public attribute; ml_collections takes no parser of our own.
flags.FLAGS['config'].parser = ConfigFileParser()
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
_SEARCH_STORAGE = flags.DEFINE_string(
    'search_storage', None, "Where a search's study is kept, for launches to share it: an RDB "
    'URL (postgresql://USER:PASSWORD@HOST/DATABASE) or journal:PATH, a journal file on a shared '
    'filesystem (default: sqlite:///<workdir>/study.db).')
_SEARCH_STUDY = flags.DEFINE_string(
    'search_study', None, "The search's study, which every launch that names it joins (default: "
    "the run directory's name).")
_COMPILATION_CACHE = flags.DEFINE_string(
    'compilation_cache', None, 'Folder of compiled programs that later launches load instead of '
    'compiling (default: $JAX_COMPILATION_CACHE_DIR if set, else '
    '$XDG_CACHE_HOME/mnist-mlp/jax-compilation-cache, XDG_CACHE_HOME defaulting to ~/.cache); '
    'off: compile every program.')


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with every mistake raised as the UsageError of its one line."""
  try:
    rest = parse_or_help(argv)
  except flags.Error as error:
    raise UsageError(f'{error}; run python {shown(__file__)} --helpshort for the flags') from None
  if len(rest) > 1:
    raise UsageError(f'unexpected arguments {rest[1:]}; flags look like --config.FIELD=VALUE')
  if _CONFIG.value is None:
    raise UsageError(f'no config given; {pass_a_config()}')
  return rest


def default_workdir() -> str:
  """checkpoints/<config file name without .py>[-<its argument>], beside this file."""
  config_file, _, argument = config_flags.get_config_filename(flags.FLAGS['config']).partition(':')
  name = os.path.splitext(os.path.basename(config_file))[0] + (f'-{argument}' if argument else '')
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'checkpoints', name)


def main(argv: list[str], host: Host) -> None:
  """Checks the config, joins the other processes, then trains or evaluates the run."""
  del argv
  config = _CONFIG.value
  # pylint: disable=g-import-not-at-top; after flags, so --help and flag errors stay fast
  from trainer import config_fields, config_rules
  if _PRINT_CONFIG.value:
    host.say('\n'.join(config_fields.flag_lines(config)))  # `| head` is fine.
    return
  host.phase(Phase.RUNNING)  # The run's from here on: a Ctrl-C ends it, its lock released.
  # gs:// run directories through gcsfs (fsspec), the tested path, not tf.io.gfile: no TensorFlow.
  os.environ.setdefault('EPATH_USE_TF', 'false')
  from trainer import evaluation, loop
  from trainer.host import backend, compile_cache
  from trainer.host.peers import Launch
  from trainer.host.run_dir import RunDirectory
  from trainer.plan import resolve
  run_dir = RunDirectory(_WORKDIR.value or default_workdir(), _LOCK_STALE_AFTER.value)
  config_rules.validate(config)  # Before any computation, which JAX's joining must precede.
  host.join(Launch(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                   _DISTRIBUTED.value, _INIT_TIMEOUT.value), run_dir)
  backend.start()
  for note in config_rules.settings_to_warn_of(config):
    host.warn(note)
  compile_cache.enable(_COMPILATION_CACHE.value, host.warn)
  # The run resolved once: its devices checked before any work (a search's, each batch's).
  plan = None if config.search.trials else resolve(config)
  with host.phase(Phase.EPOCHS), compile_cache.one_warning(host.warn):
    if plan is None:
      from trainer import search
      search.search(config, run_dir, host, _SEARCH_STORAGE.value, _SEARCH_STUDY.value)
    elif config.eval_only:
      evaluation.evaluate_checkpoint(plan, run_dir, host)
    else:
      loop.train_and_evaluate(plan, run_dir, host)


if __name__ == '__main__':
  HOST.run(lambda argv: main(argv, HOST), parse_flags)
