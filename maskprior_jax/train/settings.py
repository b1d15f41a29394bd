"""Everything the training loop reads, as one value (`LoopSettings`): the run's length and
cadences, where its runs go, and the optimizer's recipe."""
from __future__ import annotations

import dataclasses

import jax
import optax
from jax.sharding import Mesh

from maskprior_jax import optim
from maskprior_jax.sharding import data_mesh
import maskprior_jax.train.placement as placement_lib
from maskprior_jax.train.placement import Placement

__all__ = ["LoopSettings", "GRAD_REDUCTIONS", "BATCH_SOURCES", "PARALLEL", "SCHEDULES", "DECAY_ON", "QK_MASK_DECAY"]

#: The values of `LoopSettings.grad_reduction`.
GRAD_REDUCTIONS = ("xla", "ordered")
BATCH_SOURCES = ("host", "device", "auto")
PARALLEL = ("auto", "runs", "data", "off")
SCHEDULES = ("constant", "cosine")
DECAY_ON = ("all", "matrices")
QK_MASK_DECAY = ("legacy", "none", "init")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """Everything the training loop reads, as one value.

  Benchmarks build it once from their config (``maskprior_jax.bench.config.loop_settings``).
  The defaults are the constant-rate optimizer of the committed runs.

  Attributes:
    steps: the run's length in optimizer steps.
    batch_size: the per-run batch size.
    steps_per_call: steps per compiled call (``lax.scan``); ``steps`` and the cadences divide by
      it.
    eval_every: evaluation cadence in steps (0: at step 0 and the end only).
    checkpoint_every: checkpoint cadence in steps (0: only at the end and on SIGTERM).
    log_every: progress-log cadence in steps.
    max_to_keep: checkpoints kept.
    data_parallel: split every run's batch over all devices (a mesh over ``jax.devices()``).
    fsdp: also shard large state leaves over them (`fsdp_sharding`).
    grad_reduction: "xla" or "ordered" (see `make_train_step`).
    batches: "host" (built by numpy), "device" (drawn inside the step) or "auto" (the
      benchmark's choice: device where its training set is held whole on the device).
    parallel: where the stacked runs go: "auto", "runs", "data" or "off" (see `Placement`).
    run_block: how many of a device's runs are stepped together: "all" (one vmapped block: the
      fastest on an accelerator, but a run's float32 bits then depend on how many runs share its
      device), a number k as a string (k at a time: a run's bits depend only on k), or "auto"
      (1 on a CPU, "all" on an accelerator).
    optimizer_name: "adam", "adamw" or "sgd" (`maskprior_jax.optim.base_optimizer`).
    learning_rate: the peak learning rate.
    weight_decay: the weights' decay rate.
    mask_lr_multiplier: the mask prior's learning rate over the base.
    freeze_mask: the mask prior stays as initialised, bit for bit.
    warmup_steps: linear warmup from 0.
    schedule: "constant", or "cosine" (to 0 at ``steps``).
    grad_clip_norm: clip the gradient to this global norm (0: none).
    b2: Adam's second-moment decay.
    decay_on: "all" leaves, or "matrices" (weight matrices only, not LayerNorm, biases or
      embeddings).
    qk_mask_decay: how the query/key kernels and the mask prior decay, in every method alike:
      "legacy" (the kernels like every other weight, the mask not at all), "none" (neither) or
      "init" (both toward their initial values).

  Raises:
    ValueError: for a value outside its choices, or cadences that ``steps_per_call`` does not
      divide.

  Example:
    >>> from maskprior_jax.train import LoopSettings
    >>> settings = LoopSettings(steps=100, batch_size=32, learning_rate=3e-4, schedule="cosine", warmup_steps=10)
    >>> round(settings.learning_rate_at(10), 6), settings.learning_rate_at(100)
    (0.0003, 0.0)
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
    return placement_lib.run_block_for(self, runs_per_device)

  def placement(self, num_runs: int, params_per_run: int = 0) -> Placement:
    """Where `num_runs` stacked runs of `params_per_run` parameters each train (`parallel`), and how
    many of a device's runs are stepped together (`run_block`): `maskprior_jax.train.placement.choose`."""
    return placement_lib.choose(self, num_runs, params_per_run)

  def with_run_block(self, where: Placement) -> Placement:
    """`where` with this `run_block` for its runs per device (none with data parallel)."""
    return placement_lib.with_run_block(self, where)
