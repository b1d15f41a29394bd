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


#: The leaf name of a prior kept inside "params" (`maskprior_jax.linen` with ``mask_collection="params"``).
PRIOR_LEAF = "mask_prior"   # a prior kept inside "params" (`maskprior_jax.linen`, mask_collection="params")


def _params_labels(params: Any) -> Any:
  """"params" for every leaf, except a prior kept inside the params (a leaf named "mask_prior")."""
  def label(path, _):
    return MASK_PRIOR if any(_key_name(k) == PRIOR_LEAF for k in path) else "params"
  return jax.tree_util.tree_map_with_path(label, params)


def collection_labels(tree: dict) -> dict:
  """Labels every leaf of a variable tree for `with_mask_transform`.

  Args:
    tree: what ``model.init`` returns (``{"params": ..., "mask_prior": ..., ...}``), or the
      params alone (a tree with neither a "params" nor a "mask_prior" key at the top). Inside
      the params, a leaf named "mask_prior" is the prior (`maskprior_jax.linen` with
      ``mask_collection="params"``).

  Returns:
    A tree of the same structure holding "mask_prior" at the prior's leaves, "params" at the
    other weights and "untouched" in every other collection (model state the optimizer must
    never change).

  Example:
    >>> from maskprior_jax.optim import collection_labels
    >>> collection_labels({"params": {"w": 1.0}, "mask_prior": {"bias": 0.0}, "batch_stats": {"m": 0.0}})
    {'params': {'w': 'params'}, 'mask_prior': {'bias': 'mask_prior'}, 'batch_stats': {'m': 'untouched'}}
  """
  if not isinstance(tree, Mapping) or not ({"params", MASK_PRIOR} & set(tree)):
    return _params_labels(tree)

  def label(name, sub):
    if name == "params":
      return _params_labels(sub)
    return jax.tree.map(lambda _: name if name == MASK_PRIOR else UNTOUCHED, sub)
  return {name: label(name, sub) for name, sub in tree.items()}


def with_mask_transform(params_tx: optax.GradientTransformation,
                        mask_tx: optax.GradientTransformation | None) -> optax.GradientTransformation:
  """One optax transformation over a whole variable tree, routed by collection.

  Args:
    params_tx: the weights' transformation ("params").
    mask_tx: the mask prior's transformation ("mask_prior"); None freezes it (zero updates and no
      optimizer state).

  Returns:
    An ``optax.GradientTransformation`` (an ``optax.partition`` by `collection_labels`) that
    gives every other collection ("batch_stats", "cache", ...) zero updates.
  """
  return optax.partition({"params": params_tx, MASK_PRIOR: mask_tx or optax.set_to_zero(),
                          UNTOUCHED: optax.set_to_zero()}, collection_labels)


def _scaled(lr: float | Schedule, factor: float) -> float | Schedule:
  if callable(lr):
    return lambda step: factor * lr(step)
  return factor * lr


def _key_name(k) -> str:
  return str(getattr(k, "key", getattr(k, "name", k)))


def weight_matrices(tree: Any) -> Any:
  """Marks the weight matrices of a Flax parameter tree: the usual mask for weight decay.

  Args:
    tree: a parameter tree.

  Returns:
    A tree of bools: True at leaves named "kernel" with two or more dimensions (Dense and
    attention projections), False at LayerNorm scales, biases, embeddings and anything else.
    Pass it as ``optax.adamw(mask=...)`` or ``DecayRule(decay_mask=...)``.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, x: bool(path) and _key_name(path[-1]) == "kernel" and getattr(x, "ndim", 0) >= 2, tree)


def query_key_kernels(tree: Any) -> Any:
  """Marks the attention query and key kernels (the weights a QK prior initialises).

  Args:
    tree: a parameter tree.

  Returns:
    A tree of bools, True at leaves named "kernel" under a "query" or "key" module.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, x: bool(path) and _key_name(path[-1]) == "kernel" and any(_key_name(k) in ("query", "key")
                                                                              for k in path[:-1]), tree)


class DecayTowardInitState(NamedTuple):
  """The state of `add_decayed_weights_toward_init`.

  Attributes:
    init: the params at initialisation, the point weight decay pulls toward.
  """
  init: Any


