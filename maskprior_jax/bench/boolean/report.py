"""The Boolean benchmark's tables and plots, from run records (results.json): one task's table,
mechanism and degree-profile tables and plots, the headline over the tasks, and the pooling of
run folders that `maskprior report` does. Used at the end of a run and by `maskprior report`."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.workdir import path as as_path, write_figure, write_text
from maskprior_jax.bench.boolean import methods as boolean_methods
from maskprior_jax.bench.boolean.tasks import TASKS
from maskprior_jax.bench.runner import METHODS


def mdi_share(unseen_mse: float, mdi_unseen_mse: float) -> float:
  """Unseen MSE as a share of the MDI's (0 = the truth, 1 = the MDI); NaN where the MDI is exact."""
  return unseen_mse / mdi_unseen_mse if mdi_unseen_mse > 0 else float("nan")


def median_cell(ratios: Sequence[float | None]) -> str:
  """An exploration table's cell: the median over seeds of unseen MSE / MDI's (a run that did not
  fit counts as 1, the MDI's error), then the per-seed values."""
  v = [1.0 if r is None else r for r in ratios]
  per = ", ".join("did not fit" if r is None else f"{r:.2f}" for r in ratios)
  return f"{np.median(v):.2f} ({per})"


BAR = 0.10   # the paper's bar: unseen MSE at most 10% of the MDI's is "near-perfect" extrapolation


def summarize(results: dict) -> list[dict]:
  """Per method: per-seed values (in seed order), fit status, and the persistence endpoints."""
  rows = []
  ref = results["mdi_unseen_mse_true"]
  for m in results_lib.methods_in(results):
    runs = sorted((r for r in results["runs"] if r["method"] == m), key=lambda r: r["seed"])
    last = lambda r, k: r["persistence"][-1].get(k)
    fitted = [r for r in runs if r["fitted"]]
    rows.append({"method": m, "seeds": [r["seed"] for r in runs], "fitted": [r["fitted"] for r in runs],
                 "seen_mse": [r["seen_mse"] for r in runs],
                 "ratio": [mdi_share(r["unseen_mse_true"], ref) for r in runs],
                 "ratio_fitted": [mdi_share(r["unseen_mse_true"], ref) for r in fitted],
                 "unseen_mse_true": [r["unseen_mse_true"] for r in fitted],
                 "unseen_mse_mdi": [r["unseen_mse_mdi"] for r in fitted],
                 "tv0": [float(np.mean(r["persistence"][0]["attn_tv"])) for r in runs],
                 "tv_end": [float(np.mean(last(r, "attn_tv"))) for r in runs],
                 "drift_end": [last(r, "mask_drift") for r in runs if last(r, "mask_drift") is not None]})
  return rows


def _per_seed(s: dict) -> str:
  return ", ".join(f"{v:.2f}" if ok else "did not fit" for v, ok in zip(s["ratio"], s["fitted"]))


def _fit_cell(s: dict, key: str = "ratio_fitted", fmt=lambda v: results_lib.mean_std(v)) -> str:
  """mean ± std over the fitted seeds, or "did not fit" when none did."""
  if not s[key]:
    return "did not fit"
  return fmt(s[key])


def _fitted_cell(s: dict, m: str) -> str:
  """`_fit_cell` of method m with how many of its seeds fitted; "-" where m did not run."""
  return f"{_fit_cell(s[m])} ({sum(s[m]['fitted'])}/{len(s[m]['seeds'])})" if m in s else "-"


def _present(all_results: Sequence[dict], methods: Sequence[str]) -> list[str]:
  """The methods (in the given order) with at least one run in any of the results."""
  ran = {r["method"] for res in all_results for r in res["runs"]}
  return [m for m in methods if m in ran]


def seed_ratios(results: dict, method: str) -> list[float | None]:
  """One method's unseen MSE / MDI's per seed (seed order), None where the run did not fit."""
  runs = sorted((r for r in results["runs"] if r["method"] == method), key=lambda r: r["seed"])
  return [mdi_share(r["unseen_mse_true"], results["mdi_unseen_mse_true"]) if r["fitted"] else None for r in runs]


