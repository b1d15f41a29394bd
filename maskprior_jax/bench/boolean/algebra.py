"""Fourier-Walsh analysis over the Boolean cube (fast Walsh-Hadamard transform), the degree
profile, and the minimum-degree interpolator (MDI) of a task's seen domain."""
from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Callable

import numpy as np

from maskprior_jax.bench.boolean.data import relevant_points

if TYPE_CHECKING:
  from maskprior_jax.bench.boolean.tasks import Task


def walsh_coefficients(values: np.ndarray) -> np.ndarray:
  """f_hat(S) for all S, from f on the whole cube in `cube(n)` order; index S is a bitmask."""
  a = np.asarray(values, np.float64).copy()
  n = int(np.log2(a.shape[0]))
  if a.shape[0] != 2 ** n:
    raise ValueError("walsh_coefficients needs all 2^n values of the cube")
  h = 1
  while h < a.shape[0]:
    a = a.reshape(-1, 2, h)
    a = np.stack([a[:, 0] + a[:, 1], a[:, 0] - a[:, 1]], axis=1).reshape(-1)
    h *= 2
  return a / a.shape[0]


def degree_profile(coefficients: np.ndarray) -> np.ndarray:
  """(n+1,) sums of f_hat(S)^2 over |S| = k."""
  n = int(np.log2(coefficients.shape[0]))
  sizes = np.array([bin(s).count("1") for s in range(2 ** n)])
  return np.bincount(sizes, weights=coefficients ** 2, minlength=n + 1)


def _monomials(k_vars: int, degree: int):
  return [c for d in range(degree + 1) for c in itertools.combinations(range(k_vars), d)]


@dataclasses.dataclass(frozen=True)
class Interpolator:
  """A polynomial sum_S c_S prod_{i in S} x_i over the task's variables."""
  terms: dict[tuple[int, ...], float]

  def __call__(self, x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0])
    for s, c in self.terms.items():
      out += c * (np.prod(x[:, list(s)], axis=1) if s else 1.0)
    return out

  def pretty(self, tol: float = 1e-9) -> str:
    parts = [f"{c:+.4g}{''.join(f' x{i}' for i in s) if s else ''}"
             for s, c in sorted(self.terms.items(), key=lambda t: (len(t[0]), t[0])) if abs(c) > tol]
    return " ".join(parts) if parts else "0"


def _min_norm_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Minimum-norm least squares with an absolute singular-value cut-off (the columns are
  +-1 monomials, so singular values below 1e-8 are round-off of an exact zero)."""
  if a.size == 0:
    return np.zeros(a.shape[1])
  u, sv, vt = np.linalg.svd(a, full_matrices=False)
  keep = sv > 1e-8 * np.sqrt(a.shape[0])
  return vt[keep].T @ ((u[:, keep].T @ b) / sv[keep])


def minimum_degree_interpolator(task: Task, tol: float = 1e-9) -> Interpolator:
  """The MDI of f on the seen domain, computed exactly.

  Variables outside the target and the condition do not enter (averaging over them keeps
  agreement and lowers every degree's energy), so the fit runs on the relevant variables.
  Degree by degree from the target's degree down, the degree-d coefficients are the
  minimum-norm least-squares solution after projecting out what lower degrees span.
  """
  rel = task.relevant()
  k = len(rel)
  if k > 20:
    raise ValueError(f"MDI over {k} relevant variables is too large to enumerate")
  xr, full = relevant_points(task)
  fvals, seen = task.f(full), task.is_seen(full)
  coeffs = walsh_coefficients(fvals)
  sizes = np.array([bin(s).count("1") for s in range(2 ** k)])
  degree = int(sizes[np.abs(coeffs) > tol].max()) if np.any(np.abs(coeffs) > tol) else 0
  xs = xr[seen].astype(np.float64)
  mons = _monomials(k, degree)
  phi = np.stack([np.prod(xs[:, list(m)], axis=1) if m else np.ones(len(xs)) for m in mons], axis=1)
  deg_of = np.array([len(m) for m in mons])
  residual = fvals[seen].astype(np.float64)
  result = {}
  for d in range(degree, -1, -1):
    lower = phi[:, deg_of < d]
    cur = phi[:, deg_of == d]
    if lower.shape[1]:
      u, sv, _ = np.linalg.svd(lower, full_matrices=False)
      q = u[:, sv > 1e-8 * np.sqrt(lower.shape[0])]  # orthonormal basis of what lower degrees span
      proj = lambda v, q=q: v - q @ (q.T @ v)
    else:
      proj = lambda v: v
    c = _min_norm_solve(proj(cur), proj(residual))
    residual = residual - cur @ c
    for m, ci in zip([m for m in mons if len(m) == d], c):
      if abs(ci) > tol:
        result[tuple(rel[i] for i in m)] = float(ci)
  if np.abs(residual).max() > 1e-6:
    raise AssertionError("MDI does not interpolate the seen domain")
  return Interpolator(result)


def unseen_mse(task: Task, g: Callable[[np.ndarray], np.ndarray]) -> float:
  """Mean over unseen points of (g - f)^2, over the relevant variables' cube."""
  _, full = relevant_points(task)
  unseen = ~task.is_seen(full)
  return float(np.mean((g(full[unseen]) - task.f(full[unseen])) ** 2))
