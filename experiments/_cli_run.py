"""One `maskprior` command run the way the check scripts run it: a subprocess on the CPU (`devices`
forced host devices, or XLA's default), timed, stopped with the command's error on failure."""
import json
import os
import subprocess
import sys
import time


def run_cli(args, workdir, devices=None):
  """Run `maskprior ARGS --workdir WORKDIR`; returns (its results.json, its stderr, wall seconds)."""
  flags = f"--xla_force_host_platform_device_count={devices}" if devices else ""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
  cmd = [sys.executable, "-m", "maskprior_jax.bench.cli", *args, "--workdir", workdir]
  t0 = time.perf_counter()
  done = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if done.returncode:
    sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
  wall = time.perf_counter() - t0
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f), done.stderr, wall
