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
  """An initializer that returns a fixed matrix, broadcast to the shape the module asks for.

  Args:
    matrix: the initial logit bias, (q_len, kv_len) for every head or (heads, q_len, kv_len) for
      one bias per head (e.g. from `group_matrix`). Any array-like; stored as float32.

  Returns:
    An initializer ``init(key, shape, dtype) -> jax.Array`` for the "full" and "shared" mask kinds
    (``init.mask_kinds``). It ignores ``key``.

  Raises:
    ValueError: when called, if ``matrix`` does not broadcast to ``shape`` or is not finite.

  Example:
    >>> import jax, numpy as np
    >>> from maskprior_jax import priors
    >>> init = priors.from_matrix(np.eye(3) - 1.0)
    >>> init(jax.random.key(0), (2, 3, 3)).shape
    (2, 3, 3)
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
  """A logit-bias matrix from groups of interacting positions.

  A position attends with logit ``inside`` to every position of a group that contains it, a
  reader (e.g. a CLS position) to every position of its head's groups, every position to
  itself; every other pair gets ``outside``.

  Args:
    groups: lists of positions (0 to ``seq_len - 1``) that interact.
    seq_len: the sequence length (the matrix is ``seq_len x seq_len`` per head).
    num_heads: deal the groups to this many heads round-robin (head h holds groups h, h + H,
      ...); None: every group in one shared pattern.
    inside: logit for pairs that interact.
    outside: logit for every other pair.
    readers: positions whose rows read every position of their head's groups.
    self_attend: every position attends to itself with ``inside``.
    member_rows: a group's members attend to each other (False: only readers read the group).
    member_self: with ``member_rows``, a member attends to itself too (False: only to the other
      members).
    spare_heads: what a head left without a group gets: "cycle" (group ``h % len(groups)``) or
      "union" (all groups).

  Returns:
    A float32 ``np.ndarray`` of shape (num_heads, seq_len, seq_len), or (seq_len, seq_len)
    without ``num_heads``.

  Raises:
    ValueError: for no groups, a position outside ``0..seq_len - 1`` or an unknown
      ``spare_heads``.

  Example:
    >>> from maskprior_jax import priors
    >>> priors.group_matrix([[0, 1]], 3, outside=-8.0)
    array([[ 0.,  0., -8.],
           [ 0.,  0., -8.],
           [-8., -8.,  0.]], dtype=float32)
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
  """An initializer for a "full" or "shared" mask from groups of interacting positions.

  The logit values are `group_matrix`'s, built for the sequence length the module asks for.

  Args:
    groups: lists of positions that interact (e.g. the variables of one term of a function).
    inside: logit for pairs that interact.
    outside: logit for every other pair.
    per_head: one head per group (round-robin when groups outnumber heads); False: every head
      shares the union pattern.
    readers: positions (e.g. a CLS token) that read every position of their head's groups.
    self_attend: every position attends to itself with ``inside``.
    member_rows: a group's members attend to each other.
    spare_heads: "cycle" or "union", as in `group_matrix`.

  Returns:
    An initializer ``init(key, shape, dtype) -> jax.Array`` for shapes (heads, q_len, kv_len)
    ("full") and (q_len, kv_len) ("shared").

  Raises:
    ValueError: when called, for another shape or ``q_len != kv_len`` (self-attention only).

  Example:
    >>> import jax
    >>> from maskprior_jax import priors
    >>> init = priors.interaction_groups([[0, 1], [2, 3]], outside=-4.0)
    >>> bias = init(jax.random.key(0), (2, 4, 4))
    >>> bias[0]
    Array([[ 0.,  0., -4., -4.],
           [ 0.,  0., -4., -4.],
           [-4., -4.,  0., -4.],
           [-4., -4., -4.,  0.]], dtype=float32)
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
  """ALiBi's per-head slopes, ``2 ** (-8 h / H)`` for heads h = 1..H.

  Args:
    num_heads: the number of heads H.

  Returns:
    A float64 ``np.ndarray`` of shape (num_heads,), from ``2 ** (-8 / H)`` down to ``2 ** -8``.

  Example:
    >>> from maskprior_jax import priors
    >>> priors.alibi_slopes(4)
    array([0.25      , 0.0625    , 0.015625  , 0.00390625])
  """
  return 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)


def locality_1d(slopes: Sequence[float] | None = None, *, scale: float = 1.0):
  """A distance-decaying prior, ``B[h, q, k] = -scale * slope_h * |k - q|`` (a learnable ALiBi).

  Args:
    slopes: one slope per head; None: ALiBi's ``2 ** (-8 h / H)`` (`alibi_slopes`).
    scale: a factor on every slope.

  Returns:
    An initializer ``init(key, shape, dtype) -> jax.Array`` for the "full" (heads, q_len, kv_len)
    and "relative_1d" (heads, 2 * max_len - 1) mask kinds.

  Raises:
    ValueError: when called, for another shape or a number of slopes other than the heads'.

  Example:
    >>> import jax
    >>> import maskprior_jax as mp
    >>> layer = mp.MaskPriorAttention(num_heads=2, mask_init=mp.priors.locality_1d(slopes=[1.0, 0.5]),
    ...                               mask_kind="relative_1d", max_len=4)
    >>> variables = layer.init(jax.random.key(0), jax.numpy.ones((1, 4, 8)))
    >>> variables["mask_prior"]["bias"]   # offsets k - q = -3 .. 3
    Array([[-3. , -2. , -1. ,  0. , -1. , -2. , -3. ],
           [-1.5, -1. , -0.5,  0. , -0.5, -1. , -1.5]], dtype=float32)
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
  """2-D locality over a (height, width) grid of patches.

  With ``offsets`` it is an impulse prior: head h favours the patch at its offset (dy, dx)
  (logit ``inside``) over every other (``outside``), like one tap of a convolution kernel.
  Without, a distance decay ``-slope_h * sqrt(dy**2 + dx**2)``.

  Args:
    grid: (height, width) of the patch grid.
    offsets: one (dy, dx) per head, for the impulse prior.
    slopes: one slope per head for the distance decay; None: 4 x ALiBi's slopes.
    inside: the impulse prior's logit at a head's offset.
    outside: the impulse prior's logit elsewhere.
    num_prefix: tokens before the grid (e.g. 1 for a CLS token) in a "full" mask; they get bias 0
      to and from every token.

  Returns:
    An initializer ``init(key, shape, dtype) -> jax.Array`` for the "relative_2d"
    (heads, (2 height - 1)(2 width - 1)) and "full" (heads, P + N, P + N) mask kinds, with P =
    ``num_prefix`` and N = height x width.

  Raises:
    ValueError: when called, for a shape that fits neither kind, or a number of offsets or
      slopes other than the heads'.

  Example:
    >>> import jax
    >>> from maskprior_jax import priors
    >>> init = priors.locality_2d((2, 2), offsets=[(0, 0), (0, 1)])
    >>> init(jax.random.key(0), (2, 9))[1]   # 3 x 3 table of offsets; head 1 favours (0, +1)
    Array([-4., -4., -4., -4., -4.,  0., -4., -4., -4.], dtype=float32)
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
