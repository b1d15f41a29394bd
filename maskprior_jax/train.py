"""Compiled training: a train-state pytree, a jitted (optionally seed-vmapped, multi-step)
train step that is data parallel over a device mesh (or FSDP-sharded), an eval step, and
`train_seeds`, the one training loop every benchmark runs (seed-parallel, with periodic
evaluation, checkpoints and SIGTERM handling), driven by one `LoopSettings`. The `pmap` form of
the same step lives in `maskprior_jax.pmap`; meshes and shardings in `maskprior_jax.sharding`.

A loss function has the signature `loss_fn(variables, batch, rng) -> (loss, metrics)`, where
`variables` is the model's variable tree {"params": ..., "mask_prior": ..., ...}. A model with
state of its own (e.g. "batch_stats") returns the new collections in
`metrics[UPDATED_COLLECTIONS]`; they replace the old ones after the optimizer step (the
optimizer of `maskprior_jax.optim` never changes them itself).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import logging
import time
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from maskprior_jax import checkpoint as ckpt
from maskprior_jax import distributed, faults, optim
from maskprior_jax import sharding as sharding_lib
from maskprior_jax.sharding import (batch_sharding, data_mesh, fsdp_sharding, is_runs_mesh, replicated, run_sharding,
                                    runs_mesh)

logger = logging.getLogger(__name__)

__all__ = ["LoopSettings", "Placement", "DeviceBatches", "TrainState", "NonFiniteLoss", "create_state", "make_train_step",
           "make_generating_train_step", "make_eval_step", "train_seeds", "loop_step", "RunBlocks", "stack_trees", "Progress",
           "data_mesh", "batch_sharding", "replicated", "fsdp_sharding", "GRAD_REDUCTIONS", "UPDATED_COLLECTIONS"]

LossFn = Callable[[dict, Any, jax.Array], tuple[jax.Array, dict]]
UPDATED_COLLECTIONS = "updated_collections"


class NonFiniteLoss(RuntimeError):
  """The loss became NaN or infinite; the last good state was kept."""


@flax.struct.dataclass
class TrainState:
  """step: int32 scalar; variables: trainable collections; opt_state; rng: raw uint32 key data
  (plain arrays checkpoint everywhere); nonfinite_at: -1, or the step whose loss was not finite
  (from then on the step leaves the state as it was, so the last good state is kept on device
  and the host learns of it at its next sync, not by waiting on every step)."""
  step: jax.Array
  variables: dict
  opt_state: Any
  rng: jax.Array
  nonfinite_at: jax.Array


def create_state(variables: dict, tx: optax.GradientTransformation, rng: jax.Array) -> TrainState:
  """A run's initial `TrainState`: step 0, `variables` (every collection except "intermediates"),
  `tx.init` of them, the run's RNG key (stored as key data) and no non-finite loss seen."""
  variables = {k: v for k, v in variables.items() if k != "intermediates"}
  return TrainState(step=jnp.zeros((), jnp.int32), variables=variables,
                    opt_state=tx.init(variables), rng=_key_data(rng), nonfinite_at=jnp.full((), -1, jnp.int32))


def _key_data(rng):
  return jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng


GRAD_REDUCTIONS = ("xla", "ordered")
BATCH_SOURCES = ("host", "device", "auto")
PARALLEL = ("auto", "runs", "data", "off")
# "auto" spreads whole runs over devices up to this many parameters per run; a larger run has its
# batch split over all devices instead (data parallel), where the collectives pay for themselves.
RUNS_MAX_PARAMS = 50_000_000


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a loop's runs go. mode: "runs" (whole runs spread over the devices of `mesh`, the same
  number on each; nothing is reduced across devices, so each run is computed as on one device),
  "data" (every run's batch split over all devices of `mesh`), or "single" (one device, no mesh);
  reason: why it was chosen; run_block: how many of a device's runs are stepped together (0: all,
  one vmapped block; k: k at a time, see `train_seeds`)."""
  mode: str
  mesh: Mesh | None
  num_runs: int
  reason: str
  run_block: int = 0

  @property
  def runs_per_device(self) -> int:
    return self.num_runs // self.devices if self.mode == "runs" else self.num_runs

  @property
  def devices(self) -> int:
    return 1 if self.mesh is None else int(self.mesh.devices.size)

  def describe(self) -> str:
    """The progress line's words, e.g. "run-parallel: 8 runs over 8 devices, 1 per device (auto: ...);
    stepped one run at a time"."""
    blocks = ("" if self.mode == "data" else "; all of a device's runs stepped as one vmapped block"
              if not self.run_block else "; stepped one run at a time" if self.run_block == 1
              else f"; stepped {self.run_block} runs at a time")
    if self.mode == "runs":
      return (f"run-parallel: {self.num_runs} runs over {self.devices} devices, {self.runs_per_device} "
              f"per device ({self.reason}){blocks}")
    if self.mode == "data":
      return f"data-parallel: each of {self.num_runs} runs' batch split over {self.devices} devices ({self.reason})"
    return f"one device: {self.num_runs} runs ({self.reason}){blocks}"

  def record(self) -> dict:
    """What results.json's environment keeps of it."""
    return {"mode": self.mode, "devices": self.devices, "runs": self.num_runs, "reason": self.reason,
            "run_block": self.run_block}
