"""The arithmetic benchmark's protocol, written down before the confirmation run: which seeds
explore, which confirm, the budget measurement and the rule that picks the default.

- Exploration (`experiments/arithmetic_explore.py`) uses EXPLORATION_SEEDS only.
  1. Budget: vanilla, mask, coupling and mask_coupling at BUDGET_SIZES, trained BUDGET_STEPS steps
     with each weight decay of BUDGET_WEIGHT_DECAYS; the test exact match is read off the eval
     curve at every step count of BUDGET_CHECKPOINTS.
  2. Prior variants (VARIANTS, config overrides of the mask method) at VARIANT_SIZES, with the
     budget chosen in 1.
- Budget rule (`select_budget`): a longer budget or a stronger weight decay is adopted only if it
  lifts some method's mean test exact match at some budget size by more than that cell's seed
  spread (the larger of the two standard deviations) over the current budget (1,500 steps, weight
  decay 0.1); among the settings that do, the one with the largest lift is taken. The step count
  must keep the CPU default (six methods, five seeds) under about 30 minutes on 2 cores; the
  training sizes are then reduced (the largest first, where vanilla is already at 100%) to fit.
- Variant rule (`select_variant`): score = mean over VARIANT_SIZES of the mask's mean greedy exact
  match; the best variant replaces the current default ("window") only if its score beats the
  default's by more than the spread (mean over sizes of the default's standard deviation).
- Confirmation: `maskprior arithmetic` with CONFIRMATION_SEEDS and every method, run once with
  the chosen default; its table is reported as run.
"""
from __future__ import annotations

import numpy as np

from maskprior_jax.bench.config import LATER_KEYS

EXPLORATION_SEEDS = tuple(range(100, 105))
CONFIRMATION_SEEDS = tuple(range(0, 5))

CURRENT_BUDGET = {"steps": 1500, "weight_decay": 0.1}
BUDGET_METHODS = ("vanilla", "mask", "coupling", "mask_coupling")
BUDGET_SIZES = (250, 500)
BUDGET_STEPS = 6000
BUDGET_CHECKPOINTS = (1500, 3000, 6000)
BUDGET_WEIGHT_DECAYS = (0.1, 1.0)

# Set after the budget measurement, before any variant ran: first (250, 500, 1000, 2000), then
# (500, 1000) to save time; the budget runs (weight decay 1, 6,000 steps) put the methods apart at
# 250 and 500, and the CPU default's half hour holds only these two sizes at that budget.
VARIANT_SIZES = (250, 500)
DEFAULT = "window"
VARIANTS = {
    DEFAULT: [],                                                  # places i and i-1 at 0, else -4
    "carry": ["--config.prior.kind=carry"],                       # every lower place, -1 per place below i-1
    "outside_2": ["--config.prior.outside=-2.0"],                 # a weaker prior
    "outside_8": ["--config.prior.outside=-8.0"],                 # a stronger prior
}


# The second round's optimizer and data, which the budget and variant runs above used (the default
# config then: lr 1e-3 and every key added since at its earlier value, `config.LATER_KEYS`);
# `experiments/arithmetic_explore.py` passes these so that it still reproduces them.
SECOND_ROUND = ["--config.train.learning_rate=0.001", *(f"--config.{k}={v}" for k, v in LATER_KEYS.items())]


def select_budget(cells: dict) -> tuple[dict, str]:
  """`cells[(method, size, steps, weight_decay)]` = per-seed test exact match. Returns (budget, why)."""
  base = CURRENT_BUDGET
  best, lift_best, why = dict(base), 0.0, "no longer budget lifts any method beyond the seed spread"
  for (m, n, steps, wd), v in cells.items():
    ref = cells.get((m, n, base["steps"], base["weight_decay"]))
    if ref is None or (steps, wd) == (base["steps"], base["weight_decay"]):
      continue
    lift = float(np.mean(v) - np.mean(ref))
    spread = max(float(np.std(v)), float(np.std(ref)))
    if lift > spread and lift > lift_best:
      best, lift_best = {"steps": steps, "weight_decay": wd}, lift
      why = (f"{m} at {n} examples: {np.mean(ref):.3f} -> {np.mean(v):.3f} "
             f"(+{lift:.3f}, spread {spread:.3f}) with {steps} steps, weight decay {wd}")
  return best, why


def select_variant(table: dict[str, dict[int, list[float]]]) -> tuple[str, str]:
  """`table[variant][size]` = the mask's per-seed greedy exact match. Returns (variant, why)."""
  if DEFAULT not in table:
    raise ValueError("the variant table needs the current default")
  scores = {v: float(np.mean([np.mean(x) for x in t.values()])) for v, t in table.items()}
  spread = float(np.mean([np.std(x) for x in table[DEFAULT].values()]))
  best = max(scores, key=scores.get)
  if best != DEFAULT and scores[best] - scores[DEFAULT] > spread:
    return best, f"{best} scores {scores[best]:.3f} vs default {scores[DEFAULT]:.3f} (spread {spread:.3f})"
  return DEFAULT, (f"best other {best} scores {scores[best]:.3f} vs default {scores[DEFAULT]:.3f}: "
                   f"not beyond the spread {spread:.3f}; the default stays")


