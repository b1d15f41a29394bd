"""How long the survivor of a two-process run takes to end after its peer dies, and what it says.

Starts the Boolean f2 task (the small model of the tests) as two processes on this host (JAX's
distributed runtime on 127.0.0.1, CPU collectives over gloo), kills one of them at a chosen moment
(`MASKPRIOR_FAULT` in that process only, or SIGKILL from outside once a checkpoint exists), and
prints one JSON line per case: the victim, the moment, the survivor's exit status, the seconds from
the victim's death to the survivor's exit, and the survivor's last line.

  python experiments/lost_process_timing.py                 # every case below
  python experiments/lost_process_timing.py --cases step:3/0 kill/1
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from cli_args import SMALL_BOOLEAN, free_port  # noqa: E402

ARGS = ["boolean", "--task", "f2", "--methods", "mask", "--seeds", "2", "--config.train.data_parallel=True",
        "--config.train.steps=100", "--config.train.steps_per_call=25", "--config.eval.every_steps=50",
        "--config.checkpoint.every_steps=25", "--config.checkpoint.max_to_keep=3",
        "--config.train.grad_reduction=ordered", *SMALL_BOOLEAN]
CASES = ["compile/1", "step:3/0", "eval:2/1", "save:2/0", "kill/1", "kill/0"]


def measure(case: str, root: pathlib.Path) -> dict:
  moment, victim = case.rsplit("/", 1)
  victim = int(victim)
  work = root / case.replace("/", "_").replace(":", "")
  shutil.rmtree(work, ignore_errors=True)
  port, procs = free_port(), []
  for i in range(2):
    env = {k: v for k, v in os.environ.items() if k != "MASKPRIOR_FAULT"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    if i == victim and moment != "kill":
      env["MASKPRIOR_FAULT"] = moment
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "maskprior_jax.bench.cli", *ARGS, "--workdir", str(work), "--coordinator_address",
         f"127.0.0.1:{port}", "--num_processes", "2", "--process_id", str(i)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
  if moment == "kill":   # from outside, once a checkpoint exists
    ckpt = work / "checkpoints" / "mask" / "seeds_0_1"
    while not (ckpt.exists() and any(d.name.isdigit() for d in ckpt.iterdir())):
      time.sleep(0.05)
    procs[victim].send_signal(signal.SIGKILL)
  procs[victim].wait()
  died = time.monotonic()
  _, err = procs[1 - victim].communicate(timeout=600)
  seconds = time.monotonic() - died
  lines = err.strip().splitlines()
  return {"case": moment, "victim": victim, "victim_status": procs[victim].returncode,
          "survivor_status": procs[1 - victim].returncode, "seconds_to_exit": round(seconds, 1),
          "c++_stack_shown": "Check failure stack trace" in err, "last_line": lines[-1] if lines else ""}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", nargs="+", default=CASES, help="MOMENT/VICTIM (default: %(default)s)")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as root:
    for case in args.cases:
      print(json.dumps(measure(case, pathlib.Path(root))), flush=True)


if __name__ == "__main__":
  main()
