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

import contextlib
import contextvars
import dataclasses
import functools
from typing import Any, Callable, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MaskPriorAttention", "MaskSettings", "MaskLayout", "MASK_PRIOR", "ATTENTION_WEIGHTS", "MASK_KINDS",
           "MASK_LAYOUTS", "IMPLEMENTATIONS", "mask_shape", "expand_mask", "dense_mask_bias", "relative_1d_index",
           "relative_2d_index", "decode_step", "attention_implementation", "dot_product_attention", "dropout_shape",
           "with_prior_bias", "for_platform", "target_platform", "heads_folded_attention", "PLATFORMS",
           "cudnn_unsupported"]

MASK_PRIOR = "mask_prior"
ATTENTION_WEIGHTS = "attention_weights"

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]
MaskKind = Literal["full", "shared", "relative_1d", "relative_2d"]
MASK_KINDS: tuple[str, ...] = ("full", "shared", "relative_1d", "relative_2d")


@dataclasses.dataclass(frozen=True)
class MaskSettings:
  """How a model's attention layers hold their mask prior (one value, passed down whole).

  init: initializer `(key, shape, dtype) -> B` or a plain array (see `MaskPriorAttention`).
  kind: the bias parameterization (see `MASK_LAYOUTS`).
  max_len: offset-table size for kind "relative_1d"; grid: (height, width) for "relative_2d".
  share_layers: one bias for every layer (kind "full" or "shared"), added to each layer's logits.
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
    """The `MaskPriorAttention` attributes these settings stand for."""
    return dict(mask_init=self.init, mask_kind=self.kind, max_len=self.max_len, grid=self.grid,
                num_prefix=num_prefix)


def _require(value, kind: str, what: str):
  if value is None:
    raise ValueError(f"mask_kind={kind!r} needs {what}")
  return value


def _expand_2d(stored, q_len, kv_len, grid, num_prefix):
  n = grid[0] * grid[1]
  if q_len != kv_len or q_len != n + num_prefix:
    raise ValueError(f"relative_2d mask expects {n}+{num_prefix} tokens (grid {grid} plus prefix), got {q_len}x{kv_len}")
  dense = stored[:, relative_2d_index(grid)]
  if num_prefix:
    dense = jnp.pad(dense, ((0, 0), (num_prefix, 0), (num_prefix, 0)))
  return dense


@dataclasses.dataclass(frozen=True)
class MaskLayout:
  """How one mask kind is stored and expanded.

  shape(num_heads, q_len, kv_len, max_len, grid): the stored bias's shape;
  expand(stored, q_len, kv_len, max_len, grid, num_prefix): the dense (heads or 1, q_len, kv_len) bias.
  """
  shape: Callable[..., tuple[int, ...]]
  expand: Callable[..., jax.Array]


# The one table of mask kinds: every place that needs a kind's stored shape or dense bias reads it.
MASK_LAYOUTS: dict[str, MaskLayout] = {
    # (heads, q_len, kv_len): one logit per head and pair.
    "full": MaskLayout(shape=lambda h, q, k, max_len, grid: (h, q, k),
                       expand=lambda b, q, k, max_len, grid, prefix: b),
    # (q_len, kv_len): the same bias for every head.
    "shared": MaskLayout(shape=lambda h, q, k, max_len, grid: (q, k),
                         expand=lambda b, q, k, max_len, grid, prefix: b[None]),
    # (heads, 2 * max_len - 1): one logit per head and offset k - q (one table for every length <= max_len).
    "relative_1d": MaskLayout(
        shape=lambda h, q, k, max_len, grid: (h, 2 * _require(max_len, "relative_1d", "max_len") - 1),
        expand=lambda b, q, k, max_len, grid, prefix: b[:, relative_1d_index(q, k, max_len)]),
    # (heads, (2gh - 1) * (2gw - 1)): one logit per head and 2-D offset on a (gh, gw) patch grid
    # (Swin-style table); `num_prefix` tokens before the grid (e.g. CLS) get bias 0 to and from all.
    "relative_2d": MaskLayout(
        shape=lambda h, q, k, max_len, grid: (h, (2 * _require(grid, "relative_2d", "grid=(height, width)")[0] - 1)
                                              * (2 * grid[1] - 1)),
        expand=lambda b, q, k, max_len, grid, prefix: _expand_2d(b, q, k, grid, prefix)),
}
MASK_KINDS: tuple[str, ...] = tuple(MASK_LAYOUTS)


def _layout(kind: str) -> MaskLayout:
  if kind not in MASK_LAYOUTS:
    raise ValueError(f"unknown mask_kind {kind!r}; use {', '.join(MASK_KINDS)}")
  return MASK_LAYOUTS[kind]


def mask_shape(kind: str, num_heads: int, q_len: int, kv_len: int, *,
               max_len: int | None = None,
               grid: tuple[int, int] | None = None) -> tuple[int, ...]:
  """Shape of the stored bias of a mask kind (see `MASK_LAYOUTS`)."""
  return _layout(kind).shape(num_heads, q_len, kv_len, max_len, grid)


def relative_1d_index(q_len: int, kv_len: int, max_len: int) -> np.ndarray:
  """(q_len, kv_len) indices into a (2*max_len-1) offset table: k - q + max_len - 1."""
  if max(q_len, kv_len) > max_len:
    raise ValueError(f"sequence length {max(q_len, kv_len)} exceeds the relative mask's max_len={max_len}")
  return np.arange(kv_len)[None, :] - np.arange(q_len)[:, None] + max_len - 1


def relative_2d_index(grid: tuple[int, int]) -> np.ndarray:
  """(gh*gw, gh*gw) indices into a ((2gh-1)*(2gw-1)) table of 2-D offsets."""
  gh, gw = grid
  ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
  ys, xs = ys.reshape(-1), xs.reshape(-1)
  dy = ys[None, :] - ys[:, None] + gh - 1
  dx = xs[None, :] - xs[:, None] + gw - 1
  return dy * (2 * gw - 1) + dx


def expand_mask(stored: jax.Array, kind: str, q_len: int, kv_len: int, *,
                max_len: int | None = None, grid: tuple[int, int] | None = None,
                num_prefix: int = 0) -> jax.Array:
  """The stored bias as a dense (heads, q_len, kv_len) (or (1, q, kv) if shared) logit bias
  (see `MASK_LAYOUTS`)."""
  return _layout(kind).expand(stored, q_len, kv_len, max_len, grid, num_prefix)


def dense_mask_bias(module: nn.Module, settings: "MaskSettings", name: str, num_heads: int, q_len: int,
                    kv_len: int, *, num_prefix: int = 0, dtype: Any = jnp.float32) -> jax.Array:
  """The mask prior held by `module` (a variable `name` in its MASK_PRIOR collection, created from
  `settings.init` on first use, in the kind's stored shape) as a dense (heads or 1, q_len, kv_len)
  logit bias. Call it from inside the module's compact method."""
  kind = settings.kind
  shape = mask_shape(kind, num_heads, q_len, kv_len, max_len=settings.max_len, grid=settings.grid)
  stored = module.variable(MASK_PRIOR, name, lambda: _checked_init(settings.init, module.make_rng("params"),
                                                                    shape, dtype, kind))
  if stored.value.shape != shape:
    raise ValueError(f"mask prior has shape {stored.value.shape}, expected {shape} for mask_kind={kind!r}")
  return expand_mask(stored.value, kind, q_len, kv_len, max_len=settings.max_len, grid=settings.grid,
                     num_prefix=num_prefix)


def _softmax_dtype(dtype):
  """float32 for bf16/f16/f32 inputs, float64 for float64 ones (softmax never below float32)."""
  return jnp.promote_types(jnp.float32, dtype)


def _attention_weights(query, key, bias, mask, precision=None):
  """softmax(q.k/sqrt(d) + bias) with hard mask; (batch, heads, q, kv) in float32 (float64 for
  float64 inputs)."""
  depth = query.shape[-1]
  dt = _softmax_dtype(query.dtype)
  logits = jnp.einsum("...qhd,...khd->...hqk", query, key, precision=precision).astype(dt)
  logits = logits / jnp.sqrt(depth).astype(dt)
  if bias is not None:
    logits = logits + bias.astype(dt)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(dt).min)
  return jax.nn.softmax(logits, axis=-1)


