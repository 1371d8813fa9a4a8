"""export.py: a run's classifier as files that serve without this project, and its mistakes."""

import importlib.metadata
import importlib.util
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from data.idx import load_idx
from data.mnist import load_split
from errors import UserError
from serving.folder import OutFolder
from tests.conftest import (MNIST_DIR, ROOT, TENSORFLOW_LOGS_AT_IMPORT, line_of, make_config,
                            override_flags, run_train, signalled_in)
from tests.exports.write import WEIGHTS
from tests.test_predict import flip_each_checkpoint
from trainer.plan import resolve
from trainer import evaluation, loop
from trainer.host.run_dir import RunDirectory
from trainer.host.run_lock import RunLock

HAS_TENSORFLOW = importlib.util.find_spec('tensorflow') is not None  # Not on Python 3.14 yet.
HAS_ONNX = all(importlib.util.find_spec(name) for name in ('onnx', 'onnxruntime'))
FORMATS = ['stablehlo', *(['savedmodel'] if HAS_TENSORFLOW else []),
           *(['onnx'] if HAS_ONNX else [])]
FILES = {'stablehlo': 'model.jax_export', 'savedmodel': 'saved_model', 'onnx': 'model.onnx'}
BATCH_SIZES, COUNT = (1, 37), 1000  # MNIST's first 1,000 test digits, one by one and 37 at once.
# What a loader of each format must never import: this project, and every framework but its own.
PROJECT = ['command', 'configs', 'data', 'errors', 'library_errors', 'mlp', 'native_logs',
           'serving', 'trainer', 'flax', 'optax', 'orbax']
FRAMEWORKS = {'stablehlo': ['jax', 'jaxlib'], 'savedmodel': ['tensorflow'],
              'onnx': ['onnx', 'onnxruntime']}
NEVER_IMPORTED = {form: [*PROJECT, *(name for other, names in FRAMEWORKS.items() if other != form
                                     for name in names)] for form in FRAMEWORKS}
# A fresh interpreter (-I: no project path, no user site) where those imports fail, running the
# standalone loader from outside the project.
LOAD = ('import runpy, sys\n'
        'for name in sys.argv[1].split(","):\n'
        '  sys.modules[name] = None\n'
        'sys.argv = sys.argv[2:]\n'
        'runpy.run_path(sys.argv[0], run_name="__main__")\n')


def export(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
  return run_train(*args, env=env, script='export.py')


def snapshot(folder) -> dict[str, bytes | None]:
  """Every file's bytes and every folder (None) under `folder`, by relative path."""
  return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
          for p in sorted(folder.rglob('*'))}


@pytest.fixture(scope='module')
def run(tmp_path_factory, mnist_dir):
  """A run of the default recipe for one epoch on 2,000 images."""
  workdir = tmp_path_factory.mktemp('run')
  loop.train_and_evaluate(resolve(make_config(num_epochs=1, data__train_split='train[:2000]',
                                      data__eval_split='test[:100]')), RunDirectory(workdir))
  return workdir


@pytest.fixture(scope='module')
def exported(run, tmp_path_factory):
  """export.py of every format this Python has, on a copy of the run as a training run leaves it
  mid-save: its lock held, the next epoch's folder half written. Returns (out, stdout, stderr)."""
  live = shutil.copytree(run, tmp_path_factory.mktemp('live') / 'run')
  shutil.copytree(live / '1', live / '2.orbax-checkpoint-tmp-1795680000000000')  # Uncommitted.
  out = tmp_path_factory.mktemp('export') / 'model'
  with RunLock(RunDirectory(live)):
    before = snapshot(live)
    result = export(f'--workdir={live}', f'--out={out}', f'--formats={",".join(FORMATS)}',
                    env=TENSORFLOW_LOGS_AT_IMPORT)
    assert result.returncode == 0, result.stderr  # Every format, on every stack (JAX 0.12's too).
    assert snapshot(live) == before  # Not one byte, file or folder changed in the run directory.
  return out, result.stdout, result.stderr


