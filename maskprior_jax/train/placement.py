"""Where a loop's runs go (`Placement`, decided once before the loop by `choose`): whole runs
spread over the devices, every run's batch split over them, or one device; and how many of a
device's runs one compiled call steps together."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from jax.sharding import Mesh

from maskprior_jax import sharding as sharding_lib
from maskprior_jax.sharding import data_mesh, is_runs_mesh, runs_mesh

if TYPE_CHECKING:
  from maskprior_jax.train.settings import LoopSettings

__all__ = ["Placement", "RUNS_MAX_PARAMS", "choose", "resolve", "run_block_for"]

# "auto" spreads whole runs over devices up to this many parameters per run; a larger run has its
# batch split over all devices instead (data parallel), where the collectives pay for themselves.
RUNS_MAX_PARAMS = 50_000_000


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a loop's runs go.

  Attributes:
    mode: "runs" (whole runs spread over the devices of `mesh`, the same number on each; nothing is
      reduced across devices, so each run is computed as on one device), "data" (every run's batch
      split over all devices of `mesh`) or "single" (one device, no mesh).
    mesh: the devices (None for "single").
    num_runs: the runs stacked in the loop.
    reason: why it was chosen (for the log and results.json).
    run_block: how many of a device's runs are stepped together (0: all, one vmapped block; k: k at
      a time by one compiled k-run program, see `maskprior_jax.train.RunBlocks`).
  """
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
    runs = f"{self.num_runs} run{'s' if self.num_runs != 1 else ''}"
    if self.mode == "runs":
      return (f"run-parallel: {runs} over {self.devices} devices, {self.runs_per_device} "
              f"per device ({self.reason}){blocks}")
    if self.mode == "data":
      whose = "the run's batch" if self.num_runs == 1 else f"each of {runs}' batch"
      return f"data-parallel: {whose} split over {self.devices} devices ({self.reason})"
    return f"one device: {runs} ({self.reason}){blocks}"

  def record(self) -> dict:
    """What results.json's environment keeps of it."""
    return {"mode": self.mode, "devices": self.devices, "runs": self.num_runs, "reason": self.reason,
            "run_block": self.run_block}


def run_block_for(settings: LoopSettings, runs_per_device: int) -> int:
  """`settings.run_block` as a number for a device holding `runs_per_device` runs (0: all in one block)."""
  block = settings.run_block
  if block == "auto":
    block = "1" if sharding_lib.platform() == "cpu" else "all"
  if block == "all":
    return 0
  if runs_per_device % int(block):
    raise ValueError(f"train.run_block={block}: {runs_per_device} runs per device do not split into blocks of "
                     f"{block}")
  return int(block)


def with_run_block(settings: LoopSettings, where: Placement) -> Placement:
  """`where` with the settings' run block for its runs per device (none with data parallel, where
  every device holds a share of every run)."""
  if where.mode == "data":
    return where
  return dataclasses.replace(where, run_block=run_block_for(settings, where.runs_per_device))


def choose(settings: LoopSettings, num_runs: int, params_per_run: int = 0) -> Placement:
  """Where `num_runs` stacked runs of `params_per_run` parameters each train (`settings.parallel`),
  with the settings' run block: "data" (or `data_parallel`): every run's batch split over all
  devices; "runs": whole runs spread over the devices (`sharding.runs_mesh`: the largest device
  count that divides the runs, equally over the processes); "off": one device; "auto": runs where
  there are several devices, several runs and at most `RUNS_MAX_PARAMS` parameters per run, data
  parallel for a larger model (or where one run must span several processes), else one device."""
  return with_run_block(settings, _where(settings, num_runs, params_per_run))


def _where(settings: LoopSettings, num_runs: int, params_per_run: int) -> Placement:
  n, procs = len(sharding_lib.devices()), sharding_lib.process_count()
  mode = "data" if settings.data_parallel else settings.parallel
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
    if procs > 1 or (params_per_run > RUNS_MAX_PARAMS and settings.batch_size % n == 0):
      return Placement("data", data_mesh(), num_runs, f"auto: {why}")
    return Placement("single", None, num_runs, f"auto: {why}; a batch of {settings.batch_size} is too small to split")
  return Placement("runs", mesh, num_runs, f"auto: {n} devices, {params_per_run:,} parameters per run")


def resolve(settings: LoopSettings, given: Mesh | Placement | None, num_runs: int, params_per_run) -> Placement:
  """The loop's placement from what its caller gave: a `Placement` as is, a mesh ("runs" or "data",
  with the settings' run block), or None for `choose(settings, num_runs, params_per_run())`."""
  if isinstance(given, Placement):
    where = given
  elif given is not None:
    where = with_run_block(settings, Placement("runs" if is_runs_mesh(given) else "data", given, num_runs,
                                               "given mesh"))
  else:
    where = choose(settings, num_runs, params_per_run())
  if where.mode == "runs" and num_runs % where.devices:
    raise ValueError(f"{num_runs} runs do not split evenly over the {where.devices} devices of the runs mesh")
  return where
