"""Where faults become the user's lines: an error, and what the program was doing when it met it
(errors.During), to the one line that names the problem and its fix. A table read top down: its
rows come first, in the order they are tried, each its kind of error beside its words; the first
that matches words the line, and an error of no row is a fault of the code, its traceback kept. It
imports the standard library and the project's error modules alone, and looks for a library's
errors only where that library is imported: a command's start stays fast."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import resource
import shlex
import sys
from collections.abc import Callable

from errors import (CheckpointUnreadable, ConfigError, During, ExtraMissing, SaveFailed, UserError,
                    causes, clipped, during, error_reason, first_cause, first_line, kinds_of,
                    shown)
from library_errors import (DEVICE_ALLOCATION, DEVICE_OUT_OF_MEMORY, LIBRARY_UNMAPPED,
                            TENSORSTORE_DENIED_STATUS, TENSORSTORE_OS_REASON,
                            TENSORSTORE_SPACE_STATUS, THREAD_REFUSED)
from trainer.host.cloud_storage import REMOTE_PREFIX

Matches = Callable[[BaseException], BaseException | None]  # The error a row words, or None.
Words = Callable[[BaseException, During | None], str]  # Its line, given the mark of what was done.
ROWS: list[tuple[Matches, Words]] = []  # The table, in the order its rows are tried: see below.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CREDENTIALS_HELP = ('on a Cloud TPU or GCE VM they come with its service account; elsewhere run '
                    '`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS')
# What a 429 or 5xx that outlasted the retries means, and the fix.
BUSY = ('busy or failing for a while, not this machine; rerun the same command later '
        '(https://status.cloud.google.com)')


def line(error: BaseException) -> str | None:
  """The user's line for `error`, by the first row of ROWS that it matches; None for a fault of the
  code, whose traceback is the report."""
  for matches, words in ROWS:
    found = matches(error)
    if found is not None:
      return ' '.join(words(found, during(error)).split())
  return None


def row(matches: Matches) -> Callable[[Words], Words]:
  """The next row of the table: the errors `matches` finds, worded by the decorated function."""
  def add(words: Words) -> Words:
    ROWS.append((matches, words))
    return words
  return add


def _of(*kinds: type) -> Callable[[BaseException], BaseException | None]:
  return lambda error: first_cause(error, lambda cause: isinstance(cause, kinds))


def _of_library(module: str, *names: str) -> Callable[[BaseException], BaseException | None]:
  """The first of an error's causes of these classes of `module`'s, where it is imported."""
  return lambda error: _of(*kinds_of(module, *names))(error)


# --- The rows, in the order they are tried. The machine's limits come first: they are met
# anywhere, and explain any failure raised from them. -------------------------------------------

@row(lambda error: first_cause(error, lambda cause: isinstance(cause, RuntimeError)
                               and str(cause) == THREAD_REFUSED))
def thread_refused(refused: BaseException, _: During | None = None) -> str:
  return (f'this machine would not start another thread ({refused}): it is short of memory or at '
          "its limit of processes (ulimit -u, or a container's pids limit); free memory or raise "
          'that limit, then rerun the same command')


def _memory(error: BaseException) -> BaseException | None:
  """XLA's error when a device could not allocate a buffer, or Python's MemoryError."""
  jax = sys.modules.get('jax')  # Not imported: no error of its.
  return first_cause(error, lambda cause: isinstance(cause, MemoryError) or (
      jax is not None and isinstance(cause, jax.errors.JaxRuntimeError)
      and bool(DEVICE_OUT_OF_MEMORY.search(str(cause)))))


# The fix when the device's memory runs out, by what it was doing (None: not known).
DEVICE_MEMORY_FIXES = {
    'training': 'lower batch_size, num_models or model.hidden_sizes in a new --workdir',
    'evaluating': 'lower eval_batch_size (the same command then resumes)',
    'classifying': 'classify on the CPU (JAX_PLATFORMS=cpu; the run sets the batch)',
    None: 'lower eval_batch_size (the same command then resumes), or batch_size, num_models or '
          'model.hidden_sizes in a new --workdir'}


@row(_memory)
def out_of_memory(memory_error: BaseException, marked: During | None) -> str:
  """The host's memory (Python's MemoryError), or a device's while doing what the mark says: what
  to lower, or a bigger device."""
  reason = error_reason(memory_error)
  if isinstance(memory_error, MemoryError):
    said = f'MemoryError: {reason}' if reason else 'MemoryError'
    return (f'this machine ran out of memory ({said}); free memory (close other programs, or '
            "raise the process's memory limit) and rerun the same command, or lower batch_size, "
            'num_models or model.hidden_sizes in a new --workdir, or use a machine with more '
            'memory')
  backend = sys.modules['jax'].default_backend()
  device = 'this machine' if backend == 'cpu' else f'the {backend.upper()}'
  doing = marked.doing if marked and marked.doing in DEVICE_MEMORY_FIXES else None
  fix = DEVICE_MEMORY_FIXES[doing]
  if doing == 'classifying' and backend == 'cpu':  # On the CPU already: only freed memory helps.
    fix = 'free memory (close other programs)'
  allocation = DEVICE_ALLOCATION.search(str(memory_error))  # A GPU's compiler's names it later.
  if allocation and not DEVICE_ALLOCATION.search(reason):
    reason = allocation.group(0)
  return (f'{device} ran out of memory{f" {doing}" if doing else ""} ({reason}); {fix}, or use a '
          'device with more memory')


@row(lambda error: first_cause(error, lambda cause: isinstance(cause, ImportError)
                               and bool(LIBRARY_UNMAPPED.match(str(cause)))))
def library_unmapped(error: BaseException, _: During | None = None) -> str:
  """A compiled library the system would not load, by its likely reason: the system refuses a
  noexec filesystem's; memory bounds any."""
  named = LIBRARY_UNMAPPED.match(str(error)).group(1)  # type: ignore[union-attr]
  library = shown(named) if os.path.isabs(named) else named  # A bare name: a library it needs.
  said = f'the system would not load {library} (failed to map segment from shared object)'
  with contextlib.suppress(OSError):
    if os.statvfs(named if os.path.isabs(named) else sys.prefix).f_flag & os.ST_NOEXEC:
      return (f'{said}: its filesystem is mounted noexec; make the environment where programs may '
              'run (make train VENV=/path/there/venv) and run the command with its Python '
              '(/path/there/venv/bin/python)')
  limit = resource.getrlimit(resource.RLIMIT_AS)[0]
  if limit != resource.RLIM_INFINITY:
    return (f"{said}: this process's memory limit ({limit >> 20} MiB of address space, ulimit -v) "
            'is too small; raise it (ulimit -v unlimited), then rerun the same command')
  return (f'{said}: this machine may be short of memory, or a security policy may forbid loading '
          'it from there; free memory and rerun the same command, or make the environment '
          'elsewhere (make train VENV=/path/there/venv)')