def probabilities_by_predict(workdir) -> np.ndarray:
  """predict.py's probabilities of MNIST's first test digits: its restore and forward pass."""
  config, restored = evaluation.restore_run(RunDirectory(workdir))
  images = load_split(config.data, f'test[:{COUNT}]').images
  return evaluation.probabilities(config, restored, images)


def load_in_a_fresh_python(out, form: str, folder, *args: str) -> subprocess.CompletedProcess:
  """serving/load_export.py in `python -I` from `folder`, unable to import this project or any
  framework but the format's own."""
  return subprocess.run(
      [sys.executable, '-I', '-c', LOAD, ','.join(NEVER_IMPORTED[form]),
       str(ROOT / 'serving' / 'load_export.py'), str(out), f'--format={form}', *args],
      cwd=folder, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize('form', FORMATS)
def test_each_format_loads_without_this_project_and_gives_predicts_probabilities(
    form, run, exported, tmp_path):
  saved = tmp_path / 'probabilities.npz'
  loaded = load_in_a_fresh_python(
      exported[0], form, tmp_path, f'--images={MNIST_DIR / "t10k-images-idx3-ubyte.gz"}',
      f'--batch_sizes={",".join(map(str, BATCH_SIZES))}', f'--count={COUNT}', f'--save={saved}')
  assert loaded.returncode == 0, loaded.stderr
  record = json.loads(loaded.stdout.strip().splitlines()[-1])
  # Any N: one symbolic batch dimension, uint8 images in, float32 probabilities out.
  assert record['spec'] == {
      'stablehlo': '(ShapedArray(uint8[N,28,28]),) -> (ShapedArray(float32[N,10]),)',
      'savedmodel': "{'images': TensorSpec(shape=(None, 28, 28), dtype=tf.uint8, name='images')} "
                    "-> {'probabilities': TensorSpec(shape=(None, 10), dtype=tf.float32, "
                    "name='probabilities')}",
      'onnx': "images: tensor(uint8) ['N', 28, 28] -> probabilities: tensor(float) ['N', 10]"}[form]
  expected = probabilities_by_predict(run)
  with np.load(saved) as results:
    for size in BATCH_SIZES:  # The 1,000 digits in batches of 1, and of 37 (the last one of 1).
      got = results[f'batch{size}']
      assert got.shape == (COUNT, 10) and got.dtype == np.float32
      np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
      np.testing.assert_array_equal(got.argmax(axis=1), expected.argmax(axis=1))
  assert len(set(expected.argmax(axis=1))) > 5  # A trained classifier: the digits differ.


def test_the_export_names_its_files_and_what_it_holds(run, exported):
  out, stdout, stderr = exported
  manifest = json.loads((out / 'export.json').read_text())
  assert manifest['files'] == {form: FILES[form] for form in FORMATS}  # Each one asked for.
  assert manifest['epoch'] == 1  # The committed checkpoint, not the one being written.
  assert manifest['input'] == {'name': 'images', 'dtype': 'uint8', 'shape': ['N', 28, 28]}
  assert manifest['output'] == {'name': 'probabilities', 'dtype': 'float32', 'shape': ['N', 10]}
  assert manifest['config']['model.hidden_sizes'] == [512, 512]
  assert sorted(p.name for p in out.iterdir()) == sorted([*manifest['files'].values(),
                                                          'export.json'])
  assert [line.split()[0] for line in stdout.splitlines()] == [
      str(out / name) for name in (*manifest['files'].values(), 'export.json')]
  lines = stderr.strip().splitlines()  # TensorFlow's notes at import are not among them.
  assert len(lines) == 1 and lines[0].startswith('exported the checkpoint of epoch 1 in '), stderr
  assert (out / 'model.jax_export').stat().st_size > 512 * 784 * 4  # The parameters are inside.
  # How long each file loads is bounded by the versions that wrote it: named, file by file.
  writers = {'model.jax_export': {'jax': jax.__version__, 'calling_convention_version': 10},
             'saved_model': {'tensorflow': HAS_TENSORFLOW and importlib.metadata.version(
                 'tensorflow-cpu')},
             'model.onnx': {'onnx': HAS_ONNX and importlib.metadata.version('onnx'), 'opset': 17,
                            'ir_version': 8}}
  assert manifest['written_by'] == {FILES[form]: writers[FILES[form]] for form in FORMATS}


def test_an_export_is_replaced_only_with_overwrite_and_then_whole(run, exported, tmp_path):
  out = shutil.copytree(exported[0], tmp_path / 'model')
  (out / 'notes.txt').write_text('not an export: kept')
  before = snapshot(out)
  refused = export(f'--workdir={run}', f'--out={out}')
  lines = refused.stderr.strip().splitlines()
  assert refused.returncode == 1 and len(lines) == 1, refused.stderr
  held = ', '.join(name for name in (*FILES.values(), 'export.json') if (out / name).exists())
  assert lines[0] == (f'error: {out} already holds an export ({held}); pass --overwrite to '
                      'replace it, or another --out')
  assert snapshot(out) == before
  replaced = export(f'--workdir={run}', f'--out={out}', '--formats=stablehlo', '--overwrite')
  assert replaced.returncode == 0, replaced.stderr
  # The new export alone: no file of the old one's other formats left beside it.
  assert sorted(p.name for p in out.iterdir()) == ['export.json', 'model.jax_export', 'notes.txt']
  assert json.loads((out / 'export.json').read_text())['files'] == {
      'stablehlo': 'model.jax_export'}
  assert not list(tmp_path.glob('.model.partial-*'))


# Each mistake with the standalone loader: what is made in a folder, the loader's arguments after
# the script, the modules it cannot import, and what its one line says.
def damaged_gzip() -> bytes:
  """A gzip file whose compressed bytes were overwritten: zlib's own error, not an OSError."""
  whole = bytearray(gzip.compress(bytes(range(256)) * 64))
  whole[20:40] = b'\xff' * 20
  return bytes(whole)


LOADER_MISTAKES = {
    'no folder': (lambda f: None, ['{f}/missing'], '',
                  'is not a folder; pass the --out folder that export.py wrote'),
    'a run, not an export': (lambda f: (f / 'run').mkdir(), ['{f}/run'], '',
                             'holds no stablehlo export (model.jax_export); pass the --out folder'),
    'the other format': (lambda f: (f / 'out' / 'saved_model').mkdir(parents=True), ['{f}/out'],
                         '', 'holds no stablehlo export (model.jax_export); pass '
                         '--format=savedmodel, the format it holds'),
    'no onnxruntime': (lambda f: (f / 'model.onnx').write_bytes(b'x'), ['{f}', '--format=onnx'],
                       'onnxruntime', '--format=onnx needs onnxruntime (import of onnxruntime '
                       'halted'),
    'no tensorflow': (lambda f: (f / 'out' / 'saved_model').mkdir(parents=True),
                      ['{f}/out', '--format=savedmodel'], 'tensorflow',
                      '--format=savedmodel needs tensorflow (import of tensorflow halted'),
    'no jax': (lambda f: (f / 'model.jax_export').write_bytes(b'x'), ['{f}'], 'jax',
               '--format=stablehlo needs jax (import of jax halted'),
    'no flatbuffers': (lambda f: (f / 'model.jax_export').write_bytes(b'x'), ['{f}'],
                       'flatbuffers', '--format=stablehlo needs flatbuffers (Please install '
                       "'flatbuffers'"),
    'an export cut short': (lambda f: (f / 'model.jax_export').write_bytes(b'x'), ['{f}'], '',
                            'cannot load the stablehlo export in '),
    'images damaged': (lambda f: (f / 'seven.gz').write_bytes(damaged_gzip()),
                       ['{f}', '--images={f}/seven.gz'], '', 'cannot read --images='),
    'images not IDX': (lambda f: (f / 'seven.png').write_bytes(b'x' * 64),
                       ['{f}', '--images={f}/seven.png'], '',
                       'seven.png is not a whole IDX file of 28x28 images; pass one'),
    'batch of none': (lambda f: None, ['{f}', '--batch_sizes=1,0'], '',
                      "argument --batch_sizes: '1,0' is not counts of 1 or more, e.g. 1,37; "
                      'usage:'),
}


@pytest.mark.parametrize('case', LOADER_MISTAKES)
def test_the_standalone_loader_says_a_mistake_in_one_line(case, tmp_path):
  make, args, hidden, expected = LOADER_MISTAKES[case]
  make(tmp_path)
  loaded = subprocess.run(
      [sys.executable, '-I', '-c', LOAD, hidden, str(ROOT / 'serving' / 'load_export.py'),
       *(arg.format(f=tmp_path) for arg in args)],
      cwd=tmp_path, capture_output=True, text=True, timeout=60)
  lines = loaded.stderr.strip().splitlines()
  assert loaded.returncode in (1, 2) and loaded.stdout == '', loaded.stderr
  assert len(lines) == 1 and lines[0].startswith('error: ') and expected in lines[0], loaded.stderr


def test_the_standalone_loader_s_help_says_what_it_is_whole_and_exits_0():
  loader = ROOT / 'serving' / 'load_export.py'
  helped = subprocess.run([sys.executable, '-I', str(loader), '--help'], capture_output=True,
                          text=True, timeout=60)
  assert helped.returncode == 0 and helped.stderr == ''
  described = ' '.join(helped.stdout.split('\n\n')[1].split())
  assert described.startswith('Classifies MNIST test digits with an export of export.py')
  assert described.endswith('(StableHLO), TensorFlow (the SavedModel) or onnxruntime (ONNX), '
                            'nothing else.')


# The small exports in tests/exports/, each written by the JAX release that its folder names (its
# write.py says how), and the pairs (writer, reader) among them and the pinned JAX releases that
# the reader refuses: a file of a newer release (jax.export promises 3 weeks of forward
# compatibility), or of one older than the 6 months of backward compatibility. Others load.
EXPORTS = ROOT / 'tests' / 'exports'
WRITERS = sorted(path.name.removeprefix('jax-') for path in EXPORTS.glob('jax-*'))
REFUSED = {('0.12.0.1', '0.10.2'): 'newer', ('0.8.1', '0.12.0.1'): 'older'}


@pytest.mark.parametrize('writer', WRITERS)
def test_a_jax_export_of_another_release_loads_or_names_both_releases_and_the_fix(writer,
                                                                                  tmp_path):
  folder, here = EXPORTS / f'jax-{writer}', jax.__version__
  loaded = load_in_a_fresh_python(folder, 'stablehlo', tmp_path, '--batch_sizes=5',
                                  f'--save={tmp_path / "probabilities.npz"}')
  refused = REFUSED.get((writer, here))
  if refused is None:
    assert loaded.returncode == 0, loaded.stderr
    images = load_idx(str(MNIST_DIR), 'test')[0][:5]
    logits = (images.astype(np.float32) / 255).mean(axis=2) @ WEIGHTS  # write.py's classifier.
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.load(tmp_path / 'probabilities.npz')['batch5'], expected,
                               rtol=0, atol=1e-6)
    return
  fix = {'newer': f'newer than this jax {here}, which cannot read it; load it with jax {writer} '
                  f'or newer, or export the run again with jax {here}',
         'older': f'older than this jax {here} reads (docs/export.md: how long each format '
                  f'loads); export the run again with jax {here}, or load it with jax {writer}'}
  lines = loaded.stderr.strip().splitlines()
  assert loaded.returncode == 1 and loaded.stdout == '' and len(lines) == 1, loaded.stderr
  assert lines[0].startswith(f'error: cannot load the stablehlo export in {folder} ('), lines[0]
  assert lines[0].endswith(f'): model.jax_export was written by jax {writer}, {fix[refused]}')