SCHEDULES = ("constant", "cosine")
DECAY_ON = ("all", "matrices")
QK_MASK_DECAY = ("legacy", "none", "init")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """Everything the training loop reads, as one value (benchmarks build it once from their config,
  `maskprior_jax.bench.config.loop_settings`).

  steps, batch_size: the run's length and per-run batch size.
  steps_per_call: steps per compiled call (lax.scan); steps and the cadences below divide by it.
  eval_every, checkpoint_every (0: only at the end and on SIGTERM), log_every: cadences in steps.
  max_to_keep: checkpoints kept.
  data_parallel: split every run's batch over all devices (a mesh over jax.devices());
    fsdp: also shard large state leaves over them; grad_reduction: "xla" or "ordered"
    (see `make_train_step`); batches: "host" (built by numpy), "device" (drawn inside the step) or "auto" (a
    benchmark's choice: device where its training set is held whole on the device; the loop itself
    only sees the batch function it is given).
  parallel: where the stacked runs go (`placement`); run_block: how many of a device's runs are
    stepped together (`train_seeds`): "all" (one vmapped block: the fastest on an accelerator, but a
    run's float32 bits then depend on how many runs share its device), a number k (k at a time: a
    run's bits depend only on k, so a run alone on its device equals the same run among others on
    one device), or "auto": 1 on a CPU (compute-bound from one run, so stepping runs one at a
    time costs little there), "all" on an accelerator.
  optimizer, learning_rate, weight_decay, mask_lr_multiplier, freeze_mask: the optimizer
    (`optimizer()`, `maskprior_jax.optim.mask_prior_optimizer`).
  The recipe: warmup_steps (linear from 0), schedule ("constant", or "cosine" to 0 at `steps`),
    grad_clip_norm (global norm; 0: none), b2 (Adam's second-moment decay), decay_on ("all" leaves,
    or "matrices": weight matrices only, not LayerNorm, biases or embeddings), qk_mask_decay: how
    the attention query/key kernels and the mask prior decay, in every method alike: "legacy" (the
    kernels like every other weight, the mask not at all), "none" (neither), "init" (both toward
    their initial values). The defaults are the constant-rate optimizer of the committed runs.
  """
  steps: int
  batch_size: int
  steps_per_call: int = 1
  eval_every: int = 0
  checkpoint_every: int = 0
  log_every: int = 250
  max_to_keep: int = 2
  data_parallel: bool = False
  fsdp: bool = False
  grad_reduction: str = "xla"
  batches: str = "host"
  parallel: str = "auto"
  run_block: str = "auto"
  optimizer_name: str = "adamw"
  learning_rate: float = 1e-3
  weight_decay: float = 0.0
  mask_lr_multiplier: float = 1.0
  freeze_mask: bool = False
  warmup_steps: int = 0
  schedule: str = "constant"
  grad_clip_norm: float = 0.0
  b2: float = 0.999
  decay_on: str = "all"
  qk_mask_decay: str = "legacy"

  def __post_init__(self):
    if self.steps_per_call <= 0:
      raise ValueError(f"train.steps_per_call must be positive, got {self.steps_per_call}")
    for name, value in (("eval.every_steps", self.eval_every or self.steps), ("train.steps", self.steps),
                        ("checkpoint.every_steps", self.checkpoint_every)):
      if value % self.steps_per_call:
        raise ValueError(f"{name} ({value}) must be a multiple of train.steps_per_call ({self.steps_per_call})")
    if self.grad_reduction not in GRAD_REDUCTIONS:
      raise ValueError(f"train.grad_reduction must be {' or '.join(GRAD_REDUCTIONS)}, not {self.grad_reduction!r}")
    if self.batches not in BATCH_SOURCES:
      raise ValueError(f"train.batches must be {' or '.join(BATCH_SOURCES)}, not {self.batches!r}")
    if self.parallel not in PARALLEL:
      raise ValueError(f"train.parallel must be {', '.join(PARALLEL)}, not {self.parallel!r}")
    if not (self.run_block in ("auto", "all") or (str(self.run_block).isdigit() and int(self.run_block) > 0)):
      raise ValueError(f"train.run_block must be auto, all or a positive number of runs, not {self.run_block!r}")
    if self.data_parallel and self.parallel not in ("auto", "data"):
      raise ValueError(f"train.data_parallel=true splits every batch over the devices: not with "
                       f"train.parallel={self.parallel}")
    if self.fsdp and not (self.data_parallel or self.parallel == "data"):
      raise ValueError("train.fsdp shards the state over the data-parallel mesh: set train.parallel=data too")
    for name, value, allowed in (("train.schedule", self.schedule, SCHEDULES), ("train.decay_on", self.decay_on, DECAY_ON),
                                 ("train.qk_mask_decay", self.qk_mask_decay, QK_MASK_DECAY)):
      if value not in allowed:
        raise ValueError(f"{name} must be {' or '.join(allowed)}, not {value!r}")
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f"train.warmup_steps ({self.warmup_steps}) must be in [0, train.steps) = [0, {self.steps}): "
                       "a shorter run needs a shorter warmup (--config.train.warmup_steps=N)")
    if self.grad_clip_norm < 0:
      raise ValueError(f"train.grad_clip_norm must be >= 0, got {self.grad_clip_norm}")
    if self.fsdp and self.grad_reduction == "ordered":
      raise ValueError("train.grad_reduction=ordered gathers every device's gradient: not with train.fsdp=true")

  def learning_rate_schedule(self, learning_rate: float | None = None):
    """The base rate: a float when constant without warmup (the committed runs' optimizer state),
    else an optax schedule (linear warmup from 0, then constant or cosine to 0 at `steps`)."""
    peak = self.learning_rate if learning_rate is None else learning_rate
    if self.schedule == "constant" and not self.warmup_steps:
      return peak
    if self.schedule == "cosine":
      return optax.warmup_cosine_decay_schedule(0.0, peak, self.warmup_steps, self.steps, end_value=0.0)
    return optax.join_schedules([optax.linear_schedule(0.0, peak, self.warmup_steps), optax.constant_schedule(peak)],
                                [self.warmup_steps])

  def optimizer(self, learning_rate: float | None = None) -> optax.GradientTransformation:
    """The optimizer these settings name: the base rule on "params" (with the recipe: schedule,
    clipping, b2, which leaves decay and how), the mask's own learning rate (`mask_lr_multiplier` x)
    on the mask prior, or frozen (`freeze_mask`)."""
    matrices = optim.weight_matrices if self.decay_on == "matrices" else None
    decay_mask, anchor_mask = matrices, None
    if self.qk_mask_decay == "none":
      def decay_mask(tree, matrices=matrices):
        qk = optim.query_key_kernels(tree)
        keep = matrices(tree) if matrices else jax.tree.map(lambda _: True, tree)
        return jax.tree.map(lambda k, q: bool(k) and not q, keep, qk)
    elif self.qk_mask_decay == "init":
      anchor_mask = optim.query_key_kernels
    rules = optim.mask_rules(
        self.learning_rate_schedule(learning_rate), name=self.optimizer_name, weight_decay=self.weight_decay,
        b2=self.b2, mask_lr_multiplier=self.mask_lr_multiplier, freeze_mask=self.freeze_mask,
        mask_weight_decay=self.weight_decay if self.qk_mask_decay == "init" else 0.0,
        decay=optim.DecayRule(decay_mask, anchor_mask, mask_to_init=self.qk_mask_decay == "init"))
    return optim.clipped(optim.with_mask_transform(*rules), self.grad_clip_norm or None)

  def learning_rate_at(self, step: int) -> float:
    """The base learning rate at a step."""
    lr = self.learning_rate_schedule()
    return float(lr(step)) if callable(lr) else float(lr)

  def mesh(self) -> Mesh | None:
    """A mesh over all devices when data parallel (None otherwise)."""
    return data_mesh() if (self.data_parallel or self.parallel == "data") else None

  def run_block_for(self, runs_per_device: int) -> int:
    """`run_block` as a number for a device holding `runs_per_device` runs (0: all in one block)."""
    block = self.run_block
    if block == "auto":
      block = "1" if sharding_lib.platform() == "cpu" else "all"
    if block == "all":
      return 0
    if runs_per_device % int(block):
      raise ValueError(f"train.run_block={block}: {runs_per_device} runs per device do not split into blocks of "
                       f"{block}")
    return int(block)

  def placement(self, num_runs: int, params_per_run: int = 0) -> Placement:
    """Where `num_runs` stacked runs of `params_per_run` parameters each train (`parallel`), and how
    many of a device's runs are stepped together (`run_block`)."""
    return self.with_run_block(self._where(num_runs, params_per_run))

  def with_run_block(self, where: Placement) -> Placement:
    """`where` with this `run_block` for its runs per device (none with data parallel, where every
    device holds a share of every run)."""
    if where.mode == "data":
      return where
    return dataclasses.replace(where, run_block=self.run_block_for(where.runs_per_device))

  def _where(self, num_runs: int, params_per_run: int = 0) -> Placement:
    """Where `num_runs` stacked runs of `params_per_run` parameters each train (`parallel`):
    "data" (or `data_parallel`): every run's batch split over all devices; "runs": whole runs
    spread over the devices (`sharding.runs_mesh`: the largest device count that divides the
    runs, equally over the processes); "off": one device; "auto": runs where there are several
    devices, several runs and at most `RUNS_MAX_PARAMS` parameters per run, data parallel for a
    larger model (or where one run must span several processes), else one device."""
    n, procs = len(sharding_lib.devices()), sharding_lib.process_count()
    mode = "data" if self.data_parallel else self.parallel
    if mode == "data":
      return Placement("data", data_mesh(), num_runs, "train.parallel=data")
    if mode == "off":
      if procs > 1:
        raise ValueError("train.parallel=off: one device, but this is one of several processes")
      return Placement("single", None, num_runs, "train.parallel=off")
    mesh = runs_mesh(num_runs)
    if mode == "runs":
      if mesh is None and procs > 1:
        raise ValueError(f"train.parallel=runs: {num_runs} runs cannot be split evenly over {procs} processes")
      if mesh is None:
        return Placement("single", None, num_runs, f"train.parallel=runs, but {num_runs} run(s) on {n} device(s)")
      return Placement("runs", mesh, num_runs, "train.parallel=runs")
    if n == 1:
      return Placement("single", None, num_runs, "auto: one device")
    if params_per_run > RUNS_MAX_PARAMS or mesh is None:
      why = (f"{params_per_run:,} parameters per run" if params_per_run > RUNS_MAX_PARAMS
             else f"{num_runs} run(s) do not split over the devices")
      if procs > 1 or (params_per_run > RUNS_MAX_PARAMS and self.batch_size % n == 0):
        return Placement("data", data_mesh(), num_runs, f"auto: {why}")
      return Placement("single", None, num_runs, f"auto: {why}; a batch of {self.batch_size} is too small to split")
    return Placement("runs", mesh, num_runs, f"auto: {n} devices, {params_per_run:,} parameters per run")