@row(lambda error: error if isinstance(error, ExtraMissing) else None)
def extra_missing(error: BaseException, _: During | None) -> str:
  """A library of an extra that `make train` leaves out, which what the user asked for needs."""
  asked, library, install, instead = error.args
  return (f'{asked} needs {library} ({error.__cause__}), an extra that `make train` leaves out: '
          f'{install}, or {instead}')


@row(lambda error: error if isinstance(error, UserError) else None)  # Its line given where found.
def user_error(error: BaseException, _: During | None = None) -> str:
  """The error's own line, with a config field's fix in flag syntax."""
  if isinstance(error, ConfigError):
    return f'{error}; pass --config.{error.field}={error.fix}'
  return str(error)


@row(lambda error: error if getattr(during(error), 'doing', '') == 'preparing MNIST' else None)
def tfds_refused(error: BaseException, marked: During | None) -> str:
  """TFDS refusing the files it was to prepare MNIST from (a checksum not its own, say)."""
  from data.tfds_source import FILES_HELP  # pylint: disable=g-import-not-at-top; loaded: its error
  return (f'TFDS could not prepare MNIST from {getattr(marked, "path", "")} '
          f'({type(error).__name__}: {first_line(str(error))}); {FILES_HELP}')


@row(_of_library('gcsfs.retry', 'HttpError'))
def http_answer(error: BaseException, marked: During | None) -> str:
  """gcsfs's answer once its retries are spent: credentials that lapsed, or a service busy."""
  answer = error_reason(error) or type(error).__name__
  doing, path = (marked.doing, marked.path) if marked else ('using', '')
  if getattr(error, 'code', None) == 401:
    return (f'Cloud Storage refused the credentials {doing} {path} ({answer}); {CREDENTIALS_HELP}, '
            'then rerun the same command')
  return f'Cloud Storage answered {answer} {doing} {path}, again after the retries: {BUSY}'


