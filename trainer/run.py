"""What a run is, built once from its plan: by `open_run` to train or evaluate it (its plan and
directory, its compiled programs, and the objects that write its outputs: the lock, the reporter,
the checkpoints), by `open_saved` to classify with it (its checkpoints, read on one device). Every
restore goes through Saved.restore()."""

import contextlib
import dataclasses
from collections.abc import Iterator

from data.mnist import Examples, load_splits
from mlp import steps
from trainer import config_rules
from trainer.checkpoints import Checkpoints, Restored, readable_config
from trainer.host.boundary import Host
from trainer.plan import Plan
from trainer.programs import Programs, compile_programs, state_template
from trainer.reporting import Reporter
from trainer.host.run_dir import RunDirectory
from trainer.host.run_lock import RunLock


@dataclasses.dataclass(frozen=True)
class Saved:
  """A run's checkpoints and the state they restore into: what every use of a run reads."""
  plan: Plan
  run_dir: RunDirectory
  host: Host
  template: steps.TrainState  # The state's shapes, dtypes and sharding: what restores into.
  checkpoints: Checkpoints

  def restore(self) -> Restored | None:
    """The newest checkpoint that restores and verifies (the damaged passed over), or None."""
    return self.checkpoints.restore(self.template)


@dataclasses.dataclass(frozen=True)
class Run(Saved):
  """A run to train or evaluate, built once by `open_run` and handed whole to the loop and the
  evaluation."""
  programs: Programs
  eval: Examples  # On the host as well: its pictures are drawn there.
  reporter: Reporter  # Silent on every process but process 0.
  lock: RunLock | None  # Held when training; None when only evaluating: a live run's files stay.


@contextlib.contextmanager
def open_saved(plan: Plan, run_dir: RunDirectory, host: Host) -> Iterator[Saved]:
  """A run's checkpoints, read on the plan's one device whatever the run trained on (predict.py,
  export.py)."""
  run_dir.check_usable()
  with Checkpoints(run_dir, plan, host, read_only=True) as checkpoints:
    yield Saved(plan, run_dir, host, state_template(plan), checkpoints)


@contextlib.contextmanager
def open_run(plan: Plan, run_dir: RunDirectory, host: Host,
             evaluate_only: bool = False) -> Iterator[Run]:
  """The one place a run is built; on exit every save is complete and the lock released."""
  # On a bucket the first touch stays make()'s: the client of the lock words a refusal (no
  # credentials, no permission, no network) in one line, where gcsfs would log its retries.
  if not (evaluate_only or run_dir.remote):
    run_dir.check_usable()  # A folder this user may not list is said before its checkpoints.
    config_rules.check_resumable(readable_config(run_dir), plan.saved, run_dir.name)
  splits = (plan.data.train_split, plan.data.eval_split)[evaluate_only:]  # Evaluating: eval alone.
  *train, eval_examples = load_splits(plan.data, *splits)
  reporter = Reporter(run_dir, plan, host)
  if host.primary:
    run_dir.make()  # Before the lock, whose file is in it.
  with contextlib.ExitStack() as stack:
    lock = None
    if not evaluate_only:  # Before orbax tidies the folder; a refusal stops every process.
      lock = stack.enter_context(RunLock(run_dir, host))
      host.check_shared_directory(run_dir)
    programs = compile_programs(plan, next(iter(train), None), eval_examples)
    checkpoints = stack.enter_context(Checkpoints(run_dir, plan, host, read_only=evaluate_only))
    yield Run(plan, run_dir, host, programs.template, checkpoints, programs, eval_examples,
              reporter, lock)
