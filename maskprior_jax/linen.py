"""Flax's own Linen attention classes with a mask prior: the exact drop-in.

`MultiHeadDotProductAttention` and `SelfAttention` are subclasses of
``flax.linen.MultiHeadDotProductAttention`` and ``flax.linen.SelfAttention`` with the same class
names, so swapping one import line is the whole change::

    from maskprior_jax import linen as attn   # instead of flax.linen's attention classes
    attn.MultiHeadDotProductAttention(num_heads=8, mask_init=prior)

Everything Flax's class does is Flax's own code: the attribute and call signatures, the auto-name
(``MultiHeadDotProductAttention_0``, hence the parameter paths and ``make_rng("dropout")`` paths, so
existing checkpoints load and dropout draws the same masks), ``broadcast_dropout``,
``force_fp32_for_softmax``, ``decode`` and its "cache" variables, ``sow_weights``, ``attention_fn``.
The prior is added as the ``bias`` argument of the attention function (Flax's
``dot_product_attention`` by default), cast to the logits' dtype so bfloat16 computes as in Flax.
Without ``mask_init`` the module is Flax's, bit for bit. Mirrored and tested against the installed
Flax (0.11 and newer). The added attributes (``mask_init``, ``mask_kind``, ``max_len``, ``grid``,
``num_prefix``, ``mask_collection``) are described on each class.

For new code `maskprior_jax.MaskPriorAttention` is the documented module (more attention paths:
cuDNN, blockwise, grouped-query attention).
"""
from __future__ import annotations

import inspect
from typing import Any

import flax.linen as nn
import jax

from maskprior_jax import _signatures
from maskprior_jax.attention import (MASK_PRIOR, MaskSettings, _checked_init, expand_mask, mask_shape,
                                     with_prior_bias)
from maskprior_jax.optim import PRIOR_LEAF

__all__ = ["MultiHeadDotProductAttention", "SelfAttention", "PRIOR_LEAF"]


class _PriorMixin(nn.Module):
  """The mask-prior attributes and the call that adds the prior to Flax's attention function."""
  mask_init: Any = None
  mask_kind: str = "full"
  max_len: int | None = None
  grid: tuple[int, int] | None = None
  num_prefix: int = 0
  mask_collection: str = MASK_PRIOR

  def __call__(self, *args, **kwargs):
    if self.mask_init is None:
      return super().__call__(*args, **kwargs)
    if self.mask_collection not in (MASK_PRIOR, "params"):
      raise ValueError(f"mask_collection must be {MASK_PRIOR!r} or 'params', not {self.mask_collection!r}")
    inner = self.attention_fn
    object.__setattr__(self, "attention_fn", with_prior_bias(inner, self._prior))   # for this call only
    try:
      return super().__call__(*args, **kwargs)
    finally:
      object.__setattr__(self, "attention_fn", inner)

  def _prior(self, q_len: int, kv_len: int) -> jax.Array:
    """The dense (heads or 1, q_len, kv_len) prior; when decoding, the decoded token's own row."""
    settings = MaskSettings(self.mask_init, self.mask_kind, self.max_len, self.grid)
    decoding = self.decode and q_len == 1 and kv_len > 1 and self.has_variable("cache", "cache_index")
    rows = kv_len if decoding else q_len
    shape = mask_shape(self.mask_kind, self.num_heads, rows, kv_len, max_len=self.max_len, grid=self.grid)
    name = "bias" if self.mask_collection == MASK_PRIOR else PRIOR_LEAF
    stored = self.variable(self.mask_collection, name, lambda: _checked_init(
        settings.init, self.make_rng("params"), shape, self.param_dtype, self.mask_kind)).value
    if stored.shape != shape:
      raise ValueError(f"mask prior has shape {stored.shape}, expected {shape} for mask_kind={self.mask_kind!r}")
    dense = expand_mask(stored, self.mask_kind, rows, kv_len, max_len=self.max_len, grid=self.grid,
                        num_prefix=self.num_prefix)
    if decoding:   # Flax has already advanced the index past the token being decoded
      row = self.get_variable("cache", "cache_index") - 1
      dense = jax.lax.dynamic_slice_in_dim(dense, row, 1, axis=-2)
    return dense