def _unanswered(error: BaseException) -> BaseException | None:
  """Cloud Storage's retries run out, or no answer at all (a connection refused, a timeout)."""
  return _of(*kinds_of('google.api_core.exceptions', 'RetryError', 'TooManyRequests',
                      'ServerError'), *kinds_of('google.auth.exceptions', 'TransportError'),
             *kinds_of('requests', 'ConnectionError', 'Timeout'))(error)


@row(_unanswered)
def unanswered(error: BaseException, marked: During | None) -> str:
  """Retries run out: Cloud Storage busy or failing (429, 5xx: the network is fine), or no answer
  at all (offline, no name server)."""
  answer = _of_library('google.api_core.exceptions', 'TooManyRequests', 'ServerError')(error)
  bucket = _bucket(marked)[1]
  if answer is not None:
    retried = _of_library('google.api_core.exceptions', 'RetryError')(error)
    return (f'Cloud Storage answered {bucket} with {answer.code} '  # type: ignore[attr-defined]
            f'{error_reason(answer.message)}'  # type: ignore[attr-defined]
            f'{" until the retries ran out" if retried else ""}: {BUSY}')
  chain = [*causes(error)]
  said = [cause.strerror for cause in chain if isinstance(cause, OSError) and cause.strerror]
  reason = said[-1] if said else error_reason(chain[-1])
  return (f'cannot reach Cloud Storage for {bucket} ({reason}); check this machine\'s network '
          'connection, then rerun the same command')


@row(_of_library('google.api_core.exceptions', 'NotFound'))
def bucket_missing(error: BaseException, marked: During | None) -> str:
  workdir, bucket = _bucket(marked)
  return (f'the bucket {bucket} of --workdir={workdir} does not exist; create it (gcloud storage '
          f'buckets create {bucket} --location=REGION) or pass another --workdir')


@row(_of_library('google.api_core.exceptions', 'Forbidden', 'Unauthorized'))
def bucket_forbidden(error: BaseException, marked: During | None) -> str:
  bucket = _bucket(marked)[1]
  return (f'no permission to use {bucket} ({error.code} {error.message}); '  # type: ignore
          "give this machine's account the Storage Object Admin role on the bucket (gcloud "
          f'storage buckets add-iam-policy-binding {bucket} ...) or pass another --workdir')


@row(_of_library('google.auth.exceptions', 'RefreshError'))
def not_refreshed(error: BaseException, marked: During | None) -> str:
  """Credentials found but not refreshed: failing for now (retryable), or refused (expired)."""
  bucket = _bucket(marked)[1]
  reason = error_reason(error.args[0] if error.args else error)
  if getattr(error, 'retryable', False):
    return (f'the Google Cloud credentials to reach {bucket} could not be refreshed for now '
            f'({reason}); rerun the same command later')
  return (f'the Google Cloud credentials found could not be refreshed to reach {bucket} '
          f'({reason}): expired or revoked; {CREDENTIALS_HELP}')


@row(_of_library('google.auth.exceptions', 'GoogleAuthError'))
def no_credentials(error: BaseException, marked: During | None) -> str:
  return (f'no Google Cloud credentials to reach {_bucket(marked)[1]} ({type(error).__name__}); '
          f'{CREDENTIALS_HELP}')


@row(_of_library('sqlalchemy.exc', 'OperationalError', 'InterfaceError'))
def study_storage_lost(error: BaseException, _: During | None) -> str:
  """A search's study database that stopped answering mid-batch (its server down, no network)."""
  return (f'the study storage stopped answering ({type(error).__name__}: '
          f'{clipped(error_reason(error))}); the running trials go stale, and the same command '
          'trains them again once the storage answers')