@dataclasses.dataclass(frozen=True)
class DeviceBatches:
  """Batches drawn inside the compiled step: `fn(step, run)` (traced int32 scalars) returns run
  `run`'s batch for training step `step` (see `make_generating_train_step`)."""
  fn: Callable[[jax.Array, jax.Array], Any]


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
  """A jitted `step(state, batch) -> (state, metrics)`.

  seed_axis: state and batch carry a leading seed axis; the step is vmapped over it, so S
    independent runs share one compiled program.
  steps_per_call > 1: `batch` carries a leading axis of that many steps, run with lax.scan
    (metrics come back stacked).
  mesh: a "data" mesh (`sharding.data_mesh`): batches are sharded over its "data" axis and the
    state replicated, or sharded as `state_sharding` says (e.g. `fsdp_sharding(state, mesh)` for
    large models: XLA gathers each weight where it is used and reduce-scatters its gradient). A
    "runs" mesh (`sharding.runs_mesh`, with `seed_axis`): state, batch and metrics are sharded on
    their run axis, each device steps its own runs and nothing crosses devices.
  grad_reduction: "xla" (XLA's all-reduce of the gradient) or "ordered" (with a mesh: each
    device's gradient gathered and summed in a fixed order, so the state is bit for bit the
    same however the mesh's devices are spread over processes; costs a gather of every
    device's gradient, so not with a sharded state; see `_ordered_value_and_grad`).
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
  """A jitted `step(state, first_step) -> (state, metrics)` that draws its own batches on the
  device: `device_batch_fn(step, run)` (traced; int32 scalars) returns run `run`'s batch for
  training step `step`, a pure function of the two (e.g. indices drawn with a key folded from
  the run's seed and the step, gathered from a training set held on the device), so a resumed
  run sees the batches it would have seen and no batch crosses from the host. The state carries
  a leading run axis of `num_runs` (as `make_train_step(seed_axis=True)`); each call runs
  `steps_per_call` steps (metrics stacked on a leading step axis). With a `mesh`, every run's
  batch is constrained to the "data" axis, so each device draws and gathers only its rows (JAX's
  partitionable threefry gives the same numbers whatever the sharding). `grad_reduction` as in
  `make_train_step`. With a "runs" mesh each device draws and steps only its own runs.
  runs_argument (one device, no mesh): the step is `step(state, first_step, runs)`, `runs` the
  int32 indices of the `num_runs` runs the state holds (a block of a larger set of runs).
  """
  by_run = is_runs_mesh(mesh)
  step = jax.vmap(step_fn(loss_fn, tx, value_and_grad=None if by_run else _value_and_grad(
      loss_fn, mesh, grad_reduction, state_sharding)))
  runs = jnp.arange(num_runs, dtype=jnp.int32)

  def one(state, i):
    batch = jax.vmap(device_batch_fn, in_axes=(None, 0))(i, runs)
    if mesh is not None:   # a "data" mesh (a "runs" mesh takes the per-device call below)
      batch = jax.lax.with_sharding_constraint(batch, batch_sharding(mesh, 1))
    return step(state, batch)

  def call(state, first_step):
    return jax.lax.scan(one, state, first_step + jnp.arange(steps_per_call, dtype=jnp.int32))

  def with_runs(state, first_step, given_runs):   # the runs `given_runs` the state holds, their own batches
    def one_of(st, i):
      return step(st, jax.vmap(device_batch_fn, in_axes=(None, 0))(i, given_runs))
    return jax.lax.scan(one_of, state, first_step + jnp.arange(steps_per_call, dtype=jnp.int32))

  if runs_argument:
    if mesh is not None:
      raise ValueError("runs_argument: a one-device step (the caller places each block of runs)")
    return jax.jit(with_runs, donate_argnums=(0,) if donate else ())

  if by_run:   # each device draws and steps its own runs: the run indices are sharded with the state
    sharded = _per_device(with_runs, mesh, (P("runs"), P(), P("runs")), (P("runs"), P(None, "runs")))

    def call(state, first_step):
      return sharded(state, first_step, runs)
  kwargs = {}
  if by_run:
    kwargs = dict(in_shardings=(run_sharding(mesh), replicated(mesh)),
                  out_shardings=(run_sharding(mesh), run_sharding(mesh, 1)))
  elif mesh is not None:
    state_spec = replicated(mesh) if state_sharding is None else state_sharding
    kwargs = dict(in_shardings=(state_spec, replicated(mesh)), out_shardings=(state_spec, replicated(mesh)))
  return jax.jit(call, donate_argnums=(0,) if donate else (), **kwargs)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _cut(tree, k: int, blocks: int):
  """A tree's leading axis cut into `blocks` blocks of `k` (one compiled program for the whole tree)."""
  return [jax.tree.map(lambda a: a[i * k:(i + 1) * k], tree) for i in range(blocks)]


@functools.partial(jax.jit, static_argnums=1)
def _concat(trees, axis: int):
  """Trees of the same structure concatenated leaf by leaf along `axis` (one compiled program)."""
  return trees[0] if len(trees) == 1 else jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=axis), *trees)


