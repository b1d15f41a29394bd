"""Blockwise attention in pure JAX: an online softmax over key blocks, and a custom VJP that
recomputes the scores block by block and returns the bias gradient at the bias's own size.

XLA's attention keeps batch x heads x T x S scores (and probabilities) for the backward pass. Here
the forward pass keeps only the output and each row's log-sum-exp; the backward pass walks the key
blocks again, so its temporaries are batch x heads x T x block. The bias gradient is summed over
every axis the bias was broadcast along (a prior shared by the batch gets a (1, heads, T, S)
gradient, not one per example). Works on any backend; layout as `jax.nn.dot_product_attention`:
query (B, T, N, H), key and value (B, S, N, H), bias and boolean mask broadcastable to (B, N, T, S).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["blockwise_attention"]


def _as4(x):
  if x is None:
    return None
  x = jnp.asarray(x)
  return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _block(x, j, size, length):
  """Key block j of a (., ., ., S or 1) array (a broadcast key axis is kept as is)."""
  if x is None or x.shape[-1] == 1:
    return x
  return jax.lax.dynamic_slice_in_dim(x, j * size, size, axis=3) if x.shape[-1] == length else x


def _pad_keys(x, pad):
  """Pad the key axis (last) of a bias or mask to the padded length (broadcast axes stay 1)."""
  if x is None or x.shape[-1] == 1 or pad == 0:
    return x
  return jnp.pad(x, ((0, 0),) * 3 + ((0, pad),))


def _scores(q, k, bias, mask, valid, scale):
  s = jnp.einsum("bnth,bnsh->bnts", q, k) * scale
  if bias is not None:
    s = s + bias
  if mask is not None:
    s = jnp.where(mask, s, jnp.finfo(s.dtype).min)   # as XLA's attention: a fully masked row is uniform
  return jnp.where(valid, s, -jnp.inf)               # padding keys count for nothing


def _prepare(query, key, value, bias, mask, block_size):
  dt = jnp.promote_types(jnp.float32, query.dtype)
  q = jnp.swapaxes(query, 1, 2).astype(dt)                      # (B, N, T, H)
  k, v = (jnp.swapaxes(x, 1, 2).astype(dt) for x in (key, value))
  S = k.shape[2]
  size = min(block_size, S)
  nb = -(-S // size)
  pad = nb * size - S
  if pad:
    k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k, v))
  bias4 = None if bias is None else _pad_keys(_as4(bias).astype(dt), pad)
  mask4 = None if mask is None else _pad_keys(_as4(mask).astype(bool), pad)
  valid = (jnp.arange(nb * size) < S)[None, None, None, :]
  return q, k, v, bias4, mask4, valid, dict(S=S, size=size, nb=nb, scale=1.0 / jnp.sqrt(q.shape[-1]).astype(dt))


def _forward(query, key, value, bias, mask, block_size):
  q, k, v, bias4, mask4, valid, g = _prepare(query, key, value, bias, mask, block_size)
  size, L = g["size"], g["nb"] * g["size"]
  B, N, T, H = q.shape

  def body(carry, j):
    m, denom, acc = carry
    kj, vj = (jax.lax.dynamic_slice_in_dim(x, j * size, size, axis=2) for x in (k, v))
    s = _scores(q, kj, _block(bias4, j, size, L), _block(mask4, j, size, L),
                jax.lax.dynamic_slice_in_dim(valid, j * size, size, axis=3), g["scale"])
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    return (m_new, denom * corr + p.sum(-1), acc * corr[..., None] + jnp.einsum("bnts,bnsh->bnth", p, vj)), None
  init = (jnp.full((B, N, T), -jnp.inf, q.dtype), jnp.zeros((B, N, T), q.dtype), jnp.zeros((B, N, T, H), q.dtype))
  (m, denom, acc), _ = jax.lax.scan(body, init, jnp.arange(g["nb"]))
  out = acc / denom[..., None]
  return jnp.swapaxes(out, 1, 2).astype(query.dtype), m + jnp.log(denom)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def blockwise_attention(query, key, value, bias=None, mask=None, block_size: int = 128):
  """Dot-product attention with an additive logit bias, computed key block by key block.

  The forward pass keeps only the output and each row's log-sum-exp; the custom VJP walks the
  key blocks again, so temporaries are batch x heads x T x ``block_size``, and the bias gradient
  comes back at the bias's own size.

  Args:
    query: (B, T, N, H).
    key: (B, S, N, H).
    value: (B, S, N, H).
    bias: an additive logit bias broadcastable to (B, N, T, S).
    mask: boolean, broadcastable to (B, N, T, S); False excludes a pair.
    block_size: keys per block.

  Returns:
    The attention output, (B, T, N, H), in the query's dtype.
  """
  return _forward(query, key, value, bias, mask, block_size)[0]


def _fwd(query, key, value, bias, mask, block_size):
  out, lse = _forward(query, key, value, bias, mask, block_size)
  return out, (query, key, value, bias, mask, out, lse)


def _bwd(block_size, res, d_out):
  query, key, value, bias, mask, out, lse = res
  q, k, v, bias4, mask4, valid, g = _prepare(query, key, value, bias, mask, block_size)
  size, nb, scale, L = g["size"], g["nb"], g["scale"], g["nb"] * g["size"]
  do = jnp.swapaxes(d_out, 1, 2).astype(q.dtype)                               # (B, N, T, H)
  delta = jnp.sum(do * jnp.swapaxes(out, 1, 2).astype(q.dtype), -1)           # (B, N, T)
  bias_keys = None if bias4 is None else bias4.shape[-1]

  def reduce_to_bias(ds):
    axes = tuple(a for a in range(3) if bias4.shape[a] == 1)
    ds = ds.sum(axes, keepdims=True) if axes else ds
    return ds.sum(-1, keepdims=True) if bias_keys == 1 else ds

  def body(carry, j):
    dq, dbias_sum = carry
    kj, vj = (jax.lax.dynamic_slice_in_dim(x, j * size, size, axis=2) for x in (k, v))
    mj = _block(mask4, j, size, L)
    s = _scores(q, kj, _block(bias4, j, size, L), mj, jax.lax.dynamic_slice_in_dim(valid, j * size, size, axis=3),
                scale)
    p = jnp.exp(s - lse[..., None])
    dv = jnp.einsum("bnts,bnth->bnsh", p, do)
    ds = p * (jnp.einsum("bnth,bnsh->bnts", do, vj) - delta[..., None])
    if mj is not None:
      ds = jnp.where(mj, ds, 0.0)                      # a masked score has no gradient (as XLA's where)
    dq = dq + jnp.einsum("bnts,bnsh->bnth", ds, kj) * scale
    dk = jnp.einsum("bnts,bnth->bnsh", ds, q) * scale
    db = None
    if bias4 is not None:
      db = reduce_to_bias(ds)
      if bias_keys == 1:
        dbias_sum, db = dbias_sum + db, None
    return (dq, dbias_sum), (dk, dv, db)
  dbias0 = None if bias_keys != 1 else jnp.zeros(bias4.shape, q.dtype)
  (dq, dbias_sum), (dk, dv, db) = jax.lax.scan(body, (jnp.zeros_like(q), dbias0), jnp.arange(nb))
  join = lambda x: jnp.moveaxis(x, 0, 2).reshape(x.shape[1], x.shape[2], nb * size, x.shape[-1])[:, :, :g["S"]]
  d_query = jnp.swapaxes(dq, 1, 2).astype(query.dtype)
  d_key, d_value = (jnp.swapaxes(join(x), 1, 2).astype(key.dtype) for x in (dk, dv))
  d_bias = None
  if bias is not None:
    if bias_keys == 1:
      full = dbias_sum
    else:   # (nb, b, n, t, size) -> (b, n, t, nb * size) -> the real keys
      full = jnp.moveaxis(db, 0, 3).reshape(db.shape[1:4] + (nb * size,))[..., :g["S"]]
    d_bias = full.reshape(jnp.shape(bias)).astype(jnp.asarray(bias).dtype)
  return d_query, d_key, d_value, d_bias, None


blockwise_attention.defvjp(_fwd, _bwd)