def task_table(results: dict) -> str:
  ref = results["mdi_unseen_mse_true"]
  header = ["method", "fitted / seeds", "seen MSE", "unseen MSE vs truth", "unseen / MDI's", "per seed (unseen / MDI's)",
            "unseen MSE vs MDI", "attn TV start → end", "‖B−B0‖/‖B0‖ end"]
  rows = []
  for s in summarize(results):
    rows.append([s["method"], f"{sum(s['fitted'])}/{len(s['seeds'])}", results_lib.mean_std(s["seen_mse"]),
                 _fit_cell(s, "unseen_mse_true"), _fit_cell(s), _per_seed(s), _fit_cell(s, "unseen_mse_mdi"),
                 f"{np.mean(s['tv0']):.2f} → {np.mean(s['tv_end']):.2f}",
                 results_lib.mean_std(s["drift_end"]) if s["drift_end"] else "-"])
  mech = results["mechanism"]
  head = (f"**{results['task']}** (n = {results['n']}): f = `{results['target']}`, seen: `{results['seen']}`; "
          f"MDI = `{results['mdi']}`, MDI's unseen MSE vs truth = {ref:.4g}. Seeds {_seed_list(results)}; "
          f"a run fits when its seen MSE ≤ {results['fit_threshold_seen_mse']:.3g}; only fitted runs are scored.\n\n")
  out = head + results_lib.markdown_table(header, rows)
  out += ("\nReference interpolants from the structure alone (unseen MSE / MDI's): span of the support monomials "
          f"{mdi_share(mech['support_lsq_unseen_mse'], ref):.3f}, per-support count lookup "
          f"{mdi_share(mech['count_lookup_unseen_mse'], ref):.3f}.\n")
  out += "\n" + mechanism_table(results) + "\n" + degree_table(results)
  readers = readout_table(results)
  return out + ("\n" + readers if readers else "")


def readout_table(results: dict) -> str:
  """For the reader designs: per support, each reader's mean readout at each count of +1 entries
  (mean ± population std over the fitted seeds), and whether the count occurs on the seen domain.
  Empty when no run has readers."""
  runs = [r for r in results["runs"] if r.get("reader_readout_by_count") and r["fitted"]]
  methods = [m for m in results_lib.methods_in(results) if any(r["method"] == m for r in runs)]
  if not methods:
    return ""
  first = next(r for r in runs if r["method"] == methods[0])["reader_readout_by_count"]
  rows = []
  for k, support in enumerate(first):
    for j, entry in enumerate(support["by_count"]):
      row = ["{" + ", ".join(f"x{v}" for v in support["support"]) + "}", entry["count"], "seen" if entry["seen"] else "unseen"]
      for m in methods:
        vals = [r["reader_readout_by_count"][k]["by_count"][j]["readout"] for r in runs if r["method"] == m]
        row.append(results_lib.mean_std(vals))
      rows.append(row)
  return ("Reader designs: each support's readout by its count of +1 entries (fitted seeds):\n\n"
          + results_lib.markdown_table(["support", "count of +1", "on the seen domain"] + methods, rows))


def _seed_list(results: dict) -> str:
  seeds = sorted({r["seed"] for r in results["runs"]})
  return ", ".join(map(str, seeds)) if seeds else "-"


def mechanism_table(results: dict) -> str:
  """Mean prediction on each group of unseen points: truth, MDI, the two references, each method
  (mean over its fitted seeds)."""
  mech = results["mechanism"]
  methods = [s["method"] for s in summarize(results)]
  header = [f"unseen group ({mech['by']})", "share of unseen", "truth", "MDI", "support LSQ", "count lookup"] + methods
  rows = []
  total = sum(mech["size"])
  for g, label in enumerate(mech["groups"]):
    row = [label, f"{mech['size'][g] / total:.1%}"] + [f"{mech[k][g]:.2f}" for k in ("truth", "mdi", "support_lsq", "count_lookup")]
    for m in methods:
      vals = [r["unseen_group_means"][g] for r in results["runs"] if r["method"] == m and r["fitted"]]
      row.append(results_lib.mean_std(vals) if vals else "did not fit")
    rows.append(row)
  return "Mean prediction on the unseen points, by group:\n\n" + results_lib.markdown_table(header, rows)


def degree_table(results: dict) -> str:
  """Degree profile (sum of f̂(S)² by |S|) of the truth, the MDI and each method (mean over all seeds)."""
  truth, mdi = np.asarray(results["truth_degree_profile"]), np.asarray(results["mdi_degree_profile"])
  top = max(int(np.flatnonzero(truth > 1e-9).max()), int(np.flatnonzero(mdi > 1e-9).max())) + 1
  truth, mdi = (np.pad(v, (0, max(0, top + 1 - len(v)))) for v in (truth, mdi))
  rows = [["truth"] + [f"{v:.3f}" for v in truth[:top + 1]], ["MDI"] + [f"{v:.3f}" for v in mdi[:top + 1]]]
  for m in results_lib.methods_in(results):
    prof = [r["degree_profile"] for r in results["runs"] if r["method"] == m and r.get("degree_profile")]
    if prof:
      mean = np.mean(np.asarray(prof)[:, :top + 1], 0)
      rows.append([m] + [f"{v:.3f}" for v in mean])
  return "Degree profile (energy by degree):\n\n" + results_lib.markdown_table(
      ["function"] + [f"degree {d}" for d in range(top + 1)], rows)


