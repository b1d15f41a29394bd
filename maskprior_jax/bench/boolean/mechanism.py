"""What a model predicts where it never saw data, next to the truth, the MDI and two
interpolants built from the task's structure alone.

Unseen points are grouped so that a table can show them (`unseen_groups`):
- "relevant": by the configuration of the relevant variables, where the unseen domain has at
  most 8 of them (f1, f2, f4);
- "counts": by the number of +1 entries in each support (a head that averages uniformly over a
  support sees exactly this), where that gives at most 16 groups (frozen-coordinate);
- "condition": by the configuration of the seen condition's variables (f3).

Reference interpolants, computed exactly on the relevant variables' cube, both fitted to the
seen points by minimum-norm least squares and using only which variables interact:
- `support_lsq`: the span of every monomial inside a support of the target (all subsets of
  each support, the constant included);
- `count_lookup`: per support, one free value per count of +1 entries, summed over supports
  (what a bias that turns each support into a lookup table over its count can represent).
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from maskprior_jax.bench.boolean.algebra import _min_norm_solve
from maskprior_jax.bench.boolean.data import relevant_points
from maskprior_jax.bench.boolean.tasks import Task

MAX_RELEVANT_GROUPS = 8
MAX_COUNT_GROUPS = 16


def _support_monomials(task: Task) -> list[tuple[int, ...]]:
  out = set()
  for g in task.groups:
    for d in range(len(g) + 1):
      out.update(itertools.combinations(g, d))
  return sorted(out, key=lambda m: (len(m), m))


def _count_features(task: Task, x: np.ndarray) -> np.ndarray:
  """(N, sum_g |g|+1) one-hot of each support's count of +1 entries."""
  cols = []
  for g in task.groups:
    count = (x[:, list(g)] > 0).sum(1)
    cols.append(np.stack([count == c for c in range(len(g) + 1)], 1))
  return np.concatenate(cols, 1).astype(np.float64)


def _monomial_features(monomials, x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  return np.stack([np.prod(x[:, list(m)], axis=1) if m else np.ones(len(x)) for m in monomials], 1)


def support_lsq(task: Task) -> Callable[[np.ndarray], np.ndarray]:
  """Minimum-norm least squares on the seen points in the span of the support monomials."""
  _, full = relevant_points(task)
  seen = task.is_seen(full)
  mons = _support_monomials(task)
  c = _min_norm_solve(_monomial_features(mons, full[seen]), task.f(full[seen]).astype(np.float64))
  return lambda x: _monomial_features(mons, x) @ c


def count_lookup(task: Task) -> Callable[[np.ndarray], np.ndarray]:
  """Minimum-norm least squares on the seen points over per-support count indicators."""
  _, full = relevant_points(task)
  seen = task.is_seen(full)
  c = _min_norm_solve(_count_features(task, full[seen]), task.f(full[seen]).astype(np.float64))
  return lambda x: _count_features(task, x) @ c


def _keys(task: Task, x: np.ndarray, by: str) -> list[tuple]:
  if by == "relevant":
    return [tuple(r) for r in x[:, list(task.relevant())].tolist()]
  if by == "counts":
    return [tuple(r) for r in np.stack([(x[:, list(g)] > 0).sum(1) for g in task.groups], 1).tolist()]
  cond = sorted(task._condition[1])
  return [tuple(r) for r in x[:, cond].tolist()]


def _label(task: Task, key: tuple, by: str) -> str:
  sign = lambda v: "+" if v > 0 else "-"
  if by == "relevant":
    return " ".join(f"x{i}{sign(v)}" for i, v in zip(task.relevant(), key))
  if by == "counts":
    return ", ".join(f"#+{{{','.join(f'x{i}' for i in g)}}}={c}" for g, c in zip(task.groups, key))
  return " ".join(f"x{i}{sign(v)}" for i, v in zip(sorted(task._condition[1]), key))


def unseen_groups(task: Task) -> tuple[str, list[tuple]]:
  """(grouping, sorted keys of the unseen groups); see the module docstring."""
  _, full = relevant_points(task)
  unseen = full[~task.is_seen(full)]
  for by, limit in (("relevant", MAX_RELEVANT_GROUPS), ("counts", MAX_COUNT_GROUPS)):
    keys = sorted(set(_keys(task, unseen, by)))
    if len(keys) <= limit:
      return by, keys
  return "condition", sorted(set(_keys(task, unseen, "condition")))


def group_ids(task: Task, x: np.ndarray, by: str, keys: list[tuple]) -> np.ndarray:
  """(N,) index into `keys` of each point's group; -1 for seen points."""
  index = {k: i for i, k in enumerate(keys)}
  ids = np.array([index.get(k, -1) for k in _keys(task, x, by)], np.int64)
  ids[task.is_seen(x)] = -1
  return ids


def group_means(values: np.ndarray, ids: np.ndarray, num_groups: int) -> list[float]:
  """Mean of `values` (N,) over each group (NaN for an empty group)."""
  sums = np.bincount(ids[ids >= 0], weights=values[ids >= 0], minlength=num_groups)
  counts = np.bincount(ids[ids >= 0], minlength=num_groups)
  return [float(s / c) if c else float("nan") for s, c in zip(sums, counts)]


def describe(task: Task, mdi: Callable[[np.ndarray], np.ndarray]) -> dict:
  """The task's mechanism record: grouping, labels, and per group the truth, the MDI and the two
  reference interpolants (means over the relevant cube); the references' unseen MSE."""
  by, keys = unseen_groups(task)
  _, full = relevant_points(task)
  ids = group_ids(task, full, by, keys)
  refs = {"support_lsq": support_lsq(task), "count_lookup": count_lookup(task)}
  out = {"by": by, "groups": [_label(task, k, by) for k in keys],
         "size": np.bincount(ids[ids >= 0], minlength=len(keys)).tolist(),
         "truth": group_means(task.f(full).astype(np.float64), ids, len(keys)),
         "mdi": group_means(mdi(full), ids, len(keys))}
  unseen = ~task.is_seen(full)
  truth_unseen = task.f(full[unseen])
  for name, g in refs.items():
    out[name] = group_means(g(full), ids, len(keys))
    out[f"{name}_unseen_mse"] = float(np.mean((g(full[unseen]) - truth_unseen) ** 2))
    out[f"{name}_seen_max_error"] = float(np.abs(g(full[~unseen]) - task.f(full[~unseen])).max())
  return out
