"""QK-based structured initializations, the baselines the mask prior is compared with.

- `mimetic`: W_q W_k^T ~ alpha Z + beta I per head and W_v W_o ~ alpha Z - beta I
  (Trockman & Kolter 2023), Z ~ N(0, 1/d), by truncated SVD.
- `fit_qk`: query/key weights fitted by gradient descent so that the model's initial
  attention matches a target pattern (the structured-initialization recipe of Zheng et al.),
  here the same interaction pattern the mask prior encodes. Only attention weights are fitted,
  only on inputs (never targets).
"""
from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskprior_jax.measure import attention_maps


def _attention_paths(params: dict) -> list[tuple[str, ...]]:
  flat = flax.traverse_util.flatten_dict(params)
  return sorted({k[:-2] for k in flat if len(k) >= 2 and k[-2] == "query" and k[-1] == "kernel"})


def _svd_factors(a: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
  u, s, vt = np.linalg.svd(a)
  root = np.sqrt(s[:rank])
  return u[:, :rank] * root, vt[:rank].T * root     # a ~ left @ right.T


def mimetic(params: dict, rng: np.random.Generator, *, alpha: float = 0.7, beta: float = 0.7,
            alpha_v: float = 0.4, beta_v: float = 0.4) -> dict:
  """Mimetic initialization of every attention layer found in `params` (Flax MHA layout)."""
  flat = flax.traverse_util.flatten_dict(jax.device_get(params))
  flat = {k: np.array(v) for k, v in flat.items()}
  for path in _attention_paths(params):
    wq = flat[path + ("query", "kernel")]
    d, heads, hd = wq.shape
    eye = np.eye(d)
    q, k = np.zeros_like(wq), np.zeros_like(wq)
    for h in range(heads):
      a = alpha * rng.normal(0, 1 / np.sqrt(d), (d, d)) + beta * eye
      left, right = _svd_factors(a, hd)
      q[:, h], k[:, h] = left, right
    flat[path + ("query", "kernel")], flat[path + ("key", "kernel")] = q, k
    wv, wo = flat[path + ("value", "kernel")], flat[path + ("out", "kernel")]
    a = alpha_v * rng.normal(0, 1 / np.sqrt(d), (d, d)) - beta_v * eye
    left, right = _svd_factors(a, min(d, heads * hd))
    v = np.zeros((d, heads * hd))
    o = np.zeros((heads * hd, wo.shape[-1]))
    v[:, : left.shape[1]], o[: right.shape[1]] = left, right.T[:, : wo.shape[-1]]
    flat[path + ("value", "kernel")] = v.reshape(wv.shape).astype(wv.dtype)
    flat[path + ("out", "kernel")] = o.reshape(wo.shape).astype(wo.dtype)
    for name in ("query", "key"):
      flat[path + (name, "kernel")] = flat[path + (name, "kernel")].astype(wq.dtype)
  # device_put, not jnp.asarray: a NumPy array through jnp.asarray is a small compiled program per shape
  return flax.traverse_util.unflatten_dict({k: jax.device_put(v) for k, v in flat.items()})


def fit_qk(apply_fn: Callable, variables: dict, inputs: Any, target: jax.Array, *,
           steps: int = 300, learning_rate: float = 1e-2, batch_size: int | None = None,
           seed: int = 0) -> tuple[dict, float]:
  """Fit every layer's query/key weights so that attention ~ `target` (heads, q, kv).

  Minimizes the mean KL(target || attention) with Adam, the other weights fixed.

  Args:
    apply_fn: the model's apply function; its attention layers sow their weights.
    variables: the model's variables (a "params" collection holding "query" and "key" kernels).
    inputs: (N, ...) model inputs the fit is made on.
    target: (heads, q, kv) attention pattern, each row summing to 1.
    steps: Adam steps.
    learning_rate: Adam's rate.
    batch_size: inputs per step, drawn without replacement from `inputs` by a generator keyed by
      `seed`; None (or at least N): every input at every step.
    seed: the draw of those batches.

  Returns:
    (variables with the fitted query/key weights, the final mean total-variation distance between
    attention rows and target rows over `inputs`).
  """
  flat = flax.traverse_util.flatten_dict(variables["params"])
  is_qk = {k: len(k) >= 2 and k[-2] in ("query", "key") for k in flat}
  trainable = {k: v for k, v in flat.items() if is_qk[k]}
  frozen = {k: v for k, v in flat.items() if not is_qk[k]}
  target = jnp.asarray(target)

  def merged(tr):
    return {**variables, "params": flax.traverse_util.unflatten_dict({**frozen, **tr})}

  def loss(tr, x):
    maps = attention_maps(apply_fn, merged(tr), x)
    kl = [jnp.sum(target * (jnp.log(target + 1e-9) - jnp.log(a + 1e-9)), -1).mean() for a in maps]
    return jnp.mean(jnp.stack(kl))

  tx = optax.adam(learning_rate)
  opt = tx.init(trainable)
  def update(tr, opt, x):
    upd, opt = tx.update(jax.grad(loss)(tr, x), opt, tr)
    return optax.apply_updates(tr, upd), opt

  n = len(inputs)
  if batch_size is None or batch_size >= n:
    step = jax.jit(lambda tr, opt: update(tr, opt, inputs))   # the inputs a constant of the program
    for _ in range(steps):
      trainable, opt = step(trainable, opt)
  else:
    batch_step, rng, pool = jax.jit(update), np.random.default_rng(seed), np.asarray(inputs)
    for _ in range(steps):
      trainable, opt = batch_step(trainable, opt, pool[rng.choice(n, batch_size, replace=False)])
  def final_tv(tr):   # one program, not each operation of the model on its own
    return jnp.stack([0.5 * jnp.abs(a - target).sum(-1).mean() for a in attention_maps(apply_fn, merged(tr), inputs)])
  tv = float(np.mean(np.asarray(jax.jit(final_tv)(trainable))))
  return merged(trainable), tv
