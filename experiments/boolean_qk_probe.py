"""Round 5 of the Boolean protocol, part 1: how many inputs the qk baseline's fit needs
(`protocol.QK_FIT_SIZES`), by the rule `protocol.select_qk_fit_size`, written before this ran.

  python experiments/boolean_qk_probe.py --out experiments/results/boolean_qk_probe        # measure (about 50 min, 2 cores)
  python experiments/boolean_qk_probe.py --markdown experiments/results/boolean_qk_probe   # the tables again

For each exploration task (its supports at n = `protocol.QK_EXPLORATION_N`), exploration seed, size
and two draws (`run.qk_fit_points` draws 0 and 1), the qk model's query/key weights are fitted as the
qk method fits them (`baselines.fit_qk`, the built-in config's steps and rate, batches of
`protocol.QK_FIT_BATCH`), then measured on
`protocol.QK_HELDOUT` points of a third draw, never fitted on: (a) the total-variation distance of the
fitted attention to the prior's pattern, (b) the distance between the two draws' fitted attention
(means over layers, heads, query rows and points). No training. Writes fits.jsonl (one line per
task, seed, size), qk_probe.md (medians per size, per-task values) and selection.md (the rule's choice).
"""
import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from maskprior_jax import baselines, measure
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.boolean import protocol
from maskprior_jax.bench.boolean import run as boolean_run
from maskprior_jax.bench.boolean.tasks import Task
from maskprior_jax.bench.config import builtin_config

HELDOUT_DRAW = 2


def _tv(maps, target) -> float:
  return float(np.mean([0.5 * jnp.abs(a - target).sum(-1).mean() for a in maps]))


def _between(maps_a, maps_b) -> float:
  return float(np.mean([0.5 * jnp.abs(a - b).sum(-1).mean() for a, b in zip(maps_a, maps_b)]))


class _Fits:
  """One exploration task's qk model, target and built-in fit settings: `start(seed)` gives the seed's
  initial variables and held-out points, `maps` fits on inputs and measures on those points."""

  def __init__(self, task: Task):
    self.task, self.cfg = task, builtin_config("boolean")
    bench = boolean_run.BooleanTask(task, self.cfg)
    self.model, self.sample = bench.model("qk"), bench.sample_input
    self.target = jnp.asarray(bench.probe.target_attn)

  def start(self, seed: int):
    heldout = boolean_run.to_ids(boolean_run.qk_fit_points(self.task.n, protocol.QK_HELDOUT, seed, HELDOUT_DRAW))
    return self.model.init(jax.random.key(seed), self.sample), heldout

  def inputs(self, size: int, seed: int, draw: int):
    return boolean_run.to_ids(boolean_run.qk_fit_points(self.task.n, size, seed, draw))

  def maps(self, variables, inputs, heldout, order: int):
    """(attention maps on `heldout` after the qk fit on `inputs` with batch order `order`, the fit's TV)."""
    fitted, tv = baselines.fit_qk(self.model.apply, variables, inputs, self.target, steps=self.cfg.qk.fit_steps,
                                  learning_rate=self.cfg.qk.fit_learning_rate, batch_size=protocol.QK_FIT_BATCH,
                                  seed=order)
    return measure.attention_maps(self.model.apply, fitted, heldout), tv


def measure_task(task: Task, seeds, sizes, log=print) -> list[dict]:
  """Rows {task, seed, size, heldout_tv: [draw 0, draw 1], fit_tv: [...], draw_tv} for one task."""
  fits, rows = _Fits(task), []
  for seed in seeds:
    variables, heldout = fits.start(seed)
    for size in sizes:
      t0 = time.perf_counter()
      maps, fit_tv = zip(*(fits.maps(variables, fits.inputs(size, seed, draw), heldout, seed) for draw in (0, 1)))
      row = {"task": task.name, "n": task.n, "seed": seed, "size": size, "fit_tv": list(fit_tv),
             "heldout_tv": [_tv(m, fits.target) for m in maps], "draw_tv": _between(*maps)}
      rows.append(row)
      log(f"{task.name} seed {seed} size {size}: held-out TV {row['heldout_tv'][0]:.4f}/{row['heldout_tv'][1]:.4f}, "
          f"draw-to-draw {row['draw_tv']:.4f} ({time.perf_counter() - t0:.0f} s)")
  return rows


