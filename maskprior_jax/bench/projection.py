"""A run's wall time stated before it starts, from its FLOPs and the device's dense peak.

The FLOPs come from the programs compiled ahead of time for an accelerator
(`experiments/accelerator_compile.py`, results in `experiments/results/accelerator_compile`); the
times are a range at 10% and 45% of the device's peak, as `docs/results/accelerator_compile.md`
states them. A projection, not a measurement: it leaves compilation and host work out."""
from __future__ import annotations

__all__ = ["PAPER_HEADLINE_FLOP", "PEAKS", "peak_for", "time_statement"]

# The paper-size Boolean headline (config boolean_paper: 5 tasks x 4 methods x 5 seeds, 8,000 steps,
# every evaluation): 137.617 PFLOP in float32 (137.617 as well in bfloat16 on a TPU, 138.197 with
# cuDNN's attention on a GPU), as XLA counted it for the compiled programs. tests/test_docs.py checks
# this number against experiments/results/accelerator_compile/programs.jsonl.
PAPER_HEADLINE_FLOP = 137.617e15

# Dense peak FLOP/s (vendor figures, no sparsity) by the device kind JAX reports, for (bfloat16,
# float32 as the device computes float32 matrix products by default: TF32 on NVIDIA Ampere and newer,
# one bfloat16 pass on a TPU, plain float32 on older GPUs). Matched by substring, first match wins.
PEAKS: dict[str, tuple[float, float]] = {
    "H200": (989e12, 494e12), "H100": (989e12, 494e12), "A100": (312e12, 156e12), "L4": (121e12, 60e12),
    "A10": (125e12, 62.5e12), "V100": (125e12, 15.7e12), "T4": (65e12, 8.1e12),
    "TPU v6": (918e12, 918e12), "TPU v5p": (459e12, 459e12), "TPU v5": (197e12, 197e12),
    "TPU v4": (275e12, 275e12), "TPU v3": (123e12, 123e12), "TPU v2": (46e12, 46e12),
}
MFUS = (0.10, 0.45)


def peak_for(device_kind: str, dtype: str = "float32") -> float | None:
  """The dense peak FLOP/s of a device kind (`jax.devices()[0].device_kind`), or None if unknown."""
  for name, (bf16, f32) in PEAKS.items():
    if name.lower() in device_kind.lower():
      return bf16 if dtype == "bfloat16" else f32
  return None


def _minutes(seconds: float) -> str:
  return f"{seconds / 60:,.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def time_statement(flop: float, device_kind: str, num_devices: int = 1, dtype: str = "float32") -> str:
  """One line: how long `flop` FLOPs take on `num_devices` devices of a kind, at 45% and 10% of
  their peak; where the kind's peak is unknown, how to measure it instead."""
  peak = peak_for(device_kind, dtype)
  if peak is None:
    return (f"{flop / 1e15:,.1f} PFLOP; no peak is known here for {device_kind!r}: time the first task alone "
            "(TASKS = TASKS[:1]) and multiply by the number of tasks")
  fast, slow = (flop / (num_devices * peak * m) for m in reversed(MFUS))
  return (f"{flop / 1e15:,.1f} PFLOP: about {_minutes(fast)} to {_minutes(slow)} on {num_devices} x {device_kind} "
          f"({dtype}, at 45% to 10% of its {peak / 1e12:,.0f} TFLOP/s peak; compiling adds minutes)")
