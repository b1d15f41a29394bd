"""The arithmetic third round end to end on one machine, its runs in parallel processes: the recipe
grid on the exploration seeds, the protocol's rule, then on the selected recipe the confirmation
curve (protocol.CURVE_SIZES, six methods, the confirmation seeds), modular addition (sizes 1,000,
2,000, 4,000, four methods) and, time allowing, the qk_mask_decay="init" variant of the curve.

  python experiments/arithmetic_all.py --root runs --jobs 12          # e.g. on one GPU
  python experiments/arithmetic_all.py --root runs --jobs 1           # the same, one run at a time

Run folders: ROOT/arith_recipe/lr{lr}_wd{wd} (what experiments/arithmetic_recipe.py writes; finished
settings are skipped), ROOT/arith_curve, ROOT/arith_modadd, ROOT/arith_curve_init; each method runs
in FOLDER/parts/METHOD and the parts are merged into FOLDER (experiments/arithmetic_curve.py).
--time-limit stops starting runs and interrupts running ones in time to merge what finished;
--tar writes the results (checkpoints left out) to a tar file every minute and at the end.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import threading
import time

from arithmetic_curve import arithmetic_args, merge, method_jobs, run_parallel
from arithmetic_recipe import _grid

from maskprior_jax.bench.arithmetic import protocol
from maskprior_jax.bench.arithmetic.run import METHODS
from maskprior_jax.bench.workdir import read_json

MODADD_METHODS = ("vanilla", "mimetic", "qk", "mask")
MODADD_SIZES = "1000,2000,4000"


def log(*a):
  print(time.strftime("%H:%M:%S"), *a, flush=True)


def finished(folder: pathlib.Path) -> set:
  res = read_json(folder / "results.json", move=False)
  return {r["method"] for r in res["runs"]} if res else set()


def merge_parts(folder: pathlib.Path, methods) -> None:
  parts = [folder / "parts" / m for m in methods if m in finished(folder / "parts" / m)]
  if parts:
    merge(parts, folder)
    log(f"merged {folder}: {sorted(finished(folder))}")


def tar_loop(roots, dest: pathlib.Path, stop: threading.Event) -> None:
  def once():
    tmp = dest.with_name(dest.name + ".tmp")
    have = [str(r) for r in roots if r.exists()]
    if have:
      subprocess.run(["tar", "czf", str(tmp), "--exclude=checkpoints", *have], check=False)
      tmp.replace(dest)
  while not stop.wait(60):
    once()
  once()


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default="runs")
  p.add_argument("--jobs", type=int, default=1)
  p.add_argument("--time-limit", type=float, help="seconds from the start")
  p.add_argument("--tar", help="tar file to write the results to")
  p.add_argument("--no-variant", action="store_true", help="skip the qk_mask_decay=init variant")
  p.add_argument("--steps", type=int, default=protocol.RECIPE_STEPS, help="a quick look: fewer steps everywhere")
  p.add_argument("--grid", help="a quick look: lr:weight_decay pairs instead of protocol.RECIPE_GRID")
  args = p.parse_args()
  t0, root = time.time(), pathlib.Path(args.root)
  end = t0 + args.time_limit if args.time_limit else None
  grid_dir, curve_dir = root / "arith_recipe", root / "arith_curve"
  modadd_dir, init_dir = root / "arith_modadd", root / "arith_curve_init"
  stop, tarring = threading.Event(), None
  if args.tar:
    tarring = threading.Thread(target=tar_loop, daemon=True,
                               args=([grid_dir, curve_dir, modadd_dir, init_dir], pathlib.Path(args.tar), stop))
    tarring.start()
  try:
    # 1. The grid, one process per (setting, method) not yet finished.
    seeds = f"{protocol.RECIPE_SEEDS[0]}-{protocol.RECIPE_SEEDS[-1]}"
    sizes = ",".join(map(str, protocol.RECIPE_SIZES))
    jobs, settings = [], []
    for lr, wd in _grid(args.grid):
      folder = grid_dir / f"lr{lr}_wd{wd}"
      settings.append(folder)
      common = arithmetic_args(lr, wd, seeds=seeds, sizes=sizes, steps=args.steps)
      jobs += method_jobs(folder, [m for m in METHODS if m not in finished(folder)], common, f"{folder.name}/")
    log(f"grid: {len(jobs)} method-settings to run")
    failed = run_parallel(jobs, args.jobs, log=log, kill_at=end and end - 60)
    for folder in settings:
      if (folder / "parts").is_dir():
        merge_parts(folder, METHODS)
    if failed:
      log(f"grid incomplete ({', '.join(failed)}); no recipe selected")
      return 1
    # 2. The rule (experiments/arithmetic_recipe.py skips the finished runs and selects).
    subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("arithmetic_recipe.py")),
                    "--workdir", str(grid_dir), "--steps", str(args.steps), *(["--grid", args.grid] if args.grid else [])],
                   check=True, stdout=subprocess.DEVNULL)
    rec = json.loads((grid_dir / "recipe.json").read_text())
    lr, wd = rec["learning_rate"], rec["weight_decay"]
    log(f"selected: {rec['why']}")
    # 3. The confirmation runs on the selected recipe, then the variant.
    conf = f"{protocol.CONFIRMATION_SEEDS[0]}-{protocol.CONFIRMATION_SEEDS[-1]}"
    curve_sizes = ",".join(map(str, protocol.CURVE_SIZES))
    curve = arithmetic_args(lr, wd, seeds=conf, sizes=curve_sizes, steps=args.steps)
    modadd = arithmetic_args(lr, wd, seeds=conf, sizes=MODADD_SIZES, steps=args.steps, extra=["--task", "modadd"])
    init = arithmetic_args(lr, wd, seeds=conf, sizes=curve_sizes, steps=args.steps, qk_mask_decay="init")
    jobs = method_jobs(curve_dir, METHODS, curve, "curve/") + method_jobs(modadd_dir, MODADD_METHODS, modadd, "modadd/")
    if not args.no_variant:
      jobs += method_jobs(init_dir, METHODS, init, "init/")
    failed = run_parallel(jobs, args.jobs, log=log, stop_after=end and end - 240, kill_at=end and end - 45)
    merge_parts(curve_dir, METHODS)
    merge_parts(modadd_dir, MODADD_METHODS)
    merge_parts(init_dir, METHODS)
    log(f"done in {time.time() - t0:.0f}s" + (f"; unfinished: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
  finally:
    stop.set()
    if tarring:
      tarring.join()


if __name__ == "__main__":
  sys.exit(main())
