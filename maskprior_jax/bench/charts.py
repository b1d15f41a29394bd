"""The headline comparison of each benchmark as one chart (`maskprior report --chart FILE.png`), with
every seed drawn, from the same results.json files as the tables. `chart_data` is what the chart
shows, as plain numbers (written next to the picture as FILE.json, which the tests compare the way
they compare the tables); `draw` turns it into the picture."""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench import workdir as workdir_lib

HEADLINE_METHODS = ("vanilla", "mimetic", "qk", "mask")   # the methods every benchmark compares


def _boolean(pooled: Sequence[dict]) -> dict:
  """Per task and method, every seed's unseen MSE over the MDI's (fitted runs; the others counted),
  and the structure-only bound."""
  from maskprior_jax.bench.boolean import report
  tasks = []
  for res in pooled:
    per = {}
    for m in [m for m in results_lib.methods_in(res, HEADLINE_METHODS) if m in HEADLINE_METHODS]:
      runs = sorted((r for r in res["runs"] if r["method"] == m), key=lambda r: r["seed"])
      per[m] = {"fitted": [round(report.mdi_share(r["unseen_mse_true"], res["mdi_unseen_mse_true"]), 6)
                           for r in runs if r["fitted"]],
                "not_fitted": sum(not r["fitted"] for r in runs)}
    tasks.append({"task": res["task"], "bound": round(report.structure_bound(res), 6), "methods": per})
  return {"kind": "boolean", "tasks": tasks}


def _arithmetic(res: dict) -> dict:
  """Per method and training-set size, every seed's exact match on the test set."""
  sizes = sorted({r["train_size"] for r in res["runs"]})
  return {"kind": "arithmetic", "task": res["task"], "sizes": sizes,
          "methods": {m: [[round(r["exact_match"], 6) for r in sorted(res["runs"], key=lambda r: r["seed"])
                           if r["method"] == m and r["train_size"] == s] for s in sizes]
                      for m in results_lib.methods_in(res, HEADLINE_METHODS)}}


def _supervised(res: dict) -> dict:
  """Per method, every seed's headline metric (test accuracy, or bits per character)."""
  from maskprior_jax.bench import supervised_report
  key = supervised_report.headline_key(res)
  return {"kind": res["benchmark"], "metric": key,
          "methods": {m: [round(r[key], 6) for r in sorted(res["runs"], key=lambda r: r["seed"]) if r["method"] == m]
                      for m in results_lib.methods_in(res, HEADLINE_METHODS)}}


def chart_data(loaded: Sequence[dict], boolean_pooled: Sequence[dict] = ()) -> list[dict]:
  """One panel per results.json (the Boolean tasks pooled into one panel)."""
  panels = [_boolean(boolean_pooled)] if boolean_pooled else []
  for res in loaded:
    if res["benchmark"] == "arithmetic":
      panels.append(_arithmetic(res))
    elif res["benchmark"] in ("vision", "language"):
      panels.append(_supervised(res))
  return panels


def _dots(ax, x, values, color, width=0.12):
  jitter = np.linspace(-width, width, len(values)) if len(values) > 1 else np.zeros(1)
  ax.scatter(x + jitter, values, s=14, color=color, zorder=3)


def _draw_boolean(ax, panel):
  colors = {m: f"C{i}" for i, m in enumerate(HEADLINE_METHODS)}
  methods = [m for m in HEADLINE_METHODS if any(m in t["methods"] for t in panel["tasks"])]
  step = 1.0 / (len(methods) + 1)
  for i, t in enumerate(panel["tasks"]):
    ax.hlines(t["bound"], i - 0.45, i + 0.45, colors="black", lw=1.2, label="structure-only bound" if i == 0 else None)
    for j, m in enumerate(methods):
      got = t["methods"].get(m)
      if not got:
        continue
      x = i - 0.5 + (j + 1) * step
      _dots(ax, x, got["fitted"], colors[m], width=step / 4)
      if got["fitted"]:
        ax.hlines(np.mean(got["fitted"]), x - step / 3, x + step / 3, colors=colors[m], lw=2,
                  label=m if i == 0 else None)
      if got["not_fitted"]:
        ax.annotate(f"{got['not_fitted']} not fitted", (x, 0.02), rotation=90, fontsize=6, ha="center",
                    va="bottom", color=colors[m])
  ax.axhline(1.0, ls="--", c="gray", lw=0.8)
  ax.set_xticks(range(len(panel["tasks"])), [t["task"] for t in panel["tasks"]], fontsize=8)
  ax.set(ylabel="unseen MSE / MDI's (1 = MDI, 0 = truth)")
  ax.set_title("Boolean: each fitted seed, the mean, and the structure-only bound (black)", fontsize=9)
  ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.12))


