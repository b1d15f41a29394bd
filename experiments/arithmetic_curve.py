"""The arithmetic confirmation run on the recipe the protocol's rule selected: the learning curve
(protocol.CURVE_SIZES, all six methods, the confirmation seeds), run once.

  python experiments/arithmetic_recipe.py --workdir runs/arith_recipe       # the grid and the rule first
  python experiments/arithmetic_curve.py --recipe runs/arith_recipe/recipe.json --workdir runs/arith_curve
  python experiments/arithmetic_curve.py --recipe runs/arith_recipe/recipe.json --workdir runs/arith_modadd \\
      --methods vanilla,mimetic,qk,mask --train-sizes 1000,2000,4000 -- --task modadd
  python experiments/arithmetic_curve.py --lr 1e-3 --wd 0.1 --workdir runs/look --steps 500   # a quick look

It is `maskprior arithmetic` with protocol.recipe_overrides(lr, weight decay): arguments after
`--` go to that command unchanged. With --jobs N > 1 each method trains in its own process and
run folder (WORKDIR/parts/METHOD; one small program leaves most of a GPU idle), at most N at a
time, and the finished folders are merged into WORKDIR (results.json, config.json, run_config.json,
TensorBoard files, the report): the same results as one process, since every method's runs depend only on the
config and the seeds. A rerun skips finished methods.
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from maskprior_jax.bench import cli
from maskprior_jax.bench.arithmetic import protocol, report
from maskprior_jax.bench.arithmetic.run import METHODS
from maskprior_jax.bench.workdir import read_json, write_json


class MergeError(ValueError):
  pass


def merge(parts: list[pathlib.Path], out: pathlib.Path) -> dict:
  """One run folder from run folders of the same config (`config_digest`) holding disjoint
  (method, seed) runs: results.json's runs, curves and wall times joined, config.json and the
  TensorBoard files copied, the report written. Returns the merged results."""
  merged = None
  for part in parts:
    res = read_json(part / "results.json", move=False)
    if res is None:
      raise MergeError(f"{part} has no results.json")
    if merged is None:
      merged = {**res, "runs": list(res["runs"]), "curves": dict(res["curves"]), "wall_s": dict(res["wall_s"])}
      continue
    if res["config_digest"] != merged["config_digest"] or res["benchmark"] != merged["benchmark"]:
      raise MergeError(f"{part} holds runs of another config than {parts[0]}; merge only runs of one config")
    have = {(r["method"], r["seed"]) for r in merged["runs"]}
    if any((r["method"], r["seed"]) in have for r in res["runs"]) or set(res["curves"]) & set(merged["curves"]):
      raise MergeError(f"{part} repeats a method already merged; merge only disjoint methods")
    merged["runs"] += res["runs"]
    merged["curves"].update(res["curves"])
    merged["wall_s"].update(res["wall_s"])
  if merged is None:
    raise MergeError("nothing to merge")
  out.mkdir(parents=True, exist_ok=True)
  for part in parts:
    if (part / "tensorboard").is_dir():
      shutil.copytree(part / "tensorboard", out / "tensorboard", dirs_exist_ok=True)
  for name in ("config.json", "run_config.json"):   # the same in every part (one config)
    if (parts[0] / name).exists():
      shutil.copyfile(parts[0] / name, out / name)
  write_json(out / "results.json", merged)
  report.write_report(merged, out)
  return merged


def arithmetic_args(lr: float, wd: float, *, seeds: str, sizes: str, steps: int = protocol.RECIPE_STEPS,
                    qk_mask_decay: str = "none", extra=()) -> list[str]:
  """`maskprior arithmetic`'s arguments for one recipe setting (everything but --workdir and --methods)."""
  return ["--seeds", seeds, "--train-sizes", sizes,
          *protocol.recipe_overrides(lr, wd, qk_mask_decay=qk_mask_decay, steps=steps),
          "--config.eval.every_steps=250", "--config.checkpoint.every_steps=1000", *extra]


def method_jobs(folder: pathlib.Path, methods, args: list[str], label: str = "") -> list[tuple[str, pathlib.Path, list[str]]]:
  """`run_parallel` jobs training each method in FOLDER/parts/METHOD with `maskprior arithmetic ARGS`."""
  return [(f"{label}{m}", folder / "parts" / m, ["arithmetic", "--methods", m, *args]) for m in methods]