class MaskPriorAttention(nn.Module):
  """Multi-head dot-product attention with a learnable additive mask prior.

  A drop-in for `flax.linen.MultiHeadDotProductAttention`: the same attribute names, call
  keywords (`inputs_k`, `inputs_v`, `inputs_kv`, `mask`, `deterministic`, `dropout_rng`,
  `sow_weights`) and parameter tree, plus the mask prior.

  Attributes:
    num_heads: number of heads.
    qkv_features: total width of q, k, v (default: input width); d_head = qkv_features / num_heads.
    out_features: output width (default: input width).
    dropout_rate, broadcast_dropout, deterministic: attention-weight dropout, as in Flax (the
      "dropout" RNG stream, or `dropout_rng`).
    mask_init: initializer `(key, shape, dtype) -> B`, or an array broadcast to the stored
      shape; None means vanilla attention. An initializer from `maskprior_jax.priors` names the
      mask kinds it was built for, and another kind is refused.
    mask_kind: "full", "shared", "relative_1d" or "relative_2d" (see `mask_shape`).
    max_len: table size for "relative_1d".
    grid: (height, width) patch grid for "relative_2d".
    num_prefix: tokens before the grid ("relative_2d"), e.g. 1 for a CLS token.
    implementation: None or "xla" (XLA's attention; what None means in this JAX version),
      "cudnn" (cuDNN's fused kernel; GPU only, and its support for a learnable bias and its
      gradient depends on shape and dtype), "blockwise" (`maskprior_jax.blockwise`: memory per
      key block, any backend), or "auto": cuDNN where `attention_implementation` says it is safe
      for this call, XLA otherwise.
    dtype / param_dtype / precision / kernel_init / out_kernel_init / bias_init /
      out_bias_init / use_bias: as in Flax.

    num_kv_heads: key/value heads for grouped-query attention (dividing num_heads; query head h
      reads key/value head h // (num_heads / num_kv_heads)); default num_heads.
    attention_fn: a Flax-style attention function, called as `attention_fn(query, key, value,
      bias=..., mask=..., dropout_rng=..., dropout_rate=..., broadcast_dropout=..., deterministic=...,
      dtype=..., precision=..., module=None)` with the mask prior (plus any `bias` argument) as
      `bias`, e.g. `flax.linen.dot_product_attention`; default: this module's own paths.

    decode: autoregressive decoding with a key/value cache, as Flax: `init` with the full-length
      input creates the "cache" collection (keys and values of `num_kv_heads` heads, the index);
      then each `apply(..., mutable=["cache"])` takes one token, attends to the tokens cached so
      far, and uses its own row of the mask prior (relative kinds: its own offsets), so decoding
      token by token equals the full pass with a causal mask.
    normalize_qk: LayerNorm (scale only) over the head dimension of queries and keys ("query_ln",
      "key_ln"), as Flax.

  Not supported (Flax's attributes missing here on purpose): `force_fp32_for_softmax` (softmax
  is always float32) and the deprecated dot_general / einsum class hooks.
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
    """Attend from `inputs_q` (..., q_len, features) to `inputs_k`/`inputs_v` (..., kv_len, features).

    inputs_k defaults to inputs_q and inputs_v to inputs_k (self-attention); `inputs_kv`
    sets both (Flax's older keyword; not together with inputs_k or inputs_v).
    mask: boolean, broadcastable to (batch, heads, q_len, kv_len); False excludes a pair
      whatever the bias says (Flax's convention).
    bias: an extra additive logit bias broadcastable to (batch, heads, q_len, kv_len), e.g.
      a mask prior shared across layers.
    deterministic: no attention dropout (defaults to the attribute; needed when dropout_rate > 0).
    sow_weights: store the attention weights in "intermediates" under ATTENTION_WEIGHTS.
    """
    if inputs_kv is not None:
      if inputs_k is not None or inputs_v is not None:
        raise ValueError("give inputs_kv, or inputs_k/inputs_v, not both")
      inputs_k = inputs_v = inputs_kv
    if inputs_k is None:
      inputs_k = inputs_q
    if inputs_v is None:
      inputs_v = inputs_k
    _layout(self.mask_kind)
    features = self.out_features or inputs_q.shape[-1]
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
    row = None
    if self.decode:
      initialized = self.has_variable("cache", "cached_key")
      cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
      cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
      index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
      if initialized:   # the first call (init) only creates the cache, as Flax's
        row = index.value
        key, value, mask = decode_step(cached_key.value, cached_value.value, row, key, value, mask)
        cached_key.value, cached_value.value, index.value = key, value, row + 1
    key, value = _grouped(key, value, self.num_heads)
    q_len, kv_len = query.shape[-3], key.shape[-3]

    total_bias = bias
    if self.mask_init is not None:
      settings = MaskSettings(self.mask_init, self.mask_kind, self.max_len, self.grid)
      rows = kv_len if row is not None else q_len
      prior = dense_mask_bias(self, settings, "bias", self.num_heads, rows, kv_len, num_prefix=self.num_prefix,
                              dtype=self.param_dtype)
      if row is not None:   # the decoded token's own row of the bias
        prior = jax.lax.dynamic_slice_in_dim(prior, row, 1, axis=-2)
      total_bias = prior if total_bias is None else total_bias + prior

    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic) \
        if self.dropout_rate > 0.0 else True
    compute_dtype = self.dtype or query.dtype
    sow = self.sow_weights or sow_weights or self.is_mutable_collection("intermediates")
    if self.attention_fn is not None:
      rng = None if deterministic else (dropout_rng if dropout_rng is not None else self.make_rng("dropout"))
      out = self.attention_fn(query, key, value, bias=total_bias, mask=mask, dropout_rng=rng,
                              dropout_rate=self.dropout_rate, broadcast_dropout=self.broadcast_dropout,
                              deterministic=deterministic, dtype=self.dtype, precision=self.precision, module=None)
      return self._out(out, features)
    # Explicit path where the weights are needed (dropout, persistence measurements), and for
    # float64, which XLA's fused path would round to float32 inside its softmax (the blockwise path
    # keeps float64).
    if not deterministic or sow or (query.dtype == jnp.float64 and self.implementation != "blockwise"):
      weights = _attention_weights(query, key, total_bias, mask, self.precision)
      if sow:
        self.sow("intermediates", ATTENTION_WEIGHTS, weights)
      if not deterministic:
        rng = dropout_rng if dropout_rng is not None else self.make_rng("dropout")
        keep_shape = dropout_shape(weights.shape, self.broadcast_dropout)
        keep = jax.random.bernoulli(rng, 1.0 - self.dropout_rate, keep_shape)
        weights = jnp.where(keep, weights / (1.0 - self.dropout_rate), 0.0)
      out = jnp.einsum("...hqk,...khd->...qhd", weights.astype(compute_dtype), value, precision=self.precision)
    else:
      out = _fused_attention(query, key, value, total_bias, mask, self.implementation)
    return self._out(out, features)

  def _out(self, out, features):
    return nn.DenseGeneral(features=features, axis=(-2, -1),
                           kernel_init=self.out_kernel_init or self.kernel_init,
                           bias_init=self.out_bias_init or self.bias_init, use_bias=self.use_bias,
                           dtype=self.dtype, param_dtype=self.param_dtype, precision=self.precision,
                           name="out")(out)


IMPLEMENTATIONS = ("xla", "cudnn", "blockwise", "auto")


def dropout_shape(weights_shape: tuple[int, ...], broadcast: bool) -> tuple[int, ...]:
  """The attention-dropout mask's shape, as Flax's `dot_product_attention_weights`: with
  `broadcast_dropout` one (q_len, kv_len) mask shared by every batch element and head, else one
  per weight."""
  if not broadcast:
    return tuple(weights_shape)
  return (1,) * (len(weights_shape) - 2) + tuple(weights_shape[-2:])


def decode_step(cached_key, cached_value, position, key, value, mask):
  """One autoregressive step with a key/value cache (arrays in, arrays out; the modules store them).

  cached_key/cached_value: (..., max_length, kv_heads, head_dim); position: the cache index (int32
  scalar); key/value: the new token's (..., 1, kv_heads, head_dim), written at `position`. Returns
  the updated keys and values, and `mask` combined with "key position <= the token's".
  """
  *batch, max_length, heads, depth = cached_key.shape
  expected = tuple(batch) + (1, heads, depth)
  if tuple(key.shape) != expected:
    raise ValueError(f"decode=True takes one token at a time: expected keys of shape {expected} "
                     f"(the cache's), got {tuple(key.shape)}")
  start = (0,) * len(batch) + (position, 0, 0)
  key = jax.lax.dynamic_update_slice(cached_key, key.astype(cached_key.dtype), start)
  value = jax.lax.dynamic_update_slice(cached_value, value.astype(cached_value.dtype), start)
  visible = jnp.broadcast_to(jnp.arange(max_length) <= position, tuple(batch) + (1, 1, max_length))
  mask = visible if mask is None else jnp.logical_and(mask, visible)
  return key, value, mask


def _grouped(key, value, num_heads: int):
  """Grouped-query attention: each key/value head repeated for its group of query heads
  (query head h reads key/value head h // (num_heads / kv_heads)); unchanged when the counts match."""
  groups = num_heads // key.shape[-2]
  if groups == 1:
    return key, value
  return jnp.repeat(key, groups, axis=-2), jnp.repeat(value, groups, axis=-2)


# The platform "auto" resolves for while a program is traced: None means the process's backend
# (`jax.default_backend()`); `for_platform` sets it, so that a program can be built on a CPU for
# what a GPU or TPU would run (`maskprior compile`).
_TARGET_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("maskprior_attention_platform",
                                                                             default=None)
PLATFORMS = ("cpu", "gpu", "tpu")


@contextlib.contextmanager
def for_platform(platform: str | None):
  """Within this block, "auto" attention resolves for `platform` ("cpu", "gpu" or "tpu"; None: the
  process's backend) instead of `jax.default_backend()`. Resolution happens while a program is
  traced, so trace (`jit(...).trace`, `.lower`) inside the block::

    with mp.attention.for_platform("gpu"):
      lowered = step.trace(state, batch).lower(lowering_platforms=("cuda",))
  """
  if platform not in (None, *PLATFORMS):
    raise ValueError(f"platform must be None or one of {', '.join(PLATFORMS)}, not {platform!r}")
  token = _TARGET_PLATFORM.set(platform)
  try:
    yield
  finally:
    _TARGET_PLATFORM.reset(token)


def target_platform() -> str:
  """The platform "auto" attention resolves for now: `for_platform`'s, else the process's backend."""
  if _TARGET_PLATFORM.get():
    return _TARGET_PLATFORM.get()
  from maskprior_jax import sharding   # devices set for a target (`sharding.for_devices`)
  return sharding.platform()


def cudnn_unsupported(q_len: int, kv_len: int, head_dim: int) -> str | None:
  """Why cuDNN's fused attention (as this JAX calls it, bfloat16/float16) refuses a training call of
  these sizes, or None: the head dimension must be a multiple of 8 and at most 128 (256 from Hopper on;
  the lower bound is used, as a program built ahead of time cannot ask the device), and both sequence
  lengths must be even (JAX checks it for every differentiated call, with a bias or without)."""
  if head_dim % 8 or head_dim > 128:
    return f"cuDNN's fused attention needs a head dimension that is a multiple of 8 and at most 128, not {head_dim}"
  if q_len % 2 or kv_len % 2:
    return (f"cuDNN's fused attention (trained) needs even sequence lengths, not {q_len} x {kv_len} "
            "(e.g. a CLS token before an even number of tokens)")
  return None


def attention_implementation(requested: str | None, dtype, bias_batch: int | None,
                             backend: str | None = None, *, shape: tuple[int, int, int] | None = None) -> str:
  """The attention path a call will use: "xla", "cudnn" or "blockwise".

  "auto" picks cuDNN only on a GPU (`backend`, else `target_platform()`: the platform set by
  `for_platform`, or the process's backend), for bfloat16/float16 inputs, and where the bias (if any)
  has a batch dimension of 1 (one bias for the whole batch, as a mask prior; a float32 bias has been
  reported to give NaNs); everything else runs XLA. Several runs stacked under `jax.vmap` (one
  prior per run) keep the fused kernel: the run axis is folded into the heads (see
  `dot_product_attention`). With `shape` = (q_len, kv_len, head_dim), "auto" also keeps to the sizes
  cuDNN supports (`cudnn_unsupported`: e.g. an odd sequence length runs XLA). None means
  "xla" (this JAX version's choice). "blockwise"
  (`maskprior_jax.blockwise`) runs on any backend with memory linear in the key length per block, and
  returns the bias gradient at the bias's own size.
  """
  if requested in (None, "xla"):
    return "xla"
  if requested in ("cudnn", "blockwise"):
    return requested
  if requested != "auto":
    raise ValueError(f"implementation must be None, 'xla', 'cudnn', 'blockwise' or 'auto', not {requested!r}")
  backend = backend or target_platform()
  half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  fits = shape is None or cudnn_unsupported(*shape) is None
  return "cudnn" if backend in ("gpu", "cuda") and half and bias_batch in (None, 1) and fits else "xla"


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array | None = None,
                          mask: jax.Array | None = None, *, implementation: str | None = None,
                          block_size: int = 128) -> jax.Array:
  """softmax(q.k/sqrt(H) + bias, where mask) . v with `jax.nn.dot_product_attention`'s layout:
  query (B, T, N, H), key/value (B, S, N, H), bias (additive) and mask (boolean, False excludes)
  broadcastable to (B, N, T, S). implementation: None/"xla" (XLA's attention), "cudnn" (GPU, where
  cuDNN supports the case), "blockwise" (pure JAX, any backend: key blocks of `block_size` with an
  online softmax and a custom VJP that recomputes scores block by block; the bias gradient comes
  back at the bias's own size), or "auto" (see `attention_implementation`).

  cuDNN with a bias under `jax.vmap` (several runs in one program, each with its own prior): JAX's
  batching rule for the fused kernel assumes that a batched bias carries the example batch, so the
  call is made through `heads_folded_attention` instead, which folds the mapped axis into the heads
  ((R, B, T, N, H) -> (B, T, R*N, H), the bias (R, Bb, N, T, S) -> (Bb, R*N, T, S)): one fused call
  forward and one backward for all runs, the bias gradient at the bias's own size."""
  bias_batch = None if bias is None and mask is None else (
      jnp.shape(bias)[0] if bias is not None and jnp.ndim(bias) == 4 else 1)
  shape = (query.shape[-3], key.shape[-3], query.shape[-1])
  impl = attention_implementation(implementation, query.dtype, bias_batch, shape=shape)
  if impl == "cudnn":
    why = cudnn_unsupported(*shape)
    if why is not None:
      raise ValueError(f"implementation='cudnn': {why}; use 'auto' (XLA where cuDNN cannot) or 'xla'")
  if impl == "blockwise":
    from maskprior_jax.blockwise import blockwise_attention
    return blockwise_attention(query, key, value, bias, mask, block_size)
  if impl == "cudnn" and (bias is not None or mask is not None):
    return heads_folded_attention(query, key, value, bias, mask, implementation="cudnn")
  return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask, implementation=impl)


def _fold_runs(x, batched: bool, runs: int, head_axis: int):
  """An array with a leading mapped axis of `runs` (broadcast there if not `batched`) with that axis
  merged into its heads axis (`head_axis` of the unmapped array), runs major."""
  x = x if batched else jnp.broadcast_to(x, (runs,) + x.shape)
  x = jnp.moveaxis(x, 0, head_axis)
  return x.reshape(x.shape[:head_axis] + (-1,) + x.shape[head_axis + 2:])


def _unfold_runs(x, runs: int, head_axis: int):
  """`_fold_runs` undone: the heads axis split into (runs, heads), the runs moved to the front."""
  x = x.reshape(x.shape[:head_axis] + (runs, -1) + x.shape[head_axis + 1:])
  return jnp.moveaxis(x, head_axis, 0)


def _heads_folding(fn, head_axes_in: tuple[int, ...], head_axes_out: tuple[int, ...]):
  """`fn` (arrays in, a tuple of arrays out) whose `jax.vmap` folds the mapped axis into each
  array's heads axis and calls `fn` once (itself again, so nested maps fold again)."""
  folded = jax.custom_batching.custom_vmap(fn)

  @folded.def_vmap
  def rule(axis_size, in_batched, *args):
    outs = folded(*(_fold_runs(a, b, axis_size, h) for a, b, h in zip(args, in_batched, head_axes_in)))
    return tuple(_unfold_runs(o, axis_size, h) for o, h in zip(outs, head_axes_out)), (True,) * len(outs)
  return folded


@functools.lru_cache(maxsize=None)
def _heads_folded_call(implementation: str):
  """The custom-VJP attention of `heads_folded_attention` for one implementation (built once)."""
  attend = functools.partial(jax.nn.dot_product_attention, implementation=implementation)
  # The forward, and the backward, which makes cuDNN's training forward again for the statistics its
  # backward kernel reads (a custom_vmap function has no reverse-mode derivative of its own, so the
  # forward's residuals cannot be handed over): one more fused forward per layer in training.
  infer = _heads_folding(lambda q, k, v, b: (attend(q, k, v, b),), (2, 2, 2, 1), (2,))
  bwd = _heads_folding(lambda q, k, v, b, g: tuple(jax.vjp(attend, q, k, v, b)[1](g)), (2, 2, 2, 1, 2),
                       (2, 2, 2, 1))

  @jax.custom_vjp
  def call(q, k, v, b):
    return infer(q, k, v, b)[0]

  def call_fwd(q, k, v, b):
    return infer(q, k, v, b)[0], (q, k, v, b)

  def call_bwd(res, g):
    return bwd(*res, g)

  call.defvjp(call_fwd, call_bwd)
  return call


def heads_folded_attention(query: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array | None = None,
                           mask: jax.Array | None = None, *, implementation: str = "cudnn") -> jax.Array:
  """`jax.nn.dot_product_attention(..., implementation=implementation)` whose `jax.vmap` folds the
  mapped axis into the heads instead of the batch: R stacked runs, each with its own bias, are one
  call over R*N heads with the bias's batch dimension unchanged (cuDNN's batching rule would need a
  bias that carries the example batch). Layout as `dot_product_attention`: query (B, T, N, H),
  key/value (B, S, N, H) (N heads each), bias broadcastable to (B, N, T, S); a boolean mask is added
  to the bias as a large negative logit, as JAX's cuDNN path does. Gradients: one backward call,
  the bias's at the bias's shape (batch 1 or B, N heads)."""
  n = query.shape[-2]
  dtype = query.dtype
  if bias is not None:
    bias = jnp.asarray(bias)
    bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape).astype(dtype)
  if mask is not None:
    mask = jnp.asarray(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    neg = jnp.asarray(-2 << 40 if dtype == jnp.bfloat16 else -2 << 14 if dtype == jnp.float16
                      else jnp.finfo(dtype).min / 2, dtype)
    add = jnp.where(mask, jnp.asarray(0, dtype), neg)
    bias = add if bias is None else bias + add
  b = bias.shape[0]
  bias = jnp.broadcast_to(bias, (b, n) + bias.shape[2:])   # one row of heads per head: the fold splits them
  return _heads_folded_call(implementation)(query, key, value, bias)


def with_prior_bias(attention_fn: Callable[..., jax.Array],
                    prior: Callable[[int, int], jax.Array]) -> Callable[..., jax.Array]:
  """A Flax-style attention function that adds `prior(q_len, kv_len)` (cast to the logits' dtype) to
  its `bias` argument, with `attention_fn`'s signature (Flax filters the keywords it passes by it).
  How the Flax-named drop-ins (`maskprior_jax.linen`, `maskprior_jax.nnx.MultiHeadAttention`) hand
  their prior to Flax's own attention code."""
  @functools.wraps(attention_fn)
  def with_prior(query, key, value, *rest, bias=None, **kw):
    b = prior(query.shape[-3], key.shape[-3]).astype(kw.get("dtype") or jnp.result_type(query.dtype, key.dtype))
    return attention_fn(query, key, value, *rest, bias=b if bias is None else bias + b, **kw)
  return with_prior


def _fused_attention(query, key, value, bias, mask, implementation):
  """`jax.nn.dot_product_attention` over (batch, len, heads, d) with leading dims flattened."""
  lead = query.shape[:-3]
  flat = lambda x: x.reshape((-1,) + x.shape[-3:])
  q, k, v = flat(query), flat(key), flat(value)
  b = q.shape[0]

  def batch4(x):
    if x is None:
      return None
    x = jnp.asarray(x)
    while x.ndim < 4:
      x = x[None]
    if x.ndim > 4:
      x = jnp.broadcast_to(x, lead + x.shape[-3:]).reshape((b,) + x.shape[-3:])
    return x

  bias4 = batch4(bias)
  if bias4 is not None:
    bias4 = bias4.astype(q.dtype)
  mask4 = batch4(mask)
  if mask4 is not None:
    mask4 = mask4.astype(bool)
  out = dot_product_attention(q, k, v, bias4, mask4, implementation=implementation)
  return out.reshape(lead + out.shape[1:])


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