def measure_order(task: Task, seeds, size: int, log=print) -> list[dict]:
  """Two fits on the same `size` inputs (draw 0) that differ only in the order of their batches (the
  batch generator's seed: the run's, and the run's + 1,000): the distance between them on the held-out
  points is how far the fit's end point moves with its path alone. Rows {task, seed, size, order_tv}."""
  fits, rows = _Fits(task), []
  for seed in seeds:
    variables, heldout = fits.start(seed)
    inputs = fits.inputs(size, seed, 0)
    maps = [fits.maps(variables, inputs, heldout, order)[0] for order in (seed, seed + 1000)]
    rows.append({"task": task.name, "seed": seed, "size": size, "order_tv": _between(*maps)})
    log(f"{task.name} seed {seed} size {size}: batch order alone moves the fit by TV {rows[-1]['order_tv']:.4f}")
  return rows


def medians(rows: list[dict]) -> dict[int, tuple[float, float]]:
  """{size: (median held-out TV over (task, seed, draw), median draw-to-draw TV over (task, seed))}."""
  sizes = sorted({r["size"] for r in rows})
  return {s: (float(np.median([v for r in rows if r["size"] == s for v in r["heldout_tv"]])),
              float(np.median([r["draw_tv"] for r in rows if r["size"] == s]))) for s in sizes}


def markdown(rows: list[dict]) -> str:
  med = medians(rows)
  sizes = sorted(med)
  head = results_lib.markdown_table(
      ["fit inputs", "held-out TV to the pattern (median)", "draw-to-draw TV (median)",
       "fit TV on its own inputs (median)"],
      [[f"{s:,}", f"{med[s][0]:.4f}", f"{med[s][1]:.4f}",
        f"{np.median([v for r in rows if r['size'] == s for v in r['fit_tv']]):.4f}"] for s in sizes])
  tasks = list(dict.fromkeys(r["task"] for r in rows))
  per_task = results_lib.markdown_table(
      ["task"] + [f"{s:,}: draw-to-draw TV per seed" for s in sizes],
      [[t] + [", ".join(f"{r['draw_tv']:.3f}" for r in rows if r["task"] == t and r["size"] == s) for s in sizes]
       for t in tasks])
  return (f"{head}\n\nTotal-variation distances on {protocol.QK_HELDOUT:,} held-out cube points (a draw never fitted "
          "on), mean over layers, heads, query rows and points; medians over tasks, seeds (and the two draws).\n\n"
          f"{per_task}\n")


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  g = p.add_mutually_exclusive_group(required=True)
  g.add_argument("--out", help="measure, and write fits.jsonl, qk_probe.md and selection.md here")
  g.add_argument("--markdown", help="print the tables and the choice from this folder's fits.jsonl")
  p.add_argument("--seeds", default=",".join(map(str, protocol.EXPLORATION_SEEDS)))
  p.add_argument("--order", action="store_true", help="with --out: measure instead how far the batch order alone "
                 "moves a fit of 1,024 inputs (order.jsonl; after the rule, not part of it)")
  a = p.parse_args()
  if a.markdown:
    rows = [json.loads(line) for line in (pathlib.Path(a.markdown) / "fits.jsonl").read_text().splitlines()]
    size, why = protocol.select_qk_fit_size(medians(rows))
    order = pathlib.Path(a.markdown) / "order.jsonl"
    extra = ""
    if order.exists():
      o = [json.loads(line)["order_tv"] for line in order.read_text().splitlines()]
      extra = (f"\nTwo fits on the same 1,024 inputs that differ only in the order of their batches (measured after "
               f"the rule, not part of it): TV between them {np.median(o):.4f} (median over {len(o)} task-seed pairs, "
               f"range {min(o):.3f}-{max(o):.3f}).\n")
    print(markdown(rows) + f"\nThe rule's choice: qk.fit_inputs = {size}: {why}.\n" + extra)
    return
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  seeds = [int(s) for s in a.seeds.split(",")]
  if set(seeds) & set(protocol.CONFIRMATION_SEEDS):
    raise SystemExit(f"seeds {sorted(set(seeds) & set(protocol.CONFIRMATION_SEEDS))} are confirmation seeds")
  if a.order:
    rows = [r for t in protocol.EXPLORATION_TASKS.values()
            for r in measure_order(Task(t.name, protocol.QK_EXPLORATION_N, t.target, t.seen), seeds, 1024)]
    (out / "order.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"median TV between two fits that differ in batch order only: {np.median([r['order_tv'] for r in rows]):.4f}")
    return
  rows = []
  for t in protocol.EXPLORATION_TASKS.values():
    rows += measure_task(Task(t.name, protocol.QK_EXPLORATION_N, t.target, t.seen), seeds, protocol.QK_FIT_SIZES)
  (out / "fits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (out / "qk_probe.md").write_text(markdown(rows))
  size, why = protocol.select_qk_fit_size(medians(rows))
  (out / "selection.md").write_text(f"qk.fit_inputs = {size}: {why}.\n")
  print(markdown(rows), f"\nqk.fit_inputs = {size}: {why}.")


if __name__ == "__main__":
  main()