@pytest.mark.skipif(not HAS_ONNX, reason='the ONNX extra is not installed here')
def test_an_onnx_model_newer_than_this_onnxruntime_names_its_opset_and_the_fix(tmp_path):
  """As a model that a newer onnx wrote, in the ONNX of years to come, reaches an older runtime."""
  import onnx  # pylint: disable=g-import-not-at-top
  import onnxruntime  # pylint: disable=g-import-not-at-top
  graph = onnx.helper.make_graph(
      [onnx.helper.make_node('Identity', ['images'], ['probabilities'])], 'future',
      [onnx.helper.make_tensor_value_info('images', onnx.TensorProto.FLOAT, ['N', 10])],
      [onnx.helper.make_tensor_value_info('probabilities', onnx.TensorProto.FLOAT, ['N', 10])])
  onnx.save_model(onnx.helper.make_model(graph, ir_version=99, opset_imports=[
      onnx.helper.make_opsetid('', 99)]), tmp_path / 'model.onnx')
  (tmp_path / 'export.json').write_text(json.dumps({'written_by': {'model.onnx': {
      'onnx': '9.0.0', 'opset': 99, 'ir_version': 99}}}))
  loaded = load_in_a_fresh_python(tmp_path, 'onnx', tmp_path)
  lines = loaded.stderr.strip().splitlines()
  assert loaded.returncode == 1 and loaded.stdout == '' and len(lines) == 1, loaded.stderr
  assert lines[0].startswith(f'error: cannot load the onnx export in {tmp_path} ('), lines[0]
  assert lines[0].endswith(
      f'): model.onnx holds ONNX opset 99 (IR version 99), which onnxruntime '
      f'{onnxruntime.__version__} does not run; install a newer one (pip install -r '
      'requirements/onnx.txt), or export the run again'), lines[0]


