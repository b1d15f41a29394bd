"""The Boolean benchmark's methods: the four every benchmark compares (`runner.METHODS`) and the
attribution controls, each of which changes one thing against a method there.

The mask model differs from vanilla in two things: it carries the prior, and by default it has no
positional embedding (`prior.pos_embedding`). The controls take them apart:

- mask_positions: the mask prior with the model's usual positional embedding (mask minus "no
  positions": what the positions' removal does);
- mask_shuffled: the same mask kind and support sizes over variables drawn at random (seeded by
  `prior.shuffle_seed`, disjoint from the true supports where the task leaves enough variables):
  right shape, wrong structure;
- bias_zero: a learnable bias of the mask's shape initialised at zero, with the mask model's other
  settings (no positions, the mask's learning rule): the bias without the prior;
- qk_nopos: the QK initialisation under the mask model's position setting, so that qk_nopos and
  mask differ only in where the prior lives (query/key weights or an additive bias).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from maskprior_jax.bench import runner

CONTROLS = ("mask_positions", "mask_shuffled", "bias_zero", "qk_nopos")
# Reader designs (`boolean.designs`): one reader token per support; "reader_<design>".
DESIGN_METHODS = ("reader_p1", "reader_p2", "reader_d1", "reader_d2")
METHODS = runner.METHODS + CONTROLS + DESIGN_METHODS


def design_of(method: str) -> str | None:
  """The reader design a method runs ("p1", ...), or None."""
  return method.removeprefix("reader_") if method in DESIGN_METHODS else None

# Methods whose model carries a learnable bias (with the pattern from `prior_groups`, or zeros).
BIAS_METHODS = ("mask", "mask_positions", "mask_shuffled", "bias_zero")
# Methods that run under the mask model's position setting (prior.pos_embedding).
MASK_POSITIONS = ("mask", "mask_shuffled", "bias_zero", "qk_nopos")
# The attribution table: each control next to the two methods it sits between.
ATTRIBUTION = ("vanilla", "qk", "qk_nopos", "bias_zero", "mask_shuffled", "mask_positions", "mask")
# (label, control, method): the mask against a control that differs from it in one thing.
CONTRASTS = (("no positions (mask_positions → mask)", "mask_positions", "mask"),
             ("structure (mask_shuffled → mask)", "mask_shuffled", "mask"),
             ("the prior's values (bias_zero → mask)", "bias_zero", "mask"),
             ("where the prior lives (qk_nopos → mask)", "qk_nopos", "mask"))


def init_method(method: str) -> str:
  """How `runner.initial_variables` initialises a method's runs (qk_nopos as qk)."""
  return "qk" if method == "qk_nopos" else method


def shuffled_groups(groups: Sequence[Sequence[int]], n: int, seed: int) -> list[list[int]]:
  """Groups of the same sizes over variables drawn at random (seeded): each drawn from the
  variables outside every true group when there are enough of them, otherwise from all n; never
  equal to a true group where another choice exists."""
  rng = np.random.default_rng(seed)
  true = [sorted(set(int(i) for i in g)) for g in groups]
  outside = sorted(set(range(n)) - {i for g in true for i in g})
  out = []
  for g in true:
    pool = outside if len(outside) >= len(g) else list(range(n))
    for _ in range(1000):
      draw = sorted(int(i) for i in rng.choice(pool, len(g), replace=False))
      if draw not in true:
        break
    out.append(draw)
  return out
