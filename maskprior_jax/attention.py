"""Multi-head attention with a learnable additive logit bias (the mask prior).

logits[b, h, q, k] = q.k / sqrt(d_head) + B[h, q, k]

`B` lives in the variable collection named by `MASK_PRIOR` ("mask_prior"), never
in "params", so an optimizer can treat it on its own (see `maskprior_jax.optim`).
It is created by a Flax-style initializer `mask_init(key, shape, dtype)` (or from a plain
array); without one the module is plain attention and creates no "mask_prior" collection.
Parameter names and shapes ("query", "key", "value", "out"), attribute names and call
keywords match `flax.linen.MultiHeadDotProductAttention`, so weights and call sites are
interchangeable (see the class docstring for what is not supported).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from maskprior_jax import _signatures
from maskprior_jax.dot_product import (IMPLEMENTATIONS, PLATFORMS, _attention_weights, _fused_attention,
                                       attention_implementation, cudnn_unsupported, dot_product_attention,
                                       for_platform, heads_folded_attention, target_platform, with_prior_bias)
from maskprior_jax.layouts import (MASK_KINDS, MASK_LAYOUTS, MaskKind, MaskLayout, _layout, decode_step, dropout_shape,
                                   expand_mask, mask_shape, relative_1d_index, relative_2d_index)

__all__ = ["MaskPriorAttention", "MaskSettings", "MaskLayout", "MASK_PRIOR", "ATTENTION_WEIGHTS", "MASK_KINDS",
           "MASK_LAYOUTS", "IMPLEMENTATIONS", "mask_shape", "expand_mask", "dense_mask_bias", "relative_1d_index",
           "relative_2d_index", "decode_step", "attention_implementation", "dot_product_attention", "dropout_shape",
           "with_prior_bias", "for_platform", "target_platform", "heads_folded_attention", "PLATFORMS",
           "cudnn_unsupported"]

#: The variable collection that holds the mask prior (never "params").
MASK_PRIOR = "mask_prior"
#: The name under which attention weights are sown into "intermediates".
ATTENTION_WEIGHTS = "attention_weights"

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]


@dataclasses.dataclass(frozen=True)
class MaskSettings:
  """How a model's attention layers hold their mask prior (one value, passed down whole).

  Attributes:
    init: the initializer ``(key, shape, dtype) -> B`` (e.g. from `maskprior_jax.priors`) or a
      plain array broadcast to the stored shape.
    kind: the bias parameterization: "full", "shared", "relative_1d" or "relative_2d" (see
      `MASK_LAYOUTS`).
    max_len: the offset table's length for kind "relative_1d".
    grid: (height, width) of the patch grid for kind "relative_2d".
    share_layers: one bias for every layer (kind "full" or "shared"), added to each layer's
      logits.

  Raises:
    ValueError: for an unknown kind, or ``share_layers`` with a relative kind.
  """
  init: Any
  kind: MaskKind = "full"
  max_len: int | None = None
  grid: tuple[int, int] | None = None
  share_layers: bool = False

  def __post_init__(self):
    if self.kind not in MASK_KINDS:
      raise ValueError(f"unknown mask kind {self.kind!r}; use {', '.join(MASK_KINDS)}")
    if self.share_layers and self.kind not in ("full", "shared"):
      raise ValueError("share_layers=True needs kind 'full' or 'shared'")

  def attention_kwargs(self, num_prefix: int = 0) -> dict:
    """The `MaskPriorAttention` attributes these settings stand for.

    Args:
      num_prefix: tokens before the grid (kind "relative_2d"), e.g. 1 for a CLS token.

    Returns:
      A dict with ``mask_init``, ``mask_kind``, ``max_len``, ``grid`` and ``num_prefix``.
    """
    return dict(mask_init=self.init, mask_kind=self.kind, max_len=self.max_len, grid=self.grid,
                num_prefix=num_prefix)


def dense_mask_bias(module: nn.Module, settings: "MaskSettings", name: str, num_heads: int, q_len: int,
                    kv_len: int, *, num_prefix: int = 0, dtype: Any = jnp.float32) -> jax.Array:
  """The mask prior a Linen module holds, as a dense logit bias; call it inside a compact method.

  The prior is the variable ``name`` of the module's ``"mask_prior"`` collection, created from
  ``settings.init`` on first use (with the "params" RNG stream) in the kind's stored shape.

  Args:
    module: the Linen module that holds the variable.
    settings: the `MaskSettings` (initializer and kind).
    name: the variable's name in the collection.
    num_heads: attention heads.
    q_len: query length.
    kv_len: key/value length.
    num_prefix: tokens before the grid ("relative_2d").
    dtype: the stored variable's dtype.

  Returns:
    The dense bias, (heads or 1, q_len, kv_len).

  Raises:
    ValueError: if the stored variable's shape is not the kind's, or the initializer fails its
      checks (shape, finite values, the kinds it was built for).
  """
  kind = settings.kind
  shape = mask_shape(kind, num_heads, q_len, kv_len, max_len=settings.max_len, grid=settings.grid)
  stored = module.variable(MASK_PRIOR, name, lambda: _checked_init(settings.init, module.make_rng("params"),
                                                                    shape, dtype, kind))
  if stored.value.shape != shape:
    raise ValueError(f"mask prior has shape {stored.value.shape}, expected {shape} for mask_kind={kind!r}")
  return expand_mask(stored.value, kind, q_len, kv_len, max_len=settings.max_len, grid=settings.grid,
                     num_prefix=num_prefix)


class MaskPriorAttention(nn.Module):
  """Multi-head dot-product attention with a learnable additive mask prior.

  ``logits[b, h, q, k] = q . k / sqrt(head_dim) + B[h, q, k]``, where ``B`` is the variable
  ``"bias"`` of the ``"mask_prior"`` collection (`MASK_PRIOR`), never in ``"params"``, so an
  optimizer can treat it on its own (`mask_prior_optimizer`). A drop-in for
  ``flax.linen.MultiHeadDotProductAttention``: the same attribute names, call keywords and
  parameter tree ("query", "key", "value", "out"), plus the mask prior. Without ``mask_init``
  it is plain attention and creates no "mask_prior" collection.

  Attributes:
    num_heads: number of attention heads.
    qkv_features: total width of queries, keys and values (default: the input width);
      ``head_dim = qkv_features // num_heads``.
    out_features: output width (default: the input width).
    dtype: the computation dtype (default: inferred from the inputs and parameters).
    param_dtype: the parameters' and the mask prior's dtype.
    broadcast_dropout: one attention-dropout mask for every batch element and head.
    dropout_rate: attention-weight dropout rate (the "dropout" RNG stream, or ``dropout_rng``).
    deterministic: no dropout; may instead be given to the call.
    precision: the ``jax.lax.Precision`` of the projections and the attention.
    kernel_init: initializer of the query, key and value kernels.
    out_kernel_init: initializer of the output kernel (default: ``kernel_init``).
    bias_init: initializer of the projections' biases.
    out_bias_init: initializer of the output bias (default: ``bias_init``).
    use_bias: the projections have biases.
    mask_init: the prior's initializer ``(key, shape, dtype) -> B`` (see `maskprior_jax.priors`),
      or an array broadcast to the stored shape; None: vanilla attention. An initializer from
      `maskprior_jax.priors` names the kinds it was built for, and another kind is refused.
    mask_kind: how ``B`` is stored: "full" (heads, q_len, kv_len), "shared" (q_len, kv_len),
      "relative_1d" (heads, 2 max_len - 1: one logit per offset) or "relative_2d" (heads,
      (2 height - 1)(2 width - 1): one logit per 2-D offset); see `mask_shape`.
    max_len: the longest sequence, for "relative_1d".
    grid: (height, width) of the patch grid, for "relative_2d".
    num_prefix: tokens before the grid ("relative_2d"), e.g. 1 for a CLS token.
    implementation: None or "xla" (XLA's attention), "cudnn" (cuDNN's fused kernel, GPU only),
      "blockwise" (`maskprior_jax.blockwise`: memory per key block, any backend) or "auto" (cuDNN
      where `attention_implementation` says it is safe for the call, XLA otherwise).
    sow_weights: store the attention weights in "intermediates" under `ATTENTION_WEIGHTS`.
    num_kv_heads: key/value heads for grouped-query attention, dividing ``num_heads`` (query head
      h reads key/value head ``h // (num_heads // num_kv_heads)``); default ``num_heads``.
    attention_fn: a Flax-style attention function, e.g. ``flax.linen.dot_product_attention``,
      called with the mask prior (plus any call ``bias``) as ``bias``; default: this module's
      own paths.
    decode: autoregressive decoding with a key/value cache, as Flax: ``init`` with the
      full-length input creates the "cache" collection; each ``apply(..., mutable=["cache"])``
      then takes one token and uses its own row of the prior, so decoding token by token equals
      the full pass with a causal mask.
    normalize_qk: LayerNorm (scale only) over the head dimension of queries and keys
      ("query_ln", "key_ln"), as Flax.

  Not supported on purpose: Flax's ``force_fp32_for_softmax`` (the softmax is always float32)
  and the deprecated dot_general and einsum class hooks.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import maskprior_jax as mp
    >>> layer = mp.MaskPriorAttention(
    ...     num_heads=2, mask_init=mp.priors.interaction_groups([[0, 1], [2, 3]], outside=-4.0))
    >>> x = jnp.ones((8, 4, 16))                      # (batch, length, features)
    >>> variables = layer.init(jax.random.key(0), x)
    >>> sorted(variables)
    ['mask_prior', 'params']
    >>> variables["mask_prior"]["bias"].shape         # (heads, q_len, kv_len)
    (2, 4, 4)
    >>> layer.apply(variables, x).shape
    (8, 4, 16)
  """
  num_heads: int
  qkv_features: int | None = None
  out_features: int | None = None
  dtype: Any = None
  param_dtype: Any = jnp.float32
  broadcast_dropout: bool = True
  dropout_rate: float = 0.0
  deterministic: bool | None = None
  precision: Any = None
  kernel_init: Initializer = nn.initializers.lecun_normal()
  out_kernel_init: Initializer | None = None
  bias_init: Initializer = nn.initializers.zeros_init()
  out_bias_init: Initializer | None = None
  use_bias: bool = True
  mask_init: Initializer | jax.Array | np.ndarray | None = None
  mask_kind: MaskKind = "full"
  max_len: int | None = None
  grid: tuple[int, int] | None = None
  num_prefix: int = 0
  implementation: str | None = None
  sow_weights: bool = False
  num_kv_heads: int | None = None
  attention_fn: Callable[..., jax.Array] | None = None
  decode: bool = False
  normalize_qk: bool = False

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_k: jax.Array | None = None,
               inputs_v: jax.Array | None = None, *, inputs_kv: jax.Array | None = None,
               mask: jax.Array | None = None, bias: jax.Array | None = None,
               deterministic: bool | None = None, dropout_rng: jax.Array | None = None,
               sow_weights: bool = False) -> jax.Array:
    """Attends from ``inputs_q`` to ``inputs_k`` and ``inputs_v``.

    Args:
      inputs_q: queries' inputs, (..., q_len, features).
      inputs_k: keys' inputs, (..., kv_len, features); default ``inputs_q`` (self-attention).
      inputs_v: values' inputs, (..., kv_len, features); default ``inputs_k``.
      inputs_kv: Flax's older keyword for both keys' and values' inputs (not together with
        ``inputs_k`` or ``inputs_v``).
      mask: boolean, broadcastable to (batch, heads, q_len, kv_len); False excludes a pair
        whatever the bias says (Flax's convention).
      bias: an extra additive logit bias broadcastable to (batch, heads, q_len, kv_len), e.g. a
        mask prior shared across layers; it is added to this layer's prior.
      deterministic: no attention dropout; defaults to the attribute (needed when
        ``dropout_rate > 0``).
      dropout_rng: the key for attention dropout; default a key from the "dropout" RNG stream.
      sow_weights: store the attention weights, (..., heads, q_len, kv_len), in "intermediates"
        under ``ATTENTION_WEIGHTS``.

    Returns:
      The output, (..., q_len, out_features).

    Raises:
      ValueError: for ``inputs_kv`` with ``inputs_k``/``inputs_v``, ``qkv_features`` not divisible
        by ``num_heads``, an unknown mask kind, or a mask prior that does not fit the lengths.
    """
    inputs_k, inputs_v = _kv_inputs(inputs_q, inputs_k, inputs_v, inputs_kv)
    _layout(self.mask_kind)
    features = self.out_features or inputs_q.shape[-1]
    query, key, value = self._project(inputs_q, inputs_k, inputs_v)
    row = None
    if self.decode:
      key, value, mask, row = self._decode_cache(key, value, mask)
    key, value = _grouped(key, value, self.num_heads)
    total_bias = self._with_prior(bias, query.shape[-3], key.shape[-3], row)
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic) \
        if self.dropout_rate > 0.0 else True
    if self.attention_fn is not None:
      rng = None if deterministic else (dropout_rng if dropout_rng is not None else self.make_rng("dropout"))
      out = self.attention_fn(query, key, value, bias=total_bias, mask=mask, dropout_rng=rng,
                              dropout_rate=self.dropout_rate, broadcast_dropout=self.broadcast_dropout,
                              deterministic=deterministic, dtype=self.dtype, precision=self.precision, module=None)
      return self._out(out, features)
    sow = self.sow_weights or sow_weights or self.is_mutable_collection("intermediates")
    # Explicit path where the weights are needed (dropout, persistence measurements), and for
    # float64, which XLA's fused path would round to float32 inside its softmax (the blockwise path
    # keeps float64).
    if not deterministic or sow or (query.dtype == jnp.float64 and self.implementation != "blockwise"):
      out = self._explicit(query, key, value, total_bias, mask, sow, deterministic, dropout_rng)
    else:
      out = _fused_attention(query, key, value, total_bias, mask, self.implementation)
    return self._out(out, features)

  def _project(self, inputs_q, inputs_k, inputs_v):
    """Queries (..., q_len, heads, head_dim), keys and values (..., kv_len, kv_heads, head_dim)."""
    qkv_features = self.qkv_features or inputs_q.shape[-1]
    if qkv_features % self.num_heads:
      raise ValueError(f"qkv_features={qkv_features} is not divisible by num_heads={self.num_heads}")
    head_dim = qkv_features // self.num_heads
    dense = functools.partial(nn.DenseGeneral, axis=-1, features=(self.num_heads, head_dim),
                              dtype=self.dtype, param_dtype=self.param_dtype,
                              kernel_init=self.kernel_init, bias_init=self.bias_init,
                              use_bias=self.use_bias, precision=self.precision)
    kv_heads = self.num_kv_heads or self.num_heads
    if self.num_heads % kv_heads:
      raise ValueError(f"num_kv_heads={kv_heads} does not divide num_heads={self.num_heads}")
    query = dense(name="query")(inputs_q)
    key = dense(name="key", features=(kv_heads, head_dim))(inputs_k)
    value = dense(name="value", features=(kv_heads, head_dim))(inputs_v)
    if self.normalize_qk:
      ln = functools.partial(nn.LayerNorm, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
      query, key = ln(name="query_ln")(query), ln(name="key_ln")(key)
    return query, key, value

  def _decode_cache(self, key, value, mask):
    """Autoregressive decoding: this token's key and value written into the "cache" collection;
    returns the cached keys, values, their mask and the token's row (None at init, which only
    creates the cache, as Flax's)."""
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return key, value, mask, None
    row = index.value
    key, value, mask = decode_step(cached_key.value, cached_value.value, row, key, value, mask)
    cached_key.value, cached_value.value, index.value = key, value, row + 1
    return key, value, mask, row

  def _with_prior(self, bias, q_len: int, kv_len: int, row):
    """The call's `bias` plus this layer's mask prior (its decoded row when decoding), or `bias` alone."""
    if self.mask_init is None:
      return bias
    settings = MaskSettings(self.mask_init, self.mask_kind, self.max_len, self.grid)
    rows = kv_len if row is not None else q_len
    prior = dense_mask_bias(self, settings, "bias", self.num_heads, rows, kv_len, num_prefix=self.num_prefix,
                            dtype=self.param_dtype)
    if row is not None:   # the decoded token's own row of the bias
      prior = jax.lax.dynamic_slice_in_dim(prior, row, 1, axis=-2)
    return prior if bias is None else bias + prior

  def _explicit(self, query, key, value, bias, mask, sow: bool, deterministic: bool, dropout_rng):
    """Attention with its weights materialised: sown into "intermediates" where asked, dropped out
    unless `deterministic` (with `dropout_rng`, or a key from the "dropout" stream)."""
    weights = _attention_weights(query, key, bias, mask, self.precision)
    if sow:
      self.sow("intermediates", ATTENTION_WEIGHTS, weights)
    if not deterministic:
      rng = dropout_rng if dropout_rng is not None else self.make_rng("dropout")
      keep = jax.random.bernoulli(rng, 1.0 - self.dropout_rate, dropout_shape(weights.shape, self.broadcast_dropout))
      weights = jnp.where(keep, weights / (1.0 - self.dropout_rate), 0.0)
    return jnp.einsum("...hqk,...khd->...qhd", weights.astype(self.dtype or query.dtype), value,
                      precision=self.precision)

  def _out(self, out, features):
    return nn.DenseGeneral(features=features, axis=(-2, -1),
                           kernel_init=self.out_kernel_init or self.kernel_init,
                           bias_init=self.out_bias_init or self.bias_init, use_bias=self.use_bias,
                           dtype=self.dtype, param_dtype=self.param_dtype, precision=self.precision,
                           name="out")(out)


_signatures.readable(MaskPriorAttention)


def _kv_inputs(inputs_q, inputs_k, inputs_v, inputs_kv):
  """Keys' and values' inputs: inputs_k defaults to inputs_q and inputs_v to inputs_k; `inputs_kv`
  (Flax's older keyword) sets both."""
  if inputs_kv is not None:
    if inputs_k is not None or inputs_v is not None:
      raise ValueError("give inputs_kv, or inputs_k/inputs_v, not both")
    return inputs_kv, inputs_kv
  inputs_k = inputs_q if inputs_k is None else inputs_k
  return inputs_k, inputs_k if inputs_v is None else inputs_v




def _grouped(key, value, num_heads: int):
  """Grouped-query attention: each key/value head repeated for its group of query heads
  (query head h reads key/value head h // (num_heads / kv_heads)); unchanged when the counts match."""
  groups = num_heads // key.shape[-2]
  if groups == 1:
    return key, value
  return jnp.repeat(key, groups, axis=-2), jnp.repeat(value, groups, axis=-2)




def _checked_init(init, key, shape, dtype, kind: str | None = None):
  """The initial bias: `init(key, shape, dtype)` (or an array broadcast to `shape`), checked."""
  kinds = getattr(init, "mask_kinds", None)
  if kind is not None and kinds is not None and kind not in kinds:
    raise ValueError(f"this mask prior was built for mask_kind {' or '.join(kinds)}, not {kind!r}")
  if callable(init):
    value = jnp.asarray(init(key, shape, dtype))
  else:
    try:
      value = jnp.broadcast_to(jnp.asarray(init, jnp.float32), tuple(shape))
    except ValueError:
      raise ValueError(f"mask_init array of shape {np.shape(init)} does not broadcast to the mask "
                       f"shape {tuple(shape)}") from None
  if value.shape != tuple(shape):
    raise ValueError(f"mask_init returned shape {value.shape}, expected {tuple(shape)}")
  if not isinstance(value, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(value))):
    raise ValueError("mask_init returned non-finite values; the mask prior must be finite "
                     "(use a hard boolean mask for exclusions)")
  return value.astype(dtype)
