"""Loop efficiency: the training loop as the `maskprior` commands run it, against its compiled step alone.

For each benchmark's default config (the mask method, `--seeds` runs, the default cadences of
logging, evaluation, checkpoints and TensorBoard; `runner.run`, what every `maskprior` command
calls): the loop's steps/s (the loop's own timing, from the end of its first, compiling call to its
end, every evaluation, log line and checkpoint included) divided by the steps/s of the same
compiled step with device batches, called back to back with nothing else. Both batch sources are
measured (`host`: numpy batches built every step; `device`), each `--repeats` times, the bare step
timed just before and just after every loop (the median of those six timings is the denominator: a
shared machine's speed drifts between minutes); the tables give every repeat. Then run
scaling: run-steps/s (steps/s x stacked runs) of the Boolean default's step for 1, 5, 20 and 80
stacked runs. One JSON line per measurement; `--markdown` prints the tables.

  python experiments/loop_efficiency.py --out experiments/results/loop_efficiency/cpu.jsonl
  python experiments/loop_efficiency.py --markdown experiments/results/loop_efficiency/cpu.jsonl
"""
import argparse
import dataclasses
import json
import logging
import os
import pathlib
import platform
import re
import sys
import tempfile
import time

import jax
import numpy as np

from maskprior_jax import train
from maskprior_jax.bench import config as C
from maskprior_jax.bench import runner

BENCHMARKS = ("boolean", "arithmetic", "vision", "language")
LOOP_LINE = re.compile(r"loop: (\d+) steps in ([\d.]+) s.*evaluation ([\d.]+) s, checkpoints ([\d.]+) s")


def make_bench(name, seeds):
  cfg = C.builtin_config(name)
  if name == "boolean":
    from maskprior_jax.bench.boolean import run, tasks
    return run.BooleanTask(tasks.TASKS["f2_2parity"], cfg)
  if name == "arithmetic":
    from maskprior_jax.bench.arithmetic.run import Arithmetic
    return Arithmetic(cfg, seeds)
  from maskprior_jax.bench import supervised
  module = __import__(f"maskprior_jax.bench.{name}.run", fromlist=["load_problem"])
  return supervised.Supervised(cfg, module.load_problem(cfg))


class _LoopLines(logging.Handler):
  def __init__(self):
    super().__init__()
    self.lines = []

  def emit(self, record):
    self.lines.append(record.getMessage())


def loop_rate(name, seeds, batches, steps):
  """Steps/s of the loop as `runner.run` drives it, from the loop's own timing line."""
  bench = make_bench(name, seeds)
  bench.settings = dataclasses.replace(bench.settings, batches=batches, **({"steps": steps} if steps else {}))
  handler = _LoopLines()
  log = logging.getLogger("maskprior_jax.train")
  log.addHandler(handler)
  log.setLevel(logging.INFO)
  try:
    with tempfile.TemporaryDirectory() as work:
      t0 = time.perf_counter()
      runner.run(bench, ["mask"], seeds, pathlib.Path(work), log=lambda *a: None)
      total = time.perf_counter() - t0
  finally:
    log.removeHandler(handler)
  found = [m for m in map(LOOP_LINE.search, handler.lines) if m]
  n, s, ev, ck = int(found[-1].group(1)), float(found[-1].group(2)), float(found[-1].group(3)), float(found[-1].group(4))
  return bench, {"loop_steps": n, "loop_s": s, "loop_steps_per_s": n / s, "evaluation_s": ev, "checkpoint_s": ck,
                 "loop_steps_per_s_without_evaluation": n / (s - ev), "command_s": total,
                 "steps": bench.settings.steps, "eval_every": bench.settings.eval_every,
                 "checkpoint_every": bench.settings.checkpoint_every, "log_every": bench.settings.log_every}


