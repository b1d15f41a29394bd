"""How each mask kind stores its bias and expands it to a dense logit bias, and the cache step of
autoregressive decoding: arrays in, arrays out (the modules in `maskprior_jax.attention` and
`maskprior_jax.nnx` hold the variables). Every public name is re-exported by `maskprior_jax.attention`."""
from __future__ import annotations

import dataclasses
from typing import Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MaskLayout", "MASK_LAYOUTS", "MASK_KINDS", "mask_shape", "expand_mask", "relative_1d_index",
           "relative_2d_index", "decode_step", "dropout_shape"]

MaskKind = Literal["full", "shared", "relative_1d", "relative_2d"]

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
  """How one mask kind is stored and expanded (one entry of `MASK_LAYOUTS`).

  Attributes:
    shape: ``shape(num_heads, q_len, kv_len, max_len, grid)``, the stored bias's shape.
    expand: ``expand(stored, q_len, kv_len, max_len, grid, num_prefix)``, the dense
      (heads or 1, q_len, kv_len) bias.
  """
  shape: Callable[..., tuple[int, ...]]
  expand: Callable[..., jax.Array]


#: The one table of mask kinds: each kind's stored shape and dense expansion (`MaskLayout`).
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
#: The mask kinds: "full", "shared", "relative_1d", "relative_2d".
MASK_KINDS: tuple[str, ...] = tuple(MASK_LAYOUTS)


def _layout(kind: str) -> MaskLayout:
  if kind not in MASK_LAYOUTS:
    raise ValueError(f"unknown mask_kind {kind!r}; use {', '.join(MASK_KINDS)}")
  return MASK_LAYOUTS[kind]


def mask_shape(kind: str, num_heads: int, q_len: int, kv_len: int, *,
               max_len: int | None = None,
               grid: tuple[int, int] | None = None) -> tuple[int, ...]:
  """The shape of the stored bias of a mask kind (see `MASK_LAYOUTS`).

  Args:
    kind: "full", "shared", "relative_1d" or "relative_2d".
    num_heads: attention heads.
    q_len: query length.
    kv_len: key/value length.
    max_len: the longest sequence, for "relative_1d".
    grid: (height, width) of the patch grid, for "relative_2d".

  Returns:
    The stored shape: (num_heads, q_len, kv_len), (q_len, kv_len), (num_heads, 2 max_len - 1)
    or (num_heads, (2 height - 1)(2 width - 1)).

  Raises:
    ValueError: for an unknown kind, or a relative kind without its ``max_len`` or ``grid``.

  Example:
    >>> from maskprior_jax.attention import mask_shape
    >>> mask_shape("relative_1d", 4, 16, 16, max_len=32)
    (4, 63)
  """
  return _layout(kind).shape(num_heads, q_len, kv_len, max_len, grid)


def relative_1d_index(q_len: int, kv_len: int, max_len: int) -> np.ndarray:
  """Indices into a (2 max_len - 1) table of offsets: ``k - q + max_len - 1``.

  Args:
    q_len: query length.
    kv_len: key/value length.
    max_len: the table's longest sequence.

  Returns:
    An integer ``np.ndarray`` of shape (q_len, kv_len).

  Raises:
    ValueError: if a length exceeds ``max_len``.
  """
  if max(q_len, kv_len) > max_len:
    raise ValueError(f"sequence length {max(q_len, kv_len)} exceeds the relative mask's max_len={max_len}")
  return np.arange(kv_len)[None, :] - np.arange(q_len)[:, None] + max_len - 1


def relative_2d_index(grid: tuple[int, int]) -> np.ndarray:
  """Indices into a ((2 height - 1)(2 width - 1)) table of 2-D offsets on a patch grid.

  Args:
    grid: (height, width) of the patch grid; patches are numbered row by row.

  Returns:
    An integer ``np.ndarray`` of shape (height * width, height * width).
  """
  gh, gw = grid
  ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
  ys, xs = ys.reshape(-1), xs.reshape(-1)
  dy = ys[None, :] - ys[:, None] + gh - 1
  dx = xs[None, :] - xs[:, None] + gw - 1
  return dy * (2 * gw - 1) + dx


def expand_mask(stored: jax.Array, kind: str, q_len: int, kv_len: int, *,
                max_len: int | None = None, grid: tuple[int, int] | None = None,
                num_prefix: int = 0) -> jax.Array:
  """A stored mask prior as a dense logit bias (see `MASK_LAYOUTS`).

  Args:
    stored: the stored bias, in `mask_shape`'s shape for ``kind``.
    kind: its mask kind.
    q_len: query length.
    kv_len: key/value length.
    max_len: the offset table's length ("relative_1d").
    grid: (height, width) of the patch grid ("relative_2d").
    num_prefix: tokens before the grid ("relative_2d"); they get bias 0 to and from every token.

  Returns:
    The dense bias, (heads, q_len, kv_len), or (1, q_len, kv_len) for kind "shared".

  Raises:
    ValueError: for an unknown kind or lengths the layout cannot serve.
  """
  return _layout(kind).expand(stored, q_len, kv_len, max_len, grid, num_prefix)


def dropout_shape(weights_shape: tuple[int, ...], broadcast: bool) -> tuple[int, ...]:
  """The attention-dropout mask's shape, as Flax's ``dot_product_attention_weights``.

  Args:
    weights_shape: the attention weights' shape, (..., heads, q_len, kv_len).
    broadcast: Flax's ``broadcast_dropout``: one (q_len, kv_len) mask shared by every batch
      element and head.

  Returns:
    ``(1, ..., 1, q_len, kv_len)`` with ``broadcast``, else ``weights_shape``.
  """
  if not broadcast:
    return tuple(weights_shape)
  return (1,) * (len(weights_shape) - 2) + tuple(weights_shape[-2:])


def decode_step(cached_key, cached_value, position, key, value, mask):
  """One autoregressive step with a key/value cache (arrays in, arrays out; the modules store them).

  Args:
    cached_key: the cache's keys, (..., max_length, kv_heads, head_dim).
    cached_value: the cache's values, same shape.
    position: the cache index, an int32 scalar: where the new token is written.
    key: the new token's key, (..., 1, kv_heads, head_dim).
    value: the new token's value, same shape.
    mask: a boolean mask to combine with causality, or None.

  Returns:
    ``(keys, values, mask)``: the updated cache and ``mask`` combined with "key position <= the
    token's", (..., 1, 1, max_length).

  Raises:
    ValueError: if ``key`` is not one token of the cache's shape.
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
