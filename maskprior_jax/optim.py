"""Optimizers that know the mask-prior collection.

The variable tree is what `model.init` returns: `{"params": ..., "mask_prior": ...}` and
possibly model state such as "batch_stats" or "cache". `with_mask_transform` routes every
collection explicitly with `optax.partition`: "params" to the weights' transformation,
"mask_prior" to the mask's, and every other collection to `optax.set_to_zero()` (no
update, no weight decay, no optimizer state: such collections are the model's to change,
e.g. through `mutable=["batch_stats"]`). `mask_prior_optimizer` builds the usual case from
a few numbers: the mask's own learning rate (multiplier or schedule), no weight decay on it
unless asked, or frozen (`optax.set_to_zero`: no state, no change, ever).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import jax
import optax

from maskprior_jax.attention import MASK_PRIOR

__all__ = ["mask_prior_optimizer", "with_mask_transform", "mask_rules", "base_optimizer", "DecayRule", "clipped",
           "collection_labels", "weight_matrices", "query_key_kernels", "add_decayed_weights_toward_init",
           "DecayTowardInitState", "PRIOR_LEAF"]

Schedule = Callable[[Any], Any]


UNTOUCHED = "untouched"


PRIOR_LEAF = "mask_prior"   # a prior kept inside "params" (`maskprior_jax.linen`, mask_collection="params")


def _params_labels(params: Any) -> Any:
  """"params" for every leaf, except a prior kept inside the params (a leaf named "mask_prior")."""
  def label(path, _):
    return MASK_PRIOR if any(_key_name(k) == PRIOR_LEAF for k in path) else "params"
  return jax.tree_util.tree_map_with_path(label, params)


def collection_labels(tree: dict) -> dict:
  """Label every leaf: "mask_prior" for the mask prior, "params" for the other weights, "untouched"
  for every other collection (model state the optimizer must never change).

  `tree` is what `model.init` returns (`{"params": ..., "mask_prior": ..., ...}`), or the params
  alone (a training loop that passes only `params`: a tree with neither a "params" nor a
  "mask_prior" key at the top). Inside the params, a leaf named "mask_prior" is the prior
  (`maskprior_jax.linen` modules with `mask_collection="params"`)."""
  if not isinstance(tree, Mapping) or not ({"params", MASK_PRIOR} & set(tree)):
    return _params_labels(tree)

  def label(name, sub):
    if name == "params":
      return _params_labels(sub)
    return jax.tree.map(lambda _: name if name == MASK_PRIOR else UNTOUCHED, sub)
  return {name: label(name, sub) for name, sub in tree.items()}


def with_mask_transform(params_tx: optax.GradientTransformation,
                        mask_tx: optax.GradientTransformation | None) -> optax.GradientTransformation:
  """One transformation over a variable tree: `params_tx` for "params", `mask_tx` for the mask
  prior (None freezes it: zero updates and no optimizer state), and zero updates for any other
  collection ("batch_stats", "cache", ...)."""
  return optax.partition({"params": params_tx, MASK_PRIOR: mask_tx or optax.set_to_zero(),
                          UNTOUCHED: optax.set_to_zero()}, collection_labels)


def _scaled(lr: float | Schedule, factor: float) -> float | Schedule:
  if callable(lr):
    return lambda step: factor * lr(step)
  return factor * lr


def _key_name(k) -> str:
  return str(getattr(k, "key", getattr(k, "name", k)))


def weight_matrices(tree: Any) -> Any:
  """True at the weight matrices of a Flax parameter tree (leaves named "kernel" with two or more
  dimensions: Dense and attention projections), False at LayerNorm scales, biases, embeddings and
  anything else: the usual mask for weight decay (`optax.adamw(mask=...)`)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: bool(path) and _key_name(path[-1]) == "kernel" and getattr(x, "ndim", 0) >= 2, tree)


