"""Dot-product attention with an additive logit bias, by implementation: XLA's, cuDNN's fused kernel
(with stacked runs folded into its heads), or the blockwise pure-JAX one (`dot_product_attention`,
`attention_implementation`), and the platform a program is traced for (`for_platform`). The
attention modules (`maskprior_jax.attention`) call these; every public name is re-exported there."""
from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Callable

import jax
import jax.numpy as jnp

__all__ = ["IMPLEMENTATIONS", "PLATFORMS", "for_platform", "target_platform", "cudnn_unsupported",
           "attention_implementation", "dot_product_attention", "heads_folded_attention", "with_prior_bias"]


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


#: The attention implementations a module or `dot_product_attention` accepts (None means "xla").
IMPLEMENTATIONS = ("xla", "cudnn", "blockwise", "auto")


#: The platforms `for_platform` accepts.
PLATFORMS = ("cpu", "gpu", "tpu")
# The platform "auto" resolves for while a program is traced: None means the process's backend
# (`jax.default_backend()`); `for_platform` sets it, so that a program can be built on a CPU for
# what a GPU or TPU would run (`maskprior compile`).
_TARGET_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("maskprior_attention_platform",
                                                                             default=None)




@contextlib.contextmanager
def for_platform(platform: str | None):
  """A context in which "auto" attention resolves for another platform than this process's.

  Resolution happens while a program is traced, so trace (``jit(...).trace``, ``.lower``)
  inside the block; this is how the library compiles GPU and TPU programs on a CPU::

    with mp.attention.for_platform("gpu"):
      lowered = step.trace(state, batch).lower(lowering_platforms=("cuda",))

  Args:
    platform: "cpu", "gpu" or "tpu"; None: the process's backend.

  Raises:
    ValueError: for another platform name.
  """
  if platform not in (None, *PLATFORMS):
    raise ValueError(f"platform must be None or one of {', '.join(PLATFORMS)}, not {platform!r}")
  token = _TARGET_PLATFORM.set(platform)
  try:
    yield
  finally:
    _TARGET_PLATFORM.reset(token)


def target_platform() -> str:
  """The platform "auto" attention resolves for now.

  Returns:
    The platform set by `for_platform`, else the platform of the devices set for a target
    (``maskprior_jax.sharding.for_devices``), else ``jax.default_backend()``.
  """
  if _TARGET_PLATFORM.get():
    return _TARGET_PLATFORM.get()
  from maskprior_jax import sharding   # devices set for a target (`sharding.for_devices`)
  return sharding.platform()


def cudnn_unsupported(q_len: int, kv_len: int, head_dim: int) -> str | None:
  """Why cuDNN's fused attention refuses a training call of these sizes, or None.

  The head dimension must be a multiple of 8 and at most 128 (256 from Hopper on; the lower
  bound is used, as a program built ahead of time cannot ask the device), and both sequence
  lengths must be even (JAX checks it for every differentiated call).

  Args:
    q_len: query length.
    kv_len: key/value length.
    head_dim: the head dimension.

  Returns:
    A one-line reason, or None where cuDNN supports the sizes.

  Example:
    >>> from maskprior_jax.attention import cudnn_unsupported
    >>> cudnn_unsupported(16, 16, 64) is None
    True
    >>> cudnn_unsupported(17, 17, 64)[:40]
    "cuDNN's fused attention (trained) needs "
  """
  if head_dim % 8 or head_dim > 128:
    return f"cuDNN's fused attention needs a head dimension that is a multiple of 8 and at most 128, not {head_dim}"
  if q_len % 2 or kv_len % 2:
    return (f"cuDNN's fused attention (trained) needs even sequence lengths, not {q_len} x {kv_len} "
            "(e.g. a CLS token before an even number of tokens)")
  return None


