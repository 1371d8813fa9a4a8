"""A plan's programs, compiled once: each pass (mlp/passes.py) compiled over the plan's mesh by
jit, shard_map or pmap, over data resident there; the state they start from and restore into."""

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from data.mnist import Examples
from errors import During
from mlp import optim, passes, steps
from trainer.plan import AXIS, MEMBERS, Plan, Recipe


Specs = tuple[Any, Any]  # A pass's in_specs and out_specs on the mesh.


@dataclasses.dataclass(frozen=True)
class Epoch:
  """An epoch as its programs ran it: the figures the reporter records."""
  number: int
  trained: dict[str, Any]
  evaluated: dict[str, Any]
  timing: tuple[float, float, int]  # Seconds in all, seconds training, images trained.
  learning_rate: float | list[float]  # Of members that set their own, each member's.


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Host or single-device values as global arrays, one full copy on every device of the mesh."""
  sharding = NamedSharding(mesh, P())

  def to_mesh(leaf):
    if jax.dtypes.issubdtype(getattr(leaf, 'dtype', None), jax.dtypes.prng_key):
      return jax.random.wrap_key_data(to_mesh(jax.random.key_data(leaf)))
    # A Python number (the fresh step) takes JAX's dtype for it: int32, not NumPy's int64.
    host = np.asarray(leaf)
    host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype), copy=False)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(to_mesh, tree)


def _here(leaf: jax.Array) -> bool:
  """Whether this process holds all of a global array: on its devices alone, or a copy on each."""
  return leaf.is_fully_addressable or leaf.sharding.is_fully_replicated


def gathers(tree: Any) -> bool:
  """Whether `to_host` of global arrays gathers across processes: then every process calls it."""
  return not all(_here(leaf) for leaf in jax.tree.leaves(tree))


def to_host(tree: Any) -> Any:
  """Global arrays as host values; one split over the devices of several processes gathered to
  every process (a collective: `gathers`)."""
  return jax.tree.map(lambda leaf: jax.device_get(leaf) if _here(leaf) else
                      multihost_utils.process_allgather(leaf, tiled=True), tree)


def state_spec(plan: Plan) -> P:
  """Where the state lies on the mesh: its members split over the `members` axis, or the whole
  state on every device."""
  return P(MEMBERS) if plan.spec.member_axis else P()


def _compile(per_device: Callable, plan: Plan, args: tuple, specs: Specs, *,
             donate: bool) -> Callable:
  """The per-device function as one compiled program for the plan's mesh: under jit and pmap
  replicated in and out, under mesh as `specs` (in_specs, out_specs) lay its arguments and
  results."""
  mode, mesh = plan.mode, plan.mesh
  if mode == 'pmap':  # Maps over a device index; the arguments go whole to every device.
    mapped = jax.pmap(lambda _, first, rest: per_device(first, *rest), AXIS,
                      in_axes=(0, None, None), out_axes=None, devices=list(mesh.devices.flat),
                      donate_argnums=(1,) if donate else ())  # `first`: the state.
    index = jax.device_put(np.arange(mesh.size), NamedSharding(mesh, P(AXIS)))
    compiled = mapped.lower(index, args[0], args[1:]).compile()
    return lambda first, *rest: compiled(index, first, rest)
  if mode == 'mesh':
    # check_vma=False keeps pmap's meaning of the per-device code: jax.grad of replicated params
    # is each device's own gradient, which train_step averages with pmean. (With varying-axis
    # checks, grad would already sum over devices, and the pmean would leave Adam's moments 8x.)
    per_device = jax.shard_map(per_device, mesh=mesh, in_specs=specs[0], out_specs=specs[1],
                               check_vma=False)
  return jax.jit(per_device, donate_argnums=(0,) if donate else ()).lower(*args).compile()


def create_state(recipe: Recipe, key: jax.Array) -> steps.TrainState:
  """Step 0 of the recipe: the model initialized from `key`, and its optimizer's state; from keys
  stacked [M], M members' states stacked."""
  create = functools.partial(steps.create_train_state, recipe.model, recipe.optimizer)
  if key.ndim == 0:
    return create(key)
  states = jax.vmap(create)(key)
  if not recipe.injected:
    return states
  return dataclasses.replace(states, opt_state=optim.with_injected(states.opt_state,
                                                                   dict(recipe.injected)))


def state_template(plan: Plan) -> steps.TrainState:
  """The plan's state (of its members stacked) as shapes, dtypes and sharding on its mesh
  (replicated, or its members split: `state_spec`), computed without creating it (jax.eval_shape):
  what a fresh state fills, a checkpoint restores into and the programs compile for (their
  optimizer is the recipe's)."""
  count = len(plan.members)
  keys = jax.random.split(jax.random.key(0), count) if count else jax.random.key(0)
  abstract = jax.eval_shape(functools.partial(create_state, plan.recipe), keys)
  sharding = NamedSharding(plan.mesh, state_spec(plan))
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


def figures(sums: dict[str, Any]) -> dict[str, Any]:
  """Host metric sums as loss and accuracy; of members ([M] sums), the members' means, and each
  member's in `loss_by_member` and `accuracy_by_member`."""
  if np.ndim(sums['count']) == 0:
    return steps.summarize(sums)
  each = [steps.summarize({k: v[m] for k, v in sums.items()}) for m in range(len(sums['count']))]
  losses, accuracies = [e['loss'] for e in each], [e['accuracy'] for e in each]
  return {'loss': sum(losses) / len(losses), 'accuracy': sum(accuracies) / len(accuracies),
          'loss_by_member': losses, 'accuracy_by_member': accuracies}


