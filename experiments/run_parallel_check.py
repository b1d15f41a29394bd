"""Run-parallel against one device, on the Boolean default: the same seeds, the same bits?

Runs `maskprior boolean --task f2 --seeds 8 --methods mask` (the default config, nothing else
changed) as a user would on a host with 8 devices (8 forced host devices: it picks run-parallel by
itself), then the same command with `--config.train.parallel=off` on that host (one device), then on
a host with a single device; and the same three with `--config.train.run_block=all` (every run of a
device in one vmapped block). Prints, per seed, each layout's `state_sha256` and whether they agree,
with each command's placement and wall time; `--out` appends the JSON lines.

  python experiments/run_parallel_check.py --out experiments/results/run_parallel/cpu_2core.jsonl
  python experiments/run_parallel_check.py --markdown experiments/results/run_parallel/cpu_2core.jsonl
"""
import argparse
import json
import os
import sys
import tempfile

import jax
from _cli_run import run_cli

LAYOUTS = (("8 devices, auto", 8, []), ("8 devices, parallel=off", 8, ["--config.train.parallel=off"]),
           ("1 device", 1, []))


def run(workdir, devices, extra, task, seeds, overrides):
  res, _, wall = run_cli(["boolean", "--task", task, "--seeds", str(seeds), "--methods", "mask", *extra, *overrides],
                        workdir, devices)
  return {"placement": res["environment"]["placement"]["mask"], "wall_s": wall,
          "state_sha256": {str(r["seed"]): r["state_sha256"] for r in res["runs"]},
          "seen_mse": {str(r["seed"]): r["seen_mse"] for r in res["runs"]}}


def markdown(rows):
  lines = []
  for block in dict.fromkeys(r["run_block"] for r in rows):
    group = [r for r in rows if r["run_block"] == block]
    seeds = list(group[0]["state_sha256"])
    lines += [f"train.run_block={block}:", "",
              "| seed | " + " | ".join(r["layout"] for r in group) + " | all equal |",
              "|---" * (len(group) + 2) + "|"]
    for s in seeds:
      digests = [r["state_sha256"][s] for r in group]
      lines.append(f"| {s} | " + " | ".join(d[:12] for d in digests) + f" | {'yes' if len(set(digests)) == 1 else 'no'} |")
    lines.append("| placement | " + " | ".join(
        f"{r['placement']['mode']} x{r['placement']['devices']}, block {r['placement'].get('run_block', 0) or 'all'}"
        for r in group) + " | |")
    lines.append("| wall s | " + " | ".join(f"{r['wall_s']:.0f}" for r in group) + " | |")
    lines.append("")
  first = rows[0]
  lines.append(f"Boolean default, task {first['task']}, {len(first['state_sha256'])} seeds, method mask; "
               f"{first['cpus']} CPU cores, JAX {first['jax']}.")
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--task", default="f2")
  p.add_argument("--seeds", type=int, default=8)
  p.add_argument("--run-blocks", default="auto,all", help="train.run_block values to check")
  p.add_argument("--config", action="append", default=[], help="extra --config.KEY=VALUE overrides (tests)")
  p.add_argument("--out", help="append JSON lines here (default: stdout)")
  p.add_argument("--markdown", help="print the tables of a JSON-lines file and exit")
  a = p.parse_args()
  if a.markdown:
    with open(a.markdown) as f:
      print(markdown([json.loads(line) for line in f]))
    return
  rows = []
  with tempfile.TemporaryDirectory() as work:
    for block in a.run_blocks.split(","):
      for i, (name, devices, extra) in enumerate(LAYOUTS):
        out = run(os.path.join(work, f"{block}_{i}"), devices, extra, a.task, a.seeds,
                  [f"--config.train.run_block={block}", *a.config])
        rows.append({"run_block": block, "layout": name, "task": a.task, **out, "cpus": os.cpu_count(),
                     "jax": jax.__version__})
        print(f"[run_parallel_check] run_block={block} {name}: {out['wall_s']:.0f} s", file=sys.stderr, flush=True)
  sink = open(a.out, "a") if a.out else sys.stdout
  for r in rows:
    print(json.dumps(r), file=sink, flush=True)
  print(markdown(rows), file=sys.stderr)


if __name__ == "__main__":
  main()
