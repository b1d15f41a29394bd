"""The tables and plots of the vision and language benchmarks (`vision.report` and
`language.report` are this module), from run records (results.json): test accuracy or bits per
char per method against the best baseline, and persistence."""
from __future__ import annotations

import os

import numpy as np

from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.workdir import path as as_path, write_text


def headline_key(results: dict) -> str:
  return "test_bits_per_char" if results.get("task") == "lm" else "test_accuracy"


def table(results: dict) -> str:
  key = headline_key(results)
  lower_better = key == "test_bits_per_char"
  methods = results_lib.methods_in(results)
  mean = {m: np.mean([r[key] for r in results["runs"] if r["method"] == m]) for m in methods}
  baselines = [m for m in methods if m != "mask"]
  best = (min if lower_better else max)(baselines, key=lambda m: mean[m]) if baselines else None
  rows = []
  for m in methods:
    vals = [r[key] for r in results["runs"] if r["method"] == m]
    if best is None or m == best:
      gap = "-"
    elif lower_better:
      gap = f"{(mean[m] - mean[best]) / mean[best]:+.1%} vs {best}"
    else:
      gap = f"{100 * (mean[m] - mean[best]):+.1f} points vs {best}"
    rows.append([m, len(vals), results_lib.mean_std(vals), gap])
  what = "test bits per char (byte)" if lower_better else "test accuracy"
  head = f"**{results['benchmark']}: {results['dataset']}**"
  if "unigram_bits_per_char" in results:
    head += f"; unigram entropy of the test text {results['unigram_bits_per_char']:.3f} bits per char"
  out = head + "\n\n" + results_lib.markdown_table(["method", "seeds", what, "against the best baseline"], rows)
  out += "\nPersistence (attention TV from the prior's pattern, start → end, mean over layers and seeds):\n\n"
  out += results_lib.persistence_table(results)
  return out


def write_report(results: dict, workdir: str | os.PathLike) -> None:
  """table.md and the plots of a run folder."""
  workdir = as_path(workdir)
  write_text(workdir / "table.md", table(results))
  curves = results["curves"]
  if not curves:
    return
  key = headline_key(results)
  ref = {"unigram": results["unigram_bits_per_char"]} if "unigram_bits_per_char" in results else None
  results_lib.plot_curves(workdir / "test_curve.png", results_lib.metric_curves(curves, key),
                         title=f"{results['dataset']}: {key.replace('_', ' ')} (eval subset)", ylabel=key, hlines=ref)
  results_lib.plot_curves(workdir / "persistence.png", results_lib.metric_curves(curves, "attn_tv"),
                         title=f"{results['dataset']}: attention distance from the prior's pattern",
                         ylabel="mean TV distance (layers)")