# ----------------------------------------------------------------------------- third round: the recipe
# Written before any run of it (issue: a recipe that does not collapse, selection on validation).
# - Fixed parts (every method alike): linear warmup over RECIPE_WARMUP_FRACTION of the steps, cosine
#   decay to 0, global-norm clipping at 1, AdamW b2 0.98, weight decay on weight matrices only, the
#   QK-initialised query/key kernels and the mask prior not decayed (qk_mask_decay "none"; the
#   variant "init", both decaying toward their initial values, is run beside it), a validation
#   split of RECIPE_VAL_SIZE pairs, and published position coupling with its random offset.
# - Grid on the exploration seeds (RECIPE_SEEDS), sizes RECIPE_SIZES, all six methods, RECIPE_STEPS
#   steps: learning rate x weight decay (RECIPE_GRID).
# - Rule (`select_recipe`): a setting is eligible when at least RECIPE_MIN_FIT of its runs end at
#   >= 95% exact match on their own training set. Among eligible settings, the one with the highest
#   mean over (method, size) of the mean-over-seeds validation exact match at the selected step
#   (never the test set); a setting within RECIPE_TIE of the best counts as tied, and ties go to the
#   smaller learning rate, then the smaller weight decay. If none is eligible, the one with the most
#   fitted runs. Every method weighs the same in the score, so no method picks the recipe.
# - Confirmation: sizes CURVE_SIZES, six methods, CONFIRMATION_SEEDS, the chosen setting, run once.
RECIPE_SEEDS = EXPLORATION_SEEDS[:3]
RECIPE_SIZES = (250, 1000)
RECIPE_STEPS = 6000
RECIPE_WARMUP_FRACTION = 0.05
RECIPE_VAL_SIZE = 500
RECIPE_GRID = {"learning_rate": (5e-4, 1e-3, 2e-3), "weight_decay": (0.1, 1.0)}
RECIPE_MIN_FIT = 0.9
RECIPE_TIE = 0.005
CURVE_SIZES = (250, 500, 1000, 2000)


def recipe_overrides(learning_rate: float, weight_decay: float, qk_mask_decay: str = "none",
                     steps: int = RECIPE_STEPS) -> list[str]:
  """The config overrides of one recipe setting (the fixed parts and the grid's two values)."""
  return [f"--config.train.steps={steps}", f"--config.train.learning_rate={learning_rate}",
          f"--config.train.weight_decay={weight_decay}", f"--config.train.warmup_steps={int(RECIPE_WARMUP_FRACTION * steps)}",
          "--config.train.schedule=cosine", "--config.train.grad_clip_norm=1.0", "--config.train.b2=0.98",
          "--config.train.decay_on=matrices", f"--config.train.qk_mask_decay={qk_mask_decay}",
          f"--config.task.val_size={RECIPE_VAL_SIZE}", "--config.task.coupling=published"]


def select_recipe(cells: dict) -> tuple[tuple[float, float], str]:
  """`cells[(learning_rate, weight_decay)]` = list of run records (dicts with "method",
  "selected_val_exact", "final_train_exact"). Returns ((learning_rate, weight_decay), why)."""
  stats = {}
  for setting, runs in cells.items():
    fit = float(np.mean([r["final_train_exact"] >= 0.95 for r in runs]))
    groups = {}
    for r in runs:
      groups.setdefault((r["method"], r.get("train_size")), []).append(r["selected_val_exact"])
    stats[setting] = (fit, float(np.mean([np.mean(v) for v in groups.values()])))
  eligible = {s: v for s, v in stats.items() if v[0] >= RECIPE_MIN_FIT}
  if not eligible:
    best = max(stats, key=lambda s: (stats[s][0], stats[s][1]))
    return best, (f"no setting has {RECIPE_MIN_FIT:.0%} of runs fitted; the most fitted: lr {best[0]}, "
                  f"weight decay {best[1]} ({stats[best][0]:.0%} fitted, validation {stats[best][1]:.3f})")
  top = max(v[1] for v in eligible.values())
  tied = sorted(s for s, v in eligible.items() if v[1] >= top - RECIPE_TIE)
  best = tied[0]
  return best, (f"lr {best[0]}, weight decay {best[1]}: mean validation exact match {stats[best][1]:.3f} "
                f"(best {top:.3f}; {len(tied)} within {RECIPE_TIE}), {stats[best][0]:.0%} of runs fitted; "
                f"eligible {len(eligible)} of {len(stats)}")