@row(_of(SaveFailed))
def save_failed(error: BaseException, _: During | None) -> str:
  """A checkpoint's save refused, naming the checkpoint a rerun resumes from."""
  assert isinstance(error, SaveFailed)
  if _run_dir_gone(error.directory):
    failed = _removed(error.directory)
  else:
    failed = write_failed(error.directory, error.__cause__ or error, saved=bool(error.kept))
    failed = f'{failed} (epoch {error.kept[-1]})' if error.kept else failed
  if error.stopped:
    return f'stopped by {error.stopped}, but its checkpoint was not saved: {failed}'
  return failed


@row(_of(CheckpointUnreadable))
def checkpoint_unreadable(error: BaseException, _: During | None) -> str:
  """Not damage, so nothing is set aside: the fix is the user's access or storage."""
  assert isinstance(error, CheckpointUnreadable)
  cause = list(causes(error))[-1]  # Orbax wraps a failed read in an Exception that names none.
  fix = ('let this user read its files, then rerun the same command'
         if isinstance(cause, PermissionError) or TENSORSTORE_DENIED_STATUS in str(cause)
         else 'rerun the same command once the storage reads again')
  return (f'cannot read the checkpoint of epoch {error.epoch} in {error.directory} '
          f'({type(cause).__name__}: {clipped(str(cause))}); every checkpoint was left in place: '
          f'{fix}')


def _missing_module(error: BaseException) -> BaseException | None:
  """A module this Python lacks, also where a library raised its own ImportError from it
  (jax.export's 'Please install flatbuffers'); not a module of the project's own."""
  if not isinstance(error, ImportError):
    return None
  missing = first_cause(error, lambda cause: isinstance(cause, ModuleNotFoundError))
  top = (getattr(missing, 'name', None) or '').split('.')[0]
  if not top or any(os.path.isfile(os.path.join(PROJECT_ROOT, *path))
                    for path in ((top, '__init__.py'), (f'{top}.py',))):
    return None
  return missing


@row(_missing_module)
def missing_module(error: BaseException, _: During | None = None) -> str:
  """A module this Python lacks, as where a command is run without the project's environment."""
  name = getattr(error, 'name', None) or ''
  top, python = name.split('.')[0], shown(sys.executable)
  if top in getattr(sys, 'stdlib_module_names', ()):  # Python 3.10 and later know theirs.
    return (f'this Python ({python}) was built without its standard module {name!r} (a system '
            'library was missing as it was compiled); make the environment with another Python: '
            'make clean-env train PYTHON=/path/to/python3.12')
  what = (f"this Python's {top} has no module {name!r} (another version than the project pins?)"
          if top != name and _installed(top) else f'this Python ({python}) has no module {name!r}')
  venv = os.path.join(PROJECT_ROOT, '.venv')
  reinstall = f'{python} -m pip install -r {shown(os.path.join(PROJECT_ROOT, "requirements.txt"))}'
  if os.path.realpath(sys.prefix) == os.path.realpath(venv):
    return f'{what}, which this project needs; install its requirements again: {reinstall}'
  fix = (f'run the command with the Python of its environment (make train makes it): '
         f'{shown(os.path.join(venv, "bin", "python"))} {shlex.join(sys.argv)}')
  if sys.prefix != sys.base_prefix and sys.version_info >= (3, 11):  # A virtual environment.
    fix += f', or install the requirements into this one: {reinstall}'
  return f'{what}, which this project needs; {fix}'


def _joining(error: BaseException) -> BaseException | None:
  """JAX's refusal of a launch's arguments, met joining the run's other processes."""
  marked = during(error)
  return error if marked and marked.doing == 'joining' and isinstance(
      error, (ValueError, TypeError, RuntimeError)) else None


@row(_joining)
def could_not_join(error: BaseException, _: During | None) -> str:
  return (f'could not join the multi-process run ({error}); on each process pass '
          "--coordinator_address=HOST:PORT (process 0's), --num_processes=N and --process_id=I "
          'with I from 0 to N-1, or on a TPU pod slice only --distributed')


def _marked_os_error(error: BaseException) -> BaseException | None:
  """An OSError met where the program marked what file it read or wrote."""
  marked = during(error)
  return error if isinstance(error, OSError) and marked is not None and (
      marked.doing in REFUSALS or marked.doing == 'writing') else None


