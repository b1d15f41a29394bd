"""Design exploration for the Boolean mask prior: a grid of prior/model variants, each run on
the five GOTU tasks, written as one Markdown table.

  python experiments/boolean_explore.py --workdir runs/explore --seeds 2 --steps 1500 \
      [--variants name,name] [--tasks f2_2parity,...] [--methods mask,vanilla]

Every variant is a set of config overrides on the built-in boolean config. The table reports
unseen MSE vs truth as a fraction of the MDI's (0 = perfect extrapolation, 1 = the MDI).
"""
import argparse
import json
import pathlib

import numpy as np

from maskprior_jax.bench import results as experiment
from maskprior_jax.bench.boolean import run as boolean_run
from maskprior_jax.bench.boolean import tasks as boolean
from maskprior_jax.bench.config import apply_overrides, builtin_config

# The exploration started from positions in queries/keys only and outside logit -8; every
# variant is that base plus its own overrides (the built-in default is now "pos_input_out4").
BASE = ["--config.model.pos_where=qk", "--config.prior.outside=-8.0", "--config.train.learning_rate=3e-4"]

VARIANTS = {
    "pos_qk_union": ["--config.prior.spare_heads=union"],
    "pos_qk_lr1e-3": ["--config.train.learning_rate=1e-3"],
    # where positions enter (value path vs attention only vs nowhere)
    "pos_qk": [],
    "pos_input": ["--config.model.pos_where=input"],
    "pos_none": ["--config.model.pos_embedding=none"],
    # which rows carry the pattern: CLS + group members, or CLS only (tokens attend to themselves)
    "pos_none_self": ["--config.model.pos_embedding=none", "--config.prior.token_rows=self"],
    "pos_qk_self": ["--config.prior.token_rows=self"],
    # strength and learnability
    "pos_none_out4": ["--config.model.pos_embedding=none", "--config.prior.outside=-4.0"],
    "pos_none_out30": ["--config.model.pos_embedding=none", "--config.prior.outside=-30.0"],
    "pos_none_frozen": ["--config.model.pos_embedding=none", "--config.prior.mode=frozen"],
    "pos_qk_frozen": ["--config.prior.mode=frozen"],
    "pos_none_first": ["--config.model.pos_embedding=none", "--config.prior.layers=first"],
    "pos_none_shared": ["--config.model.pos_embedding=none", "--config.prior.per_head=false"],
    # a mask that can move: its own, larger learning rate
    "pos_qk_masklr30": ["--config.prior.mask_lr_multiplier=30.0"],
    "pos_qk_masklr300": ["--config.prior.mask_lr_multiplier=300.0"],
    "pos_qk_out4": ["--config.prior.outside=-4.0"],
    "pos_qk_out2": ["--config.prior.outside=-2.0"],
    "pos_input_out4": ["--config.model.pos_where=input", "--config.prior.outside=-4.0"],
}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--workdir", default="runs/explore")
  p.add_argument("--seeds", type=int, default=2)
  p.add_argument("--seed-offset", type=int, default=100, help="exploration seeds differ from the headline's 0, 1, 2")
  p.add_argument("--steps", type=int, default=1500)
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--tasks", default=",".join(boolean.TASKS))
  p.add_argument("--methods", default="mask")
  args = p.parse_args()
  root = pathlib.Path(args.workdir)
  tasks = args.tasks.split(",")
  rows = []
  for name in args.variants.split(","):
    cfg = apply_overrides(builtin_config("boolean"), BASE + VARIANTS[name] + [
        f"--config.train.steps={args.steps}", "--config.eval.every_steps=500"])
    for method in args.methods.split(","):
      row = [name, method]
      for t in tasks:
        res = boolean_run.run_task(boolean.TASKS[t], cfg, [method], list(range(args.seed_offset, args.seed_offset + args.seeds)), root / name / t)
        ratio = [r["unseen_mse_true"] / res["mdi_unseen_mse_true"] for r in res["runs"] if r["method"] == method]
        seen = [r["seen_mse"] for r in res["runs"] if r["method"] == method]
        row.append(f"{np.mean(ratio):.2f} ± {np.std(ratio):.2f} (seen {np.mean(seen):.1g})")
      rows.append(row)
      (root / f"explore_{name}_{method}.md").write_text(experiment.markdown_table(["variant", "method"] + tasks, [row]))
  table = collect(root, tasks)
  (root / "explore.md").write_text(table)
  print(table, flush=True)


def collect(root: pathlib.Path, tasks) -> str:
  """One row per (variant, method) found under root: mean ± std over seeds of unseen MSE / MDI's."""
  rows = []
  for vdir in sorted(p for p in root.iterdir() if p.is_dir()):
    runs = {}
    for t in tasks:
      path = vdir / t / "results.json"
      if path.exists():
        res = json.loads(path.read_text())
        for r in res["runs"]:
          runs.setdefault(r["method"], {}).setdefault(t, []).append(
              (r["unseen_mse_true"] / res["mdi_unseen_mse_true"], r["seen_mse"]))
    for method, by_task in sorted(runs.items()):
      cells = []
      for t in tasks:
        v = np.asarray(by_task.get(t, []))
        cells.append(f"{v[:, 0].mean():.2f} ± {v[:, 0].std():.2f} (seen {v[:, 1].mean():.1g})" if len(v) else "-")
      rows.append([vdir.name, method, *cells])
  return experiment.markdown_table(["variant", "method"] + list(tasks), rows)


if __name__ == "__main__":
  main()
