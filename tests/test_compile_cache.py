"""The compilation cache: where it lives, runs that share it, and a cache that cannot be written."""

import subprocess
import sys
import warnings

import pytest

from tests.conftest import ROOT, override_flags, read_metrics, without_timings
from trainer import compile_cache

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


def test_jax_cache_failures_are_one_warning_and_other_warnings_pass(recwarn):
  said = []
  with compile_cache.one_warning(said.append):
    for name in ('jit_a', 'jit_b'):
      warnings.warn(f"Error writing persistent compilation cache entry for '{name}': "
                    'OSError: [Errno 28] No space left on device')
    warnings.warn('something else')
  assert len(said) == 1
  assert 'OSError: [Errno 28] No space left on device' in said[0], said
  assert [str(w.message) for w in recwarn] == ['something else']


def launch(workdir, cache) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, 'train.py', *QUICK, *override_flags(), f'--workdir={workdir}',
       f'--compilation_cache={cache}'],
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


def entries(cache) -> dict[str, bytes]:
  """Each cached program's last-read stamp, by name (JAX writes one at every read)."""
  return {p.name: p.read_bytes() for p in cache.glob('*-atime')}


@pytest.mark.slow
def test_runs_share_the_cache_read_it_back_and_train_the_same_numbers(tmp_path, mnist_dir):
  cache = tmp_path / 'cache'
  # Two runs at once on an empty cache: both compile and write the same programs.
  assert finish([launch(tmp_path / 'a', cache), launch(tmp_path / 'b', cache)]) == ['', '']
  written = entries(cache)
  assert len(written) >= 3 and len(list(cache.glob('*-cache'))) == len(written)
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  warm, unwritable = finish([launch(tmp_path / 'warm', cache),
                             launch(tmp_path / 'none', blocker / 'cache')])
  assert warm == ''
  read_back = entries(cache)
  assert read_back.keys() == written.keys()  # Nothing new compiled,
  assert all(read_back[name] != written[name] for name in written)  # every program read back.
  assert unwritable.splitlines() == [
      f'warning: the compilation cache {blocker / "cache"} cannot be used (Not a directory); this '
      'run compiles every program itself (pass --compilation_cache=FOLDER, or '
      '--compilation_cache=off)']
  reference = without_timings(read_metrics(tmp_path / 'a'))
  for run in ('b', 'warm', 'none'):
    assert without_timings(read_metrics(tmp_path / run)) == reference, run
    assert (tmp_path / run / '1').is_dir()  # The checkpoint of its epoch.
