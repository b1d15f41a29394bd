"""Pieces every benchmark shares: seed-parallel training with periodic evaluation, the run
folder (config, metrics, results), Markdown tables and plots.

A benchmark supplies: a model, per-seed initial variables, a loss, a batch function
`batch_fn(step, seeds) -> batch with a leading seed axis`, and an eval hook.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maskprior_jax import train
from maskprior_jax.attention import MASK_PRIOR


def stack_trees(trees: Sequence[Any]) -> Any:
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def train_seeds(*, loss_fn, tx, variables: Sequence[dict], seeds: Sequence[int],
                batch_fn: Callable[[int, Sequence[int]], Any], steps: int, steps_per_call: int,
                eval_every: int, eval_fn: Callable[[int, dict], dict], label: str,
                log_every: int = 250, checkpointer=None,
                checkpoint_every: int = 0, mesh=None, fsdp: bool = False) -> tuple[train.TrainState, list[dict]]:
  """Train one run per seed in a single vmapped program.

  With a `mesh` (see `train.data_mesh`), every seed's batch is split over the mesh's "data"
  axis (data parallel, the state replicated); the batch size must divide by its size. Each
  process then feeds only its rows of the global batch (`distributed.process_slice`). With
  `fsdp` as well, large state leaves are split over the mesh (`train.fsdp_sharding`).

  eval_fn(step, stacked_variables) -> dict of per-seed arrays, called at step 0, every
  `eval_every` steps and at the end. With a `checkpointer`, the state and the eval history
  are saved every `checkpoint_every` steps, at the end and on SIGTERM (then `Preempted` is
  raised), and a run finds and continues from its latest checkpoint. Returns the final
  stacked state and the eval history.
  """
  from maskprior_jax import checkpoint as ckpt
  for name, value in (("eval.every_steps", eval_every), ("train.steps", steps),
                      ("checkpoint.every_steps", checkpoint_every)):
    if value % steps_per_call:
      raise ValueError(f"{name} ({value}) must be a multiple of train.steps_per_call ({steps_per_call})")
  states = stack_trees([train.create_state(v, tx, jax.random.key(s)) for v, s in zip(variables, seeds)])
  state_sharding = train.fsdp_sharding(states, mesh) if (mesh is not None and fsdp) else None
  step_fn = train.make_train_step(loss_fn, tx, seed_axis=True, steps_per_call=steps_per_call, mesh=mesh,
                                  state_sharding=state_sharding)
  lead = 1 + int(steps_per_call > 1)   # the batch axis comes after (steps,) seeds

  def place(batch):
    if mesh is None:
      return batch
    from maskprior_jax import distributed
    local = jax.tree.map(lambda a: np.asarray(a)[(slice(None),) * lead + (distributed.process_slice(a.shape[lead]),)],
                         batch)
    return distributed.global_batch(local, mesh, lead)
  done, history = 0, None
  if checkpointer is not None:
    restored = checkpointer.restore_latest(jax.device_get(states))
    if restored is not None:
      states, record = restored
      done, history = int(record["step"]), record["history"]
      print(f"[{label}] resumed from the checkpoint at step {done}", file=sys.stderr, flush=True)
  if mesh is not None:
    states = jax.device_put(states, state_sharding or train.replicated(mesh))
  if history is None:
    history = [{"step": 0, **_host(eval_fn(0, states.variables))}]
  progress = train.Progress(steps, label=label, every=log_every)
  progress.last_step = done

  def save(step, wait=False):
    if checkpointer is not None:
      checkpointer.save(step, jax.device_get(states), {"step": step, "history": history}, wait=wait)

  try:
    with ckpt.SigtermFlag() as sigterm:
      while done < steps:
        chunk = [batch_fn(done + j, seeds) for j in range(steps_per_call)]
        batch = stack_trees(chunk) if steps_per_call > 1 else chunk[0]
        new_states, metrics = step_fn(states, place(batch))
        # One host sync per call (steps_per_call steps): a non-finite loss never replaces good state.
        loss = np.asarray(jax.device_get(metrics["loss"]))
        if not np.all(np.isfinite(loss)):
          raise NonFiniteLoss(f"[{label}] loss became non-finite between steps {done} and "
                              f"{done + steps_per_call}; last good checkpoint kept. Lower train.learning_rate")
        states, done = new_states, done + steps_per_call
        if done % log_every == 0 or done == steps:
          progress.update(done, {"loss": loss[-1] if loss.ndim > 1 else loss})
        if done % eval_every == 0 or done == steps:
          history.append({"step": done, **_host(eval_fn(done, states.variables))})
        if (checkpoint_every and done % checkpoint_every == 0) or done == steps:
          save(done, wait=done == steps)
        if sigterm.raised:
          save(done, wait=True)
          raise ckpt.Preempted(f"[{label}] SIGTERM at step {done}: checkpoint saved; rerun the same command to resume")
  finally:
    if checkpointer is not None:
      checkpointer.wait()  # a pending async save reaches disk whatever ends the loop
  return states, history


class NonFiniteLoss(RuntimeError):
  pass


def _host(d: dict) -> dict:
  return {k: np.asarray(jax.device_get(v)).tolist() for k, v in d.items()}


def mask_drift(variables: dict, initial: dict) -> jax.Array:
  """Per seed ||B_t - B_0|| / ||B_0|| over the whole mask-prior collection."""
  cur, ini = jax.tree.leaves(variables[MASK_PRIOR]), jax.tree.leaves(initial[MASK_PRIOR])
  axes = lambda x: tuple(range(1, x.ndim))
  num = sum(jnp.sum((c - i) ** 2, axis=axes(c)) for c, i in zip(cur, ini))
  den = sum(jnp.sum(i ** 2, axis=axes(i)) for i in ini)
  return jnp.sqrt(num / jnp.maximum(den, 1e-12))


def total_variation(attn: jax.Array, pattern: jax.Array) -> jax.Array:
  """Mean over (batch, heads, rows) of 0.5 * sum_k |attn - pattern|; attn (..., B, H, q, kv)."""
  return 0.5 * jnp.abs(attn - pattern).sum(-1).mean(axis=(-1, -2, -3))


# ----------------------------------------------------------------------------- run folder
def write_json(path: pathlib.Path, obj: Any) -> None:
  """Write atomically (temp file + rename), so an interrupted write never leaves half a file."""
  path = pathlib.Path(path)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(obj, indent=1, default=_json_default))
  os.replace(tmp, path)


def _json_default(o):
  if isinstance(o, (np.floating, np.integer)):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  return str(o)


def open_results(workdir: pathlib.Path, cfg, digest: str, header: dict) -> dict:
  """The run folder's results.json if it holds a run of the same config (`digest`), so that
  finished methods are kept; otherwise a new record of `header` with empty runs. Writes
  config.json."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  results = {**header, "config_digest": digest, "runs": [], "curves": {}, "wall_s": {},
             "environment": environment()}
  path = workdir / "results.json"
  if path.exists():
    old = json.loads(path.read_text())
    if old.get("config_digest") == digest:
      results = old
  write_json(workdir / "config.json", cfg.to_dict())
  return results


