"""Multi-host helpers on JAX's own distributed runtime.

`initialize(mode)`: with `mode="auto"` (the default) JAX's own cluster detection is asked (Cloud
TPU VM slices, SLURM, Open MPI, Kubernetes: the environments `jax.distributed.initialize()`
recognises without arguments) and the runtime starts where it recognises one; a single host
without one stays one process. Explicit settings win: the coordinator address, the number of
processes and this process's id (flags or the environment variables MASKPRIOR_COORDINATOR,
MASKPRIOR_NUM_PROCESSES, MASKPRIOR_PROCESS_ID). `started()` says how the runtime was started.
Each process loads only its shard of the data (`process_slice`) and the global batch is
assembled with `jax.make_array_from_process_local_data`; checkpoints are written by orbax from
every process (each its own shards); every other file is written by process 0 only.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh

from maskprior_jax.sharding import batch_sharding

__all__ = ["initialize", "detect_cluster", "started", "heartbeat_timeout", "is_main_process", "process_slice",
           "process_part", "take_part", "global_batch", "barrier", "broadcast_flag", "host_tree"]


MODES = ("auto", "on", "off")
_started = "single process"
HEARTBEAT_TIMEOUT = 10   # seconds without a heartbeat before the runtime calls a process lost


def heartbeat_timeout() -> int:
  """Seconds without a heartbeat after which JAX's runtime calls a process lost.

  Returns:
    $MASKPRIOR_HEARTBEAT_TIMEOUT, else ``HEARTBEAT_TIMEOUT`` (JAX's own default is 100).

  Raises:
    ValueError: if the variable is not a whole number of seconds.
  """
  value = os.environ.get("MASKPRIOR_HEARTBEAT_TIMEOUT", str(HEARTBEAT_TIMEOUT))
  if not value.isdigit() or int(value) < 1:
    raise ValueError(f"$MASKPRIOR_HEARTBEAT_TIMEOUT must be a whole number of seconds, not {value!r}")
  return int(value)


def _runtime_settings() -> dict:
  """Keyword arguments of `jax.distributed.initialize` that the installed JAX takes (the heartbeat
  timeout is an argument since JAX 0.7; older versions keep their own)."""
  import inspect
  params = inspect.signature(jax.distributed.initialize).parameters
  return {"heartbeat_timeout_seconds": heartbeat_timeout()} if "heartbeat_timeout_seconds" in params else {}


def detect_cluster() -> str | None:
  """The cluster environment JAX's own detection recognises here.

  Returns:
    "slurm", "ompi", "gce_tpu", "gke_tpu", "k8s", ... (what ``jax.distributed.initialize()``
    with no arguments would use), or None.
  """
  try:
    from jax._src import clusters
    kinds = list(clusters.ClusterEnv._cluster_types)
  except (ImportError, AttributeError):   # JAX moved its detection: fall back to the TPU variables
    tpu = os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS")
    return "tpu" if tpu else None
  for kind in kinds:
    if getattr(kind, "opt_in_only_method", False):
      continue
    try:
      if kind.is_env_present():
        return getattr(kind, "name", kind.__name__)
    except Exception:   # a detector that cannot tell (missing package, no metadata server) says no
      continue
  return None


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, mode: str = "auto") -> str:
  """Starts JAX's distributed runtime where this is one of several processes.

  Explicit settings win (arguments, or the environment variables MASKPRIOR_COORDINATOR,
  MASKPRIOR_NUM_PROCESSES, MASKPRIOR_PROCESS_ID); otherwise JAX's own cluster detection (Cloud TPU
  VM slices, SLURM, Open MPI, Kubernetes) is asked; otherwise this stays one process.

  Args:
    coordinator: the coordinator's "host:port".
    num_processes: the number of processes.
    process_id: this process's index.
    mode: "auto" (as above), "on" (the same, but an error where neither gives a runtime) or
      "off" (never start it; explicit settings are then an error).

  Returns:
    How it started (also `started`): "flags", "detected: <cluster>" or "single process".

  Raises:
    ValueError: for an unknown mode, "on" with no runtime to start, "off" with explicit
      settings, or an invalid $MASKPRIOR_HEARTBEAT_TIMEOUT.
  """
  global _started
  if mode not in MODES:
    raise ValueError(f"--distributed must be one of {', '.join(MODES)}, not {mode!r}")
  coordinator = coordinator or os.environ.get("MASKPRIOR_COORDINATOR")
  if num_processes is None and "MASKPRIOR_NUM_PROCESSES" in os.environ:
    num_processes = int(os.environ["MASKPRIOR_NUM_PROCESSES"])
  if process_id is None and "MASKPRIOR_PROCESS_ID" in os.environ:
    process_id = int(os.environ["MASKPRIOR_PROCESS_ID"])
  if mode == "off":
    if coordinator:
      raise ValueError("--distributed off, but a coordinator address is given (flag or $MASKPRIOR_COORDINATOR)")
    _started = "single process"
    return _started
  cluster = None if coordinator else detect_cluster()
  if not coordinator and cluster is None:
    if mode == "on":
      raise ValueError("--distributed on: JAX recognises no cluster here (Cloud TPU VM, SLURM, Open MPI, "
                       "Kubernetes); give --coordinator_address, --num_processes and --process_id")
    _started = "single process"
    return _started
  # CPU processes need a collectives backend for cross-process all-reduce (ignored by TPU and GPU).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator:
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
                               **_runtime_settings())
    _started = "flags"
  else:
    jax.distributed.initialize(**_runtime_settings())
    _started = f"detected: {cluster}"
  return _started


def started() -> str:
  """How this process's runtime was started.

  Returns:
    The string `initialize` returned ("single process" before it is called).
  """
  return _started


def is_main_process() -> bool:
  """Whether this is process 0, the one that writes results and prints tables.

  Returns:
    True in process 0 and in a single process.
  """
  return jax.process_index() == 0


def process_slice(global_batch_size: int) -> slice:
  """This process's rows of a global batch (processes hold equal, contiguous shares).

  Args:
    global_batch_size: rows of the global batch.

  Returns:
    A ``slice`` into the batch axis.

  Raises:
    ValueError: if the batch does not divide by the number of processes.
  """
  return _part_slice(global_batch_size, process_part())


def _part_slice(size: int, part: tuple[int, int]) -> slice:
  i, n = part
  if size % n:
    raise ValueError(f"global batch {size} is not divisible by {n} processes")
  per = size // n
  return slice(i * per, (i + 1) * per)


def process_part() -> tuple[int, int]:
  """The ``part`` a host batch function builds in this process.

  Returns:
    ``(process index, number of processes)``.
  """
  return jax.process_index(), jax.process_count()


def take_part(rows, part: tuple[int, int] = (0, 1)):
  """Share i of n equal, contiguous shares of ``rows`` along the first axis.

  What process i of n feeds of a global batch whose rows are ``rows`` (the same rows as
  `process_slice` in that process).

  Args:
    rows: an array (or anything sliceable) with the batch on its first axis.
    part: ``(i, n)``.

  Returns:
    ``rows[i * len(rows) // n:(i + 1) * len(rows) // n]``.

  Raises:
    ValueError: if the rows do not divide into n shares.

  Example:
    >>> import numpy as np
    >>> from maskprior_jax.distributed import take_part
    >>> take_part(np.arange(8), (1, 4))
    array([2, 3])
  """
  return rows[_part_slice(len(rows), part)]


def global_batch(local: dict, mesh: Mesh, batch_axis: int = 0) -> dict:
  """Assembles per-process rows into one global array per leaf, sharded over "data".

  Args:
    local: this process's rows, a dict of arrays.
    mesh: the "data" mesh.
    batch_axis: leading axes before the batch axis (e.g. 1 for a leading seed axis).

  Returns:
    A dict of global ``jax.Array`` s.
  """
  sharding = batch_sharding(mesh, batch_axis)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local)


def barrier(name: str) -> None:
  """Waits until every process gets here (a no-op for one process).

  Args:
    name: the barrier's name (every process must use the same).
  """
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def broadcast_flag(flag: bool) -> bool:
  """Process 0's ``flag`` in every process.

  Args:
    flag: this process's value.

  Returns:
    Process 0's value (``flag`` itself for one process).
  """
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils
  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def host_tree(tree):
  """The same pytree as numpy arrays in every process.

  Args:
    tree: a pytree of ``jax.Array`` s.

  Returns:
    The pytree as numpy arrays: fully addressable or replicated leaves are read locally, leaves
    sharded over other processes' devices are all-gathered.
  """
  def get(a):
    if not isinstance(a, jax.Array) or a.is_fully_addressable:
      return np.asarray(jax.device_get(a))
    if a.is_fully_replicated:
      return np.asarray(a.addressable_data(0))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(a, tiled=True))
  return jax.tree.map(get, tree)
