"""Device meshes and shardings shared by the training step, the multi-host helpers and the
benchmarks: a 1-D "data" mesh, batch and replicated shardings, and the FSDP rule."""
from __future__ import annotations

from typing import Iterable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def data_mesh(devices: Iterable[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named "data" over all (or the given) devices."""
  devices = np.asarray(list(devices) if devices is not None else jax.devices())
  return Mesh(devices, ("data",))


def batch_sharding(mesh: Mesh, batch_axis: int = 0) -> NamedSharding:
  """Shard the batch axis (after `batch_axis` leading axes) over "data"; the rest replicated."""
  return NamedSharding(mesh, P(*([None] * batch_axis), "data"))


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding that holds a full copy of an array on every device of `mesh`."""
  return NamedSharding(mesh, P())


def fsdp_sharding(tree, mesh: Mesh, *, min_size: int = 1 << 14, axis_name: str = "data"):
  """FSDP-style rule: every leaf with at least `min_size` elements is split over the mesh's
  `axis_name` along its largest axis that divides evenly; smaller leaves are replicated.
  Returns a pytree of NamedSharding matching `tree` (arrays or ShapeDtypeStructs), e.g. for a
  TrainState, so that parameters, the mask prior and the optimizer moments are sharded alike."""
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
