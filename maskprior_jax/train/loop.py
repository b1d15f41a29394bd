"""The training loop (`train_seeds`): resume, step, log, evaluate, checkpoint, stop on SIGTERM or a
non-finite loss, time itself. Where the runs go and how a call steps them was decided before the
loop (`maskprior_jax.train.stepping`); the loop only calls its `Stepper`."""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from maskprior_jax import checkpoint as ckpt
from maskprior_jax import distributed, faults
import maskprior_jax.train.placement as placement_lib
import maskprior_jax.train.stepping as stepping
from maskprior_jax.train.batches import DeviceBatches
from maskprior_jax.train.placement import Placement
from maskprior_jax.train.settings import LoopSettings
from maskprior_jax.train.state import LossFn, NonFiniteLoss, TrainState, create_state, num_params, stack_trees

logger = logging.getLogger("maskprior_jax.train")

__all__ = ["train_seeds", "Progress"]

_SYNC_IDS = itertools.count(1)   # preemption sync-point ids: calls of every loop in this process


@functools.partial(jax.jit, static_argnums=1)
def _initial_states(variables: tuple, tx: optax.GradientTransformation, keys: tuple) -> TrainState:
  """Every run's initial state (`create_state`), stacked, as one compiled program: run one by one,
  the optimizer's zeros and the stacking are a small program per leaf shape at every start."""
  return stack_trees([create_state(v, tx, k) for v, k in zip(variables, keys)])


