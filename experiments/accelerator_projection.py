"""A projection, not a measurement: the wall time of each benchmark's default command and of the
paper-size Boolean headline on each accelerator target, from the FLOPs of the programs
`maskprior compile` built for it (experiments/accelerator_compile.py's JSON lines) at a stated MFU.

  python experiments/accelerator_projection.py --markdown experiments/results/accelerator_compile/programs.jsonl

Per command: every method group's training calls for the config's train.steps and its evaluations
(every eval.every_steps, and at step 0), one group after another as the runner runs them, each on the
devices its program uses; at 10% and at 45% of the target's dense peak for the model's dtype
(`bench.compile.TARGETS`), and the MFU at which the command would take 5 minutes. Not included: the
compile time (the last column gives what compiling took on this 2-core CPU, two jobs at once), the
initialisation (qk's fit), checkpoints and the final metrics. The paper-size headline is 5 tasks x 4
methods x 5 seeds: the f1 programs count four times (f1 to f4 have n = 15 in boolean_paper, the same
program sizes) and frozen_coordinate's (n = 18) once.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from accelerator_compile import DTYPES, PAPER_HEADLINE_TASKS, _commands, _headline, _steps, load  # noqa: E402

MFUS = (0.10, 0.45)          # the stated MFUs
GOAL_SECONDS = 300           # the paper-size headline in at most 5 minutes on one device


def _dur(seconds: float) -> str:
  if seconds < 10:
    return f"{seconds:.1f} s"
  return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.1f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def markdown(rows) -> str:
  from maskprior_jax.bench.compile import TARGETS, projection
  groups = _commands(rows)
  lines = [f"| target | dtype | command | steps | PFLOP in all | at {MFUS[0]:.0%} MFU | at {MFUS[1]:.0%} MFU | "
           f"MFU for {GOAL_SECONDS // 60} minutes | compiling here |", "|---|---|---|---|---|---|---|---|---|"]
  for target, t in TARGETS.items():
    if not t.peak:
      continue
    for dtype in DTYPES:
      plans = [("boolean_paper headline (5 tasks x 4 methods x 5 seeds)",
                _headline(groups, target, dtype, "boolean_paper", PAPER_HEADLINE_TASKS), _steps("boolean_paper"))]
      plans += [(f"{b} (default)", groups.get((target, dtype, b)), _steps(b))
                for b in ("boolean", "arithmetic", "vision", "language")]
      for name, rs, steps in plans:
        if not rs:
          continue
        flops = sum(r["flops_per_call"] * (r["calls_per_step"] * steps + (r["program"] == "eval")) for r in rs)
        times = [projection(rs, steps, m, t.peak[dtype]) for m in MFUS]
        need = projection(rs, steps, 1.0, t.peak[dtype]) / GOAL_SECONDS
        needed = f"{need:.1%}" if need >= 0.001 else "<0.1%"
        lines.append(f"| {target} | {dtype} | {name} | {steps:,} | {flops / 1e15:,.3f} | {_dur(times[0])} | "
                     f"{_dur(times[1])} | {needed} | {_dur(sum(r['compile_seconds'] for r in rs))} |")
  return "\n".join(lines) + "\n"


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--markdown", required=True, help="the JSON-lines file of experiments/accelerator_compile.py")
  a = p.parse_args()
  print(markdown(load(pathlib.Path(a.markdown))), end="")


if __name__ == "__main__":
  main()