def attention_implementation(requested: str | None, dtype, bias_batch: int | None,
                             backend: str | None = None, *, shape: tuple[int, int, int] | None = None) -> str:
  """The attention path a call will use: "xla", "cudnn" or "blockwise".

  "auto" picks cuDNN only on a GPU, for bfloat16 or float16 inputs, where the bias (if any) has a
  batch dimension of 1 (one bias for the whole batch, as a mask prior) and, with ``shape``, for
  sizes cuDNN supports (`cudnn_unsupported`); everything else runs XLA. Several runs stacked
  under ``jax.vmap`` (one prior per run) keep the fused kernel: the run axis is folded into the
  heads (see `dot_product_attention`).

  Args:
    requested: None or "xla" (XLA), "cudnn", "blockwise" (`maskprior_jax.blockwise`, any
      backend) or "auto".
    dtype: the inputs' dtype.
    bias_batch: the bias's batch dimension (None: no bias or mask).
    backend: the platform to resolve for; default `target_platform`.
    shape: (q_len, kv_len, head_dim), to keep "auto" to the sizes cuDNN supports.

  Returns:
    "xla", "cudnn" or "blockwise".

  Raises:
    ValueError: for an unknown ``requested``.

  Example:
    >>> import jax.numpy as jnp
    >>> from maskprior_jax.attention import attention_implementation
    >>> attention_implementation("auto", jnp.bfloat16, 1, backend="gpu", shape=(64, 64, 32))
    'cudnn'
    >>> attention_implementation("auto", jnp.float32, 1, backend="gpu")
    'xla'
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
  """Dot-product attention with an additive logit bias, in ``jax.nn.dot_product_attention``'s layout.

  Computes ``softmax(q k^T / sqrt(H) + bias, where mask) v``.

  cuDNN with a bias under ``jax.vmap`` (several runs in one program, each with its own prior):
  JAX's batching rule for the fused kernel assumes that a batched bias carries the example
  batch, so the call goes through `heads_folded_attention`, which folds the mapped axis into the
  heads: one fused call forward and one backward for all runs, the bias gradient at the bias's
  own size.

  Args:
    query: (B, T, N, H): batch, query length, heads, head dimension.
    key: (B, S, N, H).
    value: (B, S, N, H).
    bias: an additive logit bias broadcastable to (B, N, T, S), e.g. a dense mask prior.
    mask: boolean, broadcastable to (B, N, T, S); False excludes a pair.
    implementation: None or "xla" (XLA's attention), "cudnn" (GPU, where cuDNN supports the
      case), "blockwise" (pure JAX, any backend: key blocks of ``block_size`` with an online
      softmax and a custom VJP that recomputes scores block by block) or "auto" (see
      `attention_implementation`).
    block_size: keys per block for "blockwise".

  Returns:
    The attention output, (B, T, N, H).

  Raises:
    ValueError: for an unknown implementation, or "cudnn" for sizes it does not support.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import maskprior_jax as mp
    >>> q = k = v = jax.random.normal(jax.random.key(0), (2, 6, 4, 8))
    >>> bias = mp.attention.expand_mask(jnp.zeros((4, 11)), "relative_1d", 6, 6, max_len=6)
    >>> out = mp.dot_product_attention(q, k, v, bias=bias)
    >>> out.shape
    (2, 6, 4, 8)
    >>> blockwise = mp.dot_product_attention(q, k, v, bias=bias, implementation="blockwise", block_size=2)
    >>> bool(jnp.allclose(out, blockwise, atol=1e-5))
    True
  """
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
  """``jax.nn.dot_product_attention`` whose ``jax.vmap`` folds the mapped axis into the heads.

  R stacked runs, each with its own bias, become one call over R x N heads with the bias's batch
  dimension unchanged (cuDNN's batching rule would need a bias that carries the example batch).
  A boolean mask is added to the bias as a large negative logit, as JAX's cuDNN path does.

  Args:
    query: (B, T, N, H).
    key: (B, S, N, H).
    value: (B, S, N, H).
    bias: broadcastable to (B, N, T, S).
    mask: boolean, broadcastable to (B, N, T, S).
    implementation: passed to ``jax.nn.dot_product_attention``.

  Returns:
    The attention output, (B, T, N, H); gradients come from one backward call, the bias's at
    the bias's shape (batch 1 or B, N heads).
  """
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
  """A Flax-style attention function that adds a prior to its ``bias`` argument.

  How the Flax-named drop-ins (`maskprior_jax.linen`, `maskprior_jax.nnx.MultiHeadAttention`)
  hand their prior to Flax's own attention code. The result keeps ``attention_fn``'s signature
  (Flax filters the keywords it passes by it).

  Args:
    attention_fn: e.g. ``flax.linen.dot_product_attention``.
    prior: ``prior(q_len, kv_len)``, the dense (heads, q_len, kv_len) bias; cast to the logits'
      dtype.

  Returns:
    The wrapped attention function.
  """
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
