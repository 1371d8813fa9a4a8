"""The compilation cache: where it lives, runs that share it, and a cache that cannot be written."""

import json
import pathlib
import subprocess
import sys
import warnings

import jax
import pytest

from tests.conftest import ROOT, override_flags, read_metrics, without_timings
from trainer.host import compile_cache

QUICK = ['--config=configs/quick.py', '--config.num_epochs=1']


def test_the_flag_wins_then_jax_variable_then_the_users_cache_folder(tmp_path):
  home = {'HOME': str(tmp_path)}
  assert compile_cache.choose_folder(None, home) == str(
      tmp_path / '.cache' / 'mnist-mlp' / 'jax-compilation-cache')
  xdg = {**home, 'XDG_CACHE_HOME': '/x'}
  assert compile_cache.choose_folder(None, xdg) == '/x/mnist-mlp/jax-compilation-cache'
  jax_variable = {**xdg, 'JAX_COMPILATION_CACHE_DIR': '/j'}
  assert compile_cache.choose_folder(None, jax_variable) == '/j'
  assert compile_cache.choose_folder(str(tmp_path / 'c'), jax_variable) == str(tmp_path / 'c')
  assert compile_cache.choose_folder('off', jax_variable) is None


@pytest.mark.parametrize('where, reason', [('a_file', 'it is a file'),
                                           ('a_file/cache', 'Not a directory')])
def test_a_file_in_the_cache_folders_place_is_one_warning_naming_it(where, reason, tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  (tmp_path / 'a_file').write_text('')
  said = []
  kept = {name: getattr(jax.config, name)
          for name in ('jax_enable_compilation_cache', 'jax_compilation_cache_dir')}
  try:
    assert compile_cache.enable(str(tmp_path / where), said.append) is None
    assert jax.config.jax_enable_compilation_cache is False
  finally:  # The suite's own cache, for the tests after this one.
    for name, value in kept.items():
      jax.config.update(name, value)
  assert said == [f'the compilation cache {tmp_path / where} cannot be used ({reason}); this run '
                  'compiles every program itself (pass --compilation_cache=FOLDER, or '
                  '--compilation_cache=off)']


def test_jax_cache_failures_are_one_warning_naming_the_folder_and_other_warnings_pass(recwarn,
                                                                                      tmp_path):
  said = []
  before = jax.config.jax_compilation_cache_dir
  jax.config.update('jax_compilation_cache_dir', str(tmp_path))
  try:
    with compile_cache.one_warning(said.append):
      for name in ('jit_a', 'jit_b'):
        warnings.warn(f"Error writing persistent compilation cache entry for '{name}': "
                      'OSError: [Errno 28] No space left on device')
      warnings.warn('something else')
  finally:
    jax.config.update('jax_compilation_cache_dir', before)
  assert len(said) == 1
  assert said[0].startswith(f'the compilation cache {tmp_path} failed (OSError: [Errno 28] No '
                            'space left on device); the run goes on'), said
  assert [str(w.message) for w in recwarn] == ['something else']


# train.py as a user launches it, counting JAX's compilation cache events (jax.monitoring, JAX's
# public instrumentation) into the file named first.
COUNTING = """
import atexit, collections, json, pathlib, runpy, sys
import jax.monitoring
counts, path = collections.Counter(), pathlib.Path(sys.argv.pop(1))
jax.monitoring.register_event_listener(lambda event, **_: counts.update([event]))
atexit.register(lambda: path.write_text(json.dumps(counts)))
sys.argv = sys.argv[1:]
runpy.run_path('train.py', run_name='__main__')
"""


def launch(workdir, cache) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, '-c', COUNTING, f'{workdir}.events', 'train.py', *QUICK, *override_flags(),
       f'--workdir={workdir}', f'--compilation_cache={cache}'],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(processes: list[subprocess.Popen]) -> list[str]:
  """Each process's stderr, once all have ended with status 0."""
  try:
    outputs = [p.communicate(timeout=300) for p in processes]
  finally:
    for p in processes:
      p.kill()
  assert [p.returncode for p in processes] == [0] * len(processes), outputs
  return [err for _, err in outputs]


def cache_events(workdir) -> dict[str, int]:
  """How often the run's programs went to the cache (requests), loaded from it (hits), were
  compiled and written to it (misses)."""
  counts = json.loads(pathlib.Path(f'{workdir}.events').read_text())
  prefix = '/jax/compilation_cache/'
  return {name.removeprefix(prefix): n for name, n in counts.items() if name.startswith(prefix)}


@pytest.mark.slow
def test_runs_share_the_cache_read_it_back_and_train_the_same_numbers(tmp_path, mnist_dir):
  cache = tmp_path / 'cache'
  # Two runs at once on an empty cache: both compile and write the same programs.
  assert finish([launch(tmp_path / 'a', cache), launch(tmp_path / 'b', cache)]) == ['', '']
  compiled = [cache_events(tmp_path / run).get('cache_misses', 0) for run in ('a', 'b')]
  assert sum(compiled) >= 3 and any(cache.iterdir())  # Compiled, and written for later launches.
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  warm, unwritable = finish([launch(tmp_path / 'warm', cache),
                             launch(tmp_path / 'none', blocker / 'cache')])
  assert warm == ''
  relaunched = cache_events(tmp_path / 'warm')
  # Every program loaded from the cache, none compiled.
  assert relaunched['cache_hits'] == relaunched['compile_requests_use_cache'] >= 3
  assert 'cache_misses' not in relaunched
  assert 'compile_requests_use_cache' not in cache_events(tmp_path / 'none')
  assert unwritable.splitlines() == [
      f'warning: the compilation cache {blocker / "cache"} cannot be used (Not a directory); this '
      'run compiles every program itself (pass --compilation_cache=FOLDER, or '
      '--compilation_cache=off)']
  reference = without_timings(read_metrics(tmp_path / 'a'))
  for run in ('b', 'warm', 'none'):
    assert without_timings(read_metrics(tmp_path / run)) == reference, run
    assert (tmp_path / run / '1').is_dir()  # The checkpoint of its epoch.