@row(_marked_os_error)
def refused(error: BaseException, marked: During | None) -> str:
  """A file the OS would not write or read where the mark says: a run directory that is gone is
  named as such."""
  assert marked is not None, 'refusals are marked'
  if _run_dir_gone(marked.run_dir):
    return _removed(marked.run_dir)
  if marked.doing not in REFUSALS:
    return write_failed(marked.path, error)
  named = getattr(error, 'filename', None) if marked.doing == 'loading data' else None
  return REFUSALS[marked.doing].format(path=named or marked.path, reason=os_reason(error))


# --- What the rows' words share -----------------------------------------------------------------

# What the OS's refusal means, by what the program was doing, given the path it did it on and the
# OS's reason ('writing' a file: write_failed, whose fix depends on the reason).
REFUSALS = {
    'reading': ('cannot read {path} ({reason}); move it out of the run directory or restore it, '
                'then rerun the same command'),
    'writing the output': ('cannot write the output ({reason}); free space where it is '
                           'redirected, then rerun the same command'),
    'creating the run directory': ('cannot create the run directory {path} ({reason}); pass a '
                                   '--workdir that can be written to'),
    # The file the OS names: one of the data folder's, or the folder itself.
    'loading data': ('{path} cannot be read ({reason}); give this user read access to it and its '
                     'folder, or set --config.data.dir to a folder that holds a readable copy'),
    'listing the images': ('cannot list the folder {path} ({reason}); pass a folder that can be '
                           'read, or the image files themselves')}


def _installed(module: str) -> bool:
  with contextlib.suppress(ImportError, ValueError):
    return importlib.util.find_spec(module) is not None
  return False


def _bucket(marked: During | None) -> tuple[str, str]:
  """The run directory a Cloud Storage error was met on, and its bucket (gs://NAME)."""
  workdir = marked.path if marked else ''
  return workdir, f'{REMOTE_PREFIX}{workdir[len(REMOTE_PREFIX):].split("/", 1)[0]}'


# The fix for a write the OS refused, by its reason; any other (a full disk, lost access): free
# space or restore access.
WRITE_FIXES = {
    # A folder for a file, or back; a file where a folder on the way is made (os.makedirs).
    **dict.fromkeys((os.strerror(errno.EISDIR), os.strerror(errno.ENOTDIR),
                     os.strerror(errno.EEXIST)), 'move the folder or file in its way out of it'),
    # A folder on the way gone, or one that takes no new files.
    os.strerror(errno.ENOENT): 'make sure the folder that holds it is there and takes new files',
    # The process's limit of open files (ulimit -n) reached, or the whole system's.
    os.strerror(errno.EMFILE): 'raise the limit of open files (ulimit -n)',
    os.strerror(errno.ENFILE): "close other programs: the system's open files are at its limit"}


def os_reason(error: BaseException) -> str:
  """The OS's reason, or inside orbax's (tensorstore's) error text, whose form varies by version."""
  if reason := getattr(error, 'strerror', None):
    return reason
  text = str(error)
  if found := TENSORSTORE_OS_REASON.search(text):
    return found.group(1)
  if TENSORSTORE_SPACE_STATUS in text:
    return 'No space left on device, or over quota'
  return clipped(text)


def write_failed(path: str, error: BaseException, saved: bool | None = None) -> str:
  """A write the machine refused (full disk, lost permission, I/O error). `saved`: whether a
  checkpoint is there to resume from; None where the writer cannot tell."""
  reason = os_reason(error)
  then = {True: ' to resume from the newest checkpoint',
          False: ' to start again: no checkpoint is there to resume from', None: ''}[saved]
  fix = WRITE_FIXES.get(reason, 'free space or restore access there')
  return f'cannot write {path} ({reason}); {fix}, then rerun the same command{then}'


def _removed(run_dir: str) -> str:
  return (f'the run directory {run_dir} was removed or moved while the run wrote there; move it '
          'back and rerun the same command to resume, or rerun it to start again')


def _run_dir_gone(run_dir: str) -> bool:
  return bool(run_dir) and not run_dir.startswith(REMOTE_PREFIX) and not os.path.isdir(run_dir)