def train_seeds(*, loss_fn: LossFn, tx: optax.GradientTransformation, variables: Sequence[dict],
                seeds: Sequence[int], batches: Callable[..., Any] | DeviceBatches, settings: LoopSettings,
                eval_fn: Callable[[int, dict], dict], label: str = "", checkpointer=None,
                mesh: Mesh | Placement | None = None) -> tuple[TrainState, list[dict]]:
  """The training loop: one run per seed, all seeds in one compiled program.

  Runs ``settings.steps`` steps (``settings.steps_per_call`` per compiled call). Where the runs
  go is the placement's: run-parallel (a "runs" mesh: each device holds and steps whole runs, and
  no value crosses devices inside the step, so every run is computed as it would be alone; with
  ``placement.run_block`` k > 0 each device's runs are stepped k at a time, see `RunBlocks`), or
  data-parallel (a "data" mesh: every seed's batch split over the devices, the state replicated
  or, with ``settings.fsdp``, sharded; each process feeds only its rows of the global batch).
  The host waits on the device only at log, evaluation and checkpoint points; a non-finite loss
  freezes that seed's state inside the compiled step, and the next sync raises `NonFiniteLoss`
  without saving.

  Args:
    loss_fn: ``loss_fn(variables, batch, rng) -> (loss, aux)``, the loss of one run.
    tx: the optimizer (e.g. `maskprior_jax.mask_prior_optimizer`).
    variables: one initial variable tree per seed.
    seeds: the runs' seeds (each run's key and batches derive from its seed).
    batches: a host batch function ``batch_fn(step, seeds) -> batch`` with a leading seed axis,
      a function of seed and step (so a resumed run sees the batches it would have seen); one
      that takes a ``part`` keyword, ``batch_fn(step, seeds, part=(i, n))``, builds only share i
      of n of every seed's rows (`maskprior_jax.distributed.take_part`). Or `DeviceBatches`:
      batches drawn inside the compiled step.
    settings: the `LoopSettings`.
    eval_fn: ``eval_fn(step, stacked_variables) -> dict`` of per-seed arrays, called at step 0,
      every ``settings.eval_every`` steps and at the end. If it has a method
      ``log_train(step, row)``, that gets the window's per-seed mean "loss" and "grad_norm" and
      the "learning_rate" at every log point.
    label: the runs' name in the progress log and in errors.
    checkpointer: a `maskprior_jax.checkpoint.Checkpointer`: the state and the evaluation history
      are saved every ``settings.checkpoint_every`` steps, at the end and on SIGTERM, and a run
      continues from its latest checkpoint.
    mesh: a `Placement`, a mesh, or None for ``settings.placement(len(seeds), parameters per
      run)``.

  Returns:
    ``(state, history)``: the final stacked `TrainState` and the list of evaluation rows.

  Raises:
    NonFiniteLoss: when a run's loss became NaN or infinite (no checkpoint is written).
    maskprior_jax.checkpoint.Preempted: after SIGTERM, once the checkpoint is saved (with
      several processes, every process saves the same step).
  """
  steps = settings.steps
  placement = placement_lib.resolve(settings, mesh, len(seeds), lambda: num_params(variables[0]))
  states = _initial_states(tuple(variables), tx, tuple(jax.random.key_data(jax.random.key(s)) for s in seeds))
  runs = stepping.stepper(loss_fn, tx, states, seeds, batches, settings, placement)   # decided once
  main = distributed.is_main_process()
  if main:
    logger.info("[%s] %s", label, placement.describe())
  done, history = _resume(runs, checkpointer, label)
  history = history or [{"step": 0, **_host(eval_fn(0, runs.state().variables))}]
  faults.point("compile")
  progress = Progress(steps, label=label, every=settings.log_every, enabled=main)
  progress.last_step = done
  window, timing = _TrainWindow(eval_fn, settings), _Timing(label)
  preempted = _preemption()
  try:
    with ckpt.SigtermFlag(install=jax.process_count() == 1) as sigterm:
      while done < steps:
        metrics = runs.step(done)   # no host sync: the device runs ahead while the next batch is built
        done += settings.steps_per_call
        timing.first_call(done, runs)
        window.add(metrics)
        faults.point("step")
        term = preempted(sigterm)   # read once: a signal arriving later is handled at the next step
        log_now, eval_now, save_now = _due(settings, done, term)
        if not (log_now or eval_now or save_now):
          continue
        state = runs.state()
        _check_finite(state, label)
        if log_now:
          loss = distributed.host_tree(metrics["loss"])
          progress.update(done, {"loss": loss[-1] if loss.ndim > 1 else loss})
          window.flush(done)
        if eval_now:
          with timing.spent("evaluation"):
            history.append({"step": done, **_host(eval_fn(done, state.variables))})
          faults.point("eval")
        if save_now and checkpointer is not None:
          with timing.spent("checkpoints"):
            _save(checkpointer, done, state, history, wait=done == steps or term)
        if term:
          raise ckpt.Preempted(f"[{label}] SIGTERM at step {done}: checkpoint saved; rerun the same command to resume")
  finally:
    if checkpointer is not None:
      checkpointer.wait()  # a pending async save reaches disk whatever ends the loop
  timing.report(done, main)
  return runs.state(), history


def _host(d: dict) -> dict:
  return {k: np.asarray(jax.device_get(v)).tolist() for k, v in d.items()}


def _resume(runs: stepping.Stepper, checkpointer, label: str) -> tuple[int, list | None]:
  """The step and eval history of the latest checkpoint, restored into the stepper (in its
  layout: with several processes each reads its shards), or (0, None)."""
  restored = None if checkpointer is None else checkpointer.restore_latest(runs.abstract())
  if restored is None:
    return 0, None
  states, record = restored
  runs.load(states)
  if distributed.is_main_process():
    logger.info("[%s] resumed from the checkpoint at step %d", label, int(record["step"]))
  return int(record["step"]), record["history"]


def _due(settings: LoopSettings, done: int, term: bool) -> tuple[bool, bool, bool]:
  """Whether step `done` logs, evaluates and saves (the last step does all three; SIGTERM saves)."""
  last = done == settings.steps
  return (done % settings.log_every == 0 or last, done % (settings.eval_every or settings.steps) == 0 or last,
          bool(settings.checkpoint_every and done % settings.checkpoint_every == 0) or last or term)


