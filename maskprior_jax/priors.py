"""Mask priors from structure: functions that return Flax-style initializers.

Each builder returns `init(key, shape, dtype) -> B` for `MaskPriorAttention(mask_init=...)`.
The shape the module asks for depends on `mask_kind` (see `attention.MASK_LAYOUTS`):
"full" (heads, q_len, kv_len), "shared" (q_len, kv_len), "relative_1d"
(heads, 2*max_len-1), "relative_2d" (heads, (2gh-1)*(2gw-1)).
A builder checks the shape it is asked for and raises a ValueError naming the mismatch,
and names the mask kinds it serves (`init.mask_kinds`), so that `MaskPriorAttention` refuses
it under another kind. Priors use only structure (which positions interact), never target
values.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from maskprior_jax.attention import relative_2d_index

__all__ = ["from_matrix", "group_matrix", "interaction_groups", "alibi_slopes", "locality_1d", "locality_2d"]


def _for_kinds(*kinds: str):
  """Mark an initializer with the mask kinds whose stored shape it understands."""
  def mark(init):
    init.mask_kinds = kinds
    return init
  return mark


def _finish(value: np.ndarray, shape, dtype, what: str):
  value = np.asarray(value, dtype=np.float32)
  try:
    value = np.broadcast_to(value, tuple(shape))
  except ValueError:
    raise ValueError(f"{what}: prior of shape {value.shape} does not broadcast to the "
                     f"requested mask shape {tuple(shape)}") from None
  if not np.all(np.isfinite(value)):
    raise ValueError(f"{what}: the prior must be finite")
  return jnp.asarray(value + 0.0, dtype=dtype)  # +0.0 turns -0.0 into 0.0


def from_matrix(matrix) -> Callable:
  """Initializer returning `matrix`, broadcast to the requested shape.

  A (q_len, kv_len) matrix serves every head of a "full" mask; a (heads, q_len, kv_len)
  array gives each head its own.
  """
  matrix = np.asarray(matrix, dtype=np.float32)

  @_for_kinds("full", "shared")
  def init(key, shape, dtype=jnp.float32):
    del key
    return _finish(matrix, shape, dtype, "from_matrix")
  return init


def group_matrix(groups: Sequence[Sequence[int]], seq_len: int, *, num_heads: int | None = None,
                 inside: float = 0.0, outside: float = -8.0,
                 readers: Sequence[int] = (), self_attend: bool = True,
                 member_rows: bool = True, member_self: bool = True,
                 spare_heads: str = "cycle") -> np.ndarray:
  """Logit bias from groups of interacting positions.

  A position attends with logit `inside` to every position of a group that contains it
  (`member_rows`; with `member_self=False` to the other members only, not itself), `readers`
  (e.g. a CLS position) to every position of their head's groups, every other position to
  itself (`self_attend`); every other pair gets `outside`. With
  `num_heads`, the groups are dealt to heads round-robin (head h holds groups h, h+H, ...)
  and a head left without a group gets the union of all. Without `num_heads`, all groups
  share one pattern.

  Returns (num_heads, seq_len, seq_len) or (seq_len, seq_len).
  """
  groups = [sorted(set(int(i) for i in g)) for g in groups]
  if not groups:
    raise ValueError("group prior needs at least one group")
  for g in groups:
    if not g or min(g) < 0 or max(g) >= seq_len:
      raise ValueError(f"group {g} has positions outside 0..{seq_len - 1}")
  for r in readers:
    if not 0 <= r < seq_len:
      raise ValueError(f"reader position {r} outside 0..{seq_len - 1}")

  def pattern(gs):
    inside_mask = np.zeros((seq_len, seq_len), bool)
    for g in gs:
      idx = np.asarray(g)
      if member_rows:
        inside_mask[np.ix_(idx, idx)] = True
      for r in readers:
        inside_mask[r, idx] = True
    if self_attend:
      inside_mask[np.arange(seq_len), np.arange(seq_len)] = True
    if member_rows and not member_self:
      members = np.unique(np.concatenate([np.asarray(g) for g in gs]))
      inside_mask[members, members] = False
    return np.where(inside_mask, inside, outside).astype(np.float32)

  if num_heads is None:
    return pattern(groups)
  if spare_heads not in ("cycle", "union"):
    raise ValueError(f"spare_heads must be cycle or union, not {spare_heads!r}")
  heads = []
  for h in range(num_heads):
    mine = groups[h::num_heads]
    if not mine:
      mine = [groups[h % len(groups)]] if spare_heads == "cycle" else groups
    heads.append(pattern(mine))
  return np.stack(heads)


def interaction_groups(groups: Sequence[Sequence[int]], *, inside: float = 0.0,
                       outside: float = -8.0, per_head: bool = True,
                       readers: Sequence[int] = (), self_attend: bool = True,
                       member_rows: bool = True, spare_heads: str = "cycle"):
  """Initializer for a "full" or "shared" mask from groups of interacting positions.

  per_head=True: one head per group (round-robin when groups outnumber heads); else every
  head shares the union pattern. See `group_matrix` for the logit values.
  """
  @_for_kinds("full", "shared")
  def init(key, shape, dtype=jnp.float32):
    del key
    if len(shape) == 3:
      heads, q_len, kv_len = shape
    elif len(shape) == 2:
      heads, (q_len, kv_len) = None, shape
    else:
      raise ValueError(f"interaction_groups: needs a 'full' (heads, q, kv) or 'shared' (q, kv) "
                       f"mask, got shape {tuple(shape)}")
    if q_len != kv_len:
      raise ValueError(f"interaction_groups: self-attention only, got q_len={q_len}, kv_len={kv_len}")
    m = group_matrix(groups, q_len, num_heads=heads if per_head else None, inside=inside,
                     outside=outside, readers=readers, self_attend=self_attend,
                     member_rows=member_rows, spare_heads=spare_heads)
    return _finish(m, shape, dtype, "interaction_groups")
  return init


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi's per-head slopes 2^(-8h/H), h = 1..H."""
  return 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)


