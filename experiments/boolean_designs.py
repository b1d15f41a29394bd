"""Exploration of the Boolean reader designs on the generated tasks of
`maskprior_jax.bench.boolean.protocol` (GENERATED_TASKS, never the headline's), then the protocol's
design rule (`select_design`).

  python experiments/boolean_designs.py --workdir runs/designs                 # the whole exploration
  python experiments/boolean_designs.py --tasks g1000,g1003 --seeds 100-101 --steps 500   # a quick look

Each task runs vanilla, mask and every design with the built-in config in its own run folder
(rerunning skips what is finished). Writes designs.md (per method and task: unseen MSE / MDI's,
median over seeds and per-seed values; the kept and dropped tasks) and selection.md (the rule's
choice and why).
"""
import argparse
import pathlib


from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.args import script_seeds, script_tasks
from maskprior_jax.bench.boolean import protocol
from maskprior_jax.bench.boolean import report as boolean_report
from maskprior_jax.bench.boolean import run as boolean_run


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="runs/designs")
  p.add_argument("--seeds", default=f"{protocol.EXPLORATION_SEEDS[0]}-{protocol.EXPLORATION_SEEDS[-1]}",
                 help="exploration seeds (default: %(default)s)")
  p.add_argument("--steps", type=int, default=2000, help="training steps (default: %(default)s)")
  p.add_argument("--tasks", default=",".join(protocol.GENERATED_TASKS), help="generated tasks (default: all)")
  args = p.parse_args()
  seeds = script_seeds(args.seeds, protocol.CONFIRMATION_SEEDS)
  tasks = script_tasks(args.tasks, protocol.GENERATED_TASKS)
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  cfg = protocol.exploration_config(args.steps)
  methods = ["vanilla", protocol.DESIGN_BASELINE, *protocol.DESIGN_CANDIDATES]
  table = {m: {} for m in methods}
  for name in tasks:
    task = protocol.GENERATED_TASKS[name]
    res = boolean_run.run_task(task, cfg, methods, seeds, root / name, log=lambda *a: None)
    for m in methods:
      table[m][name] = boolean_report.seed_ratios(res, m)
    print(name, {m: boolean_report.median_cell(table[m][name]) for m in methods}, flush=True)
  kept, dropped = protocol.kept_tasks(table["vanilla"])
  rows = []
  for m in methods:
    sc, share, spread = protocol.score({t: table[m][t] for t in kept}) if kept else (float("nan"),) * 3
    rows.append([m] + [boolean_report.median_cell(table[m][t]) for t in tasks] + [f"{sc:.3f} (fit {share:.0%}, spread {spread:.3f})"])
  specs = "\n".join(f"- {t}: n = {protocol.GENERATED_TASKS[t].n}, `{protocol.GENERATED_TASKS[t].target}` seen where "
                    f"`{protocol.GENERATED_TASKS[t].seen}`" for t in tasks)
  (root / "designs.md").write_text(
      f"Unseen MSE / MDI's unseen MSE, median over seeds {seeds} (per-seed values), {args.steps} steps. Score over the "
      f"kept tasks ({', '.join(kept) or 'none'}); dropped (vanilla fits in fewer than "
      f"{protocol.MIN_FIT_SHARE:.0%} of seeds): {', '.join(dropped) or 'none'}.\n\n{specs}\n\n"
      + results_lib.markdown_table(["method"] + tasks + ["score (kept tasks)"], rows))
  if kept:
    choice, why = protocol.select_design({m: {t: table[m][t] for t in kept}
                                          for m in [protocol.DESIGN_BASELINE, *protocol.DESIGN_CANDIDATES]})
    (root / "selection.md").write_text(f"Selected: **{choice}**. {why}.\n")
    print(f"selected: {choice}: {why}")


if __name__ == "__main__":
  main()