def run_parallel(jobs: list[tuple[str, pathlib.Path, list[str]]], max_jobs: int, log=print,
                 stop_after: float | None = None, kill_at: float | None = None) -> list[str]:
  """Run `maskprior` jobs (name, run folder, arguments after the folder), each in its own process,
  at most `max_jobs` at a time; each writes WORKDIR.log beside its folder. Starts no new job after
  `stop_after` and interrupts the running ones at `kill_at` (times as time.time(); an interrupted
  run keeps its last checkpoint and resumes on a rerun). Returns the names that failed, were
  interrupted or never started."""
  todo, running, failed = list(jobs), [], []
  while todo or running:
    if kill_at is not None and time.time() >= kill_at:
      for _name, proc, _ in running:
        proc.send_signal(signal.SIGINT)
      for _name, proc, out in running:
        try:
          proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
          proc.kill()
        out.close()
      log(f"  interrupted (out of time): {', '.join(name for name, _, _ in running) or '-'}")
      return failed + [name for name, _, _ in running] + [name for name, _, _ in todo]
    while todo and len(running) < max_jobs and (stop_after is None or time.time() < stop_after):
      name, part, args = todo.pop(0)
      part.mkdir(parents=True, exist_ok=True)
      out = open(part.with_name(part.name + ".log"), "a")
      cmd = [sys.executable, "-m", "maskprior_jax.bench.cli", args[0], "--workdir", str(part), *args[1:]]
      # Processes sharing one accelerator must not each take most of its memory up front.
      env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", **os.environ}
      running.append((name, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env), out))
    if stop_after is not None and time.time() >= stop_after and todo:
      failed += [name for name, _, _ in todo]
      log(f"  not started (out of time): {', '.join(name for name, _, _ in todo)}")
      todo = []
    time.sleep(1)
    for item in [x for x in running if x[1].poll() is not None]:
      name, proc, out = item
      running.remove(item)
      out.close()
      log(f"  {name}: " + ("done" if proc.returncode == 0 else f"failed ({proc.returncode}), see its .log"))
      if proc.returncode:
        failed.append(name)
  return failed


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  argv = argv[:argv.index("--")] if "--" in argv else argv
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--recipe", help="recipe.json written by experiments/arithmetic_recipe.py (the rule's choice)")
  p.add_argument("--lr", type=float, help="learning rate (instead of --recipe)")
  p.add_argument("--wd", type=float, help="weight decay (instead of --recipe)")
  p.add_argument("--qk-mask-decay", default="none", choices=("none", "init"))
  p.add_argument("--steps", type=int, default=protocol.RECIPE_STEPS)
  p.add_argument("--workdir", default="runs/arith_curve")
  p.add_argument("--methods", default=",".join(METHODS))
  p.add_argument("--seeds", default=f"{protocol.CONFIRMATION_SEEDS[0]}-{protocol.CONFIRMATION_SEEDS[-1]}")
  p.add_argument("--train-sizes", default=",".join(map(str, protocol.CURVE_SIZES)))
  p.add_argument("--jobs", type=int, default=1, help="methods trained at once, each in its own process")
  args = p.parse_args(argv)
  if args.recipe:
    rec = json.loads(pathlib.Path(args.recipe).read_text())
    if not rec.get("complete_grid"):
      raise SystemExit(f"{args.recipe} was selected on part of the grid; finish the grid or give --lr and --wd")
    lr, wd = rec["learning_rate"], rec["weight_decay"]
  elif args.lr is not None and args.wd is not None:
    lr, wd = args.lr, args.wd
  else:
    raise SystemExit("give --recipe FILE, or --lr and --wd")
  methods = [m for m in args.methods.split(",") if m]
  common = arithmetic_args(lr, wd, seeds=args.seeds, sizes=args.train_sizes, steps=args.steps,
                           qk_mask_decay=args.qk_mask_decay, extra=extra)
  root = pathlib.Path(args.workdir)
  print(f"arithmetic curve: lr {lr}, weight decay {wd}, qk_mask_decay {args.qk_mask_decay}, methods {methods}", flush=True)
  if args.jobs <= 1:
    return cli.main(["arithmetic", "--workdir", str(root), "--methods", ",".join(methods), *common])
  failed = run_parallel(method_jobs(root, methods, common), args.jobs)
  done = [root / "parts" / m for m in methods if m not in failed]
  if done:
    print(report.table(merge(done, root)))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