def locality_1d(slopes: Sequence[float] | None = None, *, scale: float = 1.0):
  """Distance-decaying prior: B[h, q, k] = -scale * slope_h * |k - q| (learnable ALiBi).

  Works for "full" (heads, q, kv) and "relative_1d" (heads, 2*max_len-1) masks; slopes
  default to ALiBi's 2^(-8h/H).
  """
  @_for_kinds("full", "relative_1d")
  def init(key, shape, dtype=jnp.float32):
    del key
    if len(shape) not in (2, 3):
      raise ValueError(f"locality_1d: needs a 'full' or 'relative_1d' mask, got shape {tuple(shape)}")
    heads = shape[0]
    s = alibi_slopes(heads) if slopes is None else np.asarray(slopes, np.float32)
    if s.shape != (heads,):
      raise ValueError(f"locality_1d: {s.shape[0]} slopes for {heads} heads")
    if len(shape) == 2:  # relative table over offsets -(L-1)..(L-1)
      max_len = (shape[1] + 1) // 2
      dist = np.abs(np.arange(shape[1]) - (max_len - 1))[None]
    else:
      dist = np.abs(np.arange(shape[2])[None, :] - np.arange(shape[1])[:, None])[None]
    return _finish(-scale * s.reshape(-1, *([1] * (len(shape) - 1))) * dist, shape, dtype, "locality_1d")
  return init


def locality_2d(grid: tuple[int, int], *, offsets: Sequence[tuple[int, int]] | None = None,
                slopes: Sequence[float] | None = None, inside: float = 0.0,
                outside: float = -4.0, num_prefix: int = 0):
  """2-D locality over a (gh, gw) patch grid.

  With `offsets` (one (dy, dx) per head): an impulse prior, head h favours the patch at
  offset (dy, dx) (logit `inside`) over all others (`outside`), like one tap of a
  convolution kernel. Otherwise a distance decay -slope_h * euclidean distance.
  Works for "relative_2d" (heads, (2gh-1)*(2gw-1)) and "full" (heads, P+N, P+N) masks,
  P = num_prefix tokens that get 0 bias.
  """
  gh, gw = grid

  def offset_table(heads):
    dy, dx = np.meshgrid(np.arange(-(gh - 1), gh), np.arange(-(gw - 1), gw), indexing="ij")
    dy, dx = dy.reshape(-1), dx.reshape(-1)
    if offsets is not None:
      if len(offsets) != heads:
        raise ValueError(f"locality_2d: {len(offsets)} offsets for {heads} heads")
      return np.stack([np.where((dy == oy) & (dx == ox), inside, outside) for oy, ox in offsets])
    s = alibi_slopes(heads) * 4 if slopes is None else np.asarray(slopes, np.float32)
    if s.shape != (heads,):
      raise ValueError(f"locality_2d: {len(s)} slopes for {heads} heads")
    return -s[:, None] * np.sqrt(dy ** 2 + dx ** 2)[None]

  @_for_kinds("relative_2d", "full")
  def init(key, shape, dtype=jnp.float32):
    del key
    table_len = (2 * gh - 1) * (2 * gw - 1)
    if len(shape) == 2 and shape[1] == table_len:
      return _finish(offset_table(shape[0]), shape, dtype, "locality_2d")
    if len(shape) == 3 and shape[1] == shape[2] == gh * gw + num_prefix:
      dense = offset_table(shape[0])[:, relative_2d_index(grid)]
      dense = np.pad(dense, ((0, 0), (num_prefix, 0), (num_prefix, 0)))
      return _finish(dense, shape, dtype, "locality_2d")
    raise ValueError(f"locality_2d: shape {tuple(shape)} fits neither a relative_2d table "
                     f"(heads, {table_len}) nor a full mask over {num_prefix}+{gh * gw} tokens")
  return init
