"""Methods stacked into one program against one program per method, on the Boolean default.

Runs `maskprior boolean --task f2 --seeds 5` (the four methods, the default config, nothing else
changed) on a one-device host with `train.stack_methods` on and off, for both run-block layouts:
runs stepped one at a time (`train.run_block=1`, the CPU default) and every run of the program in one
vmapped block (`all`, the accelerator default). Records each command's wall time, each program's loop
line (steps/s) and every run's `state_sha256`, and prints whether stacking changed any run's bits;
`--out` appends the JSON lines, `--markdown` prints the table of a file.

  python experiments/stack_methods_check.py --out experiments/results/stack_methods/cpu_2core.jsonl
  python experiments/stack_methods_check.py --markdown experiments/results/stack_methods/cpu_2core.jsonl
"""
import argparse
import json
import os
import re
import sys
import tempfile

import jax
from _cli_run import run_cli

LOOP = re.compile(r"\[([^\]]+)\] loop: (\d+) steps in ([\d.]+) s")


def run(workdir, block, stack, task, seeds):
  args = ["boolean", "--task", task, "--seeds", f"0-{seeds - 1}", f"--config.train.run_block={block}",
          f"--config.train.stack_methods={stack}"]
  res, stderr, wall = run_cli(args, workdir)
  programs = [{"program": m.group(1), "steps": int(m.group(2)), "loop_s": float(m.group(3))}
              for m in LOOP.finditer(stderr)]
  return {"run_block": block, "stack_methods": stack, "task": task, "seeds": seeds, "wall_s": wall,
          "programs": programs, "command": " ".join(["maskprior_jax.bench.cli", *args, "--workdir", workdir]),
          "state_sha256": {f"{r['method']}/{r['seed']}": r["state_sha256"] for r in res["runs"]},
          "unseen_mse_true": {f"{r['method']}/{r['seed']}": r["unseen_mse_true"] for r in res["runs"]},
          "backend": jax.default_backend(), "cpus": os.cpu_count(), "jax": jax.__version__}


def markdown(rows):
  lines = ["| run block | stacked | programs (loop s each) | command wall s | runs with the same bits as unstacked |",
           "|---|---|---|---|---|"]
  for r in rows:
    other = [o for o in rows if o["run_block"] == r["run_block"] and o["stack_methods"] != r["stack_methods"]]
    same = "-"
    if r["stack_methods"] == "on" and other:
      ref = other[0]["state_sha256"]
      same = f"{sum(ref[k] == v for k, v in r['state_sha256'].items())}/{len(ref)}"
    progs = ", ".join(f"{p['program'].split('/')[-1]} ({p['loop_s']:.0f})" for p in r["programs"])
    lines.append(f"| {r['run_block']} | {r['stack_methods']} | {progs} | {r['wall_s']:.0f} | {same} |")
  first = rows[0]
  lines += ["", f"Boolean default, task {first['task']}, seeds 0-{first['seeds'] - 1}, the four methods, one "
            f"{first['backend']} device ({first['cpus']} cores), JAX {first['jax']}."]
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--task", default="f2")
  p.add_argument("--seeds", type=int, default=5)
  p.add_argument("--blocks", default="1,all")
  p.add_argument("--out")
  p.add_argument("--markdown")
  a = p.parse_args()
  if a.markdown:
    print(markdown([json.loads(line) for line in open(a.markdown)]))
    return
  out = open(a.out, "a") if a.out else sys.stdout
  for block in a.blocks.split(","):
    for stack in ("off", "on"):
      with tempfile.TemporaryDirectory() as work:
        row = run(work, block, stack, a.task, a.seeds)
      print(json.dumps(row), file=out, flush=True)
      print(f"run_block={block} stack_methods={stack}: {row['wall_s']:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
  main()
