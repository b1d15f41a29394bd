"""The methods every benchmark compares, and how one method is trained for every seed.

vanilla: the model as initialized; mimetic: mimetic QK/VO weights; qk: query/key weights
fitted so that the initial attention matches the prior's pattern; mask: the model with the
mask prior. Same model, budget and optimizer for all four.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maskprior_jax import baselines, distributed, measure, optim, train
from maskprior_jax.attention import MASK_PRIOR
from maskprior_jax.bench.results import RunRecord, TensorBoardLog, per_run
from maskprior_jax.checkpoint import Checkpointer, tree_sha256

METHODS = ("vanilla", "mimetic", "qk", "mask")


def make_tx(cfg, learning_rate: float | None = None):
  """The optimizer a benchmark config asks for (cfg.train, cfg.prior): the mask's own
  learning-rate multiplier, or frozen with prior.mode = "frozen"."""
  t = cfg.train
  return optim.mask_prior_optimizer(t.learning_rate if learning_rate is None else learning_rate,
                                    name=t.optimizer, weight_decay=t.weight_decay,
                                    mask_lr_multiplier=cfg.prior.mask_lr_multiplier,
                                    freeze_mask=cfg.prior.mode == "frozen")


def initial_variables(method: str, model, sample_input, seed: int, cfg, *, probe_input=None,
                      target_attn=None) -> tuple[dict, dict]:
  """One run's starting variables for a method: `model.init`, then for "mimetic" the
  mimetic QK/VO weights (cfg.mimetic), for "qk" query/key weights fitted so that the initial
  attention on `probe_input` matches `target_attn` (cfg.qk). "vanilla" and "mask" differ only
  in the model (the mask model carries its prior). Returns (variables, info)."""
  variables = model.init(jax.random.key(seed), sample_input)
  info = {}
  if method == "mimetic":
    m = cfg.mimetic
    variables = {**variables, "params": baselines.mimetic(
        variables["params"], np.random.default_rng(seed), alpha=m.alpha, beta=m.beta,
        alpha_v=m.alpha_v, beta_v=m.beta_v)}
  elif method == "qk":
    variables, tv = baselines.fit_qk(model.apply, variables, probe_input, target_attn,
                                     steps=cfg.qk.fit_steps, learning_rate=cfg.qk.fit_learning_rate)
    info["qk_fit_tv"] = tv
  return variables, info


def data_parallel_mesh(cfg):
  """A mesh over all devices when cfg.train.data_parallel is set (None otherwise)."""
  from maskprior_jax.bench.config import check_data_parallel
  if not cfg.train.get("data_parallel", False):
    return None
  check_data_parallel(cfg)
  return train.data_mesh()


def train_method(*, method: str, model, tx, cfg, seeds: Sequence[int], sample_input, probe_input,
                 target_attn, loss_fn, batch_fn, metrics_fn, label: str, checkpoint_dir=None,
                 tensorboard_dir=None, run_data=None, attn_rows=None, run_ids: Sequence[int] | None = None,
                 device_batch_fn=None):
  """Train one method for every seed in one vmapped program (`train.train_seeds`), with the
  persistence measurements.

  Shared by every benchmark. The benchmark supplies the model (with its prior for "mask"),
  the loss, `batch_fn(step, run_ids)`, and `metrics_fn(variables, data) -> dict of scalars`
  for one run (`data` is that run's slice of `run_data`, or None). Every cfg.eval.every_steps
  the history records those metrics per run, plus `attn_tv`: each layer's mean total-variation
  distance between attention rows on `probe_input` and `target_attn` (heads, q, kv) (only
  rows `attn_rows` if given), and for a model with a prior `mask_drift` ||B_t-B_0||/||B_0||.
  `run_ids` (default: the seeds) index runs for `batch_fn` when runs differ by more than the
  seed; the seeds give each run its initialization. With cfg.train.batches = "device", batches
  are drawn inside the compiled step by `device_batch_fn(step, run)` (run: index into the runs)
  instead of by `batch_fn` on the host. With `tensorboard_dir`, every evaluation reaches
  TensorBoard as it is made.
  Returns (final stacked state, history, per-run init info, stacked initial variables).
  """
  inits = [initial_variables(method, model, sample_input, s, cfg, probe_input=probe_input,
                             target_attn=target_attn) for s in seeds]
  variables0 = [v for v, _ in inits]
  init0 = jax.device_get(train.stack_trees(variables0))   # host arrays: valid on any mesh and process
  mesh = data_parallel_mesh(cfg)
  target_attn = jnp.asarray(target_attn)
  rows = slice(None) if attn_rows is None else np.asarray(attn_rows)

  def eval_one(v, data):
    out = dict(metrics_fn(v, data))
    maps = jnp.stack(measure.attention_maps(model.apply, v, probe_input))   # (layers, B, H, q, kv)
    out["attn_tv"] = measure.total_variation(maps[..., rows, :], target_attn[..., rows, :])
    return out

  def eval_all(stacked, data, init0):
    out = jax.vmap(eval_one, in_axes=(0, None if data is None else 0))(stacked, data)
    if MASK_PRIOR in stacked:
      out["mask_drift"] = measure.mask_drift(stacked, init0)
    return out
  # Over a mesh the metrics come back replicated, so that every process can read them.
  eval_all = jax.jit(eval_all, **({} if mesh is None else {"out_shardings": train.replicated(mesh)}))

  tensorboard = None if tensorboard_dir is None else TensorBoardLog(tensorboard_dir)

  def eval_fn(step, stacked):
    out = jax.device_get(eval_all(stacked, run_data, init0))   # fetched once, for the history and TensorBoard
    if tensorboard is not None:
      tensorboard(step, out)
    return out

  checkpointer = None
  if checkpoint_dir is not None:
    checkpointer = Checkpointer(checkpoint_dir, max_to_keep=cfg.checkpoint.max_to_keep)
  try:
    state, history = train.train_seeds(
        loss_fn=loss_fn, tx=tx, variables=variables0, seeds=list(run_ids if run_ids is not None else seeds),
        batch_fn=batch_fn, steps=cfg.train.steps, steps_per_call=cfg.train.steps_per_call,
        eval_every=cfg.eval.every_steps, eval_fn=eval_fn, label=label,
        checkpointer=checkpointer, checkpoint_every=cfg.checkpoint.every_steps, mesh=mesh,
        fsdp=cfg.train.get("fsdp", False), grad_reduction=cfg.train.get("grad_reduction", "xla"),
        device_batch_fn=device_batch_fn if cfg.train.get("batches", "host") == "device" else None)
  finally:
    if checkpointer is not None:
      checkpointer.close()
    if tensorboard is not None:
      tensorboard.close()
  # On the host in every process: what comes next (test metrics, digests) reads it locally.
  return distributed.host_tree(state), history, [i for _, i in inits], init0


def run_record(method: str, seed: int, i: int, state, history, infos, metrics: dict) -> RunRecord:
  """The RunRecord of run i of a stacked state: its metrics, persistence history, state digest
  and init info."""
  return RunRecord(method=method, seed=int(seed), metrics=metrics,
                   persistence=per_run(history, i, ["attn_tv", "mask_drift"]),
                   state_sha256=tree_sha256(jax.tree.map(lambda a: a[i], state.variables)), info=infos[i])
