"""How often `runner.run` enters a benchmark's module: every call from the runner into a function of
`bench/boolean/run.py` during one short Boolean run (one task, one seed, the four default methods,
100 steps), counted with `sys.setprofile`, by hook.

  python experiments/runner_walk.py
"""
import collections
import pathlib
import sys
import tempfile

import maskprior_jax
from maskprior_jax.bench import config as C
from maskprior_jax.bench import runner
from maskprior_jax.bench.boolean import run as boolean_run
from maskprior_jax.bench.boolean import tasks

ROOT = pathlib.Path(maskprior_jax.__file__).parent


def main():
  cfg = C.builtin_config("boolean")
  cfg.train.steps, cfg.eval.every_steps, cfg.train.log_every, cfg.checkpoint.every_steps = 100, 50, 50, 50
  bench = boolean_run.BooleanTask(tasks.TASKS["f2_2parity"], cfg)
  bench_file, runner_file = str(ROOT / "bench" / "boolean" / "run.py"), str(ROOT / "bench" / "runner.py")
  entries = collections.Counter()

  def profile(frame, event, arg):
    caller = frame.f_back
    if event == "call" and frame.f_code.co_filename == bench_file and caller is not None \
        and caller.f_code.co_filename == runner_file:
      entries[(caller.f_code.co_name, frame.f_code.co_name)] += 1
  with tempfile.TemporaryDirectory() as work:
    sys.setprofile(profile)
    try:
      runner.run(bench, list(runner.METHODS), [0], pathlib.Path(work), log=lambda *a: None)
    finally:
      sys.setprofile(None)
  print(f"runner.run entered bench/boolean/run.py {sum(entries.values())} times through "
        f"{len({hook for _, hook in entries})} hooks (4 methods, one seed):")
  for (where, hook), n in sorted(entries.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"  {n} x {hook} (from runner.{where})")


if __name__ == "__main__":
  main()