def test_an_out_whose_folder_is_a_file_names_that_file_in_its_way(tmp_path):
  """--out=notes.txt/model: os.makedirs of its folder meets the file, 'File exists'."""
  (tmp_path / 'notes.txt').write_text('keep me')
  out = OutFolder(str(tmp_path / 'notes.txt' / 'model'))
  with pytest.raises(UserError, match=r'^--out=\S+/notes.txt/model cannot be made: \S+/notes.txt '
                     'is a file; move it out of the way, or pass another folder to export to$'):
    out.check(str(tmp_path / 'run'))  # Before the checkpoint is read.
  def staged() -> None:  # Where the file came after the check.
    with out.staged():
      pass
  assert re.fullmatch(r'cannot write \S+/notes.txt/model \(File exists\); move the folder or file '
                      'in its way out of it, then rerun the same command', line_of(staged))
  assert sorted(os.listdir(tmp_path)) == ['notes.txt']
  assert (tmp_path / 'notes.txt').read_text() == 'keep me'


def hide_tensorflow(folder) -> dict[str, str]:
  """An environment where `import tensorflow` fails as it does where the extra is not installed."""
  (folder / 'site' / 'tensorflow').mkdir(parents=True)
  (folder / 'site' / 'tensorflow' / '__init__.py').write_text(
      "raise ImportError(\"No module named 'tensorflow'\")\n")
  return {'PYTHONPATH': str(folder / 'site')}


