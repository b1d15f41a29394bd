"""Device meshes and shardings shared by the training step, the multi-host helpers and the
benchmarks: a 1-D "data" mesh (one run's batch split over devices), a 1-D "runs" mesh (whole runs
spread over devices), batch, run and replicated shardings, and the FSDP rule."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# The devices the loop's placement decisions are made for: None means this process's
# (`jax.devices()`); `for_devices` sets others, e.g. a TPU slice's or a GPU's from
# `jax.experimental.topologies`, so that a program is built on a CPU for them (`maskprior compile`).
_TARGET: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("maskprior_target_devices", default=None)


@contextlib.contextmanager
def for_devices(devices: Sequence[jax.Device] | None):
  """Within this block `devices()`, `platform()` and `process_count()` (and so the meshes, the runs'
  placement and the run blocks) describe `devices` instead of this process's; "auto" attention
  resolves for their platform (`attention.target_platform`)."""
  token = _TARGET.set(None if devices is None else tuple(devices))
  try:
    yield
  finally:
    _TARGET.reset(token)


def devices() -> list[jax.Device]:
  """The devices placement decisions are made for: `for_devices`', else `jax.devices()`."""
  target = _TARGET.get()
  return list(target) if target is not None else list(jax.devices())


def targeted() -> bool:
  """Whether `for_devices` has set devices other than this process's."""
  return _TARGET.get() is not None


def platform() -> str:
  """"cpu", "gpu" or "tpu": the platform of `devices()` (this process's backend by default)."""
  target = _TARGET.get()
  if target is None:
    return jax.default_backend()
  name = target[0].platform
  return "gpu" if name in ("cuda", "rocm") else name


def process_count() -> int:
  """How many processes hold `devices()` (a TPU slice of several hosts: one per host)."""
  target = _TARGET.get()
  return jax.process_count() if target is None else len({d.process_index for d in target})


def data_mesh(devices: Iterable[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named "data" over all (or the given) devices.

  Args:
    devices: the devices; default ``jax.devices()`` (those set by ``for_devices`` when set).

  Returns:
    A ``jax.sharding.Mesh`` with the one axis "data".
  """
  return Mesh(np.asarray(list(devices) if devices is not None else globals()["devices"]()), ("data",))


def runs_mesh(num_runs: int, devices: Iterable[jax.Device] | None = None) -> Mesh | None:
  """A 1-D mesh named "runs" that holds `num_runs` stacked runs, the same number on each device:
  over the largest number of devices d that divides `num_runs`, with d/P devices of each of the P
  processes (so every process holds whole runs, the same count each); None where that is fewer
  than two devices (e.g. one run, or one device)."""
  devices = list(devices) if devices is not None else globals()["devices"]()
  by_process: dict[int, list] = {}
  for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
    by_process.setdefault(d.process_index, []).append(d)
  procs = sorted(by_process)
  local = min(len(v) for v in by_process.values())
  best = 0
  for per in range(local, 0, -1):   # devices per process
    if num_runs % (per * len(procs)) == 0:
      best = per
      break
  if best * len(procs) < 2:
    return None
  return Mesh(np.asarray([d for p in procs for d in by_process[p][:best]]), ("runs",))


def run_sharding(mesh: Mesh, run_axis: int = 0) -> NamedSharding:
  """Shard the stacked run axis (after `run_axis` leading axes, e.g. a step axis) over "runs"."""
  return NamedSharding(mesh, P(*([None] * run_axis), "runs"))


def is_runs_mesh(mesh: Mesh | None) -> bool:
  """True for a mesh made by `runs_mesh` (whole runs per device; nothing reduced across devices)."""
  return mesh is not None and "runs" in mesh.axis_names


def batch_sharding(mesh: Mesh, batch_axis: int = 0) -> NamedSharding:
  """Shards a batch's batch axis over "data", the rest replicated.

  Args:
    mesh: a "data" mesh.
    batch_axis: leading axes before the batch axis (e.g. 1 for a leading seed axis).

  Returns:
    A ``NamedSharding``.
  """
  return NamedSharding(mesh, P(*([None] * batch_axis), "data"))


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding that holds a full copy of an array on every device of ``mesh``.

  Args:
    mesh: the mesh.

  Returns:
    A ``NamedSharding`` with an empty ``PartitionSpec``.
  """
  return NamedSharding(mesh, P())


def fsdp_sharding(tree, mesh: Mesh, *, min_size: int = 1 << 14, axis_name: str = "data"):
  """An FSDP-style sharding: large leaves split over the mesh, small ones replicated.

  Every leaf with at least ``min_size`` elements is split over ``axis_name`` along its largest
  axis that divides evenly; smaller leaves are replicated. Apply it to a whole `TrainState`, so
  that parameters, the mask prior and the optimizer moments are sharded alike.

  Args:
    tree: arrays or ``jax.ShapeDtypeStruct`` s.
    mesh: the mesh.
    min_size: the smallest leaf (in elements) that is split.
    axis_name: the mesh axis to split over.

  Returns:
    A pytree of ``NamedSharding`` matching ``tree``.
  """
  n = mesh.shape[axis_name]

  def rule(leaf):
    shape = getattr(leaf, "shape", ())
    if n == 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
      return NamedSharding(mesh, P())
    for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
      if shape[axis] % n == 0:
        spec = [None] * len(shape)
        spec[axis] = axis_name
        return NamedSharding(mesh, P(*spec))
    return NamedSharding(mesh, P())
  return jax.tree.map(rule, tree)
