"""Orbax checkpoints of a training run: the train state (variables incl. the mask prior,
optimizer state, step, RNG) plus a JSON record (eval history, data position).

Data positions are implied by the step (every batch is a function of seed and step), so a
restored run continues with the batches it would have seen. Arrays are saved as they lie on
the devices: in a multi-process run every process writes its own shards (orbax), and a restore
into a sharded target reads each process's shards back. Saves are asynchronous; a
SIGTERM asks the loop to save and stop at the next step boundary. A latest checkpoint that
cannot be read is skipped, with a warning, for the previous one.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import signal
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from maskprior_jax import distributed
from maskprior_jax import paths

__all__ = ["Checkpointer", "Preempted", "SigtermFlag", "tree_sha256"]

logger = logging.getLogger(__name__)


class Preempted(RuntimeError):
  """Raised after SIGTERM once a checkpoint was written; rerun the same command to resume."""


class SigtermFlag:
  """A context in which SIGTERM sets ``.raised`` instead of killing the process.

  Args:
    install: False leaves signals alone (several processes: JAX's preemption service holds
      SIGTERM, see `maskprior_jax.train.train_seeds`).
  """

  def __init__(self, install: bool = True):
    self.raised = False
    self._old = None
    self._install = install

  def __enter__(self):
    if not self._install:
      return self
    try:
      self._old = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread: leave signals alone
      self._old = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.raised = True

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


def _write_error(e: Exception, directory: os.PathLike) -> OSError:
  """An asynchronous save that failed (orbax reports a full disk as a ValueError from its save
  thread) as an OSError naming the reason and the folder, which the command reports in one line."""
  text = str(e)
  code = errno.ENOSPC if "No space left" in text else getattr(e, "errno", None) or errno.EIO
  return OSError(code, f"{os.strerror(code)} (checkpoint save failed)", str(directory))


class Checkpointer:
  """The training loop's checkpoints (an orbax ``CheckpointManager``).

  Each saved step holds the stacked state and a JSON record (step, evaluation history);
  ``max_to_keep`` steps are kept. ``restore_latest(abstract_state)`` returns ``(state, record)``
  of the newest readable step, or None; a step that cannot be read is moved aside
  (``unreadable_STEP``, with a warning through the ``maskprior_jax.checkpoint`` logger) and the
  previous one tried.

  Args:
    directory: the checkpoint folder (a local path or a ``gs://`` address).
    max_to_keep: the newest steps kept.

  Raises:
    OSError: naming the folder, when a save fails (disk full, permissions).
  """

  def __init__(self, directory: str | os.PathLike, max_to_keep: int = 2):
    """`directory`: a local folder or one on storage orbax writes to (`gs://...`)."""
    directory = paths.path(directory)
    self.directory = directory.absolute() if paths.is_local(directory) else directory
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))
    # The training loop alone asks JAX's preemption service (`train.train_seeds`, one id per compiled
    # call): the service's sync point is "the next id after the highest any process passed", so every
    # id must come from one counter; orbax's own check would pass training steps in between.
    self.manager.reached_preemption = lambda step: False
    self._failed = False

  def save(self, step: int, state: Any, record: dict, *, wait: bool = False) -> None:
    try:
      self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      record=ocp.args.JsonSave(record)), force=True)
    except Exception as e:   # a failed earlier asynchronous save surfaces here
      self._failed = True
      raise _write_error(e, self.directory) from None
    if wait:
      self.wait()

  def restore_latest(self, abstract_state: Any) -> tuple[Any, dict] | None:
    """The newest readable checkpoint as (state, record), or None if there is none."""
    self.manager.wait_until_finished()
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), record=ocp.args.JsonRestore()))
        return out.state, out.record
      except Exception as e:  # a truncated or half-written checkpoint
        aside = self.directory / f"unreadable_{step}"
        if distributed.is_main_process():   # one process moves it, the others wait for that
          logger.warning("checkpoint at step %d in %s is unreadable (%s); moved to %s, trying the previous one",
                         step, self.directory, type(e).__name__, aside.name)
          (self.directory / str(step)).rename(aside)
        distributed.barrier(f"maskprior_unreadable_{step}")
        self.manager.reload()
    return None

  def wait(self):
    """Block until asynchronous saves are on disk; a failed save raises OSError once (see
    `_write_error`), later waits return."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      if self._failed:
        return
      self._failed = True
      raise _write_error(e, self.directory) from None

  def close(self):
    self.wait()
    try:
      self.manager.close()
    except Exception:   # a failed save was reported already; closing must not mask it
      if not self._failed:
        raise


def tree_sha256(tree: Any) -> str:
  """A digest of a pytree's leaves: dtype, shape and bytes, in tree order.

  Args:
    tree: a pytree of arrays.

  Returns:
    The SHA-256 hex digest; equal digests mean bit-identical states.

  Example:
    >>> import jax.numpy as jnp
    >>> from maskprior_jax.checkpoint import tree_sha256
    >>> tree_sha256({"w": jnp.zeros(3)}) == tree_sha256({"w": jnp.zeros(3)})
    True
    >>> tree_sha256({"w": jnp.zeros(3)}) == tree_sha256({"w": -jnp.zeros(3)})   # -0.0 has other bits
    False
  """
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(jax.device_get(tree)):
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(str(a.dtype).encode() + str(a.shape).encode())
    h.update(a.tobytes())
  return h.hexdigest()
