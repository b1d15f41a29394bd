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
# Both priors at once: the mask prior plus the QK initialisation (fitted with the prior in place).
COMBINED = ("mask_qk",)
# Reader designs (`boolean.designs`): one reader token per support; "reader_<design>".
DESIGN_METHODS = ("reader_p1", "reader_p2", "reader_d1", "reader_d2", "reader_a1", "reader_a2")
METHODS = runner.METHODS + CONTROLS + COMBINED + DESIGN_METHODS


def design_of(method: str) -> str | None:
  """The reader design a method runs ("p1", ...), or None."""
  return method.removeprefix("reader_") if method in DESIGN_METHODS else None

# Methods whose model carries a learnable bias (with the pattern from `prior_groups`, or zeros).
BIAS_METHODS = ("mask", "mask_positions", "mask_shuffled", "bias_zero", "mask_qk")
# Methods that run under the mask model's position setting (prior.pos_embedding).
MASK_POSITIONS = ("mask", "mask_shuffled", "bias_zero", "qk_nopos", "mask_qk")
# Methods whose prior `prior.corruption` corrupts (per seed, `corrupted_supports`).
CORRUPTIBLE = ("mask", "mask_qk")
# The attribution table: each control next to the two methods it sits between.
ATTRIBUTION = ("vanilla", "qk", "qk_nopos", "bias_zero", "mask_shuffled", "mask_positions", "mask")
# (label, control, method): the mask against a control that differs from it in one thing.
CONTRASTS = (("no positions (mask_positions → mask)", "mask_positions", "mask"),
             ("structure (mask_shuffled → mask)", "mask_shuffled", "mask"),
             ("the prior's values (bias_zero → mask)", "bias_zero", "mask"),
             ("where the prior lives (qk_nopos → mask)", "qk_nopos", "mask"))


def init_method(method: str) -> str:
  """How `runner.initial_variables` initialises a method's runs (qk_nopos and mask_qk as qk)."""
  return "qk" if method in ("qk_nopos", "mask_qk") else method


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


CORRUPTION_SALT = 20261205   # fixed with the rule below, before any run of it


def corrupted_supports(groups: Sequence[Sequence[int]], n: int, fraction: float, seed: int) -> list[list[int]]:
  """The task's supports with a fraction of them replaced by random supports of the same size: the
  imperfect-prior study's rule, written before any run of it.

  For run seed `seed`: rng = numpy's default_rng([CORRUPTION_SALT, seed]); k = round(fraction x
  the number of supports); the k supports at positions rng.choice(len(groups), k, replace=False)
  are each replaced by len(support) variables drawn without replacement from all n, redrawn while
  the draw equals any true support. Sizes, order and the other supports are kept, so 0 returns the
  task's supports and 1 replaces every one (no true support left). Raises ValueError for a
  fraction outside [0, 1], or where no wrong support of a size exists."""
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"prior.corruption must be in [0, 1], not {fraction}")
  true = [sorted(set(int(i) for i in g)) for g in groups]
  rng = np.random.default_rng([CORRUPTION_SALT, int(seed)])
  k = int(round(fraction * len(true)))
  replaced = set(int(i) for i in rng.choice(len(true), k, replace=False)) if k else set()
  out = []
  for i, g in enumerate(true):
    if i not in replaced:
      out.append(g)
      continue
    for _ in range(10000):
      draw = sorted(int(v) for v in rng.choice(n, len(g), replace=False))
      if draw not in true:
        break
    else:
      raise ValueError(f"no support of size {len(g)} over {n} variables differs from the task's")
    out.append(draw)
  return out
