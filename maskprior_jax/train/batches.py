"""Where a loop's batches come from: built on the host by numpy (`HostBatches`, around a batch
function) or drawn inside the compiled step (`DeviceBatches`). A placement (`stepping`) asks its
batches for one call's arguments; it never needs to know which kind they are."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Sequence

import jax
import numpy as np

__all__ = ["DeviceBatches", "HostBatches", "builds_part"]


@dataclasses.dataclass(frozen=True)
class DeviceBatches:
  """Batches drawn inside the compiled step (see `make_generating_train_step`).

  Attributes:
    fn: `fn(step, run)` (traced int32 scalars) returns run `run`'s batch for training step `step`,
      a pure function of the two; with `data`, `fn(step, run, data)`.
    data: None, or a pytree of arrays (e.g. the training set) that the compiled step takes as an
      argument, placed on the devices once, rather than as constants of the program: tasks whose
      data have the same shapes then share one compiled program.
  """
  fn: Callable[..., Any]
  data: Any = None

  def call_args(self, first_step: int, place: Callable) -> tuple:
    """The compiled call's arguments after the state: the call's first step."""
    del place
    return (np.int32(first_step),)

  def block_args(self, first_step: int, blocks, run_axis: int) -> list[tuple]:
    """Each run block's arguments after its state: the first step and the block's run indices."""
    del run_axis
    return [(np.int32(first_step), runs) for runs in blocks.runs]


def builds_part(batch_fn: Callable) -> bool:
  """Whether a host batch function takes `part=(i, n)` (builds only share i of n of every run's rows)."""
  return "part" in inspect.signature(batch_fn).parameters


class HostBatches:
  """A host batch function `batch_fn(step, keys[, part=(i, n)])` (a leading run axis; numpy) for
  the runs this process feeds (`keys`) and, where given, only its share `part` of every run's
  rows. A call of `steps_per_call` steps gets its batches stacked on a leading step axis."""

  def __init__(self, batch_fn: Callable, keys: Sequence[int], steps_per_call: int, part: tuple[int, int] | None = None):
    self.batch_fn, self.keys, self.steps_per_call, self.part = batch_fn, list(keys), steps_per_call, part

  def chunk(self, first_step: int):
    """The host batches of one call."""
    kwargs = {} if self.part is None else {"part": self.part}
    chunk = [self.batch_fn(first_step + j, self.keys, **kwargs) for j in range(self.steps_per_call)]
    return jax.tree.map(lambda *xs: np.stack(xs), *chunk) if self.steps_per_call > 1 else chunk[0]

  def call_args(self, first_step: int, place: Callable) -> tuple:
    """The compiled call's arguments after the state: the call's batches, placed by `place`."""
    return (place(self.chunk(first_step)),)

  def block_args(self, first_step: int, blocks, run_axis: int) -> list[tuple]:
    """Each run block's arguments after its state: its runs' rows of the call's batches, on its device."""
    chunk = self.chunk(first_step)
    return [(blocks.host_batch(chunk, b, run_axis),) for b in range(len(blocks.blocks))]