def hide_onnx(folder) -> dict[str, str]:
  """An environment where `import onnx` fails as it does where the ONNX extra is not installed."""
  (folder / 'site' / 'onnx').mkdir(parents=True)
  (folder / 'site' / 'onnx' / '__init__.py').write_text(
      "raise ModuleNotFoundError(\"No module named 'onnx'\", name='onnx')\n")
  return {'PYTHONPATH': str(folder / 'site')}


def hide_flatbuffers(folder) -> dict[str, str]:
  """An environment without flatbuffers, which jax.export's serialization imports (an environment
  made before requirements.txt pinned it): jax raises its own ImportError from the missing one."""
  (folder / 'site' / 'flatbuffers').mkdir(parents=True)
  (folder / 'site' / 'flatbuffers' / '__init__.py').write_text(
      "raise ModuleNotFoundError(\"No module named 'flatbuffers'\", name='flatbuffers')\n")
  return {'PYTHONPATH': str(folder / 'site')}


# Each mistake: how it is made (given tmp_path and the trained run), export.py's arguments after
# --out, the environment, and what its one line says.
MISTAKES = {
    'no checkpoint': (lambda f, run: (f / 'empty').mkdir(), ['--workdir={f}/empty'], None,
                      'no checkpoint in'),
    'no run directory': (lambda f, run: None, ['--workdir={f}/missing'], None, 'no checkpoint in'),
    'run is a file': (lambda f, run: (f / 'afile').write_text('x'), ['--workdir={f}/afile'], None,
                      'is a file; pass a --workdir that names a folder'),
    'damaged run': (lambda f, run: flip_each_checkpoint(shutil.copytree(run, f / 'damaged')),
                    ['--workdir={f}/damaged'], None, 'can be restored'),
    'no tensorflow': (lambda f, run: None, ['--workdir={run}', '--formats=stablehlo,savedmodel'],
                      hide_tensorflow, 'pip install -r requirements/tfds.txt'),
    'no flatbuffers': (lambda f, run: None, ['--workdir={run}'], hide_flatbuffers,
                       "has no module 'flatbuffers', which this project needs"),
    'out in the run': (lambda f, run: None, ['--workdir={run}', '--out={run}/export'], None,
                       'is inside the run directory'),
    'no onnx': (lambda f, run: None, ['--workdir={run}', '--formats=stablehlo,onnx'], hide_onnx,
                '--formats=onnx needs onnx (No module named \'onnx\'), an extra that `make train` '
                'leaves out: pip install -r requirements/onnx.txt, or pass --formats=stablehlo'),
    'unknown format': (lambda f, run: None, ['--workdir={run}', '--formats=tflite'], None,
                       'no format named tflite; pass one or more of stablehlo,savedmodel,onnx'),
    'out is a file': (lambda f, run: (f / 'model').write_text('x'), ['--workdir={run}'], None,
                      'is a file; pass a folder'),
}


