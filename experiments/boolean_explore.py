"""Exploration for the Boolean mask prior: prior variants on the exploration tasks and seeds of
`maskprior_jax.bench.boolean.protocol` (never the headline's), then the protocol's selection rule.

  python experiments/boolean_explore.py --workdir runs/explore            # every variant, mask + vanilla
  python experiments/boolean_explore.py --variants default,noself --seeds 100-101 --steps 500   # a quick look

Writes explore.md (one row per variant: unseen MSE / MDI's per task, median and per-seed values,
fitted runs) and selection.md (the rule's choice and why). Finished (variant, task) runs are kept
when the command is rerun.
"""
import argparse
import pathlib


from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.boolean import protocol
from maskprior_jax.bench.boolean import report as boolean_report
from maskprior_jax.bench.boolean import run as boolean_run
from maskprior_jax.bench.args import script_seeds


def run_variant(name: str, method: str, seeds, steps: int, root: pathlib.Path) -> dict:
  """{task: per-seed unseen/MDI's ratios (None where the run did not fit)} for one variant."""
  cfg = protocol.exploration_config(steps, protocol.EXPLORATION_BASE + protocol.VARIANTS[name])
  out = {}
  for tname, task in protocol.EXPLORATION_TASKS.items():
    res = boolean_run.run_task(task, cfg, [method], seeds, root / f"{name}_{method}" / tname, log=lambda *a: None)
    out[tname] = boolean_report.seed_ratios(res, method)
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="runs/explore")
  p.add_argument("--seeds", default=f"{protocol.EXPLORATION_SEEDS[0]}-{protocol.EXPLORATION_SEEDS[-1]}",
                 help="exploration seeds (default: %(default)s)")
  p.add_argument("--steps", type=int, default=2000, help="training steps (default: %(default)s)")
  p.add_argument("--variants", default=",".join(protocol.VARIANTS), help="(default: all)")
  p.add_argument("--reference", default="vanilla", help="a method run once per task for reference ('' for none)")
  args = p.parse_args()
  seeds = script_seeds(args.seeds, protocol.CONFIRMATION_SEEDS)
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  tasks = list(protocol.EXPLORATION_TASKS)
  table, rows = {}, []
  if args.reference:
    ref = run_variant(protocol.DEFAULT, args.reference, seeds, args.steps, root)
    rows.append([args.reference, "-"] + [boolean_report.median_cell(ref[t]) for t in tasks] + ["-"])
  for name in args.variants.split(","):
    table[name] = run_variant(name, "mask", seeds, args.steps, root)
    sc, share, spread = protocol.score(table[name])
    rows.append([name, " ".join(protocol.VARIANTS[name]) or "(built-in default)"]
                + [boolean_report.median_cell(table[name][t]) for t in tasks] + [f"{sc:.3f} (fit {share:.0%}, spread {spread:.3f})"])
    md = results_lib.markdown_table(["variant", "overrides"] + tasks + ["score"], rows)
    (root / "explore.md").write_text(
        f"Unseen MSE / MDI's unseen MSE, median over seeds {seeds} (per-seed values), {args.steps} steps; "
        "rows are the mask prior's variants, the first row the reference method.\n\n" + md)
    print(rows[-1], flush=True)
  if protocol.DEFAULT in table:
    choice, why = protocol.select_default(table)
    (root / "selection.md").write_text(f"Selected: **{choice}**. {why}.\n")
    print(f"selected: {choice}: {why}")


if __name__ == "__main__":
  main()
