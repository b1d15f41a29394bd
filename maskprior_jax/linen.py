"""Flax's own Linen attention classes with a mask prior: the exact drop-in.

`maskprior_jax.linen.MultiHeadDotProductAttention` and `SelfAttention` are subclasses of
`flax.linen.MultiHeadDotProductAttention` / `flax.linen.SelfAttention` with the same class names,
so swapping one import line is the whole change:

    from maskprior_jax import linen as attn   # instead of flax.linen's attention classes
    attn.MultiHeadDotProductAttention(num_heads=8, mask_init=prior)

Everything Flax's class does is Flax's own code: the attribute and call signatures, the auto-name
(`MultiHeadDotProductAttention_0`, hence the parameter paths and `make_rng("dropout")` paths, so
existing checkpoints load and dropout draws the same masks), `broadcast_dropout`,
`force_fp32_for_softmax`, `decode` and its "cache" variables, `sow_weights`, `attention_fn`. The
prior is added as the `bias` argument of the attention function (Flax's `dot_product_attention` by
default), cast to the logits' dtype so bfloat16 computes as in Flax. Without `mask_init` the module
is Flax's, bit for bit. Mirrored and tested against the installed Flax (0.11 and newer).

Added attributes:
  mask_init: initializer `(key, shape, dtype) -> B` (e.g. from `maskprior_jax.priors`) or an array;
    None: no prior.
  mask_kind, max_len, grid, num_prefix: the bias's parameterization, as `MaskPriorAttention`.
  mask_collection: where the bias lives. "mask_prior" (default): its own collection, variable
    "bias", so `mask_prior_optimizer` can give it its own rule. "params": inside the module's
    params as the leaf "mask_prior", for training loops that pass only `{"params": params}`;
    `mask_prior_optimizer` finds it there by that name (own learning rate, freezing).

For new code `maskprior_jax.MaskPriorAttention` is the documented module (more attention paths:
cuDNN, blockwise, grouped-query attention).
"""
from __future__ import annotations

import inspect
from typing import Any

import flax.linen as nn
import jax

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
  """`flax.linen.MultiHeadDotProductAttention` with a mask prior (see the module docstring):
  Flax's attributes and call, plus `mask_init`, `mask_kind`, `max_len`, `grid`, `num_prefix`,
  `mask_collection`. Raises ValueError for a prior that does not fit the kind or shape."""

  def __call__(self, *args, **kwargs):
    return _PriorMixin.__call__(self, *args, **kwargs)


class SelfAttention(_PriorMixin, nn.SelfAttention):
  """`flax.linen.SelfAttention` with a mask prior (see `MultiHeadDotProductAttention`)."""

  def __call__(self, *args, **kwargs):
    return _PriorMixin.__call__(self, *args, **kwargs)


for _cls, _flax in ((MultiHeadDotProductAttention, nn.MultiHeadDotProductAttention), (SelfAttention, nn.SelfAttention)):
  _cls.__call__.__signature__ = inspect.signature(_flax.__call__)   # what `help()` and introspection show