def write_task_report(results: dict, workdir: str | os.PathLike) -> None:
  """table.md and the plots of one task's run folder."""
  workdir = as_path(workdir)
  write_text(workdir / "table.md", task_table(results))
  curves = results["curves"]
  if not curves:
    return
  results_lib.plot_curves(workdir / "unseen_loss.png", results_lib.metric_curves(curves, "unseen_mse_true"),
                         title=f"{results['task']}: unseen MSE vs truth", ylabel="MSE", logy=True,
                         hlines={"MDI": results["mdi_unseen_mse_true"]}, note=STEP0_NOTE)
  results_lib.plot_curves(workdir / "persistence.png", results_lib.metric_curves(curves, "attn_tv"),
                         title=f"{results['task']}: attention distance from the prior's pattern",
                         ylabel="mean TV distance (layers)")
  drift = results_lib.metric_curves(curves, "mask_drift")
  if drift:
    results_lib.plot_curves(workdir / "mask_drift.png", drift, title=f"{results['task']}: ‖B_t − B_0‖ / ‖B_0‖",
                           ylabel="relative change")
  plot_degree_profiles(results, workdir / "degree_profiles.png")


# Why an untrained model can sit below every trained one at step 0. Measured on f2 (default config,
# vanilla, seed 0): at initialisation it predicts 1.00 +- 0.09 over 4,096 random points, and f2 is +1
# on its unseen group, so its unseen MSE is 0.005 while its seen MSE is 2.7; seeds 1 and 2 start at
# 1.25 +- 0.39 and 0.04 +- 0.32 (unseen MSE 0.35 and 0.74).
STEP0_NOTE = ("Step 0 is the untrained model: its output is nearly one constant, so its unseen error says how "
              "far that constant is from the truth there, not that it extrapolates (it has not fitted the seen "
              "points yet). Compare the trained runs at the end.")


def plot_degree_profiles(results: dict, path: str | os.PathLike) -> None:
  profiles = {}
  for r in results["runs"]:
    if r.get("degree_profile") is not None:
      profiles.setdefault(r["method"], []).append(r["degree_profile"])
  if not profiles:
    return
  truth, mdi = np.asarray(results["truth_degree_profile"]), np.asarray(results["mdi_degree_profile"])
  maxdeg = max(int(np.max(np.flatnonzero(truth > 1e-6))), int(np.max(np.flatnonzero(mdi > 1e-6)))) + 2
  pad = lambda v: np.pad(v, (0, max(0, maxdeg - len(v))))
  truth, mdi = pad(truth), pad(mdi)
  series = {"truth": truth, "MDI": mdi, **{m: np.mean(v, 0) for m, v in profiles.items()}}
  fig, ax = results_lib.new_figure((5.5, 3.6))
  width = 0.8 / len(series)
  for i, (label, prof) in enumerate(series.items()):
    ax.bar(np.arange(maxdeg) + i * width, prof[:maxdeg], width, label=label)
  ax.set(title=f"{results['task']}: degree profile (sum of f̂(S)² by |S|)", xlabel="degree", ylabel="energy")
  ax.legend(fontsize=8)
  fig.tight_layout()
  write_figure(fig, path)


