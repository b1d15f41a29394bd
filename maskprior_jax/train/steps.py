"""The compiled training step: one optimizer step of one run (`step_fn`), jitted over stacked
runs, several steps per call and a device mesh (`make_train_step`), or drawing its own batches on
the device (`make_generating_train_step`); the evaluation step; and `loop_step`, the call the loop
builds for a placement (what `maskprior compile` compiles too)."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from maskprior_jax.sharding import batch_sharding, is_runs_mesh, replicated, run_sharding
from maskprior_jax.train.batches import DeviceBatches
from maskprior_jax.train.placement import Placement
from maskprior_jax.train.settings import GRAD_REDUCTIONS, LoopSettings
from maskprior_jax.train.state import UPDATED_COLLECTIONS, LossFn, TrainState

__all__ = ["step_fn", "make_train_step", "make_generating_train_step", "make_eval_step", "loop_step"]


def _ordered_value_and_grad(loss_fn: LossFn, mesh: Mesh):
  """`value_and_grad(loss_fn)` over a batch split on the mesh's "data" axis, reduced in a fixed
  order: each device differentiates the loss of its own rows (rng folded with its shard index),
  every device's (loss, metrics, grads) is all-gathered (a copy, exact) and summed shard 0, 1,
  ... in that order on every device, then divided by the shard count. The float32 result then
  depends only on the number of shards, not on how the devices are spread over processes (an
  all-reduce may sum in another order over another transport). Equals the global-batch mean for
  a loss that is a mean over examples with equal shards; metrics are averaged over shards."""
  n = mesh.shape["data"]
  split_spec = NamedSharding(mesh, P("data"))
  per_shard = jax.vmap(jax.value_and_grad(loss_fn, has_aux=True), in_axes=(None, 0, 0))

  def fixed_mean(a):
    total = a[0]
    for i in range(1, n):
      total = total + a[i]
    return total / jnp.asarray(n, a.dtype) if jnp.issubdtype(a.dtype, jnp.inexact) else total // n

  def value_and_grad(variables, batch, rng):
    def split(a):
      if a.shape[0] % n:
        raise ValueError(f"grad_reduction='ordered': batch size {a.shape[0]} must divide by the {n} devices")
      return a.reshape(n, a.shape[0] // n, *a.shape[1:])
    shards = jax.lax.with_sharding_constraint(jax.tree.map(split, batch), split_spec)
    keys = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(n))
    out = per_shard(variables, shards, keys)
    out = jax.lax.with_sharding_constraint(out, replicated(mesh))   # every shard's result on every device
    return jax.tree.map(fixed_mean, out)
  return value_and_grad


def step_fn(loss_fn: LossFn, tx: optax.GradientTransformation, grad_reduce=None, value_and_grad=None):
  """One optimizer step of one run, `step(state, batch) -> (state, metrics)`, not compiled.

  Args:
    loss_fn: `loss_fn(variables, batch, rng) -> (loss, metrics)`.
    tx: the optimizer.
    grad_reduce: applied to (grads, loss, metrics, updated collections) before the update (the
      `pmap` form's cross-device mean), or None.
    value_and_grad: replaces `jax.value_and_grad(loss_fn, has_aux=True)` (e.g. the ordered
      reduction over a mesh).

  Returns:
    The step. Its metrics hold the loss function's, "loss" and "grad_norm" (global norm). A
    non-finite loss leaves the state as it was and records its step in `nonfinite_at`.
  """
  value_and_grad = value_and_grad or jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: TrainState, batch):
    rng, sub = jax.random.split(jax.random.wrap_key_data(state.rng))
    (loss, metrics), grads = value_and_grad(state.variables, batch, sub)
    metrics = dict(metrics)
    updated = metrics.pop(UPDATED_COLLECTIONS, {})
    if grad_reduce is not None:
      grads, loss, metrics, updated = grad_reduce((grads, loss, metrics, updated))
    updates, opt_state = tx.update(grads, state.opt_state, state.variables)
    variables = {**optax.apply_updates(state.variables, updates), **updated}
    metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
    finite = jnp.all(jnp.isfinite(loss))
    halted = state.nonfinite_at >= 0
    new = TrainState(state.step + 1, variables, opt_state, jax.random.key_data(rng), state.nonfinite_at)
    keep = ~finite | halted                 # a non-finite loss never replaces the last good state
    new = jax.tree.map(lambda old, upd: jnp.where(keep, old, upd), state, new)
    new = new.replace(nonfinite_at=jnp.where(~finite & ~halted, state.step, state.nonfinite_at))
    return new, metrics
  return step


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, *, mesh: Mesh | None = None,
                    seed_axis: bool = False, steps_per_call: int = 1, donate: bool = True,
                    state_sharding=None, grad_reduction: str = "xla"):
  """A jitted ``step(state, batch) -> (state, metrics)``.

  Args:
    loss_fn: ``loss_fn(variables, batch, rng) -> (loss, aux)``, the loss of one run.
    tx: the optimizer (e.g. `maskprior_jax.mask_prior_optimizer`).
    mesh: a "data" mesh (`data_mesh`): batches are sharded over its "data" axis and the state
      replicated, or sharded as ``state_sharding`` says. A "runs" mesh (with ``seed_axis``):
      state, batch and metrics are sharded on their run axis; each device steps its own runs and
      nothing crosses devices.
    seed_axis: state and batch carry a leading seed axis; the step is vmapped over it, so S
      independent runs share one compiled program.
    steps_per_call: with more than 1, ``batch`` carries a leading axis of that many steps, run
      with ``lax.scan`` (metrics come back stacked).
    donate: donate the state's buffers to the call.
    state_sharding: the state's sharding with a "data" mesh, e.g. ``fsdp_sharding(state, mesh)``
      (XLA gathers each weight where it is used and reduce-scatters its gradient).
    grad_reduction: "xla" (XLA's all-reduce of the gradient) or "ordered" (each device's
      gradient gathered and summed in a fixed order, so the state is bit for bit the same however
      the mesh's devices are spread over processes; not with a sharded state).

  Returns:
    The jitted step. ``metrics`` holds the loss, the gradient's global norm and the learning
    rate (per run with ``seed_axis``).

  Raises:
    ValueError: for an unknown ``grad_reduction``, or "ordered" with a sharded state.
  """
  runs = is_runs_mesh(mesh)
  if runs and not seed_axis:
    raise ValueError("a runs mesh shards the stacked run axis: make_train_step(seed_axis=True)")
  step = step_fn(loss_fn, tx, value_and_grad=None if runs else _value_and_grad(loss_fn, mesh, grad_reduction,
                                                                                state_sharding))
  if seed_axis:
    step = jax.vmap(step)
  if steps_per_call > 1:
    single = step

    def step(state, batches):
      return jax.lax.scan(single, state, batches)
  kwargs = {}
  if runs:
    lead = int(steps_per_call > 1)
    step = _per_device(step, mesh, (P("runs"), P(*[None] * lead, "runs")), (P("runs"), P(*[None] * lead, "runs")))
    kwargs = dict(in_shardings=(run_sharding(mesh), run_sharding(mesh, lead)),
                  out_shardings=(run_sharding(mesh), run_sharding(mesh, lead)))
  elif mesh is not None:
    lead = int(seed_axis) + int(steps_per_call > 1)
    state_spec = replicated(mesh) if state_sharding is None else state_sharding
    kwargs = dict(in_shardings=(state_spec, batch_sharding(mesh, lead)),
                  out_shardings=(state_spec, replicated(mesh)))
  return jax.jit(step, donate_argnums=(0,) if donate else (), **kwargs)


def _per_device(fn, mesh: Mesh, in_specs, out_specs):
  """`fn` run on every device of a "runs" mesh on that device's own runs (shard_map): the program
  each device runs is `fn` at its local run count, with nothing exchanged between devices, so a
  device's runs come out as the same runs would on one device holding just those runs."""
  shard_map = getattr(jax, "shard_map", None)
  if shard_map is None:   # JAX before 0.7
    from jax.experimental.shard_map import shard_map
    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)
  return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _value_and_grad(loss_fn: LossFn, mesh: Mesh | None, grad_reduction: str, state_sharding):
  if grad_reduction not in GRAD_REDUCTIONS:
    raise ValueError(f"grad_reduction must be {' or '.join(GRAD_REDUCTIONS)}, not {grad_reduction!r}")
  if grad_reduction == "xla" or mesh is None:
    return None
  if state_sharding is not None:
    raise ValueError("grad_reduction='ordered' gathers every device's gradient: not with a sharded (FSDP) state")
  return _ordered_value_and_grad(loss_fn, mesh)


def make_generating_train_step(loss_fn: LossFn, tx: optax.GradientTransformation,
                               device_batch_fn: Callable[[jax.Array, jax.Array], Any], num_runs: int, *,
                               steps_per_call: int = 1, mesh: Mesh | None = None, state_sharding=None,
                               donate: bool = True, grad_reduction: str = "xla", runs_argument: bool = False):
  """A jitted ``step(state, first_step) -> (state, metrics)`` that draws its own batches on the device.

  No batch crosses from the host, and a resumed run sees the batches it would have seen. With a
  ``mesh``, every run's batch is constrained to the "data" axis, so each device draws and gathers
  only its rows (JAX's partitionable threefry gives the same numbers whatever the sharding); with
  a "runs" mesh each device draws and steps only its own runs.

  Args:
    loss_fn: ``loss_fn(variables, batch, rng) -> (loss, aux)``.
    tx: the optimizer.
    device_batch_fn: ``device_batch_fn(step, run)`` (traced int32 scalars) returns run ``run``'s
      batch for training step ``step``, a pure function of the two (e.g. indices drawn with a key
      folded from the run's seed and the step, gathered from a training set held on the device).
      Or a `DeviceBatches` with ``data``: the step then takes one more argument, that data (a
      pytree of arrays, replicated over a mesh), and draws with ``fn(step, run, data)``.
    num_runs: the runs the state stacks on its leading axis.
    steps_per_call: steps per call (metrics stacked on a leading step axis).
    mesh: a "data" or "runs" mesh, as in `make_train_step`.
    state_sharding: the state's sharding with a "data" mesh.
    donate: donate the state's buffers to the call.
    grad_reduction: as in `make_train_step`.
    runs_argument: one device, no mesh: the step is ``step(state, first_step, runs)``, ``runs``
      the int32 indices of the ``num_runs`` runs the state holds (a block of a larger set).

  Returns:
    The jitted step.
  """
  with_data = isinstance(device_batch_fn, DeviceBatches) and device_batch_fn.data is not None
  if isinstance(device_batch_fn, DeviceBatches):
    device_batch_fn = device_batch_fn.fn
  by_run = is_runs_mesh(mesh)
  step = jax.vmap(step_fn(loss_fn, tx, value_and_grad=None if by_run else _value_and_grad(
      loss_fn, mesh, grad_reduction, state_sharding)))
  runs = jnp.arange(num_runs, dtype=jnp.int32)
  # `data` (0 or 1 trailing arguments): DeviceBatches.data, passed to device_batch_fn as its third argument
  draw = lambda i, given, data: jax.vmap(lambda s, r: device_batch_fn(s, r, *data), in_axes=(None, 0))(i, given)

  def call(state, first_step, *data):
    def one(st, i):
      batch = draw(i, runs, data)
      if mesh is not None:   # a "data" mesh (a "runs" mesh takes the per-device call below)
        batch = jax.lax.with_sharding_constraint(batch, batch_sharding(mesh, 1))
      return step(st, batch)
    return jax.lax.scan(one, state, first_step + jnp.arange(steps_per_call, dtype=jnp.int32))

  def with_runs(state, first_step, given_runs, *data):   # the runs `given_runs` the state holds, their own batches
    def one_of(st, i):
      return step(st, draw(i, given_runs, data))
    return jax.lax.scan(one_of, state, first_step + jnp.arange(steps_per_call, dtype=jnp.int32))

  if runs_argument:
    if mesh is not None:
      raise ValueError("runs_argument: a one-device step (the caller places each block of runs)")
    return jax.jit(with_runs, donate_argnums=(0,) if donate else ())

  extra = (P(),) * with_data
  if by_run:   # each device draws and steps its own runs: the run indices are sharded with the state
    sharded = _per_device(with_runs, mesh, (P("runs"), P(), P("runs"), *extra), (P("runs"), P(None, "runs")))

    def call(state, first_step, *data):
      return sharded(state, first_step, runs, *data)
  kwargs = {}
  if by_run:
    kwargs = dict(in_shardings=(run_sharding(mesh), replicated(mesh), *(replicated(mesh),) * with_data),
                  out_shardings=(run_sharding(mesh), run_sharding(mesh, 1)))
  elif mesh is not None:
    state_spec = replicated(mesh) if state_sharding is None else state_sharding
    kwargs = dict(in_shardings=(state_spec, replicated(mesh), *(replicated(mesh),) * with_data),
                  out_shardings=(state_spec, replicated(mesh)))
  return jax.jit(call, donate_argnums=(0,) if donate else (), **kwargs)


def make_eval_step(eval_fn: Callable[[dict, Any], Any], *, mesh: Mesh | None = None,
                   seed_axis: bool = False, batch_axis: int = 0):
  """A jitted ``eval_step(variables, batch)``.

  Args:
    eval_fn: ``eval_fn(variables, batch)`` for one run.
    mesh: a "data" mesh: the batch is sharded over its "data" axis, the variables replicated.
    seed_axis: vmap over a leading seed axis of the variables (the batch is shared by all
      seeds).
    batch_axis: leading axes of the batch before its batch axis (for the sharding).

  Returns:
    The jitted evaluation step.
  """
  fn = jax.vmap(eval_fn, in_axes=(0, None)) if seed_axis else eval_fn
  kwargs = {}
  if mesh is not None:
    kwargs = dict(in_shardings=(replicated(mesh), batch_sharding(mesh, batch_axis)))
  return jax.jit(fn, **kwargs)


def loop_step(loss_fn: LossFn, tx: optax.GradientTransformation, batches: Callable[..., Any] | DeviceBatches,
              settings: LoopSettings, placement: Placement, state_sharding=None):
  """The compiled call `train_seeds` steps its runs with, for a placement.

  With run blocks (k > 0), one k-run program on one device: ``call(state, batch)`` (host batches)
  or ``call(state, first_step, runs)`` (device batches). Otherwise one program over all runs as
  the placement lays them out: ``call(state, batch)`` or ``call(state, first_step)``.

  Args:
    loss_fn: the loss of one run.
    tx: the optimizer.
    batches: a host batch function or `DeviceBatches`.
    settings: the `LoopSettings` (``steps_per_call``, gradient reduction).
    placement: where the runs go (`Placement`).
    state_sharding: the state's sharding ("data" placement with FSDP).

  Returns:
    The jitted call; each call runs ``settings.steps_per_call`` steps.
  """
  # DeviceBatches with data go whole (the step takes the data as an argument), else their function
  device_batch_fn = (batches if batches.data is not None else batches.fn) if isinstance(batches, DeviceBatches) else None
  spc, mesh = settings.steps_per_call, placement.mesh
  if placement.run_block > 0:   # one k-run program for every block of runs, wherever it lies (see RunBlocks)
    k = placement.run_block
    if device_batch_fn is not None:
      return make_generating_train_step(loss_fn, tx, device_batch_fn, k, steps_per_call=spc, donate=False,
                                        runs_argument=True)
    return make_train_step(loss_fn, tx, seed_axis=True, steps_per_call=spc, donate=False)
  if device_batch_fn is not None:
    return make_generating_train_step(loss_fn, tx, device_batch_fn, placement.num_runs, steps_per_call=spc,
                                      mesh=mesh, state_sharding=state_sharding,
                                      grad_reduction=settings.grad_reduction)
  return make_train_step(loss_fn, tx, seed_axis=True, steps_per_call=spc, mesh=mesh, state_sharding=state_sharding,
                         grad_reduction=settings.grad_reduction)