@pytest.mark.parametrize('case', [pytest.param(case, marks=pytest.mark.slow)
                                  if case == 'damaged run' else case for case in MISTAKES])
def test_a_mistake_ends_in_one_line_and_changes_nothing(case, run, tmp_path):
  make, args, env, expected = MISTAKES[case]
  make(tmp_path, run)
  args = [arg.format(f=tmp_path, run=run) for arg in args]
  if not any(arg.startswith('--out=') for arg in args):
    args.append(f'--out={tmp_path / "model"}')
  env = env and env(tmp_path)
  before_run, before = snapshot(run), snapshot(tmp_path)
  out = export(*args, env=env)
  lines = out.stderr.strip().splitlines()
  assert out.returncode != 0 and out.stdout == '', out.stderr
  assert len(lines) == 1 and lines[0].startswith('error: ') and expected in lines[0], out.stderr
  assert snapshot(tmp_path) == before and snapshot(run) == before_run


@pytest.mark.slow
def test_a_run_is_exported_while_it_trains_and_saves_on(tmp_path, mnist_dir):
  workdir, out = tmp_path / 'run', tmp_path / 'model'
  command = [sys.executable, 'train.py', '--config=configs/quick.py', f'--workdir={workdir}',
             # A save each 2 s, 3 kept: the checkpoint the export lists lives past its read.
             *override_flags(num_epochs=500, data__train_split='train[:2000]',
                             data__eval_split='test[:500]', checkpoint_min_seconds=2)]
  with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True) as training:
    while not (workdir / '1').is_dir():  # Epoch 1's checkpoint committed; the run trains on.
      assert training.poll() is None, training.stderr.read()
      time.sleep(0.1)
    exported = export(f'--workdir={workdir}', f'--out={out}')
    assert training.poll() is None  # Still training: the export ran beside it throughout.
    training.send_signal(signal.SIGTERM)  # Finishes its epoch, saves it, stops.
    _, stderr = training.communicate(timeout=120)
  assert exported.returncode == 0, exported.stderr
  assert training.returncode == 128 + signal.SIGTERM and 'stopped by SIGTERM' in stderr, stderr
  epoch = json.loads((out / 'export.json').read_text())['epoch']
  _, restored = evaluation.restore_run(RunDirectory(workdir))
  assert restored.damaged == () and restored.epoch > epoch >= 1  # Its saves went on, all whole.


# export.py with its writer made to stop itself once a file is half written in the staged folder.
STOPPED_MIDWAY = ('import os, runpy, signal, sys, time\n'
                  'from serving import artifacts\n'
                  'sent = getattr(signal, sys.argv[1])\n'
                  'def write(state, precision, formats, folder, about):\n'
                  '  with open(os.path.join(folder, "model.jax_export"), "wb") as f:\n'
                  '    f.write(b"half")\n'
                  '  os.kill(os.getpid(), sent)\n'
                  '  time.sleep(60)\n'
                  'artifacts.write = write\n'
                  'sys.argv = ["export.py", *sys.argv[2:]]\n'
                  'runpy.run_path("export.py", run_name="__main__")\n')


