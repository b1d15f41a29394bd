"""Round 5 of the Boolean protocol, part 2: one step up in scale (`protocol.SCALE_RUNG`: dim 128,
depth 4, about 8x the CPU default's compute per run) on `protocol.SCALE_TASKS`, vanilla and mask,
seeds 0-4, everything else the built-in default; then the rung beside the committed default runs.

  python experiments/boolean_scale.py --workdir experiments/results/boolean_scale          # train (resumes)
  python experiments/boolean_scale.py --markdown experiments/results/boolean_scale          # the comparison

--markdown prints, per task, method and seed: unseen MSE / MDI's, the excess over the structure-only
bound, fitted or not, attention TV to the prior's pattern and ||B - B0|| / ||B0|| at the end, at the
default (DEFAULT_FOLDER) and at the rung, and each task's verdict by `protocol.scale_verdict`.
"""
import argparse
import json
import pathlib

import numpy as np

from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.boolean import protocol
from maskprior_jax.bench.boolean import report as boolean_report
from maskprior_jax.bench.config import apply_overrides, builtin_config

DEFAULT_FOLDER = pathlib.Path(__file__).parent / "results" / "boolean_headline"


def rung_config():
  """The built-in default with the rung's model. The rung trains vanilla and mask, which never read qk's
  keys; qk.fit_inputs stays at 0, the value its folders were recorded with (before the key existed), so
  that they resume whatever the default's qk fit becomes."""
  return apply_overrides(builtin_config("boolean"), [*protocol.SCALE_RUNG, "--config.qk.fit_inputs=0"])


def _read(folder: pathlib.Path, task: str) -> dict:
  path = folder / task / "results.json"
  if not path.exists():
    raise SystemExit(f"{path} is missing: run the rung first (--workdir {folder})")
  return json.loads(path.read_text())


def per_seed(res: dict, method: str) -> tuple[list[dict], list[float]]:
  """One method's runs in seed order (`boolean_report.summarize`): ratio (unseen MSE / MDI's), excess
  over the bound, fitted, attention TV to the pattern at the end; and ||B - B0|| / ||B0|| at the end of
  the runs with a prior."""
  s = next(x for x in boolean_report.summarize(res) if x["method"] == method)
  bound = boolean_report.structure_bound(res)
  return ([{"seed": seed, "ratio": ratio, "excess": ratio - bound, "fitted": ok, "tv_end": tv}
           for seed, ratio, ok, tv in zip(s["seeds"], s["ratio"], s["fitted"], s["tv_end"])], s["drift_end"])


def _cells(runs: list[dict], drift: list[float]) -> list[str]:
  fitted = [r["excess"] for r in runs if r["fitted"]]
  return [f"{sum(r['fitted'] for r in runs)}/{len(runs)}",
          ", ".join(f"{r['ratio']:.2f}" + ("" if r["fitted"] else "*") for r in runs),
          ", ".join(f"{r['excess']:+.2f}" + ("" if r["fitted"] else "*") for r in runs),
          f"{np.mean(fitted):+.3f} ± {np.std(fitted):.3f}" if fitted else "did not fit",
          ", ".join(f"{r['tv_end']:.2f}" for r in runs),
          results_lib.mean_std(drift) if drift else "-"]


def _excess(runs: list[dict]) -> list[float | None]:
  return [r["excess"] if r["fitted"] else None for r in runs]


def markdown(rung_folder: pathlib.Path, default_folder: pathlib.Path = DEFAULT_FOLDER) -> str:
  rows, verdicts = [], []
  for task in protocol.SCALE_TASKS:
    default, rung = _read(default_folder, task), _read(rung_folder, task)
    bound = boolean_report.structure_bound(default)
    if abs(boolean_report.structure_bound(rung) - bound) > 1e-12:
      raise SystemExit(f"{task}: the two folders hold other task data (bounds {bound} and "
                       f"{boolean_report.structure_bound(rung)})")
    runs = {}
    for m in protocol.SCALE_METHODS:
      for scale, res in (("default", default), ("rung", rung)):
        runs[m, scale], drift = per_seed(res, m)
        rows.append([task, m, scale, *_cells(runs[m, scale], drift)])
    mask_v = protocol.scale_verdict(_excess(runs["mask", "default"]), _excess(runs["mask", "rung"]))
    van_v = protocol.scale_verdict(_excess(runs["vanilla", "default"]), _excess(runs["vanilla", "rung"]))
    verdicts.append([task, f"{bound:.3f}", mask_v, van_v])
  header = ["task", "method", "scale", "fitted", "unseen / MDI's per seed", "excess per seed",
            "excess (fitted): mean ± std", "attn TV end per seed", "‖B−B0‖/‖B0‖ end"]
  return (results_lib.markdown_table(header, rows)
          + "\nSeeds 0-4 in order; * a run that did not fit its seen domain (left out of the mean). default: dim 64, "
          "depth 2 (experiments/results/boolean_headline); rung: dim 128, depth 4, everything else the same. Excess: "
          "unseen MSE / MDI's minus the task's structure-only bound.\n\n"
          + results_lib.markdown_table(["task", "structure-only bound", "mask: the gap at the rung",
                                        "vanilla: the gap at the rung"], verdicts)
          + "\nThe rule (`protocol.scale_verdict`, written before the runs): \"shrinks\" where the rung's mean "
          "excess is below the default's by more than the two seed spreads (population std) added, \"grows\" "
          "where above by more, otherwise no difference at this rung.")


def train(workdir: pathlib.Path) -> None:
  from maskprior_jax.bench.boolean import run as boolean_run
  boolean_run.run_headline(rung_config(), list(protocol.SCALE_METHODS), list(protocol.CONFIRMATION_SEEDS), workdir,
                           tasks=protocol.SCALE_TASKS)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  g = p.add_mutually_exclusive_group(required=True)
  g.add_argument("--workdir", help="train the rung into this folder (a rerun continues)")
  g.add_argument("--markdown", help="print the comparison for the rung's folder")
  a = p.parse_args()
  if a.workdir:
    train(pathlib.Path(a.workdir))
  else:
    print(markdown(pathlib.Path(a.markdown)))


if __name__ == "__main__":
  main()
