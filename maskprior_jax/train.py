"""Compiled training: a train-state pytree, a jitted (optionally seed-vmapped, multi-step)
train step that is data parallel over a device mesh, an equivalent pmap step, an eval step,
and a loop that prints progress without stalling the device.

A loss function has the signature `loss_fn(variables, batch, rng) -> (loss, metrics)`,
where `variables` is the trainable tree {"params": ..., "mask_prior": ...}.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterable, Iterator

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

LossFn = Callable[[dict, Any, jax.Array], tuple[jax.Array, dict]]


@flax.struct.dataclass
class TrainState:
  """step: int32 scalar; variables: trainable collections; opt_state; rng: raw uint32 key data
  (plain arrays checkpoint everywhere)."""
  step: jax.Array
  variables: dict
  opt_state: Any
  rng: jax.Array


def create_state(variables: dict, tx: optax.GradientTransformation, rng: jax.Array) -> TrainState:
  variables = {k: v for k, v in variables.items() if k != "intermediates"}
  return TrainState(step=jnp.zeros((), jnp.int32), variables=variables,
                    opt_state=tx.init(variables), rng=_key_data(rng))


def _key_data(rng):
  return jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng


def data_mesh(devices: Iterable[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named "data" over all (or the given) devices."""
  devices = np.asarray(list(devices) if devices is not None else jax.devices())
  return Mesh(devices, ("data",))


def batch_sharding(mesh: Mesh, batch_axis: int = 0) -> NamedSharding:
  """Shard the batch axis (after `batch_axis` leading axes) over "data"; the rest replicated."""
  return NamedSharding(mesh, P(*([None] * batch_axis), "data"))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _step_fn(loss_fn: LossFn, tx: optax.GradientTransformation, grad_reduce=None):
  def step(state: TrainState, batch):
    rng, sub = jax.random.split(jax.random.wrap_key_data(state.rng))
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.variables, batch, sub)
    if grad_reduce is not None:
      grads, loss, metrics = grad_reduce((grads, loss, metrics))
    updates, opt_state = tx.update(grads, state.opt_state, state.variables)
    variables = optax.apply_updates(state.variables, updates)
    metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
    return TrainState(state.step + 1, variables, opt_state, jax.random.key_data(rng)), metrics
  return step


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


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, *, mesh: Mesh | None = None,
                    seed_axis: bool = False, steps_per_call: int = 1, donate: bool = True,
                    state_sharding=None):
  """A jitted `step(state, batch) -> (state, metrics)`.

  seed_axis: state and batch carry a leading seed axis; the step is vmapped over it, so S
    independent runs share one compiled program.
  steps_per_call > 1: `batch` carries a leading axis of that many steps, run with lax.scan
    (metrics come back stacked).
  mesh: batches are sharded over its "data" axis and the state replicated, or sharded as
    `state_sharding` says (e.g. `fsdp_sharding(state, mesh)` for large models: XLA gathers
    each weight where it is used and reduce-scatters its gradient).
  """
  step = _step_fn(loss_fn, tx)
  if seed_axis:
    step = jax.vmap(step)
  if steps_per_call > 1:
    single = step

    def step(state, batches):
      return jax.lax.scan(single, state, batches)
  kwargs = {}
  if mesh is not None:
    lead = int(seed_axis) + int(steps_per_call > 1)
    state_spec = replicated(mesh) if state_sharding is None else state_sharding
    kwargs = dict(in_shardings=(state_spec, batch_sharding(mesh, lead)),
                  out_shardings=(state_spec, replicated(mesh)))
  return jax.jit(step, donate_argnums=(0,) if donate else (), **kwargs)


def make_pmap_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, axis_name: str = "batch"):
  """The same step under `jax.pmap`: state replicated per device, batch split on its
  leading device axis, gradients averaged with `lax.pmean`."""
  reduce = lambda tree: jax.lax.pmean(tree, axis_name)
  return jax.pmap(_step_fn(loss_fn, tx, reduce), axis_name=axis_name, donate_argnums=(0,))


def replicate_for_pmap(tree):
  """One copy of `tree` per local device, stacked on a leading axis (pmap's layout)."""
  n = jax.local_device_count()
  return jax.tree.map(lambda x: jnp.stack([x] * n), tree)


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
  """Prints `label step/total loss steps/s` every `every` steps (or a tqdm bar when asked)."""

  def __init__(self, total: int, label: str = "", every: int = 100, stream=sys.stderr,
               enabled: bool = True):
    self.total, self.label, self.every, self.stream, self.enabled = total, label, every, stream, enabled
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
    print(f"[{self.label}] step {step}/{self.total} {shown} ({rate:.1f} steps/s, "
          f"{now - self.t0:.0f}s)", file=self.stream, flush=True)


def run_steps(step_fn, state: TrainState, batches: Iterator, num_steps: int, *,
              progress: Progress | None = None, on_metrics: Callable[[int, dict], None] | None = None,
              steps_per_call: int = 1):
  """Run `num_steps` steps. Metrics of call i are fetched after call i+1 is dispatched,
  so the host never blocks the device. Returns the final state."""
  pending = None
  done = 0
  while done < num_steps:
    state, metrics = step_fn(state, next(batches))
    done += steps_per_call
    if pending is not None:
      _report(*pending, progress, on_metrics)
    pending = (done, metrics)
  if pending is not None:
    _report(*pending, progress, on_metrics)
  return state


def _report(step, metrics, progress, on_metrics):
  host = jax.device_get(metrics)
  if on_metrics is not None:
    on_metrics(step, host)
  if progress is not None:
    progress.update(step, {"loss": host["loss"]})
