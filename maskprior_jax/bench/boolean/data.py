"""The Boolean cube and the points a GOTU task trains on."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
  from maskprior_jax.bench.boolean.tasks import Task


def cube(n: int) -> np.ndarray:
  """All 2^n points of {-1,+1}^n as int8 (2^n, n); point p has x_i = 1 - 2 * bit_i(p)."""
  p = np.arange(2 ** n, dtype=np.int64)[:, None]
  return (1 - 2 * ((p >> np.arange(n)) & 1)).astype(np.int8)


def relevant_points(task: Task) -> tuple[np.ndarray, np.ndarray]:
  """The cube over the task's relevant variables, (2^k, k), and the same points embedded in
  n dimensions with every other variable at +1; f and the seen condition only read the former."""
  rel = task.relevant()
  xr = cube(len(rel))
  full = np.ones((xr.shape[0], task.n), np.int8)
  full[:, list(rel)] = xr
  return xr, full


def seen_points(task: Task, rng: np.random.Generator, max_enumerate: int = 20,
                num_samples: int = 1 << 18) -> np.ndarray:
  """Every seen point when n <= max_enumerate, else `num_samples` sampled seen points."""
  if task.n <= max_enumerate:
    x = cube(task.n)
    return x[task.is_seen(x)]
  out = []
  while sum(len(o) for o in out) < num_samples:
    x = (1 - 2 * rng.integers(0, 2, (num_samples, task.n))).astype(np.int8)
    out.append(x[task.is_seen(x)])
  return np.concatenate(out)[:num_samples]