def step_rate(bench, num_runs, calls, repeats=3, run_block=None):
  """Steps/s of the compiled step (device batches) called back to back, nothing else: the median of
  `repeats` timings of `calls` calls each; the loop's program (its placement and run blocks, or
  `run_block` in place of the config's)."""
  settings = bench.settings if run_block is None else dataclasses.replace(bench.settings, run_block=run_block)
  runs = bench.runs(list(range(num_runs)))
  method = dataclasses.replace(bench.method("mask"), settings=settings)
  tx = settings.optimizer()
  inits = [runner.initial_variables(method, method.model, bench, r.seed)[0] for r in runs]
  placement = settings.placement(len(runs), train.num_params(inits[0]))
  state = train.stack_trees([train.create_state(v, tx, jax.random.key(r.key)) for v, r in zip(inits, runs)])
  drawn = bench.device_batches(runs)   # fn(step, run), or DeviceBatches with the data it reads
  batches = drawn if isinstance(drawn, train.DeviceBatches) else train.DeviceBatches(drawn)
  # the loop's own stepper: its placement, its run blocks (each call dispatched without waiting)
  stepper = train.stepper(bench.loss_fn(method.model), tx, state, [r.key for r in runs], batches, settings, placement)
  k = placement.run_block
  stepper.step(0)   # compile
  stepper.ready()
  rates, done = [], 1
  for _ in range(repeats):   # the median of several timings: a shared CPU's speed drifts
    t0 = time.perf_counter()
    for _ in range(calls):
      m = stepper.step(done * settings.steps_per_call)
      done += 1
    stepper.ready()
    jax.block_until_ready(m)
    rates.append(calls * settings.steps_per_call / (time.perf_counter() - t0))
  return {"step_steps_per_s": float(np.median(rates)), "step_steps_per_s_each": rates, "placement": placement.mode,
          "devices": placement.devices, "run_block": k}


def env():
  return {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "devices": jax.device_count(), "cpus": os.cpu_count(), "jax": jax.__version__,
          "machine": platform.processor() or platform.machine()}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--benchmarks", default=",".join(BENCHMARKS))
  p.add_argument("--seeds", type=int, default=3, help="runs per loop (the commands' default: 3)")
  p.add_argument("--steps", type=int, default=0, help="train.steps (0: the config's default)")
  p.add_argument("--calls", type=int, default=10, help="calls of the bare step per timing")
  p.add_argument("--repeats", type=int, default=2, help="loop measurements per benchmark and batch source")
  p.add_argument("--runs", default="1,5,20,80", help="stacked runs for the scaling table (Boolean default)")
  p.add_argument("--run-blocks", default="all,1",
                 help="train.run_block values for the scaling table (all: one vmapped block; 1: one run at a time)")
  p.add_argument("--out", help="append JSON lines here (default: stdout)")
  p.add_argument("--markdown", help="print the tables of a JSON-lines file and exit")
  p.add_argument("--brief", action="store_true", help="with --markdown: the summaries only, not every timing")
  p.add_argument("--chart", help="with --markdown: also draw the loop's efficiency to this PNG (numbers as .json)")
  a = p.parse_args()
  if a.markdown:
    rows = [json.loads(line) for line in open(a.markdown)]
    print(markdown(rows, brief=a.brief))
    if a.chart:
      chart(rows, a.chart)
    return
  out = open(a.out, "a") if a.out else sys.stdout
  seeds = list(range(a.seeds))
  for name in a.benchmarks.split(","):
    for batches in ("host", "device"):
      for repeat in range(a.repeats):
        # The bare step timed right before and right after the loop: a shared machine's speed drifts
        # by a fifth within minutes, so the loop is compared with the step as fast as it ran around it.
        before = step_rate(make_bench(name, seeds), len(seeds), a.calls)
        bench, loop = loop_rate(name, seeds, batches, a.steps)
        after = step_rate(bench, len(seeds), a.calls)
        bare = {**after, "step_steps_per_s_each": before["step_steps_per_s_each"] + after["step_steps_per_s_each"]}
        bare["step_steps_per_s"] = float(np.median(bare["step_steps_per_s_each"]))
        row = {"kind": "loop", "benchmark": name, "batches": batches, "seeds": len(seeds), "repeat": repeat,
               **loop, **bare, "efficiency": loop["loop_steps_per_s"] / bare["step_steps_per_s"],
               "efficiency_without_evaluation": loop["loop_steps_per_s_without_evaluation"] / bare["step_steps_per_s"],
               **env()}
        print(json.dumps(row), file=out, flush=True)
  bench = make_bench("boolean", [0])
  for block in a.run_blocks.split(","):
    for r in (int(t) for t in a.runs.split(",") if t):
      bare = step_rate(bench, r, a.calls, run_block=block)
      print(json.dumps({"kind": "scaling", "benchmark": "boolean", "runs": r, **bare,
                        "run_steps_per_s": r * bare["step_steps_per_s"], **env()}), file=out, flush=True)


