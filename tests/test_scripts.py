import json
import pathlib
import subprocess
import sys

import pytest
from cli_args import xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow   # CI's slow step
def test_accelerator_check_runs_on_cpu_in_smoke_mode():
  out = subprocess.run([sys.executable, str(ROOT / "experiments" / "accelerator_check.py"), "--quick",
                        "--configs", "boolean_small"], capture_output=True, text=True, timeout=600,
                       env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "XLA_FLAGS": xla_flags()})
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
  by = {}
  for r in rows:
    by.setdefault(r["check"], []).append(r)
  assert by["devices"][0]["backend"] == "cpu"
  attention = {r["implementation"]: r for r in by["attention"]}
  assert attention["xla"]["runs"] and attention["xla"]["max_bias_grad_diff_vs_xla"] == 0
  assert attention["auto"]["runs"] and attention["auto"]["resolved"] == "xla"   # no cuDNN on a CPU
  assert attention["auto"]["max_bias_grad_diff_vs_xla"] == 0
  assert len(by["throughput"]) == 2 and all(r["steps_per_s"] > 0 for r in by["throughput"])
  assert by["seed_vmap"][0]["seed_steps_speedup"] > 0 and by["done"][0]["ok"]


@pytest.mark.slow   # CI's slow step
def test_attention_memory_script_runs_in_smoke_mode():
  out = subprocess.run([sys.executable, str(ROOT / "experiments" / "attention_memory.py"), "--smoke"],
                       capture_output=True, text=True, timeout=600,
                       env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "XLA_FLAGS": xla_flags()})
  assert out.returncode == 0, out.stderr[-2000:]
  assert "equality at T=128" in out.stdout and "of XLA's)" in out.stdout and "T=256: XLA" in out.stdout
