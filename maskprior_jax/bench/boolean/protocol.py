"""The Boolean benchmark's protocol: which seeds and tasks explore, which confirm, and the rule
that picks the default prior, written down before the confirmation run.

- Exploration: prior variants are compared on EXPLORATION_TASKS (tasks of our own, none of the
  five headline tasks) with EXPLORATION_SEEDS, by `experiments/boolean_explore.py`.
- Selection (`select_default`), fixed before the confirmation run: a variant is eligible when its
  mask runs fit the seen domain in at least 80% of (task, seed) pairs. Score: the mean over
  exploration tasks of the median over seeds of unseen MSE / MDI's unseen MSE (unfitted runs
  count as 1, the MDI's error). The lowest score wins, but it replaces the current default only
  if it beats the default's score by more than the seed spread (the mean over tasks of the
  default's standard deviation over seeds); otherwise the default stays.
- Confirmation: the headline (`maskprior boolean`, the five GOTU tasks) with CONFIRMATION_SEEDS,
  run once with the selected default; its table is reported as run.
"""
from __future__ import annotations

import numpy as np

from maskprior_jax.bench.boolean.tasks import Task

EXPLORATION_SEEDS = tuple(range(100, 105))
CONFIRMATION_SEEDS = tuple(range(0, 5))

# Tasks of our own with the headline tasks' kinds of structure (a parity of two with a free
# variable in its support, three weighted pairs on a parity-restricted domain, a frozen variable
# shared by two monomials, a majority), at n = 8.
EXPLORATION_TASKS = {
    "e_parity3": Task("e_parity3", 8, "x0x1x2", "x0 == 1 | x1 == 1"),
    "e_pairs": Task("e_pairs", 8, "x0x1 + 2 x1x2 - 0.5 x0x2", "x0*x1*x2 == 1"),
    "e_frozen": Task("e_frozen", 8, "x0x1x2 + x0x3x4", "x0 == 1"),
    "e_majority5": Task("e_majority5", 8, "sign(x0 + x1 + x2 + x3 + x4)", "x0 == 1 | x1 == 1"),
}

DEFAULT = "default"
# The built-in default when the exploration ran (round 2), so that the exploration reruns as it
# ran whatever the default is now: variable tokens attend inside their supports (themselves
# included), the mask model has the model's learned positions at the input.
EXPLORATION_BASE = ["--config.prior.token_rows=group", "--config.prior.pos_embedding=model"]
# Each variant is a set of config overrides on EXPLORATION_BASE, one line each, applied to the
# mask runs (the reference method runs with the base).
VARIANTS = {
    DEFAULT: [],                                                    # positions at the input, outside -4, learned
    "noself": ["--config.prior.token_rows=noself"],                 # members attend to the other members only
    "layered": ["--config.prior.layers=layered"],                   # layer 0 inside supports, layer 1 CLS reads
    "pos_none": ["--config.prior.pos_embedding=none"],              # exact symmetry inside a support
    "pos_qk": ["--config.model.pos_where=qk"],                      # positions in queries/keys, not values
    "outside_8": ["--config.prior.outside=-8.0"],                   # a stronger prior
    "frozen": ["--config.prior.mode=frozen"],                       # the mask never trains
    "noself_pos_none": ["--config.prior.token_rows=noself", "--config.prior.pos_embedding=none"],
}
# What the rule selected on the exploration split (runs/explore/selection.md), now the built-in
# default; the confirmation run uses it unchanged.
SELECTED = "noself_pos_none"
MIN_FIT_SHARE = 0.8


def score(ratios_by_task: dict[str, list[float | None]]) -> tuple[float, float, float]:
  """(score, fit share, spread) of one variant: ratios are unseen MSE / MDI's per seed, None where
  the run did not fit (counted as 1)."""
  medians, stds, fitted, total = [], [], 0, 0
  for values in ratios_by_task.values():
    v = np.asarray([1.0 if r is None else r for r in values], float)
    medians.append(float(np.median(v)))
    stds.append(float(np.std(v)))
    fitted += sum(r is not None for r in values)
    total += len(values)
  return float(np.mean(medians)), fitted / max(total, 1), float(np.mean(stds))


def select_default(table: dict[str, dict[str, list[float | None]]]) -> tuple[str, str]:
  """The selection rule above, applied to {variant: {task: per-seed ratios}}. Returns (variant, why)."""
  scores = {v: score(t) for v, t in table.items()}
  eligible = {v: s for v, s in scores.items() if s[1] >= MIN_FIT_SHARE}
  if DEFAULT not in scores:
    raise ValueError("the exploration table needs the current default")
  if not eligible:
    return DEFAULT, "no variant fits in 80% of runs; the default stays"
  best = min(eligible, key=lambda v: eligible[v][0])
  base_score, _, spread = scores[DEFAULT]
  if best != DEFAULT and base_score - eligible[best][0] > spread:
    return best, (f"{best} scores {eligible[best][0]:.3f} against the default's {base_score:.3f}, "
                  f"better by more than the seed spread {spread:.3f}")
  return DEFAULT, (f"best eligible variant {best} scores {eligible[best][0]:.3f} against the default's "
                   f"{base_score:.3f}; the difference is within the seed spread {spread:.3f}, the default stays")