class RunBlocks:
  """A loop's runs cut into blocks of `k`, each block kept on the device that holds its runs and
  stepped by one compiled k-run program (one call per block, dispatched without waiting). The
  program is the same for every block on every device, so a run's bits depend only on k: not on
  how many runs share its device, nor on how many devices or processes there are. `join` puts
  the blocks back together as the stacked state (sharded as the placement says), for the loop's
  sync points (evaluation, checkpoints, the non-finite check); `split` cuts a stacked state."""

  def __init__(self, placement: Placement, k: int, num_runs: int, own_start: int):
    self.mesh, self.k = placement.mesh, k
    devices = [sharding_lib.devices()[0]] if self.mesh is None else list(self.mesh.devices.flat)
    self.per_device = num_runs // len(devices)
    self.devices = [d for d in devices if d.process_index == jax.process_index()]
    starts = {d: devices.index(d) * self.per_device for d in self.devices}
    # (device, first run's global index, first run's index among this process's runs)
    self.blocks = [(d, starts[d] + j, starts[d] + j - own_start) for d in self.devices
                   for j in range(0, self.per_device, k)]

  @functools.cached_property
  def runs(self) -> list[jax.Array]:
    """Each block's global run indices on its device (the device-batch step's `runs` argument;
    made on first use: host batches need none)."""
    return [jax.device_put(np.arange(g, g + self.k, dtype=np.int32), d) for d, g, _ in self.blocks]

  def split(self, tree):
    """A stacked state (as the placement lays it out) cut into the blocks' states."""
    out = []
    for d in self.devices:
      local = jax.tree.map(lambda a: next(s.data for s in a.addressable_shards if s.device == d), tree)
      # committed to the device, as the step's outputs are: the step compiles once, not again at its
      # second call
      out += _cut(jax.device_put(local, d), self.k, self.per_device // self.k)
    return out

  def join(self, trees, run_axis: int = 0):
    """The blocks' trees (states, or metrics with the run axis at `run_axis`) stacked back, one
    compiled concatenation per device, sharded as the placement lays the runs out."""
    per_device = len(self.blocks) // len(self.devices)
    parts = [_concat(tuple(trees[j * per_device:(j + 1) * per_device]), run_axis) for j in range(len(self.devices))]
    if self.mesh is None:
      return parts[0]
    sharding = run_sharding(self.mesh, run_axis)

    def whole(*local):
      shape = list(local[0].shape)
      shape[run_axis] *= int(self.mesh.devices.size)
      return jax.make_array_from_single_device_arrays(tuple(shape), sharding, list(local))
    return jax.tree.map(whole, *parts)

  def host_batch(self, batch, b: int, run_axis: int):
    """Block b's rows of a host batch stacked over this process's runs, on the block's device."""
    d, _, own = self.blocks[b]
    cut = (slice(None),) * run_axis + (slice(own, own + self.k),)
    return jax.device_put(jax.tree.map(lambda a: np.asarray(a)[cut], batch), d)


def make_eval_step(eval_fn: Callable[[dict, Any], Any], *, mesh: Mesh | None = None,
                   seed_axis: bool = False, batch_axis: int = 0):
  """A jitted `eval_step(variables, batch)`; vmapped over seeds when `seed_axis`
  (the batch is shared by all seeds)."""
  fn = jax.vmap(eval_fn, in_axes=(0, None)) if seed_axis else eval_fn
  kwargs = {}
  if mesh is not None:
    kwargs = dict(in_shardings=(replicated(mesh), batch_sharding(mesh, batch_axis)))
  return jax.jit(fn, **kwargs)


class Progress:
  """Reports `[label] step k/total loss=... (steps/s, elapsed)` every `every` steps: to the
  "maskprior_jax.train" logger at INFO (the `maskprior` command shows it on stderr; an importing
  program routes or silences it with `logging`), or printed to `stream` where one is given."""

  def __init__(self, total: int, label: str = "", every: int = 100, stream=None, enabled: bool = True):
    self.total, self.label, self.every, self.enabled = total, label, every, enabled
    self.stream = stream
    self.t0 = self.t_last = time.perf_counter()
    self.last_step = 0

  def update(self, step: int, metrics: dict | None = None):
    if not self.enabled or (step % self.every and step != self.total):
      return
    now = time.perf_counter()
    rate = (step - self.last_step) / max(now - self.t_last, 1e-9)
    self.t_last, self.last_step = now, step
    shown = ""
    if metrics:
      shown = " ".join(f"{k}={float(np.mean(v)):.4g}" for k, v in metrics.items())
    line = f"[{self.label}] step {step}/{self.total} {shown} ({rate:.1f} steps/s, {now - self.t0:.0f}s)"
    if self.stream is None:
      logger.info(line)
    else:
      print(line, file=self.stream, flush=True)


def num_params(variables: dict) -> int:
  """Number of elements over the leaves of a variable tree (one run's)."""
  return int(sum(np.prod(np.shape(a), dtype=np.int64) for a in jax.tree.leaves(variables)))


def _put(tree, sharding):
  """`tree` (the same values in every process) placed with `sharding`, which may span processes."""
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  def one(a):
    host = np.asarray(jax.device_get(a))
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
  return jax.tree.map(one, tree)


def stack_trees(trees: Sequence[Any]) -> Any:
  """Stack pytrees of the same structure along a new leading (seed) axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def loop_step(loss_fn: LossFn, tx: optax.GradientTransformation, batches: Callable[..., Any] | DeviceBatches,
              settings: LoopSettings, placement: Placement, state_sharding=None):
  """The compiled call `train_seeds` steps its runs with, for a placement: with run blocks (k > 0) one
  k-run program on one device, `call(state, batch)` (host batches) or `call(state, first_step, runs)`
  (device batches); otherwise one program over all runs as the placement lays them out,
  `call(state, batch)` or `call(state, first_step)`. Each call runs `settings.steps_per_call` steps."""
  device_batch_fn = batches.fn if isinstance(batches, DeviceBatches) else None
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


_SYNC_IDS = itertools.count(1)   # preemption sync-point ids: calls of every loop in this process


def _host(d: dict) -> dict:
  return {k: np.asarray(jax.device_get(v)).tolist() for k, v in d.items()}


def train_seeds(*, loss_fn: LossFn, tx: optax.GradientTransformation, variables: Sequence[dict],
                seeds: Sequence[int], batches: Callable[..., Any] | DeviceBatches, settings: LoopSettings,
                eval_fn: Callable[[int, dict], dict], label: str = "", checkpointer=None,
                mesh: Mesh | Placement | None = None) -> tuple[TrainState, list[dict]]:
  """The training loop: one run per seed, all seeds in a single vmapped program, for
  `settings.steps` steps (`settings.steps_per_call` per compiled call).

  batches: a host batch function `batch_fn(step, seeds) -> batch` with a leading seed axis (a
  function of seed and step, so a resumed run sees the batches it would have seen), built by
  numpy. A batch_fn that takes a `part` keyword, `batch_fn(step, seeds, part=(i, n))`, builds only
  share i of n of every seed's rows (`distributed.take_part`): with a mesh each process then
  builds only its own rows (otherwise the global batch is built and the process's rows sliced
  out). Or `DeviceBatches(fn)`: batches drawn inside the compiled step
  (`make_generating_train_step`; `fn(step, run)`, run = index into `seeds`).
  mesh: where the runs go: a `Placement`, or a mesh, or None for `settings.placement(len(seeds),
  parameters per run)`; the progress log says which. Run-parallel (a "runs" mesh): each
  device holds and steps whole runs, each process builds only its own runs' host batches, and no
  value crosses devices inside the step, so every run is computed as it would be alone. With
  `placement.run_block` k > 0 (`LoopSettings.run_block`; on a CPU by default) each device's runs
  are stepped k at a time by one compiled k-run program, a call per block: a run's bits then
  depend only on k, not on the layout (see `RunBlocks`).
  With a "data" mesh,
  every seed's batch is split over its "data" axis (data parallel, the state replicated); the
  batch size must divide by its size, and each process feeds only its rows of the global batch
  (`distributed.process_slice`). With `settings.fsdp` as well, large state leaves are split over
  the mesh (`fsdp_sharding`); `settings.grad_reduction="ordered"` sums the devices' gradients in
  a fixed order (see `make_train_step`).

  eval_fn(step, stacked_variables) -> dict of per-seed arrays, called at step 0, every
  `settings.eval_every` steps and at the end. If it has a method `log_train(step, row)`, that gets,
  at every log point, the window's training figures: per-seed mean "loss" and "grad_norm" (global
  norm of the gradient) over the steps since the last log point, and "learning_rate" (summed on
  the device as the steps run; fetched only at the log point).
  With a `checkpointer` (`checkpoint.Checkpointer`), the state and the eval history are saved every
  `settings.checkpoint_every` steps, at the end and on SIGTERM (then `checkpoint.Preempted` is
  raised; with several processes a SIGTERM that reaches any one of them goes to JAX's preemption
  service, and every process saves the same step, the sync point they agree on), and a run finds and continues from its
  latest checkpoint. The host waits on the device only at those points (logging, evaluation,
  saving): a non-finite loss freezes that seed's state inside the compiled step, and the next sync
  raises `NonFiniteLoss` without saving.
  Returns the final stacked state and the eval history.
  """
  loop = settings
  steps, steps_per_call, log_every = loop.steps, loop.steps_per_call, loop.log_every
  eval_every, checkpoint_every = loop.eval_every or loop.steps, loop.checkpoint_every
  if isinstance(mesh, Placement):
    placement = mesh
  elif mesh is not None:
    placement = loop.with_run_block(Placement("runs" if is_runs_mesh(mesh) else "data", mesh, len(seeds),
                                              "given mesh"))
  else:
    placement = loop.placement(len(seeds), num_params(variables[0]))
  mesh, by_run = placement.mesh, placement.mode == "runs"
  if by_run and len(seeds) % placement.devices:
    raise ValueError(f"{len(seeds)} runs do not split evenly over the {placement.devices} devices of the runs mesh")
  if distributed.is_main_process():
    logger.info("[%s] %s", label, placement.describe())
  device_batch_fn = batches.fn if isinstance(batches, DeviceBatches) else None
  batch_fn = None if device_batch_fn is not None else batches
  states = stack_trees([create_state(v, tx, jax.random.key(s)) for v, s in zip(variables, seeds)])
  state_sharding = fsdp_sharding(states, mesh) if (mesh is not None and loop.fsdp and not by_run) else None
  blocked = placement.run_block > 0
  call = loop_step(loss_fn, tx, batches, loop, placement, state_sharding)
  lead = 1 + int(steps_per_call > 1)   # the batch axis comes after (steps,) seeds
  builds_part = (mesh is not None and not by_run and batch_fn is not None
                 and "part" in inspect.signature(batch_fn).parameters)
  own_slice = distributed.process_slice(len(seeds)) if by_run else slice(0, len(seeds))
  own_runs = list(seeds)[own_slice]
  blocks = RunBlocks(placement, placement.run_block, len(seeds), own_slice.start or 0) if blocked else None

  def host_batch(step):
    if by_run:
      return batch_fn(step, own_runs)   # this process's runs only, whole
    if builds_part:
      return batch_fn(step, seeds, part=distributed.process_part())   # this process's rows only
    return batch_fn(step, seeds)

  def host_chunk(step):
    """The host batches of one call (stacked on a leading step axis when it runs several steps)."""
    chunk = [host_batch(step + j) for j in range(steps_per_call)]
    return jax.tree.map(lambda *xs: np.stack(xs), *chunk) if steps_per_call > 1 else chunk[0]

  def place(batch):
    if mesh is None:
      return batch
    if by_run:
      sharding = run_sharding(mesh, lead - 1)
      return jax.tree.map(lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), batch)
    local = batch if builds_part else jax.tree.map(
        lambda a: np.asarray(a)[(slice(None),) * lead + (distributed.process_slice(a.shape[lead]),)], batch)
    return distributed.global_batch(local, mesh, lead)
  done, history = 0, None
  if by_run:
    states = _put(states, run_sharding(mesh))
  elif mesh is not None:
    states = jax.device_put(states, state_sharding or replicated(mesh))
  elif blocked:   # committed, as the joined states of later evaluations are: evaluation compiles once
    states = jax.device_put(states, blocks.devices[0])
  if checkpointer is not None:
    # Restored straight into the state's sharding: with several processes each reads its shards.
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), states)
    restored = checkpointer.restore_latest(abstract)
    if restored is not None:
      states, record = restored
      done, history = int(record["step"]), record["history"]
      if distributed.is_main_process():
        logger.info("[%s] resumed from the checkpoint at step %d", label, done)
  if history is None:
    history = [{"step": 0, **_host(eval_fn(0, states.variables))}]
  parts = None   # blocked: the blocks' states, and `states` joined from them at sync points
  if blocked:
    parts = blocks.split(states)
    states = blocks.join(parts)   # compiles the join here, not at the first sync point inside the loop
  faults.point("compile")
  progress = Progress(steps, label=label, every=log_every, enabled=distributed.is_main_process())
  progress.last_step = done
  log_train = getattr(eval_fn, "log_train", None)
  window, window_steps = None, 0   # device-side per-seed sums of loss and grad_norm since the last log

  def add_window(metrics):
    nonlocal window, window_steps
    part = {k: jnp.sum(metrics[k], 0) if steps_per_call > 1 else metrics[k] for k in ("loss", "grad_norm")}
    window = part if window is None else jax.tree.map(jnp.add, window, part)
    window_steps += steps_per_call

  def save(step, wait=False):
    # The arrays as they lie on the devices: orbax writes each process's shards from that process.
    if checkpointer is not None:
      checkpointer.save(step, states, {"step": step, "history": history}, wait=False)
      faults.point("save")
      if wait:
        checkpointer.wait()

  def check_finite():
    """At a sync point: stop if any seed met a non-finite loss (its state is the last good one)."""
    bad = distributed.host_tree(states.nonfinite_at).reshape(-1)
    if np.any(bad >= 0):
      first = int(bad[bad >= 0].min())
      raise NonFiniteLoss(f"[{label}] loss became non-finite between steps {first} and {first + 1}; "
                          "last good checkpoint kept. Lower train.learning_rate")

  several = jax.process_count() > 1

  def preempted() -> bool:
    if several:   # the same answer, at the same call, in every process
      from jax.experimental import multihost_utils
      # JAX's sync point is the call after the highest id any process had passed when the notice
      # came; ids count calls over the whole process (every process makes the same calls), so the
      # next call is that point even between one method's loop and the next.
      return multihost_utils.reached_preemption_sync_point(next(_SYNC_IDS))
    return sigterm.raised

  first_done, t_first = None, None   # the loop's own timing: from the end of the first call (compiled)
  spent = {"evaluation": 0.0, "checkpoints": 0.0}
  try:
    with ckpt.SigtermFlag(install=not several) as sigterm:
      while done < steps:
        # No host sync here: the device runs ahead while the next batch is built.
        if blocked:
          if device_batch_fn is not None:
            out = [call(part, np.int32(done), runs) for part, runs in zip(parts, blocks.runs)]
          else:
            batch = host_chunk(done)
            out = [call(part, blocks.host_batch(batch, b, lead - 1)) for b, part in enumerate(parts)]
          parts = [o[0] for o in out]
          metrics = blocks.join([o[1] for o in out], run_axis=lead - 1)
        elif device_batch_fn is not None:
          states, metrics = call(states, np.int32(done))
        else:
          states, metrics = call(states, place(host_chunk(done)))
        done += steps_per_call
        if t_first is None:   # the timing starts once the first (compiling) call has run
          jax.block_until_ready(parts if blocked else states)
          first_done, t_first = done, time.perf_counter()
        if log_train is not None:
          add_window(metrics)
        faults.point("step")
        log_now, eval_now = done % log_every == 0 or done == steps, done % eval_every == 0 or done == steps
        term = preempted()   # read once: a signal arriving later is handled at the next step
        save_now = (checkpoint_every and done % checkpoint_every == 0) or done == steps or term
        if not (log_now or eval_now or save_now):
          continue
        if blocked:
          states = blocks.join(parts)
        check_finite()
        if log_now:
          loss = distributed.host_tree(metrics["loss"])
          progress.update(done, {"loss": loss[-1] if loss.ndim > 1 else loss})
          if log_train is not None:
            row = {k: v / window_steps for k, v in distributed.host_tree(window).items()}
            log_train(done, {**row, "learning_rate": loop.learning_rate_at(done)})
            window, window_steps = None, 0
        if eval_now:
          t0 = time.perf_counter()
          history.append({"step": done, **_host(eval_fn(done, states.variables))})
          spent["evaluation"] += time.perf_counter() - t0
          faults.point("eval")
        if save_now:
          t0 = time.perf_counter()
          save(done, wait=done == steps or term)
          spent["checkpoints"] += time.perf_counter() - t0
        if term:
          raise ckpt.Preempted(f"[{label}] SIGTERM at step {done}: checkpoint saved; rerun the same command to resume")
  finally:
    if checkpointer is not None:
      checkpointer.wait()  # a pending async save reaches disk whatever ends the loop
  if t_first is not None and done > first_done and distributed.is_main_process():
    elapsed = time.perf_counter() - t_first
    logger.info("[%s] loop: %d steps in %.2f s after the first (compiling) call, %.1f steps/s with logging, "
                "evaluation and checkpoints (evaluation %.2f s, checkpoints %.2f s)", label, done - first_done,
                elapsed, (done - first_done) / elapsed, spent["evaluation"], spent["checkpoints"])
  return states, history
