"""Imperfect priors on the Boolean headline: the mask prior with a share of its supports replaced by
random supports of the same size (`boolean.methods.corrupted_supports`, drawn per seed by a rule
fixed before any run), crossed with how the prior trains, plus both priors at once (`mask_qk`).

  python experiments/boolean_corruption.py run --workdir experiments/results/boolean_corruption
  python experiments/boolean_corruption.py report --workdir experiments/results/boolean_corruption

`run`: one standard run folder per cell (`maskprior boolean --methods mask --seeds 0-4` with the
cell's overrides; the headline budget, the five tasks), skipping finished cells, so the same command
continues. The cell (0%, learned at the base rate) is the committed headline's own `mask` runs (the
same config and seeds): it is read from `experiments/results/boolean_headline`, not rerun.
`report`: corruption.md (per task: unseen MSE / MDI's, excess over the structure-only bound, fitted
counts, per-seed values, persistence) and one plot per task, from the run folders.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

LEVELS = (0.0, 0.25, 0.5, 1.0)
MODES = {"learned": ["--config.prior.mode=learned"],
         "frozen": ["--config.prior.mode=frozen"],
         "learned_10x": ["--config.prior.mode=learned", "--config.prior.mask_lr_multiplier=10.0"]}
HEADLINE = pathlib.Path(__file__).resolve().parent / "results" / "boolean_headline"
SEEDS = "0-4"


def cells():
  """(folder name, method, overrides) in run order: the base rate first, then frozen, then 10x; mask_qk."""
  out = []
  for mode in MODES:
    for level in LEVELS:
      if (level, mode) == (0.0, "learned"):
        continue   # the headline's own mask runs
      out.append((f"c{int(level * 100):03d}_{mode}", "mask", [f"--config.prior.corruption={level}", *MODES[mode]]))
    if mode == "learned":
      out.append(("mask_qk", "mask_qk", []))
  return out


def folder_of(root: pathlib.Path, level: float, mode: str) -> pathlib.Path:
  return HEADLINE if (level, mode) == (0.0, "learned") else root / f"c{int(level * 100):03d}_{mode}"


def run(root: pathlib.Path, only: list[str] | None) -> None:
  from maskprior_jax.bench import cli
  for name, method, overrides in cells():
    if only and name not in only:
      continue
    done = root / name / "summary.md"
    if done.exists():
      print(f"[corruption] {name}: finished, skipped", flush=True)
      continue
    t0 = time.time()
    argv = ["boolean", "--methods", method, "--seeds", SEEDS, "--workdir", str(root / name), *overrides]
    rc = cli.main(argv)
    print(f"[corruption] {name}: exit {rc}, {time.time() - t0:.0f} s", flush=True)
    if rc:
      raise SystemExit(rc)


def _load(folder: pathlib.Path, method: str) -> dict:
  """task -> (results.json, that method's runs sorted by seed)."""
  out = {}
  for p in sorted(folder.glob("*/results.json")):
    res = json.loads(p.read_text())
    runs = sorted((r for r in res["runs"] if r["method"] == method), key=lambda r: r["seed"])
    if runs:
      out[res["task"]] = (res, runs)
  return out


def _stats(res, runs):
  from maskprior_jax.bench.boolean import report as br
  ref = res["mdi_unseen_mse_true"]
  fitted = [br.mdi_share(r["unseen_mse_true"], ref) for r in runs if r["fitted"]]
  per_seed = [br.mdi_share(r["unseen_mse_true"], ref) if r["fitted"] else None for r in runs]
  tv = [float(np.mean(r["persistence"][-1]["attn_tv"])) for r in runs]
  tv0 = [float(np.mean(r["persistence"][0]["attn_tv"])) for r in runs]
  drift = [r["persistence"][-1].get("mask_drift") for r in runs if r["persistence"][-1].get("mask_drift") is not None]
  return {"fitted": fitted, "per_seed": per_seed, "n": len(runs), "tv0": tv0, "tv": tv, "drift": drift,
          "bound": br.structure_bound(res)}


def _cell(s) -> str:
  if not s["fitted"]:
    return f"did not fit (0/{s['n']})"
  return f"{np.mean(s['fitted']):.3f} ± {np.std(s['fitted']):.3f} ({len(s['fitted'])}/{s['n']})"


def report(root: pathlib.Path) -> str:
  from maskprior_jax.bench import results as results_lib
  grid = {(lv, m): _load(folder_of(root, lv, m), "mask") for lv in LEVELS for m in MODES
          if (folder_of(root, lv, m) / "f1_threesym").exists() or folder_of(root, lv, m) == HEADLINE}
  vanilla = _load(HEADLINE, "vanilla")
  qk = _load(HEADLINE, "qk")
  both = _load(root / "mask_qk", "mask_qk") if (root / "mask_qk").exists() else {}
  tasks = list(vanilla)
  lines = ["# Imperfect priors: corrupted supports x how the prior trains (seeds 0-4, the headline budget)", "",
           "Unseen MSE as a share of the MDI's, mean ± population std over the fitted seeds (fitted/run). "
           "Corruption: the share of the task's supports replaced per seed by random supports of the same size "
           "(`corrupted_supports`). The cell (0%, learned) is the headline's `mask`. vanilla and qk: the headline's.", ""]
  for task in tasks:
    v, q = _stats(*vanilla[task]), _stats(*qk[task])
    bound = v["bound"]
    k = len(vanilla[task][0]["groups"])
    replaced = ", ".join(f"{lv:.0%}: {int(round(lv * k))}" for lv in LEVELS)
    lines += [f"## {task} (structure-only bound {bound:.3f}; vanilla {_cell(v)}; qk {_cell(q)})", "",
              f"{k} supports; replaced per seed ({replaced}; Python's round, half to even).", ""]
    header = ["corruption"] + [f"{m}" for m in MODES] + [f"{m}: excess over the bound" for m in MODES]
    rows = []
    for lv in LEVELS:
      row = [f"{lv:.0%}"]
      stats = {m: _stats(*grid[(lv, m)][task]) if (lv, m) in grid and task in grid[(lv, m)] else None for m in MODES}
      row += [_cell(s) if s else "not run" for s in stats.values()]
      row += [f"{np.mean(s['fitted']) - bound:+.3f}" if s and s["fitted"] else "-" for s in stats.values()]
      rows.append(row)
    lines += [results_lib.markdown_table(header, rows), ""]
    pers = []
    for lv in LEVELS:
      for m in MODES:
        if (lv, m) in grid and task in grid[(lv, m)]:
          s = _stats(*grid[(lv, m)][task])
          per = ", ".join("did not fit" if x is None else f"{x:.2f}" for x in s["per_seed"])
          drift = f"{np.mean(s['drift']):.4f}" if s["drift"] else "-"
          pers.append([f"{lv:.0%}", m, per, f"{np.mean(s['tv0']):.2f} → {np.mean(s['tv']):.2f}", drift])
    lines += ["Per seed (seeds 0-4) and persistence (attention TV from the *task's* pattern, start → end; "
              "‖B−B0‖/‖B0‖ at the end):", "",
              results_lib.markdown_table(["corruption", "mode", "unseen / MDI's per seed", "attn TV", "‖B−B0‖/‖B0‖"], pers), ""]
    if task in both:
      s = _stats(*both[task])
      excess = f", excess {np.mean(s['fitted']) - bound:+.3f}" if s["fitted"] else ""
      per = ", ".join("did not fit" if x is None else f"{x:.2f}" for x in s["per_seed"])
      drift = f"{np.mean(s['drift']):.4f}" if s["drift"] else "-"
      lines += [f"Both priors at once (`mask_qk`: the prior plus the QK initialisation, 0% corruption, learned): "
                f"{_cell(s)}{excess}; per seed {per}; attn TV {np.mean(s['tv0']):.2f} → {np.mean(s['tv']):.2f}, "
                f"‖B−B0‖/‖B0‖ {drift}.", ""]
    _plot(root, task, grid, v, q, bound)
  text = "\n".join(lines)
  (root / "corruption.md").write_text(text)
  return text


def _plot(root, task, grid, v, q, bound):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5, 3.4))
  for m in MODES:
    xs, ys, es = [], [], []
    for lv in LEVELS:
      if (lv, m) in grid and task in grid[(lv, m)]:
        s = _stats(*grid[(lv, m)][task])
        if s["fitted"]:
          xs.append(lv * 100)
          ys.append(np.mean(s["fitted"]))
          es.append(np.std(s["fitted"]))
    if xs:
      ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=f"mask, {m}")
  ax.axhline(np.mean(v["fitted"]), ls="--", c="gray", lw=1, label="vanilla")
  ax.axhline(np.mean(q["fitted"]), ls="-.", c="gray", lw=1, label="qk")
  ax.axhline(bound, ls=":", c="k", lw=1, label="structure-only bound")
  ax.set(xlabel="supports replaced (%)", ylabel="unseen MSE / MDI's", title=task, xticks=[lv * 100 for lv in LEVELS])
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(root / f"{task}.png", dpi=100)
  plt.close(fig)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("what", choices=["run", "report"])
  p.add_argument("--workdir", default="runs/boolean_corruption")
  p.add_argument("--only", help="comma-separated cell folders to run (default: all)")
  args = p.parse_args()
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  if args.what == "run":
    run(root, args.only.split(",") if args.only else None)
  print(report(root))


if __name__ == "__main__":
  main()
