"""The arithmetic training recipe's grid on the exploration seeds, then the protocol's rule
(`maskprior_jax.bench.arithmetic.protocol.select_recipe`), never the confirmation seeds.

  python experiments/arithmetic_recipe.py --workdir runs/arith_recipe          # the grid and the rule
  python experiments/arithmetic_recipe.py --workdir runs/arith_recipe --steps 500 --grid 1e-3:0.1   # a quick look

Each (learning rate, weight decay) of protocol.RECIPE_GRID trains all six methods at
protocol.RECIPE_SIZES with the fixed parts of the recipe (`protocol.recipe_overrides`), in its own
run folder (rerunning skips finished runs). Writes recipe.md: per setting, method and size, the
validation and test exact match at the step selected on validation, the final test exact match, and
how many runs end at >= 95% training exact match; then the rule's choice, also as recipe.json
(learning_rate, weight_decay, why, settings), which `experiments/arithmetic_curve.py --recipe` reads.
"""
import argparse
import json
import pathlib

import numpy as np
from arithmetic_curve import arithmetic_args

from maskprior_jax.bench import cli, results as results_lib
from maskprior_jax.bench.arithmetic import protocol
from maskprior_jax.bench.arithmetic.run import METHODS
from maskprior_jax.bench.args import script_seeds


def _grid(text: str | None) -> list[tuple[float, float]]:
  if not text:
    return [(lr, wd) for lr in protocol.RECIPE_GRID["learning_rate"] for wd in protocol.RECIPE_GRID["weight_decay"]]
  try:
    return [(float(a), float(b)) for a, b in (cell.split(":") for cell in text.split(","))]
  except ValueError:
    raise SystemExit(f"--grid takes lr:weight_decay pairs separated by commas, not {text!r}") from None


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="runs/arith_recipe")
  p.add_argument("--seeds", default=",".join(map(str, protocol.RECIPE_SEEDS)))
  p.add_argument("--steps", type=int, default=protocol.RECIPE_STEPS)
  p.add_argument("--grid", help="lr:weight_decay pairs (default: protocol.RECIPE_GRID)")
  args = p.parse_args()
  seeds = script_seeds(args.seeds, protocol.CONFIRMATION_SEEDS)
  root = pathlib.Path(args.workdir)
  cells, rows = {}, []
  for lr, wd in _grid(args.grid):
    work = root / f"lr{lr}_wd{wd}"
    argv = ["arithmetic", "--workdir", str(work), "--methods", ",".join(METHODS),
            *arithmetic_args(lr, wd, seeds=",".join(map(str, seeds)) if len(seeds) > 1 else f"{seeds[0]}-{seeds[0]}",
                             sizes=",".join(map(str, protocol.RECIPE_SIZES)), steps=args.steps)]
    if cli.main(argv):
      raise SystemExit(f"maskprior {' '.join(argv)} failed")
    runs = json.loads((work / "results.json").read_text())["runs"]
    cells[(lr, wd)] = runs
    for m in METHODS:
      for n in protocol.RECIPE_SIZES:
        rs = sorted((r for r in runs if r["method"] == m and r["train_size"] == n), key=lambda r: r["seed"])
        fmt = lambda k: results_lib.mean_std([r[k] for r in rs]) + " (" + ", ".join(f"{r[k]:.2f}" for r in rs) + ")"
        rows.append([lr, wd, m, n, fmt("selected_val_exact"), fmt("selected_exact"), fmt("exact_match"),
                     f"{sum(r['final_train_exact'] >= 0.95 for r in rs)}/{len(rs)}"])
  (lr, wd), why = protocol.select_recipe(cells)
  text = (f"Recipe grid, exploration seeds {list(seeds)}, {args.steps} steps, sizes {list(protocol.RECIPE_SIZES)}; "
          "exact match at the step selected on validation (validation, test), final test exact match, runs ending "
          ">= 95% on their training set. Mean ± population std (per seed).\n\n"
          + results_lib.markdown_table(["lr", "weight decay", "method", "size", "validation (selected)",
                                        "test (selected)", "test (final)", "fitted"], rows)
          + f"\nSelected: **lr {lr}, weight decay {wd}**. {why}.\n")
  root.mkdir(parents=True, exist_ok=True)
  (root / "recipe.md").write_text(text)
  (root / "recipe.json").write_text(json.dumps({
      "learning_rate": lr, "weight_decay": wd, "why": why, "seeds": list(seeds), "steps": args.steps,
      "settings": [list(k) for k in cells],
      "complete_grid": sorted(cells) == sorted(_grid(None)) and args.steps == protocol.RECIPE_STEPS}, indent=1))
  print(text.splitlines()[-1])
  print("fitted share per setting:", {k: float(np.mean([r["final_train_exact"] >= 0.95 for r in v]))
                                      for k, v in cells.items()})


if __name__ == "__main__":
  main()