def query_key_kernels(tree: Any) -> Any:
  """True at the attention query and key kernels (the weights a QK prior initialises)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: bool(path) and _key_name(path[-1]) == "kernel" and any(_key_name(k) in ("query", "key")
                                                                              for k in path[:-1]), tree)


class DecayTowardInitState(NamedTuple):
  init: Any


def add_decayed_weights_toward_init(weight_decay: float) -> optax.GradientTransformation:
  """Adds `weight_decay * (params - params at init)` to the updates: decay toward the initial
  values (kept in the state) instead of toward zero."""
  def init_fn(params):
    return DecayTowardInitState(init=jax.tree.map(lambda p: p, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("add_decayed_weights_toward_init needs the params")
    return jax.tree.map(lambda g, p, p0: g + weight_decay * (p - p0), updates, params, state.init), state
  return optax.GradientTransformation(init_fn, update_fn)


def _decay(weight_decay: float, decay_mask, anchor_mask) -> list[optax.GradientTransformation]:
  """Weight decay toward zero where `decay_mask` (all leaves if None) and not `anchor_mask`, and
  toward the initial values where `anchor_mask`."""
  if not weight_decay:
    return []
  if anchor_mask is None:
    return [optax.add_decayed_weights(weight_decay, mask=decay_mask)]

  def to_zero(params):
    keep = decay_mask(params) if callable(decay_mask) else decay_mask
    anchored = anchor_mask(params) if callable(anchor_mask) else anchor_mask
    if keep is None:
      return jax.tree.map(lambda a: not a, anchored)
    return jax.tree.map(lambda k, a: bool(k) and not a, keep, anchored)
  return [optax.add_decayed_weights(weight_decay, mask=to_zero),
          optax.masked(add_decayed_weights_toward_init(weight_decay), anchor_mask)]


def base_optimizer(name: str, learning_rate: float | Schedule, weight_decay: float = 0.0,
                   b1: float = 0.9, b2: float = 0.999, *, decay_mask=None,
                   anchor_mask=None) -> optax.GradientTransformation:
  """"adam", "adamw" (decoupled decay) or "sgd" (decay added to the gradient). `decay_mask` (a
  pytree of bools or a function of the params, e.g. `weight_matrices`) limits weight decay to some
  leaves; `anchor_mask` makes those leaves decay toward their initial values instead of zero."""
  if name == "adamw" and anchor_mask is None:
    return optax.adamw(learning_rate, b1, b2, weight_decay=weight_decay, mask=decay_mask)
  decay = _decay(weight_decay, decay_mask, anchor_mask)
  if name == "adamw":
    return optax.chain(optax.scale_by_adam(b1, b2), *decay, optax.scale_by_learning_rate(learning_rate))
  if name == "adam":
    return optax.chain(*decay, optax.adam(learning_rate, b1, b2)) if decay else optax.adam(learning_rate, b1, b2)
  if name == "sgd":
    return optax.chain(*decay, optax.sgd(learning_rate)) if decay else optax.sgd(learning_rate)
  raise ValueError(f"unknown optimizer {name!r}; use adam, adamw or sgd")


@dataclasses.dataclass(frozen=True)
class DecayRule:
  """Which leaves weight decay reaches and how. decay_mask: the weights' leaves that decay (a pytree
  of bools or a function of the params, e.g. `weight_matrices`; None: all); anchor_mask: leaves that
  decay toward their initial values instead of zero (e.g. `query_key_kernels`); mask_to_init: the
  mask prior's own decay (`mask_weight_decay`) pulls toward its initial values. Anchoring a QK
  prior's kernels and the mask alike gives both priors one treatment."""
  decay_mask: Any = None
  anchor_mask: Any = None
  mask_to_init: bool = False


def mask_rules(learning_rate: float | Schedule, *, name: str = "adamw", weight_decay: float = 0.0,
               b1: float = 0.9, b2: float = 0.999, mask_learning_rate: float | Schedule | None = None,
               mask_lr_multiplier: float = 1.0, mask_weight_decay: float = 0.0,
               freeze_mask: bool = False, decay: DecayRule | None = None,
               ) -> tuple[optax.GradientTransformation, optax.GradientTransformation | None]:
  """(the weights' rule, the mask's rule or None when frozen): the base optimizer (weight decay
  where `decay` says; see `DecayRule`), and the same rule with the mask's own learning rate
  (`mask_learning_rate`, else `mask_lr_multiplier` times the base, schedules included) and its own
  weight decay (0 by default). `with_mask_transform(*mask_rules(...))` is the optimizer."""
  decay = decay or DecayRule()
  params_tx = base_optimizer(name, learning_rate, weight_decay, b1, b2, decay_mask=decay.decay_mask,
                             anchor_mask=decay.anchor_mask)
  if freeze_mask:
    return params_tx, None
  mask_lr = mask_learning_rate if mask_learning_rate is not None else _scaled(learning_rate, mask_lr_multiplier)
  anchor = (lambda tree: jax.tree.map(lambda _: True, tree)) if decay.mask_to_init and mask_weight_decay else None
  return params_tx, base_optimizer(name, mask_lr, mask_weight_decay, b1, b2, anchor_mask=anchor)


def mask_prior_optimizer(learning_rate: float | Schedule, *, name: str = "adamw",
                         weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
                         mask_learning_rate: float | Schedule | None = None,
                         mask_lr_multiplier: float = 1.0, mask_weight_decay: float = 0.0,
                         freeze_mask: bool = False,
                         grad_clip_norm: float | None = None) -> optax.GradientTransformation:
  """The base optimizer for "params", and for "mask_prior" the same rule with its own
  learning rate (`mask_learning_rate`, else `mask_lr_multiplier` times the base, schedules
  included) and its own weight decay (0 by default), or frozen (see `mask_rules`); gradients
  clipped to `grad_clip_norm` first if given. Decay on some leaves only, or toward the initial
  values: `clipped(with_mask_transform(*mask_rules(..., decay=DecayRule(...))), clip)`. For Flax
  NNX models: `maskprior_jax.nnx.mask_prior_optimizer`."""
  params_tx, mask_tx = mask_rules(learning_rate, name=name, weight_decay=weight_decay, b1=b1, b2=b2,
                                  mask_learning_rate=mask_learning_rate, mask_lr_multiplier=mask_lr_multiplier,
                                  mask_weight_decay=mask_weight_decay, freeze_mask=freeze_mask)
  return clipped(with_mask_transform(params_tx, mask_tx), grad_clip_norm)


def clipped(tx: optax.GradientTransformation, grad_clip_norm: float | None) -> optax.GradientTransformation:
  """`tx` after global-norm clipping of the gradient to `grad_clip_norm` (unchanged if None or 0)."""
  return optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx) if grad_clip_norm else tx
