"""Round 5 of the Boolean protocol, part 1's confirmation: the headline's qk row rerun once with the qk
fit on inputs of its own (`qk.fit_inputs`, the built-in default's size, chosen by
`protocol.select_qk_fit_size`), everything else the headline's recorded config, then merged into the
headline's folders.

  python experiments/boolean_qk_rerun.py --workdir runs/boolean_qk                  # train (resumes)
  python experiments/boolean_qk_rerun.py --workdir runs/boolean_qk --merge experiments/results/boolean_headline
  python experiments/boolean_qk_rerun.py --methods qk,qk_nopos --markdown experiments/results/boolean_headline

The config is the one HEADLINE's run_config.json records (the keys added since at their earlier
values), with qk.fit_inputs set; its digest without that change must equal each task's recorded
digest. --merge replaces, per task, the runs and curves of the rerun methods in HEADLINE's results.json
by the rerun's, keeps every other method's runs as they are (it checks their state_sha256 before and
after) and moves the replaced runs to superseded_runs.json beside it; results.json then carries the
rerun's config digest and a "reruns" entry (methods, environment, the digest it replaced). A config
that differs from the recorded one in anything but qk's keys is refused.
"""
import argparse
import copy
import json
import pathlib

import ml_collections
from flax import traverse_util

from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.boolean import protocol
from maskprior_jax.bench.boolean import tasks as boolean_tasks
from maskprior_jax.bench.config import LATER_KEYS, as_recorded, builtin_config, config_digest

HEADLINE = pathlib.Path(__file__).parent / "results" / "boolean_headline"
METHODS = ("qk",)


def _flat(d: dict) -> dict:
  return traverse_util.flatten_dict(d, sep=".")


def recorded_config(headline: pathlib.Path, fit_inputs: int | None) -> ml_collections.ConfigDict:
  """HEADLINE's recorded config as a ConfigDict (the keys added since at their earlier values), with
  qk.fit_inputs set (None: the built-in default's)."""
  recorded = json.loads((headline / "run_config.json").read_text())["config"]
  d = builtin_config("boolean").to_dict()
  default_fit = d["qk"]["fit_inputs"]
  for key, value in LATER_KEYS.items():
    section, leaf = key.split(".")
    if section in d:
      d[section][leaf] = value
  for key, value in _flat(recorded).items():
    section, leaf = key.split(".")
    d[section][leaf] = value
  d["qk"]["fit_inputs"] = default_fit if fit_inputs is None else fit_inputs
  return ml_collections.ConfigDict(d)


def _task_digest(cfg, res: dict) -> str:
  return config_digest({"cfg": cfg.to_dict() if hasattr(cfg, "to_dict") else cfg,
                        "task": [res["target"], res["seen"], res["n"]]})


def check_config(cfg, headline: pathlib.Path) -> None:
  """The config less its qk.fit_inputs change gives every task's recorded digest (before a merge)."""
  before = cfg.to_dict()
  before["qk"] = {**before["qk"], "fit_inputs": 0}
  for folder in sorted(p for p in headline.iterdir() if (p / "results.json").exists()):
    res = json.loads((folder / "results.json").read_text())
    if "reruns" in res:
      raise SystemExit(f"{folder.name}: the rerun was merged already")
    if _task_digest(before, res) != res["config_digest"]:
      raise SystemExit(f"{folder.name}: the rebuilt config does not give the recorded digest {res['config_digest']}")


