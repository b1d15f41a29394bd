"""Round 4 of the Boolean protocol: attention-only reader designs (`protocol.DROPIN_CANDIDATES`) on
the generated tasks with the exploration seeds, scored by their excess over each task's
structure-only bound, then the round's rule (`protocol.select_dropin`).

  python experiments/boolean_dropin.py --workdir experiments/results/boolean_dropin/exploration
  python experiments/boolean_dropin.py --tasks g1000,g1003 --seeds 100-101 --steps 500 --workdir runs/q  # a quick look

Each generated task runs the candidates with the built-in config in its own run folder (rerunning
skips what is finished). Writes dropin.md (per task: the bound; per design the median unseen MSE /
MDI's over seeds with the per-seed values, and the excess over the bound) and selection.md (the
rule's choice, whether it passed, and why). The confirmation is a plain headline run of the
selected design: `maskprior boolean --methods <design> --seeds 0-4 --workdir ...`.
"""
import argparse
import pathlib

from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.args import script_seeds, script_tasks
from maskprior_jax.bench.boolean import protocol
from maskprior_jax.bench.boolean import report as boolean_report
from maskprior_jax.bench.boolean import run as boolean_run


def main():
  tasks_default = [t for t in protocol.GENERATED_TASKS if t not in protocol.DROPIN_DROPPED]
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", default="runs/dropin")
  p.add_argument("--seeds", default=f"{protocol.EXPLORATION_SEEDS[0]}-{protocol.EXPLORATION_SEEDS[-1]}",
                 help="exploration seeds (default: %(default)s)")
  p.add_argument("--steps", type=int, default=2000, help="training steps (default: %(default)s)")
  p.add_argument("--tasks", default=",".join(tasks_default), help="generated tasks (default: all but DROPIN_DROPPED)")
  p.add_argument("--designs", default=",".join(protocol.DROPIN_CANDIDATES), help="(default: %(default)s)")
  args = p.parse_args()
  seeds = script_seeds(args.seeds, protocol.CONFIRMATION_SEEDS)
  tasks, methods = script_tasks(args.tasks, protocol.GENERATED_TASKS), args.designs.split(",")
  root = pathlib.Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  cfg = protocol.exploration_config(args.steps)
  table, bounds = {m: {} for m in methods}, {}
  for name in tasks:
    res = boolean_run.run_task(protocol.GENERATED_TASKS[name], cfg, methods, seeds, root / name, log=lambda *a: None)
    bounds[name] = boolean_report.structure_bound(res)
    for m in methods:
      table[m][name] = boolean_report.seed_ratios(res, m)
    print(name, f"bound {bounds[name]:.3f}", {m: f"{protocol.dropin_excess(table[m][name], bounds[name]):+.3f}" for m in methods},
          flush=True)
  rows = []
  for name in tasks:
    row = [name, f"{bounds[name]:.3f}"]
    for m in methods:
      row += [boolean_report.median_cell(table[m][name]), f"{protocol.dropin_excess(table[m][name], bounds[name]):+.3f}"]
    rows.append(row)
  header = ["task", "structure-only bound"] + [c for m in methods for c in (f"{m}: unseen / MDI's (per seed)", f"{m}: excess")]
  specs = "\n".join(f"- {t}: n = {protocol.GENERATED_TASKS[t].n}, `{protocol.GENERATED_TASKS[t].target}` seen where "
                    f"`{protocol.GENERATED_TASKS[t].seen}`" for t in tasks)
  (root / "dropin.md").write_text(
      f"Unseen MSE / MDI's unseen MSE, median over seeds {seeds} (per-seed values), {args.steps} steps, and the excess "
      f"of that median over the task's structure-only bound (the lower of support LSQ and count lookup).\n\n{specs}\n\n"
      + results_lib.markdown_table(header, rows))
  choice, passed, why = protocol.select_dropin(table, bounds)
  (root / "selection.md").write_text(f"Selected: **{choice}** ({'passes' if passed else 'fails'} the rule). {why}.\n")
  print(f"selected: {choice} ({'passes' if passed else 'fails'}): {why}")


if __name__ == "__main__":
  main()