def _draw_arithmetic(ax, panel):
  for i, (m, per_size) in enumerate(panel["methods"].items()):
    sizes = [s for s, v in zip(panel["sizes"], per_size) if v]
    values = [v for v in per_size if v]
    ax.plot(sizes, [np.mean(v) for v in values], marker="o", ms=3, color=f"C{i}", label=m)
    for s, v in zip(sizes, values):
      ax.scatter([s] * len(v), v, s=8, color=f"C{i}", alpha=0.5)
  ax.set_xscale("log")
  ax.set_xticks(panel["sizes"], [f"{s:,}" for s in panel["sizes"]])
  ax.minorticks_off()
  ax.set(xlabel="training-set size", ylabel="exact match (test)", ylim=(-0.02, 1.02))
  ax.set_title(f"Arithmetic ({panel['task']}): each seed, and the mean", fontsize=9)
  ax.legend(fontsize=7)


def _draw_supervised(ax, panel):
  methods = list(panel["methods"])
  for i, m in enumerate(methods):
    v = panel["methods"][m]
    ax.hlines(np.mean(v), i - 0.3, i + 0.3, colors=f"C{i}", lw=2)
    _dots(ax, i, v, f"C{i}")
  ax.set_xticks(range(len(methods)), methods, fontsize=8)
  low, high = min(min(v) for v in panel["methods"].values()), max(max(v) for v in panel["methods"].values())
  pad = max(high - low, 1e-3) * 0.6
  ax.set_ylim(low - pad, high + pad)
  better = "lower is better" if panel["metric"] == "test_bits_per_char" else "higher is better"
  ax.set(ylabel=panel["metric"].replace("_", " "))
  ax.set_title(f"{panel['kind'].capitalize()}: each seed, and the mean ({better})", fontsize=9)


def draw(panels: Sequence[dict], path: str | os.PathLike) -> None:
  """The panels side by side (the Boolean panel is wider); writes `path` and its data as .json."""
  if not panels:
    raise results_lib.ReportError("nothing to chart: no Boolean, arithmetic, vision or language results")
  widths = [2.2 if p["kind"] == "boolean" else 1.0 for p in panels]
  fig, axes = results_lib.new_figure((4.6 * sum(widths), 4.0), ncols=len(panels), width_ratios=widths)
  for ax, panel in zip(np.atleast_1d(axes), panels):
    {"boolean": _draw_boolean, "arithmetic": _draw_arithmetic}.get(panel["kind"], _draw_supervised)(ax, panel)
  save(fig, panels, path)


def save(fig, data, path: str | os.PathLike) -> None:
  """A chart's picture at `path` and the numbers it draws beside it (`.json` for `.png`)."""
  fig.tight_layout()
  workdir_lib.path(path).parent.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_figure(fig, path)
  workdir_lib.write_text(os.fspath(path).removesuffix(".png") + ".json", json.dumps(data, indent=1) + "\n")


def write(found: Sequence[tuple[os.PathLike, dict]], path: str | os.PathLike) -> None:
  """`maskprior report --chart`: the chart of (path, results) pairs (Boolean folders pooled by task)."""
  from maskprior_jax.bench.boolean import report
  boolean = [(p, res) for p, res in found if res["benchmark"] == "boolean"]
  draw(chart_data([res for _, res in found], report.pool(boolean) if boolean else []), path)