def _block(row) -> str:
  """The run block a row was measured with (rows from before train.run_block: one vmapped block)."""
  if "run_block" not in row:
    return ""
  return ", one block" if not row["run_block"] else f", blocks of {row['run_block']}"


def chart(rows, path) -> None:
  """The loop's efficiency (loop steps/s over the bare step's) per benchmark and batch source: each
  repeat a dot, the median a line; its numbers beside the picture as .json."""
  from maskprior_jax.bench import charts
  from maskprior_jax.bench import results as results_lib
  loops = [r for r in rows if r["kind"] == "loop"]
  keys = list(dict.fromkeys((r["benchmark"], r["batches"]) for r in loops))
  data = [{"benchmark": b, "batches": s, "efficiency": [round(r["efficiency"], 4) for r in loops
                                                        if (r["benchmark"], r["batches"]) == (b, s)]} for b, s in keys]
  fig, ax = results_lib.new_figure((7.5, 3.4))
  for i, d in enumerate(data):
    color = "C0" if d["batches"] == "host" else "C1"
    ax.scatter([i] * len(d["efficiency"]), d["efficiency"], s=16, color=color, zorder=3,
               label=f"{d['batches']} batches" if i < 2 else None)
    ax.hlines(np.median(d["efficiency"]), i - 0.3, i + 0.3, colors=color, lw=2)
  ax.axhline(1.0, ls="--", c="gray", lw=0.8)
  ax.set_xticks(range(len(data)), [f"{d['benchmark']}\n{d['batches']}" for d in data], fontsize=8)
  ax.set_ylabel("loop steps/s over the bare step's")
  ax.set_title("The training loop's efficiency: each repeat, and the median (1 = no overhead)", fontsize=9)
  ax.legend(fontsize=7)
  charts.save(fig, data, path)


def markdown(rows, brief: bool = False):
  lines = [] if brief else [
      "| benchmark | batches | runs | loop steps/s | bare step steps/s (median; each timing) | efficiency | evaluation "
      "share of the loop | efficiency without the evaluation's compute | placement |", "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if r["kind"] == "loop" and not brief:
      lines.append(f"| {r['benchmark']} | {r['batches']} | {r['seeds']} | {r['loop_steps_per_s']:.1f} | "
                   f"{r['step_steps_per_s']:.1f} ({', '.join(f'{x:.1f}' for x in r.get('step_steps_per_s_each', []))}) | "
                   f"{r['efficiency']:.2f} | {r['evaluation_s'] / r['loop_s']:.2f} | "
                   f"{r['efficiency_without_evaluation']:.2f} | {r['placement']} x{r['devices']}{_block(r)} |")
  loops = [r for r in rows if r["kind"] == "loop" and "repeat" in r]
  if loops:   # the repeats side by side, their median and the lowest (this shared machine drifts both ways)
    lines += [""] * bool(lines) + ["| benchmark | batches | efficiency, each repeat | median | lowest |", "|---|---|---|---|---|"]
    for key in dict.fromkeys((r["benchmark"], r["batches"]) for r in loops):
      eff = [r["efficiency"] for r in loops if (r["benchmark"], r["batches"]) == key]
      lines.append(f"| {key[0]} | {key[1]} | {', '.join(f'{e:.2f}' for e in eff)} | {np.median(eff):.2f} | {min(eff):.2f} |")
  scaling = [r for r in rows if r["kind"] == "scaling"]
  if scaling:
    lines += ["", "| stacked runs (Boolean default) | steps/s | run-steps/s | placement |", "|---|---|---|---|"]
    for r in scaling:
      lines.append(f"| {r['runs']} | {r['step_steps_per_s']:.1f} | {r['run_steps_per_s']:.0f} | "
                   f"{r['placement']} x{r['devices']}{_block(r)} |")
  first = rows[0]
  lines += ["", f"Measured on {first['device_kind']} ({first['backend']}, {first['devices']} device(s), "
            f"{first['cpus']} CPU cores), JAX {first['jax']}."]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
