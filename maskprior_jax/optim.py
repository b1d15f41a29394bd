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

from typing import Any, Callable

import jax
import optax

from maskprior_jax.attention import MASK_PRIOR

Schedule = Callable[[Any], Any]


UNTOUCHED = "untouched"


def collection_labels(tree: dict) -> dict:
  """Label every leaf by its top-level collection: "params", "mask_prior", or "untouched"
  (every other collection: model state the optimizer must never change)."""
  def label(name):
    return name if name in ("params", MASK_PRIOR) else UNTOUCHED
  return {name: jax.tree.map(lambda _, n=name: label(n), sub) for name, sub in tree.items()}


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


def base_optimizer(name: str, learning_rate: float | Schedule, weight_decay: float = 0.0,
                   b1: float = 0.9, b2: float = 0.999) -> optax.GradientTransformation:
  """"adam", "adamw" (decoupled decay) or "sgd" (decay added to the gradient)."""
  if name == "adam" and weight_decay:
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate, b1, b2))
  if name == "adam":
    return optax.adam(learning_rate, b1, b2)
  if name == "adamw":
    return optax.adamw(learning_rate, b1, b2, weight_decay=weight_decay)
  if name == "sgd":
    tx = optax.sgd(learning_rate)
    return optax.chain(optax.add_decayed_weights(weight_decay), tx) if weight_decay else tx
  raise ValueError(f"unknown optimizer {name!r}; use adam, adamw or sgd")


def mask_rules(learning_rate: float | Schedule, *, name: str = "adamw", weight_decay: float = 0.0,
               b1: float = 0.9, b2: float = 0.999, mask_learning_rate: float | Schedule | None = None,
               mask_lr_multiplier: float = 1.0, mask_weight_decay: float = 0.0,
               freeze_mask: bool = False) -> tuple[optax.GradientTransformation, optax.GradientTransformation | None]:
  """(the weights' rule, the mask's rule or None when frozen): the base optimizer, and the same
  rule with the mask's own learning rate (`mask_learning_rate`, else `mask_lr_multiplier` times
  the base, schedules included) and its own weight decay (0 by default)."""
  params_tx = base_optimizer(name, learning_rate, weight_decay, b1, b2)
  if freeze_mask:
    return params_tx, None
  mask_lr = mask_learning_rate if mask_learning_rate is not None else _scaled(learning_rate, mask_lr_multiplier)
  return params_tx, base_optimizer(name, mask_lr, mask_weight_decay, b1, b2)


def mask_prior_optimizer(learning_rate: float | Schedule, *, name: str = "adamw",
                         weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
                         mask_learning_rate: float | Schedule | None = None,
                         mask_lr_multiplier: float = 1.0, mask_weight_decay: float = 0.0,
                         freeze_mask: bool = False,
                         grad_clip_norm: float | None = None) -> optax.GradientTransformation:
  """The base optimizer for "params", and for "mask_prior" the same rule with its own
  learning rate (`mask_learning_rate`, else `mask_lr_multiplier` times the base, schedules
  included) and its own weight decay (0 by default), or frozen (see `mask_rules`); gradients
  clipped to `grad_clip_norm` first if given. For Flax NNX models: `maskprior_jax.nnx.mask_prior_optimizer`."""
  params_tx, mask_tx = mask_rules(learning_rate, name=name, weight_decay=weight_decay, b1=b1, b2=b2,
                                  mask_learning_rate=mask_learning_rate, mask_lr_multiplier=mask_lr_multiplier,
                                  mask_weight_decay=mask_weight_decay, freeze_mask=freeze_mask)
  return clipped(with_mask_transform(params_tx, mask_tx), grad_clip_norm)


def clipped(tx: optax.GradientTransformation, grad_clip_norm: float | None) -> optax.GradientTransformation:
  """`tx` after global-norm clipping of the gradient to `grad_clip_norm` (unchanged if None or 0)."""
  return optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx) if grad_clip_norm else tx
