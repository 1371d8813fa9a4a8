"""A screenshot of optuna-dashboard showing a real study, for docs/search.md: a small search in a
temporary run directory, its study served by optuna-dashboard, the study's page photographed by a
headless Chromium through Playwright.

  pip install -r requirements/docs.txt   # optuna-dashboard and playwright (not in make test)
  apt-get install chromium               # the system's Chromium (Debian; Ubuntu: chromium-browser)
  python -m benchmarks.dashboard_screenshot [--out=docs/search-dashboard.png] [--trials=8]
      [--side_by_side=4] [--num_epochs=6] [--train_examples=5000] [--chromium=/usr/bin/chromium]

The search is docs/search.md's over learning_rate and model.dropout_rate, on configs/quick.py's
validation split, shorter (under 2 minutes on 2 CPU cores). The page is the study's own,
full length: its history, hyperparameter importance, timeline, best trial and every trial's
intermediate values. Playwright drives the Chromium at --chromium and downloads no browser.
"""

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from absl import flags

from benchmarks.workload import ROOT, parse_flags, run_train, search_args
from errors import ExtraMissing, UserError
from trainer.host.boundary import Host

_OUT = flags.DEFINE_string('out', str(ROOT / 'docs' / 'search-dashboard.png'), 'The PNG to write.')
_TRIALS = flags.DEFINE_integer('trials', 8, 'Trials of the search.', lower_bound=1)
_SIDE_BY_SIDE = flags.DEFINE_integer('side_by_side', 4, 'Trials per program.', lower_bound=1)
_NUM_EPOCHS = flags.DEFINE_integer('num_epochs', 6, 'Epochs of every trial.', lower_bound=1)
_TRAIN_EXAMPLES = flags.DEFINE_integer('train_examples', 5000, 'Trains on train[:N].',
                                       lower_bound=1, upper_bound=50000)
_CHROMIUM = flags.DEFINE_string('chromium', '/usr/bin/chromium', 'The Chromium to drive.')

EXTRA = 'pip install -r requirements/docs.txt'
# Headless, and quiet: no GPU, no network of its own (updates, sync, QUIC), no first-run pages.
CHROMIUM_ARGS = ('--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync')
VIEWPORT = {'width': 1280, 'height': 900}
STARTUP_S = 60  # How long the dashboard may take to answer.


def tools() -> tuple[str, Any]:
  """optuna-dashboard's command and Playwright's sync_playwright, or the error naming the extra
  (or the Chromium) that is missing."""
  folders = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get('PATH', '')])
  dashboard = shutil.which('optuna-dashboard', path=folders)
  try:
    from playwright.sync_api import sync_playwright  # pylint: disable=g-import-not-at-top; docs'
    if dashboard is None:
      raise ImportError('no optuna-dashboard command')
  except ImportError as error:
    raise ExtraMissing('benchmarks.dashboard_screenshot', 'optuna-dashboard and Playwright', EXTRA,
                       'keep docs/search-dashboard.png as it is') from error
  if not os.access(_CHROMIUM.value, os.X_OK):
    raise UserError(f'no Chromium at --chromium={_CHROMIUM.value}; install the system\'s (apt-get '
                    'install chromium), or pass the path of one')
  return dashboard, sync_playwright


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


@contextlib.contextmanager
def serving(dashboard: str, storage: str, log: pathlib.Path) -> Iterator[str]:
  """optuna-dashboard serving `storage` on 127.0.0.1 while entered (its output in `log`): its
  address, once it answers."""
  port = free_port()
  address = f'http://127.0.0.1:{port}'
  with open(log, 'w', encoding='utf-8') as output, subprocess.Popen(
      [dashboard, storage, '--host', '127.0.0.1', '--port', str(port)], stdout=output,
      stderr=subprocess.STDOUT) as server:
    try:
      wait_for(address, server, log)
      yield address
    finally:
      server.terminate()
      server.wait()


def wait_for(address: str, server: subprocess.Popen, log: pathlib.Path) -> None:
  """Returns once the dashboard answers; its exit, or no answer in STARTUP_S, is a UserError."""
  deadline = time.monotonic() + STARTUP_S
  while time.monotonic() < deadline:
    if server.poll() is not None:
      said = (log.read_text(encoding='utf-8').strip().splitlines() or ['no output'])[-1]
      raise UserError(f'optuna-dashboard exited with status {server.returncode} ({said}); run it '
                      'alone to see why, or reinstall it: ' + EXTRA)
    with contextlib.suppress(urllib.error.URLError, ConnectionError):
      with urllib.request.urlopen(f'{address}/api/studies', timeout=5):
        return
    time.sleep(0.5)
  raise UserError(f'optuna-dashboard did not answer at {address} in {STARTUP_S} s; rerun when '
                  'the machine is less loaded')


def photograph(sync_playwright: Any, page_address: str, out: str) -> None:
  """The page, full length, once its plots are drawn, to `out` (PNG)."""
  from playwright.sync_api import Error  # pylint: disable=g-import-not-at-top; docs' extra
  try:
    with sync_playwright() as playwright:
      browser = playwright.chromium.launch(executable_path=_CHROMIUM.value, args=CHROMIUM_ARGS)
      page = browser.new_page(viewport=VIEWPORT)
      page.goto(page_address)
      page.get_by_text('Intermediate values').wait_for()
      page.wait_for_load_state('networkidle')
      page.wait_for_timeout(2000)  # Plotly's plots drawn in full.
      page.screenshot(path=out, full_page=True)
      browser.close()
  except Error as error:
    raise UserError(f'Chromium ({_CHROMIUM.value}) could not photograph {page_address}: '
                    f'{str(error).strip().splitlines()[0]}') from error


def main(argv: list[str]) -> None:
  del argv  # parse_flags refused any.
  dashboard, sync_playwright = tools()
  with tempfile.TemporaryDirectory() as root:
    workdir = os.path.join(root, 'search')
    run_train(['--config=configs/quick.py:validation', f'--workdir={workdir}',
               f'--config.num_epochs={_NUM_EPOCHS.value}',
               f'--config.data.train_split=train[:{_TRAIN_EXAMPLES.value}]',
               *search_args(_TRIALS.value, min(_SIDE_BY_SIDE.value, _TRIALS.value))], 'the search')
    with serving(dashboard, f'sqlite:///{workdir}/study.db',
                 pathlib.Path(root) / 'dashboard.log') as address:
      photograph(sync_playwright, f'{address}/dashboard/studies/1', _OUT.value)
  print(f'{_OUT.value}: {os.path.getsize(_OUT.value):,} bytes', flush=True)


if __name__ == '__main__':
  Host().run(main, parse_flags)
