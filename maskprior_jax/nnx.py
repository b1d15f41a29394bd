"""Flax NNX: the mask prior as its own variable type, a native attention module and the optimizer
helper.

- `MaskPrior`: the bias's variable type, a subclass of `nnx.Param` (as Flax's own `nnx.LoRAParam`):
  Flax's defaults (`nnx.grad(loss_fn)`, `nnx.Optimizer(model, tx, wrt=nnx.Param)`,
  `nnx.state(model, nnx.Param)`) include it, so it trains at the base rate unless told otherwise,
  and the filter `MaskPrior` still selects it alone (its own learning rate, freezing, inspection;
  `nnx.All(nnx.Param, nnx.Not(MaskPrior))` selects the other weights). Importing this module also
  registers it for the Linen "mask_prior" collection, so a Linen module wrapped with
  `flax.nnx.bridge.ToNNX` exposes its bias as `MaskPrior`.
- `MaskPriorAttention`: an `nnx.Module` with the constructor of `flax.nnx.MultiHeadAttention`
  (`num_heads`, `in_features`, `qkv_features`, `out_features`, dropout, `normalize_qk`,
  initialisers, dtypes, `rngs`) plus the mask settings of the Linen module (`mask_init`,
  `mask_kind`, `max_len`, `grid`, `num_prefix`). Given the same weights it computes what
  `maskprior_jax.MaskPriorAttention` computes.
- `mask_prior_optimizer(model, learning_rate, **kw)`: an `nnx.Optimizer` over `Param` and
  `MaskPrior` with the Linen helper's keywords; the mask gets its own rule, or none when frozen.

Gradients for it come from plain `nnx.grad(loss_fn)(model, batch)` (it is a `Param`);
`WRT = nnx.Any(nnx.Param, MaskPrior)` names the same set explicitly and is kept for earlier code.
"""
from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from maskprior_jax import _signatures, optim
from maskprior_jax.attention import (ATTENTION_WEIGHTS, MASK_PRIOR, _attention_weights, _checked_init, with_prior_bias,
                                     _fused_attention, _grouped, _layout, decode_step, dropout_shape, expand_mask, mask_shape)

__all__ = ["MaskPrior", "MaskPriorAttention", "MultiHeadAttention", "mask_prior_optimizer", "WRT"]


class MaskPrior(nnx.Param):
  """The variable type of a learnable additive attention-logit bias.

  A subclass of ``nnx.Param`` (as Flax's ``nnx.LoRAParam``): Flax's defaults (``nnx.grad``,
  ``nnx.Optimizer(model, tx, wrt=nnx.Param)``) train it at the base rate, and the filter
  ``MaskPrior`` still selects it alone (its own learning rate, freezing, inspection).

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from maskprior_jax.nnx import MaskPrior
    >>> isinstance(MaskPrior(jnp.zeros((2, 4, 4))), nnx.Param)
    True
  """


nnx.register_variable_name(MASK_PRIOR, MaskPrior, overwrite=True)

# What the mask-prior optimizer updates, and what gradients must be taken with respect to.
#: The filter for the variables the optimizer updates: ``nnx.Any(nnx.Param, MaskPrior)``.
WRT = nnx.Any(nnx.Param, MaskPrior)
DEFAULT_KERNEL_INIT = nnx.initializers.lecun_normal()   # as the Linen module and Flax's attention
DEFAULT_BIAS_INIT = nnx.initializers.zeros_init()