@pytest.mark.slow  # A fresh process that restores the run: 3-4 s.
@pytest.mark.parametrize('sent, said', [('SIGINT', 'Ctrl-C'), ('SIGTERM', 'SIGTERM')])
def test_a_signal_while_writing_is_one_line_and_leaves_no_staged_copy(sent, said, run, tmp_path):
  out = tmp_path / 'model'
  out.mkdir()
  (out / 'export.json').write_text('{"epoch": 0}')
  before = snapshot(tmp_path)
  stopped = subprocess.run([sys.executable, '-c', STOPPED_MIDWAY, sent, f'--workdir={run}',
                            f'--out={out}', '--overwrite'], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
  assert stopped.returncode == 128 + getattr(signal, sent), stopped.stderr
  assert stopped.stderr.strip().splitlines() == [
      f'error: stopped by {said} while writing the export; rerun the same command to export the '
      'run']
  assert snapshot(tmp_path) == before  # No staged copy beside it; the older export untouched.


# export.py made to receive a SIGTERM as it reports an export already whole in --out.
STOPPED_AFTER = signalled_in('export.py', 'trainer.host.exits', 'say')


# export.py made to receive a SIGTERM as its files start to replace an older export in --out.
STOPPED_IN_THE_SWAP = signalled_in('export.py', 'serving.folder', 'OutFolder._move_in',
                                   then_do_it=True)


@pytest.mark.slow  # A fresh process that restores the run: 3-4 s.
def test_a_signal_as_the_files_replace_an_older_export_waits_for_the_new_one_whole(run, tmp_path):
  """Else it could leave the older export part deleted and the new one part moved in; the export,
  whole, is said before the signal ends the command."""
  out = tmp_path / 'model'
  out.mkdir()
  (out / 'export.json').write_text('{"epoch": 0}')
  (out / 'model.jax_export').write_bytes(b'an older export')
  stopped = subprocess.run([sys.executable, '-c', STOPPED_IN_THE_SWAP, f'--workdir={run}',
                            f'--out={out}', '--overwrite'], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
  assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
  assert stopped.stderr.startswith('exported the checkpoint of epoch '), stopped.stderr
  assert f'{out}/export.json' in stopped.stdout
  assert json.loads((out / 'export.json').read_text())['epoch'] >= 1
  assert (out / 'model.jax_export').read_bytes() != b'an older export'
  assert sorted(os.listdir(tmp_path)) == ['model']


@pytest.mark.slow  # A fresh process that restores the run: 3-4 s.
def test_a_signal_once_the_export_is_whole_ends_it_saying_nothing_more(run, tmp_path):
  """Not 'stopped while writing the export; rerun': the export is there, whole."""
  out = tmp_path / 'model'
  stopped = subprocess.run([sys.executable, '-c', STOPPED_AFTER, f'--workdir={run}',
                            f'--out={out}'], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert stopped.returncode == 128 + signal.SIGTERM and stopped.stderr == '', stopped.stderr
  assert json.loads((out / 'export.json').read_text())['epoch'] >= 1
  assert sorted(os.listdir(tmp_path)) == ['model']


@pytest.mark.slow
@pytest.mark.parametrize('form', FORMATS)
def test_a_full_disk_is_one_line_and_leaves_the_export_there_as_it_was(form, run, tiny_disk):
  out = tiny_disk / 'model'  # 2 MB: the parameters alone are 2.7 MB.
  out.mkdir()
  (out / 'export.json').write_text('{"epoch": 0}')
  (out / 'model.jax_export').write_bytes(b'an older export')
  before = snapshot(tiny_disk)
  full = export(f'--workdir={run}', f'--out={out}', f'--formats={form}', '--overwrite')
  lines = full.stderr.strip().splitlines()
  assert full.returncode == 1 and len(lines) == 1, full.stderr
  assert lines[0] == (f'error: cannot write {out} (No space left on device); free space or '
                      'restore access there, then rerun the same command')
  assert snapshot(tiny_disk) == before  # The half-written export gone, the older one untouched.