def record_method(results: dict, method: str, history: Sequence[dict], wall_s: float,
                  workdir: pathlib.Path, **metrics_extra) -> None:
  """Store a finished method's eval curves and wall time, and rewrite results.json and
  metrics.jsonl (one row per method and evaluation, plus `metrics_extra`)."""
  workdir = pathlib.Path(workdir)
  results["curves"][method] = {k: [h[k] for h in history] for k in history[0]}
  results["wall_s"][method] = wall_s
  write_json(workdir / "results.json", results)
  write_jsonl(workdir / "metrics.jsonl", [
      {"method": m, **metrics_extra, **{k: c[k][t] for k in c}}
      for m, c in results["curves"].items() for t in range(len(c["step"]))])
  write_tensorboard(workdir / "tensorboard" / method, history)


def environment() -> dict:
  import flax
  import optax
  from maskprior_jax import __version__
  return {"maskprior_jax": __version__, "jax": jax.__version__, "flax": flax.__version__,
          "optax": optax.__version__, "python": platform.python_version(),
          "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}


def write_jsonl(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Rewrite a JSON-lines file atomically (one row per line)."""
  path = pathlib.Path(path)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text("".join(json.dumps(r, default=_json_default) + "\n" for r in rows))
  os.replace(tmp, path)


def write_tensorboard(logdir: pathlib.Path, history: Sequence[dict], tag_prefix: str = "") -> None:
  """Eval history as TensorBoard scalars: per-seed mean of every metric (per layer if a vector)."""
  from tensorboardX import SummaryWriter
  with SummaryWriter(str(logdir)) as w:
    for h in history:
      for k, v in h.items():
        if k == "step":
          continue
        a = np.asarray(v, float)
        if a.ndim <= 1:
          w.add_scalar(f"{tag_prefix}{k}", float(a.mean()), h["step"])
        else:  # (seeds, layers)
          for layer, value in enumerate(a.mean(0)):
            w.add_scalar(f"{tag_prefix}{k}/layer_{layer}", float(value), h["step"])


def mean_std(values: Sequence[float]) -> str:
  v = np.asarray(values, float)
  if v.size == 0:
    return "-"
  return f"{v.mean():.3g} ± {v.std():.2g}" if v.size > 1 else f"{v.mean():.3g}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def new_figure(figsize: tuple[float, float]):
  """(figure, axes) drawn without pyplot, so that saving plots never changes the caller's
  matplotlib backend or state (a notebook keeps its inline plots)."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=figsize)
  return fig, fig.subplots()


def metric_curves(curves: dict, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """`plot_curves` input from results["curves"]: method -> (steps, values (seeds, T)) for every
  method that recorded `key`; a per-layer metric (T, seeds, layers) is averaged over layers."""
  out = {}
  for m, c in curves.items():
    if key in c:
      values = np.asarray(c[key], float)
      out[m] = (np.asarray(c["step"]), (values.mean(-1) if values.ndim == 3 else values).T)
  return out


def plot_curves(path: pathlib.Path, curves: dict[str, tuple[np.ndarray, np.ndarray]], *, title: str,
                ylabel: str, logy: bool = False, hlines: dict[str, float] | None = None) -> None:
  """curves: label -> (steps (T,), values (seeds, T)); mean line with min-max band."""
  fig, ax = new_figure((5.5, 3.6))
  for label, (steps, values) in curves.items():
    values = np.asarray(values, float)
    ax.plot(steps, values.mean(0), label=label)
    if values.shape[0] > 1:
      ax.fill_between(steps, values.min(0), values.max(0), alpha=0.2)
  for label, y in (hlines or {}).items():
    ax.axhline(y, ls="--", c="gray", lw=1)
    ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=8, color="gray",
                va="bottom")
  if logy:
    ax.set_yscale("symlog", linthresh=1e-2)
  ax.set(title=title, xlabel="step", ylabel=ylabel)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


class Timer:
  def __init__(self):
    self.t0 = time.perf_counter()

  def __call__(self) -> float:
    return time.perf_counter() - self.t0


# ----------------------------------------------------------------------------- methods
METHODS = ("vanilla", "mimetic", "qk", "mask")


def initial_variables(method: str, model, sample_input, seed: int, cfg, *, probe_input=None,
                      target_attn=None) -> tuple[dict, dict]:
  """One run's starting variables for a method: `model.init`, then for "mimetic" the
  mimetic QK/VO weights (cfg.mimetic), for "qk" query/key weights fitted so that the initial
  attention on `probe_input` matches `target_attn` (cfg.qk). "vanilla" and "mask" differ only
  in the model (the mask model carries its prior). Returns (variables, info)."""
  from maskprior_jax import qk_init
  variables = model.init(jax.random.key(seed), sample_input)
  info = {}
  if method == "mimetic":
    m = cfg.mimetic
    variables = {**variables, "params": qk_init.mimetic(
        variables["params"], np.random.default_rng(seed), alpha=m.alpha, beta=m.beta,
        alpha_v=m.alpha_v, beta_v=m.beta_v)}
  elif method == "qk":
    variables, tv = qk_init.fit_qk(model.apply, variables, probe_input, target_attn,
                                   steps=cfg.qk.fit_steps, learning_rate=cfg.qk.fit_learning_rate)
    info["qk_fit_tv"] = tv
  return variables, info


def train_method(*, method: str, model, tx, cfg, seeds: Sequence[int], sample_input, probe_input,
                 target_attn, loss_fn, batch_fn, metrics_fn, label: str, checkpoint_dir=None,
                 run_data=None, attn_rows=None, run_ids: Sequence[int] | None = None):
  """Train one method for every seed in one vmapped program, with the persistence measurements.

  Shared by every benchmark. The benchmark supplies the model (with its prior for "mask"),
  the loss, `batch_fn(step, run_ids)`, and `metrics_fn(variables, data) -> dict of scalars`
  for one run (`data` is that run's slice of `run_data`, or None). Every cfg.eval.every_steps
  the history records those metrics per run, plus `attn_tv`: each layer's mean total-variation
  distance between attention rows on `probe_input` and `target_attn` (heads, q, kv) (only
  rows `attn_rows` if given), and for a model with a prior `mask_drift` ||B_t-B_0||/||B_0||.
  `run_ids` (default: the seeds) index runs for `batch_fn` when runs differ by more than the
  seed; the seeds give each run its initialization.
  Returns (final stacked state, history, per-run init info, stacked initial variables).
  """
  from maskprior_jax import qk_init
  from maskprior_jax.checkpoint import Checkpointer
  inits = [initial_variables(method, model, sample_input, s, cfg, probe_input=probe_input,
                             target_attn=target_attn) for s in seeds]
  variables0 = [v for v, _ in inits]
  init0 = stack_trees(variables0)
  target_attn = jnp.asarray(target_attn)
  rows = slice(None) if attn_rows is None else np.asarray(attn_rows)

  def eval_one(v, data):
    out = dict(metrics_fn(v, data))
    maps = jnp.stack(qk_init.attention_maps(model.apply, v, probe_input))   # (layers, B, H, q, kv)
    out["attn_tv"] = total_variation(maps[..., rows, :], target_attn[..., rows, :])
    return out

  @jax.jit
  def eval_all(stacked, data):
    out = jax.vmap(eval_one, in_axes=(0, None if data is None else 0))(stacked, data)
    if MASK_PRIOR in stacked:
      out["mask_drift"] = mask_drift(stacked, init0)
    return out

  checkpointer = None
  if checkpoint_dir is not None:
    checkpointer = Checkpointer(checkpoint_dir, max_to_keep=cfg.checkpoint.max_to_keep)
  try:
    state, history = train_seeds(
        loss_fn=loss_fn, tx=tx, variables=variables0, seeds=list(run_ids if run_ids is not None else seeds),
        batch_fn=batch_fn, steps=cfg.train.steps, steps_per_call=cfg.train.steps_per_call,
        eval_every=cfg.eval.every_steps, eval_fn=lambda step, v: eval_all(v, run_data), label=label,
        checkpointer=checkpointer, checkpoint_every=cfg.checkpoint.every_steps, mesh=data_parallel_mesh(cfg),
        fsdp=cfg.train.get("fsdp", False))
  finally:
    if checkpointer is not None:
      checkpointer.close()
  return state, history, [i for _, i in inits], init0


def data_parallel_mesh(cfg):
  """A mesh over all devices when cfg.train.data_parallel is set (None otherwise)."""
  from maskprior_jax.config import check_data_parallel
  if not cfg.train.get("data_parallel", False):
    return None
  check_data_parallel(cfg)
  return train.data_mesh()


def per_run(history: Sequence[dict], i: int, keys: Sequence[str]) -> list[dict]:
  """Run i's slice of an eval history: [{"step", key: value, ...}, ...]."""
  return [{"step": h["step"], **{k: h[k][i] for k in keys if k in h}} for h in history]


def methods_in(results: dict) -> list[str]:
  """The methods present in a results dict, in METHODS order (others after, sorted)."""
  present = {r["method"] for r in results["runs"]}
  return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def persistence_table(results: dict) -> str:
  """Per method: attention TV from the prior's pattern at the first and last evaluation (mean
  over layers and runs), and the mask's final relative change."""
  rows = []
  for m in methods_in(results):
    rs = [r for r in results["runs"] if r["method"] == m]
    tv0 = np.mean([np.mean(r["persistence"][0]["attn_tv"]) for r in rs])
    tv1 = np.mean([np.mean(r["persistence"][-1]["attn_tv"]) for r in rs])
    drift = [r["persistence"][-1]["mask_drift"] for r in rs if "mask_drift" in r["persistence"][-1]]
    rows.append([m, f"{tv0:.2f} → {tv1:.2f}", mean_std(drift) if drift else "-"])
  return markdown_table(["method", "attn TV start → end", "‖B−B0‖/‖B0‖ end"], rows)