class MaskPriorAttention(nnx.Module):
  """Multi-head dot-product attention with a learnable additive mask prior, for Flax NNX.

  The constructor of ``flax.nnx.MultiHeadAttention`` plus the mask settings of the Linen
  module. Given the same weights it computes what `maskprior_jax.MaskPriorAttention` computes;
  query, key, value and out are ``nnx.LinearGeneral`` with the Linen module's parameter shapes,
  so weights copy across one to one. The bias is ``self.mask_prior``, a `MaskPrior`.

  Args:
    num_heads: number of attention heads.
    in_features: the inputs' width.
    qkv_features: total width of queries, keys and values (default ``in_features``).
    out_features: output width (default ``in_features``).
    dtype: the computation dtype.
    param_dtype: the parameters' and the prior's dtype.
    broadcast_dropout: one attention-dropout mask for every batch element and head.
    dropout_rate: attention-weight dropout rate.
    deterministic: no dropout; may instead be given to the call.
    precision: the ``jax.lax.Precision`` of the projections and the attention.
    kernel_init: initializer of the query, key and value kernels.
    out_kernel_init: initializer of the output kernel (default ``kernel_init``).
    bias_init: initializer of the projections' biases.
    out_bias_init: initializer of the output bias (default ``bias_init``).
    use_bias: the projections have biases.
    decode: autoregressive decoding, as Flax: `init_cache` creates the key/value cache; each call
      then takes one token and uses its own row of the prior, so decoding token by token equals
      the full causal pass.
    normalize_qk: LayerNorm (scale only) over the head dimension of queries and keys.
    mask_init: the prior's initializer ``(key, shape, dtype) -> B`` or an array broadcast to the
      stored shape; None: plain attention (no `MaskPrior` is created).
    mask_kind: "full", "shared", "relative_1d" or "relative_2d"
      (`maskprior_jax.attention.MASK_LAYOUTS`).
    max_len: the longest sequence. NNX creates the bias when the module is built, so "full" and
      "shared" need it (a shorter sequence uses the bias's top-left block) unless ``mask_init``
      is an array; "relative_1d" needs it too.
    grid: (height, width) of the patch grid, for "relative_2d" (which holds
      ``height * width + num_prefix`` tokens).
    num_prefix: tokens before the grid ("relative_2d"), e.g. 1 for a CLS token.
    implementation: None or "xla", "cudnn", "blockwise" or "auto" (see
      `maskprior_jax.attention.attention_implementation`).
    num_kv_heads: key/value heads for grouped-query attention (dividing ``num_heads``).
    attention_fn: a Flax-style attention function that receives the prior as ``bias``.
    rngs: the ``nnx.Rngs`` for the weights, the prior's initializer and the dropout stream.

  Raises:
    ValueError: for an unknown mask kind, ``qkv_features`` not divisible by ``num_heads``, a
      missing ``max_len`` or ``grid``, or a prior that does not fit its shape.

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from maskprior_jax import nnx as mpnnx, priors
    >>> layer = mpnnx.MaskPriorAttention(4, 16, mask_init=priors.locality_1d(), mask_kind="relative_1d",
    ...                                  max_len=8, rngs=nnx.Rngs(0))
    >>> layer.mask_prior.shape                        # (heads, 2 * max_len - 1)
    (4, 15)
    >>> layer(jnp.ones((2, 8, 16))).shape
    (2, 8, 16)
  """

  def __init__(self, num_heads: int, in_features: int, qkv_features: int | None = None,
               out_features: int | None = None, *, dtype: Any = None, param_dtype: Any = jnp.float32,
               broadcast_dropout: bool = True, dropout_rate: float = 0.0, deterministic: bool | None = None,
               precision: Any = None, kernel_init=DEFAULT_KERNEL_INIT, out_kernel_init=None,
               bias_init=DEFAULT_BIAS_INIT, out_bias_init=None, use_bias: bool = True,
               decode: bool | None = None, normalize_qk: bool = False, mask_init=None, mask_kind: str = "full",
               max_len: int | None = None, grid: tuple[int, int] | None = None, num_prefix: int = 0,
               implementation: str | None = None, num_kv_heads: int | None = None, attention_fn=None,
               rngs: nnx.Rngs):
    _layout(mask_kind)
    qkv_features = qkv_features or in_features
    if qkv_features % num_heads:
      raise ValueError(f"qkv_features={qkv_features} is not divisible by num_heads={num_heads}")
    self.num_heads, self.head_dim = num_heads, qkv_features // num_heads
    kv_heads = num_kv_heads or num_heads
    if num_heads % kv_heads:
      raise ValueError(f"num_kv_heads={kv_heads} does not divide num_heads={num_heads}")
    self.attention_fn, self.decode, self.num_kv_heads = attention_fn, decode, kv_heads
    self.cached_key, self.cached_value, self.cache_index = nnx.data(None), nnx.data(None), nnx.data(None)
    self.in_features, self.out_features = in_features, out_features or in_features
    self.dtype, self.precision, self.implementation = dtype, precision, implementation
    self.broadcast_dropout, self.dropout_rate, self.deterministic = broadcast_dropout, dropout_rate, deterministic
    self.mask_kind, self.max_len, self.grid, self.num_prefix = mask_kind, max_len, grid, num_prefix
    self.rngs = rngs.dropout.fork() if dropout_rate > 0 else None   # as Flax: the dropout stream

    def proj(heads):
      return nnx.LinearGeneral(in_features, (heads, self.head_dim), axis=-1, dtype=dtype, param_dtype=param_dtype,
                               kernel_init=kernel_init, bias_init=bias_init, use_bias=use_bias, precision=precision,
                               rngs=rngs)
    self.query, self.key, self.value = proj(num_heads), proj(kv_heads), proj(kv_heads)
    self.out = nnx.LinearGeneral((num_heads, self.head_dim), self.out_features, axis=(-2, -1), dtype=dtype,
                                 param_dtype=param_dtype, kernel_init=out_kernel_init or kernel_init,
                                 bias_init=out_bias_init or bias_init, use_bias=use_bias, precision=precision,
                                 rngs=rngs)
    ln = lambda: nnx.LayerNorm(self.head_dim, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    # as Flax: LayerNorm over the head dimension (scale only) of queries and keys
    self.query_ln, self.key_ln = (ln(), ln()) if normalize_qk else (None, None)
    prior = None
    if mask_init is not None:
      length = self._stored_length(mask_init)
      shape = mask_shape(mask_kind, num_heads, length, length, max_len=max_len, grid=grid)
      prior = MaskPrior(_checked_init(mask_init, rngs.params(), shape, param_dtype, mask_kind))
    self.mask_prior = prior

  def _stored_length(self, mask_init) -> int:
    if self.mask_kind == "relative_2d":
      if self.grid is None:
        raise ValueError("mask_kind='relative_2d' needs grid=(height, width)")
      return self.grid[0] * self.grid[1] + self.num_prefix
    if self.max_len is not None:
      return self.max_len
    if self.mask_kind in ("full", "shared") and not callable(mask_init) and np.ndim(mask_init) >= 2:
      return int(np.shape(mask_init)[-1])   # an array prior says its own length
    raise ValueError(f"mask_kind={self.mask_kind!r} in NNX needs max_len (the longest sequence)")

  def _dropout_key(self, rngs):
    """A dropout key, as Flax: from `rngs` (an `Rngs`: its dropout stream; or an `RngStream`), else
    from the stream the module keeps."""
    stream = rngs.dropout if isinstance(rngs, nnx.Rngs) else rngs
    stream = self.rngs if stream is None else stream
    if stream is None:
      raise ValueError("dropout needs rngs: build the module with rngs or pass rngs= to the call")
    return stream()

  def init_cache(self, input_shape: tuple[int, ...], dtype: Any = jnp.float32):
    """Creates the key/value cache for ``decode``.

    Args:
      input_shape: the full-length input's shape, (batch..., max_length, features).
      dtype: the cache's dtype.
    """
    shape = (*input_shape[:-1], self.num_kv_heads, self.head_dim)
    self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
    self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
    self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

  def dense_bias(self, q_len: int, kv_len: int) -> jax.Array | None:
    """The mask prior as a dense logit bias.

    Args:
      q_len: query length.
      kv_len: key/value length.

    Returns:
      (heads or 1, q_len, kv_len), or None when the module has no prior.

    Raises:
      ValueError: if a length exceeds the stored bias's ("full" and "shared" kinds).
    """
    if self.mask_prior is None:
      return None
    stored = self.mask_prior[...]
    if self.mask_kind in ("full", "shared"):
      if max(q_len, kv_len) > stored.shape[-1]:
        raise ValueError(f"sequence length {max(q_len, kv_len)} exceeds the mask prior's {stored.shape[-1]}")
      stored = stored[..., :q_len, :kv_len]
    return expand_mask(stored, self.mask_kind, q_len, kv_len, max_len=self.max_len, grid=self.grid,
                       num_prefix=self.num_prefix)

  def __call__(self, inputs_q: jax.Array, inputs_k: jax.Array | None = None, inputs_v: jax.Array | None = None,
               *, mask: jax.Array | None = None, bias: jax.Array | None = None, deterministic: bool | None = None,
               rngs: nnx.Rngs | nnx.RngStream | None = None, sow_weights: bool = False,
               decode: bool | None = None) -> jax.Array:
    """Attends from ``inputs_q`` to ``inputs_k`` and ``inputs_v``, as ``flax.nnx.MultiHeadAttention``.

    Args:
      inputs_q: queries' inputs, (..., q_len, in_features).
      inputs_k: keys' inputs, (..., kv_len, in_features); default ``inputs_q``.
      inputs_v: values' inputs, (..., kv_len, in_features); default ``inputs_k``.
      mask: boolean, broadcastable to (batch, heads, q_len, kv_len); False excludes a pair.
      bias: an extra additive logit bias broadcastable to (batch, heads, q_len, kv_len).
      deterministic: no dropout; overrides the attribute.
      rngs: an ``nnx.Rngs`` or ``nnx.RngStream`` for dropout; default the module's stream.
      sow_weights: store the attention weights as an ``nnx.Intermediate`` under
        ``"attention_weights"``.
      decode: overrides the attribute.

    Returns:
      The output, (..., q_len, out_features).

    Raises:
      ValueError: for decoding without `init_cache`, dropout without ``deterministic``, or dropout
        without rngs.
    """
    inputs_k = inputs_q if inputs_k is None else inputs_k
    inputs_v = inputs_k if inputs_v is None else inputs_v
    query, key, value = self.query(inputs_q), self.key(inputs_k), self.value(inputs_v)
    if self.query_ln is not None:
      query, key = self.query_ln(query), self.key_ln(key)
    row = None
    if self.decode if decode is None else decode:
      if self.cached_key is None:
        raise ValueError("decode=True needs a key/value cache: call init_cache((batch, max_length, features)) first")
      row = self.cache_index[...]
      key, value, mask = decode_step(self.cached_key[...], self.cached_value[...], row, key, value, mask)
      self.cached_key[...], self.cached_value[...] = key, value
      self.cache_index[...] = row + 1
    key, value = _grouped(key, value, self.num_heads)
    kv_len = key.shape[-3]
    if row is None:
      prior = self.dense_bias(query.shape[-3], kv_len)
    else:   # the decoded token's own row of the bias
      prior = self.dense_bias(kv_len, kv_len)
      prior = None if prior is None else jax.lax.dynamic_slice_in_dim(prior, row, 1, axis=-2)
    total = prior if bias is None else (bias if prior is None else bias + prior)
    if self.dropout_rate > 0.0:
      deterministic = self.deterministic if deterministic is None else deterministic
      if deterministic is None:
        raise ValueError("dropout_rate > 0 needs deterministic=True or False (argument or attribute)")
    else:
      deterministic = True
    if self.attention_fn is not None:
      rng = None if deterministic else self._dropout_key(rngs)
      out = self.attention_fn(query, key, value, bias=total, mask=mask, dropout_rng=rng, dropout_rate=self.dropout_rate,
                              broadcast_dropout=self.broadcast_dropout, deterministic=deterministic, dtype=self.dtype,
                              precision=self.precision, module=None)
      return self.out(out)
    if not deterministic or sow_weights or (query.dtype == jnp.float64 and self.implementation != "blockwise"):
      weights = _attention_weights(query, key, total, mask, self.precision)
      if sow_weights:
        self.sow(nnx.Intermediate, ATTENTION_WEIGHTS, weights)
      if not deterministic:
        rng = self._dropout_key(rngs)
        keep_shape = dropout_shape(weights.shape, self.broadcast_dropout)
        keep = jax.random.bernoulli(rng, 1.0 - self.dropout_rate, keep_shape)
        weights = jnp.where(keep, weights / (1.0 - self.dropout_rate), 0.0)
      out = jnp.einsum("...hqk,...khd->...qhd", weights.astype(self.dtype or query.dtype), value,
                       precision=self.precision)
    else:
      out = _fused_attention(query, key, value, total, mask, self.implementation)
    return self.out(out)


class MultiHeadAttention(nnx.MultiHeadAttention):
  """``flax.nnx.MultiHeadAttention`` with a mask prior: change one import line.

  Flax's own class and code: every constructor and call argument (the ``*_metadata`` sharding
  annotations, ``keep_rngs``, ``is_causal``, ``rngs``, ``decode`` and ``init_cache``,
  ``sow_weights``, ``attention_fn``), the attribute names and the softmax dtype. The bias is
  ``self.mask_prior``, a `MaskPrior`; it reaches Flax's attention function as ``bias``, cast to
  the logits' dtype. Without ``mask_init`` the module is Flax's, bit for bit.

  Args:
    *args: Flax's positional arguments (``num_heads``, ``in_features``, ...).
    mask_init: the prior's initializer ``(key, shape, dtype) -> B`` or an array; None: no prior.
      Its key is drawn from ``rngs.params()`` after Flax's own weights, so the weights equal
      Flax's under the same ``Rngs``.
    mask_kind: "full", "shared", "relative_1d" or "relative_2d", as in `MaskPriorAttention`.
    max_len: the longest sequence ("full" and "shared" need it unless the prior is an array).
    grid: (height, width) of the patch grid, for "relative_2d".
    num_prefix: tokens before the grid ("relative_2d").
    **kwargs: Flax's keyword arguments (``qkv_features``, ``dropout_rate``, ``rngs``, ...).

  Raises:
    ValueError: for a prior that does not fit the kind or shape.

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from maskprior_jax import nnx as mpnnx, priors
    >>> layer = mpnnx.MultiHeadAttention(num_heads=2, in_features=8, decode=False, rngs=nnx.Rngs(0),
    ...                                  mask_init=priors.interaction_groups([[0, 1], [2, 3]]), max_len=4)
    >>> isinstance(layer, nnx.MultiHeadAttention), layer.mask_prior.shape
    (True, (2, 4, 4))
    >>> layer(jnp.ones((3, 4, 8))).shape
    (3, 4, 8)
  """

  def __init__(self, *args, mask_init=None, mask_kind: str = "full", max_len: int | None = None,
               grid: tuple[int, int] | None = None, num_prefix: int = 0, **kwargs):
    super().__init__(*args, **kwargs)
    _layout(mask_kind)
    self.mask_kind, self.max_len, self.grid, self.num_prefix = mask_kind, max_len, grid, num_prefix
    prior = None
    if mask_init is not None:
      length = MaskPriorAttention._stored_length(self, mask_init)
      shape = mask_shape(mask_kind, self.num_heads, length, length, max_len=max_len, grid=grid)
      prior = MaskPrior(_checked_init(mask_init, kwargs["rngs"].params(), shape,
                                      kwargs.get("param_dtype", jnp.float32), mask_kind))
    self.mask_prior = prior

  dense_bias = MaskPriorAttention.dense_bias

  def __call__(self, *args, **kwargs):
    """Flax's call, with the prior added to the attention function's ``bias``.

    The signature is ``flax.nnx.MultiHeadAttention.__call__``'s.

    Args:
      *args: ``inputs_q`` (..., q_len, in_features), ``inputs_k`` and ``inputs_v``, as Flax.
      **kwargs: Flax's keywords: ``mask`` (boolean; False excludes a pair), ``deterministic``,
        ``rngs``, ``sow_weights``, ``decode``.

    Returns:
      The output, (..., q_len, out_features).
    """
    if self.mask_prior is None:
      return super().__call__(*args, **kwargs)
    inner = self.attention_fn

    def prior(q_len, kv_len):
      decoding = q_len == 1 and kv_len > 1 and self.cache_index is not None and self.cached_key is not None \
          and self.cached_key.shape[-3] == kv_len
      dense = self.dense_bias(kv_len if decoding else q_len, kv_len)
      if decoding:   # Flax has already advanced the index past the token being decoded
        dense = jax.lax.dynamic_slice_in_dim(dense, self.cache_index[...] - 1, 1, axis=-2)
      return dense

    self.attention_fn = with_prior_bias(inner, prior)   # for this call only
    try:
      return super().__call__(*args, **kwargs)
    finally:
      self.attention_fn = inner


MultiHeadAttention.__call__.__signature__ = inspect.signature(nnx.MultiHeadAttention.__call__)
MultiHeadAttention.__init__.__signature__ = inspect.signature(nnx.MultiHeadAttention.__init__).replace(
    parameters=[*inspect.signature(nnx.MultiHeadAttention.__init__).parameters.values()] + [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
        for n, d in (("mask_init", None), ("mask_kind", "full"), ("max_len", None), ("grid", None), ("num_prefix", 0))])
for _cls in (MaskPrior, MaskPriorAttention, MultiHeadAttention):   # NNX's metaclass hides __init__ otherwise
  _signatures.readable(_cls)


def mask_prior_optimizer(model: nnx.Module, learning_rate, **kw) -> nnx.Optimizer:
  """An ``nnx.Optimizer`` with the mask prior's own rule.

  The base rule updates the model's ``Param`` s, the mask's own rule its `MaskPrior` s; other
  variable types (``BatchStat``, ``Cache``, ...) are never touched. Use it with
  ``grads = nnx.grad(loss_fn)(model, ...)`` and ``optimizer.update(model, grads)``.

  Args:
    model: the NNX model.
    learning_rate: the base learning rate (a float or an optax schedule).
    **kw: the keywords of `maskprior_jax.optim.mask_prior_optimizer`: ``name``,
      ``weight_decay``, ``b1``, ``b2``, ``mask_learning_rate``, ``mask_lr_multiplier``,
      ``mask_weight_decay``, ``freeze_mask`` (the bias then stays bit for bit),
      ``grad_clip_norm``.

  Returns:
    The ``nnx.Optimizer`` (``wrt`` = `WRT`).

  Raises:
    ValueError: for keywords `maskprior_jax.optim.mask_rules` refuses.

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from maskprior_jax import nnx as mpnnx, priors
    >>> model = mpnnx.MaskPriorAttention(2, 8, mask_init=priors.locality_1d(), max_len=4, rngs=nnx.Rngs(0))
    >>> optimizer = mpnnx.mask_prior_optimizer(model, 1e-3, freeze_mask=True)
    >>> before = model.mask_prior[...]
    >>> grads = nnx.grad(lambda m: (m(jnp.ones((1, 4, 8))) ** 2).sum())(model)
    >>> _ = optimizer.update(model, grads)
    >>> bool((model.mask_prior[...] == before).all())   # frozen, bit for bit
    True
  """
  grad_clip_norm = kw.pop("grad_clip_norm", None)
  params_tx, mask_tx = optim.mask_rules(learning_rate, **kw)
  # Labels by path: the prior's paths are read off the model once; optax then receives the tree
  # nnx.Optimizer hands it (Variables in some Flax versions, plain arrays in others), and each leaf is
  # labelled by where it sits.
  masks = {tuple(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model, MaskPrior))}

  def labels(tree):
    def kind(path, _):
      keys = tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
      keys = keys[:-1] if keys and keys[-1] in ("value", "raw_value") else keys   # a Variable's own field
      return "mask" if keys in masks else "params"
    return jax.tree_util.tree_map_with_path(kind, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))
  tx = optax.partition({"params": params_tx, "mask": mask_tx or optax.set_to_zero()}, labels)
  return nnx.Optimizer(model, optim.clipped(tx, grad_clip_norm), wrt=WRT)
