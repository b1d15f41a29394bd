"""How a loop's runs are stepped, chosen once before the loop (`stepper`): one implementation per
placement (`OneDevice`, `RunsMesh`, `DataMesh` with optional FSDP, and `Blocks`: run blocks on
one device or over a runs mesh), each behind the same small interface (`Stepper`): place the
initial states, take a restored state, dispatch one compiled call, give the stacked state at a
sync point, wait for the last call. The loop (`maskprior_jax.train.loop`) never asks which one it
has."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskprior_jax import distributed
from maskprior_jax import sharding as sharding_lib
from maskprior_jax.sharding import fsdp_sharding, replicated, run_sharding
from maskprior_jax.train.batches import DeviceBatches, HostBatches, builds_part
from maskprior_jax.train.placement import Placement
from maskprior_jax.train.settings import LoopSettings
from maskprior_jax.train.state import LossFn, TrainState
from maskprior_jax.train.steps import loop_step

__all__ = ["Stepper", "OneDevice", "RunsMesh", "DataMesh", "Blocks", "RunBlocks", "stepper"]


class Stepper:
  """Steps a loop's stacked runs as its placement says.

  The loop calls `step(first_step)` once per compiled call (dispatched without waiting: the device
  runs ahead while the next batches are built), `state()` at its sync points (evaluation,
  checkpoints, the non-finite check), `ready()` to time the first call, and before the loop
  `abstract()` / `load(state)` to restore a checkpoint into the placement's layout.

  Attributes:
    placement: where the runs go (`Placement`; its `describe()` and `record()` for the log and
      results.json).
    call: the compiled call (`steps.loop_step` for this placement).
  """

  def __init__(self, loss_fn: LossFn, tx: optax.GradientTransformation, states: TrainState, seeds: Sequence[int],
               batches: Callable | DeviceBatches, settings: LoopSettings, placement: Placement):
    self.placement, self.mesh, self.seeds = placement, placement.mesh, list(seeds)
    self.run_axis = int(settings.steps_per_call > 1)   # a batch's run axis comes after (steps,)
    self.state_sharding = self.sharding_for(states, settings)
    self.call = loop_step(loss_fn, tx, batches, settings, placement, self.state_sharding)
    self.batches = batches if isinstance(batches, DeviceBatches) else HostBatches(
        batches, self.host_keys(), settings.steps_per_call, self.host_part(batches))
    # DeviceBatches.data: placed once, an argument of every call
    self.data = (self.put_data(batches.data) if isinstance(batches, DeviceBatches) and batches.data is not None
                 else None)
    self.load(self.put(states))

  def sharding_for(self, states: TrainState, settings: LoopSettings):
    """The state's sharding where it is not the placement's default (FSDP), else None."""
    del states, settings
    return None

  def put(self, states: TrainState) -> TrainState:
    """The initial stacked states, laid out as the placement steps them."""
    return states

  def put_data(self, data):
    """`DeviceBatches.data`, laid out as the compiled call takes it (on its device, or replicated)."""
    return jax.device_put(data)

  def data_args(self, block: int | None = None) -> tuple:
    """The call's trailing data argument (none without `DeviceBatches.data`)."""
    del block
    return () if self.data is None else (self.data,)

  def host_keys(self) -> list[int]:
    """The runs whose host batches this process builds."""
    return self.seeds

  def host_part(self, batch_fn: Callable) -> tuple[int, int] | None:
    """The share of every run's rows this process builds, or None for all of them."""
    del batch_fn
    return None

  def place(self, chunk):
    """One call's host batches as the compiled call takes them."""
    return chunk

  def abstract(self):
    """The stacked state's shapes, dtypes and shardings: where a checkpoint is restored to."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), self.state())

  def load(self, states: TrainState) -> None:
    """Continue from `states` (laid out as `put` lays them)."""
    self.states = states

  def step(self, first_step: int):
    """Dispatch one compiled call (`steps_per_call` steps from `first_step`); returns its metrics."""
    self.states, metrics = self.call(self.states, *self.batches.call_args(first_step, self.place), *self.data_args())
    return metrics

  def state(self) -> TrainState:
    """The stacked state of every run (at a sync point)."""
    return self.states

  def ready(self) -> None:
    """Wait until the last call has run."""
    jax.block_until_ready(self.states)


class OneDevice(Stepper):
  """Every run on one device, stepped as one vmapped program."""


class RunsMesh(Stepper):
  """Whole runs spread over the devices of a "runs" mesh, one vmapped program per device with
  nothing exchanged between devices; each process builds only its own runs' host batches."""

  def put(self, states):
    return _put(states, run_sharding(self.mesh))

  def put_data(self, data):
    return _put(data, replicated(self.mesh))

  def host_keys(self):
    return self.seeds[distributed.process_slice(len(self.seeds))]

  def place(self, chunk):
    sharding = run_sharding(self.mesh, self.run_axis)
    return jax.tree.map(lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), chunk)


