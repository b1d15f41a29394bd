"""Exploration for the arithmetic benchmark on the exploration seeds of
`maskprior_jax.bench.arithmetic.protocol` (never the confirmation seeds): the training budget,
then the prior variants, each followed by the protocol's rule.

  python experiments/arithmetic_explore.py budget --workdir runs/arith_explore
  python experiments/arithmetic_explore.py variants --steps 1500 --weight-decay 0.1 --workdir runs/arith_explore

`budget` writes budget.md (test exact match, teacher forced, at each checkpoint step, per method,
size and weight decay, with per-seed values) and the rule's choice; `variants` writes variants.md
(the mask's greedy exact match per variant and size) and the rule's choice. Finished runs are kept
when the command is rerun.
"""
import argparse
import json
import pathlib

import numpy as np

from maskprior_jax.bench.arithmetic import protocol
from maskprior_jax.bench.args import script_seeds
from maskprior_jax.bench import cli


def _run(workdir, methods, sizes, seeds, overrides):
  args = ["arithmetic", "--workdir", str(workdir), "--methods", ",".join(methods),
          "--train-sizes", ",".join(map(str, sizes)), "--seeds", ",".join(map(str, seeds)), *protocol.SECOND_ROUND, *overrides]
  rc = cli.main(args)
  if rc:
    raise SystemExit(f"maskprior {' '.join(args)} exited with {rc}")
  return json.loads((pathlib.Path(workdir) / "results.json").read_text())


def _per_seed(values) -> str:
  return f"{np.mean(values):.3f} ± {np.std(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})"


def budget(args, seeds, root):
  cells, lines = {}, []
  for wd in protocol.BUDGET_WEIGHT_DECAYS:
    res = _run(root / f"budget_wd{wd}", protocol.BUDGET_METHODS, protocol.BUDGET_SIZES, seeds, [
        f"--config.train.steps={protocol.BUDGET_STEPS}", f"--config.train.weight_decay={wd}",
        "--config.eval.every_steps=500", "--config.checkpoint.every_steps=1000"])
    for m in protocol.BUDGET_METHODS:
      c = res["curves"][m]
      for n in protocol.BUDGET_SIZES:
        cols = [i for i, (size, _) in enumerate(c["runs"]) if size == n]
        for steps in protocol.BUDGET_CHECKPOINTS:
          t = c["step"].index(steps)
          cells[(m, n, steps, wd)] = [float(c["test_exact"][t][i]) for i in cols]
        final = [r["exact_match"] for r in res["runs"] if r["method"] == m and r["train_size"] == n]
        train = [r["final_train_exact"] for r in res["runs"] if r["method"] == m and r["train_size"] == n]
        lines.append(f"| {m} | {n} | {wd} | " + " | ".join(
            _per_seed(cells[(m, n, s, wd)]) for s in protocol.BUDGET_CHECKPOINTS)
            + f" | {_per_seed(final)} | {np.mean(train):.2f} |")
  chosen, why = protocol.select_budget(cells)
  out = (f"Budget measurement, seeds {list(seeds)}: test exact match (teacher forced) at each step count "
         f"of one {protocol.BUDGET_STEPS}-step run; the last columns are the greedy exact match and the "
         "train exact match at the end.\n\n"
         "| method | train size | weight decay | " + " | ".join(f"step {s}" for s in protocol.BUDGET_CHECKPOINTS)
         + " | greedy, end | train exact, end |\n|---|---|---|" + "---|" * (len(protocol.BUDGET_CHECKPOINTS) + 2)
         + "\n" + "\n".join(lines) + f"\n\nRule: {chosen} — {why}\n")
  (root / "budget.md").write_text(out)
  print(out)


def variants(args, seeds, root):
  table, lines = {}, []
  for name, overrides in protocol.VARIANTS.items():
    res = _run(root / f"variant_{name}", ["mask"], protocol.VARIANT_SIZES, seeds, overrides + [
        f"--config.train.steps={args.steps}", f"--config.train.weight_decay={args.weight_decay}",
        "--config.eval.every_steps=500", "--config.checkpoint.every_steps=1000"])
    table[name] = {n: [r["exact_match"] for r in sorted(res["runs"], key=lambda r: r["seed"])
                       if r["method"] == "mask" and r["train_size"] == n] for n in protocol.VARIANT_SIZES}
    lines.append(f"| {name} | " + " | ".join(_per_seed(table[name][n]) for n in protocol.VARIANT_SIZES) + " |")
  chosen, why = protocol.select_variant(table)
  out = (f"Prior variants (mask method), seeds {list(seeds)}, {args.steps} steps, weight decay "
         f"{args.weight_decay}: greedy test exact match.\n\n| variant | "
         + " | ".join(str(n) for n in protocol.VARIANT_SIZES) + " |\n|---|" + "---|" * len(protocol.VARIANT_SIZES)
         + "\n" + "\n".join(lines) + f"\n\nRule: {chosen} — {why}\n")
  (root / "variants.md").write_text(out)
  print(out)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("part", choices=("budget", "variants"))
  p.add_argument("--workdir", default="runs/arith_explore")
  p.add_argument("--seeds", default=f"{protocol.EXPLORATION_SEEDS[0]}-{protocol.EXPLORATION_SEEDS[-1]}")
  p.add_argument("--steps", type=int, default=protocol.CURRENT_BUDGET["steps"], help="variants: (default: %(default)s)")
  p.add_argument("--weight-decay", type=float, default=protocol.CURRENT_BUDGET["weight_decay"],
                 help="variants: (default: %(default)s)")
  args = p.parse_args()
  seeds = script_seeds(args.seeds, protocol.CONFIRMATION_SEEDS)
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  (budget if args.part == "budget" else variants)(args, seeds, root)


if __name__ == "__main__":
  main()