def add_decayed_weights_toward_init(weight_decay: float) -> optax.GradientTransformation:
  """Weight decay toward the initial values instead of toward zero.

  Args:
    weight_decay: the decay rate; ``weight_decay * (params - params at init)`` is added to the
      updates.

  Returns:
    An ``optax.GradientTransformation`` whose state (`DecayTowardInitState`) keeps the initial
    params.

  Raises:
    ValueError: at update time, if the params are not passed.
  """
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
  """The base optimizer by name, with weight decay on chosen leaves.

  Args:
    name: "adam", "adamw" (decoupled decay) or "sgd" (decay added to the gradient).
    learning_rate: a float or an optax schedule.
    weight_decay: the decay rate (0: none).
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    decay_mask: the leaves that decay: a pytree of bools or a function of the params (e.g.
      `weight_matrices`); None: all.
    anchor_mask: leaves that decay toward their initial values instead of zero (e.g.
      `query_key_kernels`).

  Returns:
    An ``optax.GradientTransformation``.

  Raises:
    ValueError: for an unknown name.
  """
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
  """Which leaves weight decay reaches, and toward what.

  Anchoring a QK prior's kernels and the mask alike gives both priors one treatment.

  Attributes:
    decay_mask: the weights' leaves that decay: a pytree of bools or a function of the params
      (e.g. `weight_matrices`); None: all.
    anchor_mask: leaves that decay toward their initial values instead of zero (e.g.
      `query_key_kernels`).
    mask_to_init: the mask prior's own decay (``mask_weight_decay``) pulls toward its initial
      values.
  """
  decay_mask: Any = None
  anchor_mask: Any = None
  mask_to_init: bool = False


def mask_rules(learning_rate: float | Schedule, *, name: str = "adamw", weight_decay: float = 0.0,
               b1: float = 0.9, b2: float = 0.999, mask_learning_rate: float | Schedule | None = None,
               mask_lr_multiplier: float = 1.0, mask_weight_decay: float = 0.0,
               freeze_mask: bool = False, decay: DecayRule | None = None,
               ) -> tuple[optax.GradientTransformation, optax.GradientTransformation | None]:
  """The weights' rule and the mask's rule, for `with_mask_transform`.

  ``with_mask_transform(*mask_rules(...))`` is the optimizer.

  Args:
    learning_rate: the base learning rate (a float or an optax schedule).
    name: "adam", "adamw" or "sgd".
    weight_decay: the weights' decay rate.
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    mask_learning_rate: the mask's own learning rate (float or schedule); overrides
      ``mask_lr_multiplier``.
    mask_lr_multiplier: the mask's learning rate as a multiple of the base (schedules
      included).
    mask_weight_decay: the mask's own decay rate (0 by default).
    freeze_mask: no rule for the mask: it stays as initialised, bit for bit.
    decay: which leaves decay and toward what (`DecayRule`); default all toward zero.

  Returns:
    ``(params_tx, mask_tx)``: two ``optax.GradientTransformation``, the second None when frozen.

  Raises:
    ValueError: for an unknown optimizer name.
  """
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
  """An optax optimizer whose "mask_prior" collection has its own rule, or is frozen.

  The base optimizer updates "params"; the mask prior gets the same rule with its own learning
  rate and weight decay (see `mask_rules`); any other collection gets zero updates. Decay on
  some leaves only, or toward the initial values:
  ``clipped(with_mask_transform(*mask_rules(..., decay=DecayRule(...))), clip)``. For Flax NNX
  models: `maskprior_jax.nnx.mask_prior_optimizer`.

  Args:
    learning_rate: the base learning rate (a float or an optax schedule).
    name: "adam", "adamw" or "sgd".
    weight_decay: the weights' decay rate.
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    mask_learning_rate: the mask's own learning rate (float or schedule).
    mask_lr_multiplier: the mask's learning rate as a multiple of the base.
    mask_weight_decay: the mask's own decay rate (0 by default).
    freeze_mask: the mask stays as initialised, bit for bit (no optimizer state for it).
    grad_clip_norm: clip the gradient to this global norm first (None or 0: no clipping).

  Returns:
    An ``optax.GradientTransformation`` over the whole variable tree (``model.init``'s output).

  Raises:
    ValueError: for an unknown optimizer name.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import maskprior_jax as mp
    >>> layer = mp.MaskPriorAttention(num_heads=2, mask_init=mp.priors.locality_1d())
    >>> x = jnp.ones((1, 4, 8))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> tx = mp.mask_prior_optimizer(1e-3, mask_lr_multiplier=10.0)
    >>> opt_state = tx.init(variables)
    >>> grads = jax.grad(lambda v: (layer.apply(v, x) ** 2).sum())(variables)
    >>> grads["mask_prior"]["bias"].shape                # gradients reach the mask
    (2, 4, 4)
    >>> updates, opt_state = tx.update(grads, opt_state, variables)
    >>> import optax
    >>> variables = optax.apply_updates(variables, updates)
  """
  params_tx, mask_tx = mask_rules(learning_rate, name=name, weight_decay=weight_decay, b1=b1, b2=b2,
                                  mask_learning_rate=mask_learning_rate, mask_lr_multiplier=mask_lr_multiplier,
                                  mask_weight_decay=mask_weight_decay, freeze_mask=freeze_mask)
  return clipped(with_mask_transform(params_tx, mask_tx), grad_clip_norm)


def clipped(tx: optax.GradientTransformation, grad_clip_norm: float | None) -> optax.GradientTransformation:
  """A transformation after global-norm clipping of the gradient.

  Args:
    tx: the transformation.
    grad_clip_norm: the global norm to clip to; None or 0: ``tx`` unchanged.

  Returns:
    ``optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)``, or ``tx``.
  """
  return optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx) if grad_clip_norm else tx