def headline_table(all_results: Sequence[dict]) -> str:
  """Per task and method: unseen MSE / MDI's (mean ± std over the fitted seeds, and how many
  fitted), whether the mask reaches the paper's bar, the references; then persistence."""
  methods = _present(all_results, METHODS)
  header = (["task", "n", "MDI's unseen MSE"] + [f"{m}: unseen / MDI's (fitted)" for m in methods]
            + ["mask ≤ 10% of MDI's?", "support LSQ", "count lookup", "structure-only bound"])
  rows = []
  for res in all_results:
    s = {x["method"]: x for x in summarize(res)}
    ref = res["mdi_unseen_mse_true"]
    row = [res["task"], res["n"], f"{ref:.3g}"]
    for m in methods:
      row.append(_fitted_cell(s, m))
    if "mask" in s and s["mask"]["ratio_fitted"]:
      row.append("yes" if np.mean(s["mask"]["ratio_fitted"]) <= BAR else "no")
    else:
      row.append("-")
    mech = res["mechanism"]
    row += [f"{mdi_share(mech['support_lsq_unseen_mse'], ref):.3f}",
            f"{mdi_share(mech['count_lookup_unseen_mse'], ref):.3f}", f"{structure_bound(res):.3f}"]
    rows.append(row)
  header2 = ["task"] + [f"{m}: attn TV start → end" for m in methods] + ["mask: ‖B−B0‖/‖B0‖ end"]
  rows2 = []
  for res in all_results:
    s = {x["method"]: x for x in summarize(res)}
    rows2.append([res["task"]] + [f"{np.mean(s[m]['tv0']):.2f} → {np.mean(s[m]['tv_end']):.2f}" if m in s else "-"
                                  for m in methods]
                 + [results_lib.mean_std(s["mask"]["drift_end"]) if "mask" in s and s["mask"]["drift_end"] else "-"])
  out = (results_lib.markdown_table(header, rows) + "\n" + excess_table(all_results, methods) + "\n"
         + results_lib.markdown_table(header2, rows2))
  if any(r["method"] in boolean_methods.CONTROLS for res in all_results for r in res["runs"]):
    out += "\n" + attribution_table(all_results)
    attribution = [m for m in _present(all_results, boolean_methods.ATTRIBUTION) if m not in methods]
    if attribution:
      out += "\n" + excess_table(all_results, attribution)
  others = _present(all_results, boolean_methods.COMBINED + boolean_methods.DESIGN_METHODS)
  if others:   # both priors at once and the reader designs: their errors and excess over the bound
    header3 = ["task"] + [f"{m}: unseen / MDI's (fitted)" for m in others]
    rows3 = []
    for res in all_results:
      s = {x["method"]: x for x in summarize(res)}
      rows3.append([res["task"]] + [_fitted_cell(s, m) for m in others])
    out += "\n" + results_lib.markdown_table(header3, rows3) + "\n" + excess_table(all_results, others)
  return out


def structure_bound(res: dict) -> float:
  """The best structure-only reference: the lower of the support LSQ and the per-support count
  lookup, as a share of the MDI's unseen MSE. Both are computed from the seen data and the task's
  supports alone, so no method that knows only the structure is expected below it."""
  mech, ref = res["mechanism"], res["mdi_unseen_mse_true"]
  return min(mdi_share(mech["support_lsq_unseen_mse"], ref), mdi_share(mech["count_lookup_unseen_mse"], ref))


def excess_table(all_results: Sequence[dict], methods: Sequence[str]) -> str:
  """Per task: the structure-only bound, and each method's excess over it (mean over the fitted
  seeds of unseen MSE / MDI's, minus the bound; ± the population std over those seeds; then the
  per-seed excesses)."""
  header = ["task", "structure-only bound"] + [f"{m}: excess (per seed)" for m in methods]
  rows = []
  for res in all_results:
    s = {x["method"]: x for x in summarize(res)}
    bound = structure_bound(res)
    row = [res["task"], f"{bound:.3f}"]
    for m in methods:
      if m not in s or not s[m]["ratio_fitted"]:
        row.append("-" if m not in s else "did not fit")
        continue
      v = np.asarray(s[m]["ratio_fitted"]) - bound
      row.append(f"{v.mean():+.3f} ± {v.std():.3f} ({', '.join(f'{x:+.2f}' for x in v)})" if v.size > 1
                 else f"{v[0]:+.3f} (one seed)")
    rows.append(row)
  above = [f"{res['task']} {structure_bound(res):.3f}" for res in all_results if structure_bound(res) > BAR]
  note = ("Excess over the structure-only bound (the lower of support LSQ and count lookup, as a share of the "
          "MDI's unseen MSE): method's unseen / MDI's minus the bound, over the fitted seeds. Where the bound is "
          f"above the paper's bar of {BAR:.0%} no structure-only method can reach the bar: "
          + (", ".join(above) if above else "none of these tasks") + ".\n\n")
  return note + results_lib.markdown_table(header, rows)