def merge(rerun: pathlib.Path, headline: pathlib.Path, methods) -> list[str]:
  lines, changes = [], {}
  record = json.loads((headline / "run_config.json").read_text())
  was = _flat(as_recorded(record["config"]))
  for folder in sorted(p for p in headline.iterdir() if (p / "results.json").exists()):
    old = json.loads((folder / "results.json").read_text())
    new = json.loads((rerun / folder.name / "results.json").read_text())
    now = _flat(as_recorded(json.loads((rerun / folder.name / "config.json").read_text())))
    diff = {k for k in set(was) | set(now) if was.get(k) != now.get(k)}
    if any(not k.startswith("qk.") for k in diff):
      raise SystemExit(f"{folder.name}: the rerun's config differs in {sorted(diff)}, not only in qk's keys")
    if "reruns" in old and any(set(r["methods"]) & set(methods) for r in old["reruns"]):
      raise SystemExit(f"{folder.name}: {methods} were merged already")
    kept = [r for r in old["runs"] if r["method"] not in methods]
    taken = [r for r in new["runs"] if r["method"] in methods]
    if sorted((r["method"], r["seed"]) for r in taken) != sorted((r["method"], r["seed"]) for r in old["runs"]
                                                                 if r["method"] in methods):
      raise SystemExit(f"{folder.name}: the rerun holds other seeds of {methods} than the headline")
    before = {(r["method"], r["seed"]): r["state_sha256"] for r in kept}
    merged = copy.deepcopy(old)
    order = list(dict.fromkeys(r["method"] for r in old["runs"]))
    merged["runs"] = sorted(kept + taken, key=lambda r: (order.index(r["method"]), r["seed"]))
    for m in methods:
      merged["curves"][m], merged["wall_s"][m] = new["curves"][m], new["wall_s"][m]
    merged["curves"] = {m: merged["curves"][m] for m in order}
    merged["wall_s"] = {m: merged["wall_s"][m] for m in order}
    merged["config_digest"] = new["config_digest"]
    merged.setdefault("reruns", []).append({"methods": list(methods), "environment": new["environment"],
                                            "replaced_config_digest": old["config_digest"],
                                            "config_changes": {k: now.get(k) for k in sorted(diff)}})
    after = {(r["method"], r["seed"]): r["state_sha256"] for r in merged["runs"] if r["method"] not in methods}
    assert after == before
    superseded = {"why": "fitted on the evaluation's probe inputs (round 5 replaced them: docs/results/boolean.md)",
                  "config_digest": old["config_digest"],
                  "runs": [r for r in old["runs"] if r["method"] in methods],
                  "curves": {m: old["curves"][m] for m in methods}}
    (folder / "superseded_runs.json").write_text(json.dumps(superseded, indent=1) + "\n")
    (folder / "results.json").write_text(json.dumps(merged, indent=1) + "\n")
    lines.append(f"{folder.name}: {len(taken)} runs of {','.join(methods)} replaced; {len(kept)} other runs kept "
                 f"with their state_sha256 ({len(set(before.values()))} distinct); digest {old['config_digest']} -> "
                 f"{new['config_digest']}")
    changes = {k: now.get(k) for k in diff}
  # The folder's command record takes the changed qk keys, so that the command resumes it.
  for key, value in changes.items():
    section, leaf = key.split(".")
    record["config"][section][leaf] = value
  (headline / "run_config.json").write_text(json.dumps(record, indent=1))
  return lines


def _seed_cells(runs: list[dict], ref: float) -> tuple[str, str]:
  ratios = [(r["unseen_mse_true"] / ref, r["fitted"]) for r in sorted(runs, key=lambda r: r["seed"])]
  fitted = [v for v, ok in ratios if ok]
  return (", ".join(f"{v:.2f}" + ("" if ok else "*") for v, ok in ratios),
          (results_lib.mean_std(fitted) + f" ({len(fitted)}/{len(ratios)})") if fitted else f"did not fit (0/{len(ratios)})")


def markdown(headline: pathlib.Path, methods) -> str:
  """Per task and rerun method: the superseded runs (fitted on the probe) beside the rerun, per seed."""
  rows = []
  for folder in sorted((p for p in headline.iterdir() if (p / "superseded_runs.json").exists()),
                       key=lambda p: list(boolean_tasks.TASKS).index(p.name) if p.name in boolean_tasks.TASKS else 99):
    res, old = (json.loads((folder / n).read_text()) for n in ("results.json", "superseded_runs.json"))
    ref = res["mdi_unseen_mse_true"]
    for m in methods:
      before = _seed_cells([r for r in old["runs"] if r["method"] == m], ref)
      after = _seed_cells([r for r in res["runs"] if r["method"] == m], ref)
      rows.append([folder.name, m, *before, *after])
  return (results_lib.markdown_table(["task", "method", "fitted on the probe: per seed", "mean (fitted)",
                                      "fitted on 1,024 inputs of its own: per seed", "mean (fitted)"], rows)
          + "\nUnseen MSE / MDI's unseen MSE, seeds 0-4 in order; * a run that did not fit its seen domain (not in "
          "the mean). The headline's recorded config otherwise, the same batches and seeds.")


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", help="the rerun's folder (one folder per task)")
  p.add_argument("--markdown", help="print the superseded qk runs beside the rerun's for this merged headline folder")
  p.add_argument("--merge", help="merge the finished rerun into this headline folder")
  p.add_argument("--methods", default=",".join(METHODS), help="(default: %(default)s)")
  p.add_argument("--headline", default=str(HEADLINE), help="the folder whose recorded config is rerun")
  a = p.parse_args()
  methods = a.methods.split(",")
  if a.markdown:
    print(markdown(pathlib.Path(a.markdown), methods))
    return
  if not a.workdir:
    p.error("--workdir is needed to train or merge")
  if a.merge:
    print("\n".join(merge(pathlib.Path(a.workdir), pathlib.Path(a.merge), methods)))
    return
  cfg = recorded_config(pathlib.Path(a.headline), None)
  check_config(cfg, pathlib.Path(a.headline))
  from maskprior_jax.bench.boolean import run as boolean_run
  boolean_run.run_headline(cfg, methods, list(protocol.CONFIRMATION_SEEDS), a.workdir)


if __name__ == "__main__":
  main()
