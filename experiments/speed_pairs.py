"""JAX against the fastest PyTorch variant, in paired alternating runs on one machine.

  python experiments/speed_pairs.py --torch-python /path/to/torch-env/bin/python --rounds 3

Each round runs, one after the other in fresh processes, `experiments/throughput.py` (this
library's step) and `experiments/torch_reference.py` in each variant (SDPA or matmul + softmax
attention, eager or torch.compile), for each config. A round's ratio is JAX's steps/s over the
fastest PyTorch variant's in the same round, so a machine that slows down for a while slows both
sides of a pair. Prints one JSON line per measurement and one summary line per config (per-round
ratios, their median, each variant's median steps/s). The JAX figures also carry the fraction of
the machine's matmul throughput (`--probe` in throughput.py: a large float32 matmul).
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCH_VARIANTS = {
    "sdpa eager": [],
    "matmul eager": ["--attention", "matmul"],
    "sdpa compile": ["--compile"],
    "matmul compile": ["--attention", "matmul", "--compile"],
}


def _json(cmd: list[str]) -> dict:
  out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
  return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--torch-python", required=True, help="a Python with torch installed")
  p.add_argument("--configs", default="boolean_small,boolean_paper")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--steps", default="boolean_small=200,boolean_paper=20",
                 help="measured steps per run, per config")
  p.add_argument("--variants", default=",".join(TORCH_VARIANTS), help="PyTorch variants to run")
  args = p.parse_args()
  steps = dict(item.split("=") for item in args.steps.split(","))
  variants = args.variants.split(",")
  for v in variants:
    if v not in TORCH_VARIANTS:
      p.error(f"unknown variant {v!r}; choose from {', '.join(TORCH_VARIANTS)}")
  for config in args.configs.split(","):
    n = steps.get(config, "20")
    rows = []
    for r in range(args.rounds):
      jax_row = _json([sys.executable, str(HERE / "throughput.py"), "--configs", config, "--steps", n, "--probe"])
      row = {"round": r, "config": config, "jax": jax_row["steps_per_s"], "jax_matmul_fraction": jax_row["mfu"]}
      for v in variants:
        t = _json([args.torch_python, str(HERE / "torch_reference.py"), "--config", config, "--steps", n,
                   *TORCH_VARIANTS[v]])
        row[v] = t["steps_per_s"]
        row["torch"] = t["framework"].split()[1]
      fastest = max(variants, key=lambda v: row[v])
      row.update(fastest_torch=fastest, ratio=row["jax"] / row[fastest])
      print(json.dumps(row), flush=True)
      rows.append(row)
    ratios = [r["ratio"] for r in rows]
    print(json.dumps({"config": config, "summary": True, "ratios": ratios, "median_ratio": statistics.median(ratios),
                      "jax_median": statistics.median(r["jax"] for r in rows),
                      "jax_matmul_fraction": [r["jax_matmul_fraction"] for r in rows],
                      **{f"{v}_median": statistics.median(r[v] for r in rows) for v in variants}}), flush=True)


if __name__ == "__main__":
  main()