class MultiHeadDotProductAttention(_PriorMixin, nn.MultiHeadDotProductAttention):
  """``flax.linen.MultiHeadDotProductAttention`` with a mask prior: change one import line.

  Flax's own class and code (attributes, call, auto-names and hence parameter paths, dropout
  draws, ``decode``, ``sow_weights``, ``attention_fn``), plus the attributes below. The prior
  reaches Flax's attention function as its ``bias`` argument, cast to the logits' dtype. Without
  ``mask_init`` the module is Flax's, bit for bit.

  Attributes:
    mask_init: the prior's initializer ``(key, shape, dtype) -> B`` (e.g. from
      `maskprior_jax.priors`) or an array; None: no prior.
    mask_kind: "full", "shared", "relative_1d" or "relative_2d", as in
      `maskprior_jax.MaskPriorAttention`.
    max_len: the longest sequence, for "relative_1d".
    grid: (height, width) of the patch grid, for "relative_2d".
    num_prefix: tokens before the grid ("relative_2d"), e.g. 1 for a CLS token.
    mask_collection: where the bias lives. "mask_prior" (default): its own collection, variable
      "bias", so `mask_prior_optimizer` gives it its own rule. "params": inside the module's
      params as the leaf "mask_prior", for training loops that pass only ``{"params": params}``
      (`mask_prior_optimizer` finds it there by that name).

  Raises:
    ValueError: at the call, for a prior that does not fit the kind or shape, or an unknown
      ``mask_collection``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from maskprior_jax import linen as attn, priors
    >>> layer = attn.MultiHeadDotProductAttention(num_heads=4, mask_init=priors.locality_1d())
    >>> x = jnp.ones((2, 6, 16))
    >>> variables = layer.init(jax.random.key(0), x)
    >>> variables["mask_prior"]["bias"].shape
    (4, 6, 6)
    >>> sorted(variables["params"])                 # Flax's own parameter tree
    ['key', 'out', 'query', 'value']
    >>> layer.apply(variables, x).shape
    (2, 6, 16)
  """

  def __call__(self, *args, **kwargs):
    """Flax's call, with the prior added to the attention function's ``bias``.

    The signature is ``flax.linen.MultiHeadDotProductAttention.__call__``'s.

    Args:
      *args: ``inputs_q`` (..., q_len, features), ``inputs_k`` and ``inputs_v`` (..., kv_len,
        features; default: self-attention), as Flax.
      **kwargs: Flax's keywords: ``inputs_kv``, ``mask`` (boolean, broadcastable to (batch, heads,
        q_len, kv_len); False excludes a pair), ``deterministic``, ``dropout_rng``,
        ``sow_weights``.

    Returns:
      The output, (..., q_len, out_features).
    """
    return _PriorMixin.__call__(self, *args, **kwargs)


class SelfAttention(_PriorMixin, nn.SelfAttention):
  """``flax.linen.SelfAttention`` with a mask prior (see `MultiHeadDotProductAttention`).

  Attributes:
    mask_init: the prior's initializer or an array; None: no prior.
    mask_kind: "full", "shared", "relative_1d" or "relative_2d".
    max_len: the longest sequence, for "relative_1d".
    grid: (height, width) of the patch grid, for "relative_2d".
    num_prefix: tokens before the grid ("relative_2d").
    mask_collection: "mask_prior" (its own collection) or "params" (the leaf "mask_prior").
  """

  def __call__(self, *args, **kwargs):
    """Flax's call (``inputs_q``, ``mask``, ``deterministic``, ...), with the prior as ``bias``.

    Args:
      *args: ``inputs_q``, (..., length, features), as Flax.
      **kwargs: Flax's keywords.

    Returns:
      The output, (..., length, out_features).
    """
    return _PriorMixin.__call__(self, *args, **kwargs)


for _cls, _flax in ((MultiHeadDotProductAttention, nn.MultiHeadDotProductAttention), (SelfAttention, nn.SelfAttention)):
  _cls.__call__.__signature__ = inspect.signature(_flax.__call__)   # what `help()` and introspection show
  _signatures.readable(_cls)
