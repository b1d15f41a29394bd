"""The qk baseline and the draw of its probe inputs, on the Boolean default (seeds 0-4).

The qk method's query/key weights are fitted so that the initial attention on the probe inputs (256
points of the cube, `eval.probe_size`) matches the prior's pattern. Those inputs are drawn after the
curve points (`eval.num_points`) from one generator, so changing the number of curve points draws
other probe inputs. FOLDER holds two run folders of the same default config and batch stream that
differ only there: `probe_4096` (the main job with 4,096 curve points: all four methods) and
`probe_2048` (the qk method with 2,048; their command.txt files say how each was made). The table
puts each task's qk runs side by side (unseen MSE over the MDI's, per seed, and the mean over
fitted runs), with the mask method's runs from `probe_4096` for scale.

  python experiments/boolean_probe_draw.py --markdown experiments/results/boolean_probe_draw
"""
import argparse
import json
import pathlib

from maskprior_jax.bench.results import markdown_table, mean_std


def _runs(folder: pathlib.Path, task: str, method: str) -> list[dict]:
  res = json.loads((folder / task / "results.json").read_text())
  mdi = res["mdi_unseen_mse_true"]
  return [{"seed": r["seed"], "ratio": r["unseen_mse_true"] / mdi, "fitted": r["fitted"],
           "sha": r["state_sha256"]} for r in res["runs"] if r["method"] == method]


def _per_seed(runs: list[dict]) -> str:
  return ", ".join(f"{r['ratio']:.2f}" + ("" if r["fitted"] else "*") for r in runs)


def _fitted_mean(runs: list[dict]) -> str:
  """Mean ± std over the fitted runs, as the Boolean tables write it (`results.mean_std`)."""
  return mean_std([r["ratio"] for r in runs if r["fitted"]])


def markdown(folder: pathlib.Path) -> str:
  a, b = folder / "probe_4096", folder / "probe_2048"
  tasks = sorted(p.name for p in b.iterdir() if (p / "results.json").exists())
  rows, same, total = [], 0, 0
  for task in tasks:
    q4, q2, mask = _runs(a, task, "qk"), _runs(b, task, "qk"), _runs(a, task, "mask")
    if [r["seed"] for r in q4] != [r["seed"] for r in q2]:
      raise SystemExit(f"{task}: the two folders hold other seeds")
    change = max(abs(x["ratio"] - y["ratio"]) for x, y in zip(q4, q2))
    same += sum(x["sha"] == y["sha"] for x, y in zip(q4, q2))
    total += len(q2)
    rows.append([task, _per_seed(q4), _per_seed(q2), f"{_fitted_mean(q4)} / {_fitted_mean(q2)}", f"{change:.2f}",
                 _per_seed(mask), _fitted_mean(mask)])
  header = ["task", "qk per seed, probe of 4,096", "qk per seed, probe of 2,048", "qk mean (fitted), 4,096 / 2,048",
            "largest change of a seed", "mask per seed (4,096)", "mask mean (fitted)"]
  return (markdown_table(header, rows) + "\nUnseen MSE against the truth over the MDI's (1: as far from the truth as "
          "the minimum-degree interpolator; lower is better); * a run that did not fit its seen domain (not in the "
          f"mean). qk runs with the same `state_sha256` in both: {same}/{total}.")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--markdown", required=True, help="the folder holding probe_4096 and probe_2048")
  a = p.parse_args()
  print(markdown(pathlib.Path(a.markdown)))


if __name__ == "__main__":
  main()
