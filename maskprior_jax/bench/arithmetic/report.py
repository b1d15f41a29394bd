"""The arithmetic benchmark's tables and plots, from run records (results.json): exact match by
training size and method (mean and per seed), training fit, the claim line, digit accuracy, steps
to 99%, exact match by carries and persistence. Used at the end of a run and by `maskprior report`."""
from __future__ import annotations

import os

import numpy as np

from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.workdir import path as as_path, write_figure, write_text


def claim_line(results: dict, threshold: float = 0.9, key: str = "exact_match") -> str:
  """The paper's low-data claim at the point where it matters: the largest training size where
  vanilla's mean exact match (`key`) is below `threshold`, and each other method's gain there with
  the seed spread (the larger of the two population standard deviations); a gain inside the spread
  is "no difference"."""
  vals = lambda m, n: [r[key] for r in results["runs"] if r["method"] == m and r["train_size"] == n and key in r]
  sizes = [n for n in sorted(results["train_sizes"], reverse=True) if vals("vanilla", n)]
  below = [n for n in sizes if np.mean(vals("vanilla", n)) < threshold]
  if not below or not vals("mask", below[0]):
    return ""
  n, v = below[0], vals("vanilla", below[0])

  def gain(m):
    g, spread = 100 * (np.mean(vals(m, n)) - np.mean(v)), 100 * max(np.std(vals(m, n)), np.std(v))
    return f"{m} {g:+.1f} (spread {spread:.1f}{', no difference' if abs(g) <= spread else ''})"
  gains = ", ".join(gain(m) for m in results_lib.methods_in(results) if m != "vanilla" and vals(m, n))
  what = "selected on validation" if key == "selected_exact" else "final"
  return (f"\nLargest training size where vanilla ({what}) is below {threshold:.0%}: **{n}** (vanilla "
          f"{100 * np.mean(v):.1f}%); gain over vanilla there, in points: {gains}.\n")


def table(results: dict) -> str:
  methods, sizes = results_lib.methods_in(results), results["train_sizes"]
  pick = lambda m, n, k: [r[k] for r in results["runs"] if r["method"] == m and r["train_size"] == n and k in r]
  name = (f"{results['digits']}-digit addition, answer {'reversed' if results['reverse'] else 'in the usual order'}"
          if results["task"] == "add" else f"addition mod {results['modulus']}")
  out = f"**{name}**; test set {results['test_size']} pairs, none in any training set.\n\n"
  out += "Test exact match (mean ± std over seeds):\n\n"
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [results_lib.mean_std(pick(m, n, "exact_match")) for m in methods]
                                    for n in sizes])
  bypick = lambda m, n: [f"{r['exact_match']:.3f}" for r in sorted(results["runs"], key=lambda r: r["seed"])
                         if r["method"] == m and r["train_size"] == n]
  out += "\nPer seed (seeds " + ", ".join(str(s) for s in sorted({r["seed"] for r in results["runs"]})) + "):\n\n"
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [", ".join(bypick(m, n)) or "-" for m in methods] for n in sizes])
  fits = lambda m, n: [f"{r['final_train_exact']:.2f}" for r in sorted(results["runs"], key=lambda r: r["seed"])
                       if r["method"] == m and r["train_size"] == n]
  out += ("\nTraining-set exact match at the end, per seed (below 0.99: the run no longer fits its "
          "training set, e.g. after a loss spike):\n\n")
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [", ".join(fits(m, n)) or "-" for m in methods] for n in sizes])
  out += claim_line(results)
  if any("selected_exact" in r for r in results["runs"]):
    out += ("\nTest exact match at each run's step of best validation exact match (the same rule for every "
            "method; mean ± std over seeds), and the median selected step:\n\n")
    out += results_lib.markdown_table(
        ["train size"] + methods,
        [[n] + [f"{results_lib.mean_std(pick(m, n, 'selected_exact'))} (step {np.median(pick(m, n, 'selected_step')):.0f})"
                if pick(m, n, "selected_exact") else "-" for m in methods] for n in sizes])
    out += claim_line(results, key="selected_exact")
    fitted = sum(r["final_train_exact"] >= 0.95 for r in results["runs"])
    out += f"\nRuns ending at >= 95% exact match on their training set: {fitted} of {len(results['runs'])}.\n"
  out += "\nDigit accuracy (greedy decoding):\n\n"
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [results_lib.mean_std(pick(m, n, "digit_accuracy")) for m in methods]
                                    for n in sizes])

  def steps99(m, n):
    v = pick(m, n, "steps_to_99_train")
    hit = [x for x in v if x is not None]
    return f"{np.mean(hit):.0f} ({len(hit)}/{len(v)})" if hit else f"never (0/{len(v)})"
  out += "\nSteps to 99% train exact match (mean over the seeds that got there; how many did):\n\n"
  out += results_lib.markdown_table(["train size"] + methods, [[n] + [steps99(m, n) for m in methods] for n in sizes])
  if results.get("test_carries") and all("exact_by_carries" in r for r in results["runs"]):
    counts = results["test_carries"]

    def by_carries(m, n):
      rows = np.asarray([r["exact_by_carries"] for r in results["runs"] if r["method"] == m and r["train_size"] == n],
                        dtype=float)
      return " / ".join("-" if np.isnan(v) else f"{v:.2f}" for v in rows.mean(0)) if len(rows) else "-"
    out += ("\nTest exact match by carries in the pair (0 / 1 / ... carries; test pairs with each count: "
            + " / ".join(map(str, counts)) + "), mean over seeds:\n\n")
    out += results_lib.markdown_table(["train size"] + methods, [[n] + [by_carries(m, n) for m in methods] for n in sizes])
  out += "\nPersistence: attention TV from the prior's pattern on the answer rows, start → end (mean over layers and runs):\n\n"
  out += results_lib.persistence_table(results)
  return out


def write_report(results: dict, workdir: str | os.PathLike) -> None:
  """table.md and the plots of a run folder."""
  workdir = as_path(workdir)
  write_text(workdir / "table.md", table(results))
  methods, sizes = results_lib.methods_in(results), results["train_sizes"]
  if not methods:
    return
  fig, ax = results_lib.new_figure((5.5, 3.6))
  for m in methods:
    vals = [[r["exact_match"] for r in results["runs"] if r["method"] == m and r["train_size"] == n] for n in sizes]
    ax.errorbar(sizes, [np.mean(v) for v in vals], yerr=[np.std(v) for v in vals], label=m, capsize=3, marker="o")
  ax.set_xscale("log")
  ax.set_xticks(sizes, [str(n) for n in sizes])
  ax.minorticks_off()
  ax.set(xlabel="training-set size", ylabel="test exact match", ylim=(-0.02, 1.02),
         title=f"{results['task']}: test exact match vs training size")
  ax.legend(fontsize=8)
  fig.tight_layout()
  write_figure(fig, workdir / "exact_match_vs_train_size.png")
  curves = results["curves"]
  results_lib.plot_curves(workdir / "persistence.png", results_lib.metric_curves(curves, "attn_tv"),
                         title=f"{results['task']}: attention distance from the prior (answer rows)",
                         ylabel="mean TV distance (layers)")
  results_lib.plot_curves(workdir / "test_exact_curves.png", results_lib.metric_curves(curves, "test_exact"),
                         title=f"{results['task']}: test exact match during training (all sizes)",
                         ylabel="test exact match")