class DataMesh(Stepper):
  """Every run's batch split over a "data" mesh, the state replicated (or, with `settings.fsdp`,
  its large leaves sharded over the mesh); each process feeds only its rows of the global batch."""

  def sharding_for(self, states, settings):
    return fsdp_sharding(states, self.mesh) if settings.fsdp else None

  def put(self, states):
    return jax.device_put(states, self.state_sharding or replicated(self.mesh))

  def put_data(self, data):
    return _put(data, replicated(self.mesh))

  def host_part(self, batch_fn):
    return distributed.process_part() if builds_part(batch_fn) else None

  def place(self, chunk):
    axis = self.run_axis + 1
    local = chunk if self.batches.part is not None else jax.tree.map(
        lambda a: np.asarray(a)[(slice(None),) * axis + (distributed.process_slice(a.shape[axis]),)], chunk)
    return distributed.global_batch(local, self.mesh, axis)


class Blocks(Stepper):
  """A device's runs stepped k at a time (`placement.run_block`), on one device or over a runs mesh:
  one compiled k-run program, a call per block (`RunBlocks`); the stacked state is joined from the
  blocks' states only at sync points."""

  def __init__(self, loss_fn, tx, states, seeds, batches, settings, placement):
    by_run = placement.mode == "runs"
    own = (distributed.process_slice(len(seeds)).start or 0) if by_run else 0
    self.blocks = RunBlocks(placement, placement.run_block, len(seeds), own)
    super().__init__(loss_fn, tx, states, seeds, batches, settings, placement)

  def put(self, states):
    if self.mesh is None:   # committed, as the joined states of later evaluations are: evaluation compiles once
      return jax.device_put(states, self.blocks.devices[0])
    return _put(states, run_sharding(self.mesh))

  def put_data(self, data):   # a copy on each of this process's devices, committed there
    return {d: jax.device_put(data, d) for d in self.blocks.devices}

  def data_args(self, block: int | None = None) -> tuple:
    return () if self.data is None else (self.data[self.blocks.blocks[block][0]],)

  def host_keys(self):
    return self.seeds if self.mesh is None else self.seeds[distributed.process_slice(len(self.seeds))]

  def load(self, states):
    self.parts = self.blocks.split(states)
    self.joined = self.blocks.join(self.parts)   # compiles the join here, not at the loop's first sync point

  def step(self, first_step):
    args = self.batches.block_args(first_step, self.blocks, self.run_axis)
    out = [self.call(part, *a, *self.data_args(b)) for b, (part, a) in enumerate(zip(self.parts, args))]
    self.parts, self.joined = [o[0] for o in out], None
    return self.blocks.join([o[1] for o in out], run_axis=self.run_axis)

  def state(self):
    if self.joined is None:
      self.joined = self.blocks.join(self.parts)
    return self.joined

  def ready(self):
    jax.block_until_ready(self.parts)


def stepper(loss_fn: LossFn, tx: optax.GradientTransformation, states: TrainState, seeds: Sequence[int],
            batches: Callable | DeviceBatches, settings: LoopSettings, placement: Placement) -> Stepper:
  """The `Stepper` for a placement.

  Args:
    loss_fn: the loss of one run.
    tx: the optimizer.
    states: the initial stacked `TrainState` (one run per seed).
    seeds: the runs' seeds.
    batches: a host batch function or `DeviceBatches`.
    settings: the `LoopSettings`.
    placement: where the runs go.

  Returns:
    A `Stepper` holding ``states`` in the placement's layout.
  """
  kind = Blocks if placement.run_block > 0 else {"single": OneDevice, "runs": RunsMesh, "data": DataMesh}[placement.mode]
  return kind(loss_fn, tx, states, seeds, batches, settings, placement)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _cut(tree, k: int, blocks: int):
  """A tree's leading axis cut into `blocks` blocks of `k` (one compiled program for the whole tree)."""
  return [jax.tree.map(lambda a: a[i * k:(i + 1) * k], tree) for i in range(blocks)]


@functools.partial(jax.jit, static_argnums=1)
def _concat(trees, axis: int):
  """Trees of the same structure concatenated leaf by leaf along `axis` (one compiled program)."""
  return trees[0] if len(trees) == 1 else jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=axis), *trees)


class RunBlocks:
  """A loop's runs cut into blocks of ``k``, each stepped by one compiled k-run program.

  Each block stays on the device that holds its runs (one call per block, dispatched without
  waiting). The program is the same for every block on every device, so a run's bits depend only
  on k: not on how many runs share its device, nor on how many devices or processes there are.
  `join` puts the blocks back together as the stacked state for the loop's sync points;
  `split` cuts a stacked state.

  Args:
    placement: where the runs go (`Placement`).
    k: runs per block.
    num_runs: this process's runs.
    own_start: the index of this process's first run among all runs.
  """

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


def _put(tree, sharding):
  """`tree` (the same values in every process) placed with `sharding`, which may span processes."""
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  def one(a):
    host = np.asarray(jax.device_get(a))
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
  return jax.tree.map(one, tree)