def _preemption() -> Callable:
  """`preempted(sigterm) -> bool`, asked once per call: this process's SIGTERM flag, or with several
  processes JAX's preemption sync point (the same answer, at the same call, in every process)."""
  if jax.process_count() == 1:
    return lambda sigterm: sigterm.raised
  from jax.experimental import multihost_utils
  # JAX's sync point is the call after the highest id any process had passed when the notice came;
  # ids count calls over the whole process (every process makes the same calls), so the next call
  # is that point even between one method's loop and the next.
  return lambda sigterm: multihost_utils.reached_preemption_sync_point(next(_SYNC_IDS))


def _check_finite(state: TrainState, label: str) -> None:
  """At a sync point: stop if any run met a non-finite loss (its state is the last good one)."""
  bad = distributed.host_tree(state.nonfinite_at).reshape(-1)
  if np.any(bad >= 0):
    first = int(bad[bad >= 0].min())
    raise NonFiniteLoss(f"[{label}] loss became non-finite between steps {first} and {first + 1}; "
                        "last good checkpoint kept. Lower train.learning_rate")


def _save(checkpointer, step: int, state: TrainState, history: list, wait: bool) -> None:
  # The arrays as they lie on the devices: orbax writes each process's shards from that process.
  checkpointer.save(step, state, {"step": step, "history": history}, wait=False)
  faults.point("save")
  if wait:
    checkpointer.wait()


class _TrainWindow:
  """The training figures between two log points, for `eval_fn.log_train(step, row)` where the
  evaluator has one: per-run mean "loss" and "grad_norm", summed on the device as the steps run
  and fetched only at the log point, and the base "learning_rate"."""

  def __init__(self, eval_fn, settings: LoopSettings):
    self.log_train, self.settings = getattr(eval_fn, "log_train", None), settings
    self.sums, self.steps = None, 0

  def add(self, metrics: dict) -> None:
    if self.log_train is None:
      return
    spc = self.settings.steps_per_call
    part = {k: jnp.sum(metrics[k], 0) if spc > 1 else metrics[k] for k in ("loss", "grad_norm")}
    self.sums = part if self.sums is None else jax.tree.map(jnp.add, self.sums, part)
    self.steps += spc

  def flush(self, step: int) -> None:
    if self.log_train is None:
      return
    row = {k: v / self.steps for k, v in distributed.host_tree(self.sums).items()}
    self.log_train(step, {**row, "learning_rate": self.settings.learning_rate_at(step)})
    self.sums, self.steps = None, 0


class _Timing:
  """The loop's own timing, from the end of its first (compiling) call, and the time spent in
  evaluation and checkpoints."""

  def __init__(self, label: str):
    self.label, self.first_done, self.t_first = label, None, None
    self.seconds = {"evaluation": 0.0, "checkpoints": 0.0}

  def first_call(self, done: int, runs: stepping.Stepper) -> None:
    if self.t_first is None:   # the timing starts once the first (compiling) call has run
      runs.ready()
      self.first_done, self.t_first = done, time.perf_counter()

  @contextlib.contextmanager
  def spent(self, what: str):
    t0 = time.perf_counter()
    yield
    self.seconds[what] += time.perf_counter() - t0

  def report(self, done: int, main: bool) -> None:
    if self.t_first is None or done <= self.first_done or not main:
      return
    elapsed = time.perf_counter() - self.t_first
    logger.info("[%s] loop: %d steps in %.2f s after the first (compiling) call, %.1f steps/s with logging, "
                "evaluation and checkpoints (evaluation %.2f s, checkpoints %.2f s)", self.label,
                done - self.first_done, elapsed, (done - self.first_done) / elapsed, self.seconds["evaluation"],
                self.seconds["checkpoints"])


class Progress:
  """Reports the runs' progress every ``every`` steps.

  Each report is one line, ``[label] step k/total loss=... (steps/s, elapsed)``. The lines go to the "maskprior_jax.train" logger at INFO (the ``maskprior`` command shows them
  on stderr; an importing program routes or silences them with ``logging``), or are printed to
  ``stream`` where one is given.

  Args:
    total: the run's last step.
    label: the runs' name.
    every: the cadence in steps (the last step is always reported).
    stream: a text stream to print to instead of the logger.
    enabled: False reports nothing (e.g. on processes other than the main one).
  """

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
