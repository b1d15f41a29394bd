"""Reader designs for the Boolean benchmark: structure-only models in which each support (the
variable set of one monomial) is read by its own token, built from which variables interact and
nothing else (no coefficients, no values on the unseen domain).

**What p2, d1 and d2 compute outside attention.** Each support's count of +1 entries is computed
from the input ids in Python (`ids[:, list(s)].sum(-1)`) and fed through a per-support embedding
table. The attention tower does not compute that count: it is an input feature built by hand. d1
and d2 are therefore the structure-only count lookup built as a network, and their results ("within
0.01 of the count lookup") follow from that construction, not from an attention prior. Claims about
mask priors rest on the `mask` method and its controls (`bench/boolean/methods.py`).

Every design has one reader token per support after the n variable tokens; no CLS, no positional
embedding. A hard mask lets reader k attend only to its support's variables and itself, and the
variable tokens never attend to readers; the variable rows carry the mask prior of the `mask`
method (learnable, from the task's pattern). The prediction is a bias plus the sum over readers of
a linear readout of each reader's final LayerNormed state (`reader_readout`, sown per reader so the
mechanism can be read per support).

- p1: the above.
- p2: p1 plus a zero-initialised embedding of the support's count of +1 entries, per support,
  added to the reader's input (what a frozen uniform head over the support would read).
- d1 ("count readers"): readers attend to nothing but themselves and see only their count
  embedding; each readout is differenced against the same reader with a zero count embedding. A
  count never seen in training keeps its zero embedding, so its readout is exactly 0: the
  count-lookup reference's neutral value, as a network.
- d2: p2 with d1's differenced readout: readers attend to their supports as in p2, and each
  readout is the reader's with its count embedding minus the same reader's with a zero one, so an
  unseen count (embedding still zero) contributes exactly 0 whatever the attention reads.

Attention-only designs (no feature computed by hand from the input; round 4 of
`boolean.protocol`):

- a1 ("isolated readers"): p1 with the variable tokens isolated: each attends only to itself, so
  reader k's state is a function of its own support's bits, read through attention, and the
  prediction is a sum over supports. Without positions a reader cannot tell its support's
  variables apart, so each term is a function of the support's count of +1 entries: the count
  lookup's function class, with the count computed by attention.
- a2 ("shared readers"): a1 with one reader embedding per support size, shared by the supports of
  that size, and a learnable per-support scale (initialised at 1) on each reader's readout: every
  support of a size reads its bits through the same function, up to its scale.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from maskprior_jax import priors
from maskprior_jax.attention import MaskSettings
from maskprior_jax.models import Block

DESIGNS = ("p1", "p2", "d1", "d2", "a1", "a2")
ISOLATED = ("a1", "a2")   # variable tokens attend only to themselves
COUNTED = ("p2", "d1", "d2")   # a count embedding computed from the input ids
READOUT = "reader_readout"


def reader_mask(n: int, supports: Sequence[Sequence[int]], design: str) -> np.ndarray:
  """(n + R, n + R) boolean: variables attend to variables (a1, a2: each only to itself); reader k
  to its support and itself (d1: itself only)."""
  r = len(supports)
  allowed = np.zeros((n + r, n + r), bool)
  allowed[:n, :n] = np.eye(n, dtype=bool) if design in ISOLATED else True
  for k, s in enumerate(supports):
    allowed[n + k, n + k] = True
    if design != "d1":
      allowed[n + k, list(s)] = True
  return allowed


def reader_pattern(token_pattern: np.ndarray, supports: Sequence[Sequence[int]], design: str,
                   outside: float) -> np.ndarray:
  """(heads, n + R, n + R) initial bias: the mask prior's token rows among the variables (from
  `token_pattern`, (heads, n, n)), 0 where a reader may attend, `outside` elsewhere (those pairs are
  also excluded by `reader_mask`)."""
  heads, n, _ = token_pattern.shape
  allowed = reader_mask(n, supports, design)
  out = np.full((heads, n + len(supports), n + len(supports)), outside, np.float32)
  out[:, :n, :n] = np.where(allowed[:n, :n], token_pattern, outside)
  out[:, n:, :] = np.where(allowed[n:], 0.0, outside)[None]
  return out


class _Tower(nn.Module):
  depth: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  pattern: Any
  attention_implementation: str | None = None
  dtype: Any = None

  @nn.compact
  def __call__(self, h, allowed):
    for i in range(self.depth):
      h = Block(num_heads=self.num_heads, head_dim=self.head_dim, mlp_dim=self.mlp_dim,
                mask=MaskSettings(priors.from_matrix(self.pattern)), attention_implementation=self.attention_implementation,
                dtype=self.dtype, name=f"block_{i}")(h, mask=allowed)
    return nn.LayerNorm(name="ln_final")(h)


class ReaderModel(nn.Module):
  """A reader design (`DESIGNS`) for a task with n variables and the given supports; ids (batch, n)
  in {0, 1} (1 = +1). `pattern`: the initial bias from `reader_pattern`."""
  n: int
  supports: tuple[tuple[int, ...], ...]
  design: str
  pattern: Any
  dim: int = 64
  depth: int = 2
  num_heads: int = 4
  head_dim: int = 16
  mlp_dim: int = 128
  attention_implementation: str | None = None
  dtype: Any = None

  @nn.compact
  def __call__(self, ids):
    if self.design not in DESIGNS:
      raise ValueError(f"unknown design {self.design!r}; use {', '.join(DESIGNS)}")
    batch, r = ids.shape[0], len(self.supports)
    allowed = jnp.asarray(reader_mask(self.n, self.supports, self.design))[None, None]
    x = nn.Embed(2, self.dim, name="embed")(ids)
    if self.design == "a2":   # one reader embedding per support size, shared
      sizes = sorted({len(s) for s in self.supports})
      shared = self.param("readers", nn.initializers.normal(0.02), (len(sizes), self.dim))
      starts = shared[jnp.asarray([sizes.index(len(s)) for s in self.supports])]
    else:
      starts = self.param("readers", nn.initializers.normal(0.02), (r, self.dim))
    base = jnp.broadcast_to(starts, (batch, r, self.dim))
    counted = self.design in COUNTED
    if counted:
      size = max(len(s) for s in self.supports) + 1
      table = self.param("count_embed", nn.initializers.zeros, (r, size, self.dim))
      counts = jnp.stack([ids[:, list(s)].sum(-1) for s in self.supports], -1)            # (batch, R)
      with_count = base + table[jnp.arange(r)[None], counts]
    tower = _Tower(self.depth, self.num_heads, self.head_dim, self.mlp_dim, self.pattern,
                   self.attention_implementation, self.dtype, name="tower")
    readout = nn.Dense(1, use_bias=False, name="readout")

    def readers(start):
      h = tower(jnp.concatenate([x, start], 1), allowed)
      return readout(h[:, self.n:])[..., 0]                                                # (batch, R)

    contrib = readers(with_count if counted else base)
    if self.design == "a2":
      contrib = contrib * self.param("reader_scale", nn.initializers.ones, (r,))
    if self.design in ("d1", "d2"):
      contrib = contrib - readers(base)   # a zero count embedding (an unseen count) reads exactly 0
    self.sow("intermediates", READOUT, contrib)
    return contrib.sum(-1) + self.param("bias", nn.initializers.zeros, ())