@dataclasses.dataclass(frozen=True)
class Programs:
  """A plan's compiled passes, built once by `compile_programs`, global arrays in and out,
  replicated; no state: an epoch consumes (donates) the state it starts from."""
  plan: Plan
  run_key: jax.Array  # On the mesh: drives every epoch's order, dropout and shifts (each member's).
  train_data: passes.Data | None  # None when only evaluating.
  eval_data: passes.Data
  template: steps.TrainState  # The state's shapes, dtypes and sharding: what restores into.
  train_program: Callable[..., tuple[Any, Any]] | None  # (state, data, run_key, epoch) -> ...
  eval_program: Callable[..., Any]  # (state, data) -> sums
  compile_seconds: float

  @During('training')  # The parameters and optimizer state of every member.
  def fresh_state(self) -> steps.TrainState:
    """Step 0 of the run, on the mesh."""
    # One compiled program, its result born where the template lies (eager init takes seconds).
    create = jax.jit(functools.partial(create_state, self.plan.recipe),
                     out_shardings=NamedSharding(self.plan.mesh, state_spec(self.plan)))
    return create(self.plan.keys[0])

  @During('training')
  def train_epoch(self, state: steps.TrainState,
                  number: int) -> tuple[steps.TrainState, dict[str, Any]]:
    """Epoch `number` from `state` (which it consumes); the new state and its host metrics (of
    members, their means and each one's: `figures`)."""
    assert self.train_program is not None and self.train_data is not None, 'built to evaluate'
    with jax.transfer_guard_host_to_device('allow'):  # The epoch's one transfer, asked for.
      number_on_mesh = replicate(np.int32(number), self.plan.mesh)
    state, sums = self.train_program(state, self.train_data, self.run_key, number_on_mesh)
    return state, figures(to_host(sums))

  def run_epoch(self, state: steps.TrainState,
                number: int) -> tuple[steps.TrainState, Epoch]:
    """Trains epoch `number` from `state` (which it consumes) and evaluates the result, timed."""
    start = time.perf_counter()
    state, trained = self.train_epoch(state, number)
    train_seconds = time.perf_counter() - start
    evaluated = self.evaluate(state)
    timing = (time.perf_counter() - start, train_seconds,
              self.plan.steps_per_epoch * self.plan.spec.batch_size)
    return state, Epoch(number, trained, evaluated, timing, self.learning_rate(number))

  @During('evaluating')
  def evaluate(self, state: steps.TrainState) -> dict[str, Any]:
    """The eval split's mean loss and accuracy for `state`; of members, also each one's and their
    ensemble's (`ensemble_loss`, `ensemble_accuracy`)."""
    sums = to_host(self.eval_program(state, self.eval_data))
    if isinstance(sums, dict):
      return figures(sums)
    members, ensemble = sums
    together = steps.summarize(ensemble)
    return {**figures(members), **{f'ensemble_{k}': v for k, v in together.items()}}

  def learning_rate(self, epoch: int) -> float | list[float]:
    """The rate of the epoch's last update, whose optimizer count was the number of updates
    before; of members that set their own, each member's."""
    return np.asarray(self.plan.recipe.schedule(epoch * self.plan.steps_per_epoch - 1)).tolist()


def _passes(plan: Plan) -> tuple[tuple[Callable, Specs], tuple[Callable, Specs]]:
  """The plan's training and evaluation passes, each with the specs that lay it on the mesh: of
  members split over it, the state, run keys and members' sums split, the rest whole."""
  size, axis = plan.eval_batch_size, plan.spec.axis_name
  if not plan.members:
    return ((functools.partial(passes.train_epoch, spec=plan.spec), (P(), P())),
            (functools.partial(passes.evaluate, batch_size=size, axis_name=axis), (P(), P())))
  split = state_spec(plan)
  whole = not plan.spec.member_axis  # Replicated in and out, as one spec for all.
  return ((functools.partial(passes.train_members, spec=plan.spec),
           (P(), P()) if whole else ((split, P(), split, P()), (split, split))),
          (functools.partial(passes.evaluate_members, batch_size=size, axis_name=axis,
                             member_axis=plan.spec.member_axis),
           (P(), P()) if whole else ((split, P()), (split, P()))))


def compile_programs(plan: Plan, train: Examples | None, eval_examples: Examples) -> Programs:
  """The plan's passes: data on the mesh, the programs compiled ahead (so that epochs time training
  alone); without `train`, the evaluation alone."""
  start, mesh = time.perf_counter(), plan.mesh
  run_key, template = replicate(plan.keys[1], mesh), state_template(plan)
  on_mesh = lambda examples: replicate((examples.images, examples.labels), mesh)
  train_data, eval_data = on_mesh(train) if train is not None else None, on_mesh(eval_examples)
  (train_pass, train_specs), (eval_pass, eval_specs) = _passes(plan)
  with jax.default_matmul_precision(plan.precision):  # Fixed when the programs compile.
    train_program = None
    if train_data is not None:
      number = jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P()))
      with During('training'):  # A GPU's compiler tries kernels in device memory.
        train_program = _compile(train_pass, plan, (template, train_data, run_key, number),
                                 train_specs, donate=True)
    with During('evaluating'):
      eval_program = _compile(eval_pass, plan, (template, eval_data), eval_specs, donate=False)
  return Programs(plan, run_key, train_data, eval_data, template, train_program, eval_program,
                  time.perf_counter() - start)