def attribution_table(all_results: Sequence[dict]) -> str:
  """The mask against the controls that each change one thing (`boolean.methods`): per task, each
  method's unseen MSE / MDI's (mean ± population std over the fitted seeds, how many fitted), then
  per contrast the control's mean minus the mask's, marked "no difference" when it is not larger
  than the larger of the two seed spreads."""
  methods = _present(all_results, boolean_methods.ATTRIBUTION)
  contrasts = [c for c in boolean_methods.CONTRASTS if c[1] in methods and c[2] in methods]
  header = ["task"] + [f"{m} (fitted)" for m in methods] + [label for label, _, _ in contrasts]
  rows = []
  for res in all_results:
    s = {x["method"]: x for x in summarize(res)}
    row = [res["task"]] + [_fitted_cell(s, m) for m in methods]
    for _, control, method in contrasts:
      a, b = (s[control]["ratio_fitted"] if control in s else []), (s[method]["ratio_fitted"] if method in s else [])
      if not a or not b:
        row.append("-")
        continue
      gain = float(np.mean(a) - np.mean(b))
      inside = abs(gain) <= max(np.std(a), np.std(b))
      row.append(f"{gain:+.3f}" + (" (no difference)" if inside else ""))
    rows.append(row)
  return ("Attribution: unseen MSE / MDI's (mean ± population std over the fitted seeds); a contrast is the "
          "control's mean minus the mask's (positive: the mask is better), \"no difference\" when it is not larger "
          "than the larger seed spread of the two:\n\n" + results_lib.markdown_table(header, rows))


def write_headline_report(all_results: Sequence[dict], workdir: str | os.PathLike) -> None:
  """summary.md and headline.png over the tasks."""
  write_text(workdir / "summary.md", headline_table(all_results))
  methods = _present(all_results, boolean_methods.METHODS)
  fig, ax = results_lib.new_figure((7, 3.6))
  width = 0.8 / max(len(methods), 1)
  for i, m in enumerate(methods):
    ratios = [[mdi_share(r["unseen_mse_true"], res["mdi_unseen_mse_true"]) for r in res["runs"]
               if r["method"] == m and r["fitted"]] for res in all_results]
    ax.bar(np.arange(len(all_results)) + i * width, [np.mean(v) if v else np.nan for v in ratios], width,
           yerr=[np.std(v) if v else 0 for v in ratios], label=m, capsize=2)
  ax.axhline(1.0, ls="--", c="gray", lw=1)
  ax.axhline(0.1, ls=":", c="gray", lw=1)
  ax.set_xticks(np.arange(len(all_results)) + 0.4 - width / 2, [r["task"] for r in all_results], fontsize=8)
  ax.set(ylabel="unseen MSE / MDI's unseen MSE", title="Extrapolation error relative to the MDI (fitted runs; 1 = MDI, 0 = truth)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  write_figure(fig, as_path(workdir) / "headline.png")


def pool(found: Sequence[tuple[os.PathLike, dict]]) -> list[dict]:
  """Run folders' results pooled by task (runs of one task from several folders merged, which
  must hold the same config and disjoint seeds), in the headline's task order. Raises
  results.ReportError naming the two folders otherwise."""
  by_task: dict[str, dict] = {}
  source: dict[str, os.PathLike] = {}
  for path, res in found:
    if res["task"] in by_task:   # pool seeds of the same task, from runs of the same config only
      merged, first = by_task[res["task"]], source[res["task"]]
      if res["config_digest"] != merged["config_digest"]:
        raise results_lib.ReportError(f"{first} and {path} ran {res['task']} with different configs; "
                                      "pool only runs of one config")
      have = {(r["method"], r["seed"]) for r in merged["runs"]}
      twice = sorted({(r["method"], r["seed"]) for r in res["runs"]} & have)
      if twice:
        method, seed = twice[0]
        raise results_lib.ReportError(f"{first} and {path} both hold {res['task']} method {method} seed {seed}; "
                                      "pool only disjoint seeds")
      by_task[res["task"]] = {**merged, "runs": merged["runs"] + res["runs"],
                              "curves": {**res.get("curves", {}), **merged["curves"]}}
    else:
      by_task[res["task"]], source[res["task"]] = res, path
  order = {name: i for i, name in enumerate(TASKS)}
  return sorted(by_task.values(), key=lambda r: order.get(r["task"], len(order)))


def report(found: Sequence[tuple[os.PathLike, dict]], out: os.PathLike | None) -> str:
  """`maskprior report` for Boolean run folders: pooled by task; the headline table and every
  task's table as text, and with `out` the same as files (summary.md, headline.png, one folder
  of tables and plots per task)."""
  pooled = pool(found)
  if out is not None:
    out.mkdir(parents=True, exist_ok=True)
    for res in pooled:
      (out / res["task"]).mkdir(exist_ok=True)
      write_task_report(res, out / res["task"])
    write_headline_report(pooled, out)
  return "\n".join([headline_table(pooled), *(task_table(res) for res in pooled)])
