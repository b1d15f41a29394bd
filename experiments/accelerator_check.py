"""What only an accelerator can tell: one script, JSON lines on stdout, under 8 minutes on one GPU.

  python experiments/accelerator_check.py                # on a GPU or TPU machine
  python experiments/accelerator_check.py --quick        # a few steps each (also runs on a CPU)

Lines, each with a "check" key:
- devices: backend, device kinds and count, JAX version.
- attention: for "xla", "cudnn" and "auto", whether the path runs, which one "auto" chose, and the
  largest difference of the output and of the mask prior's gradient against XLA (bfloat16 inputs,
  a bias with batch dimension 1, the case cuDNN supports).
- throughput: steps/s, examples/s, MFU against the device's peak (a table of known peaks, else a
  matmul probe) and peak memory, for the Boolean small and GOTU-size models, the ViT-Tiny and LM
  shapes (experiments/throughput.py's configs), float32 and bfloat16.
- attention_stacked: the same with 4 runs stacked by jax.vmap, each with its own prior (the runner's way
  of training seeds together), cuDNN against XLA.
- seed_vmap: the small Boolean model with 8 seeds vmapped against 1 (seed-steps/s ratio).
"""
import argparse
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import throughput  # noqa: E402  (the sibling script's model builder and timer)

import maskprior_jax as mp  # noqa: E402
from maskprior_jax import priors  # noqa: E402

# Dense bfloat16 peak FLOP/s by device kind (vendor figures, without sparsity).
PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "TPU v4": 275e12, "TPU v5e": 197e12,
         "TPU v5p": 459e12}


def emit(**row):
  print(json.dumps(row, default=str), flush=True)


def peak_flops(dtype) -> tuple[float, str]:
  kind = jax.devices()[0].device_kind
  for name, peak in PEAKS.items():
    if name.lower() in kind.lower():
      return (peak if dtype == jnp.bfloat16 else peak / 2), f"table ({name})"   # float32 via TF32-class units
  return throughput.matmul_probe(dtype or jnp.float32), "matmul probe"


def attention_check():
  q = jax.random.normal(jax.random.key(0), (4, 64, 128), jnp.bfloat16)
  ref_out = ref_grad = None
  for impl in ("xla", "cudnn", "auto"):
    m = mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_1d(), dtype=jnp.bfloat16, implementation=impl)
    row = {"check": "attention", "implementation": impl,
           "resolved": mp.attention.attention_implementation(impl, jnp.bfloat16, 1)}
    try:
      v = m.init(jax.random.key(1), q)
      out = jax.jit(m.apply)(v, q)
      grad = jax.jit(jax.grad(lambda v: jnp.sum(m.apply(v, q).astype(jnp.float32) ** 2)))(v)[mp.MASK_PRIOR]["bias"]
      if impl == "xla":
        ref_out, ref_grad = out, grad
      row.update(runs=True, finite=bool(jnp.all(jnp.isfinite(out)) & jnp.all(jnp.isfinite(grad))),
                 max_out_diff_vs_xla=float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref_out.astype(jnp.float32)))),
                 max_bias_grad_diff_vs_xla=float(jnp.max(jnp.abs(grad - ref_grad))),
                 bias_grad_scale=float(jnp.max(jnp.abs(ref_grad))))
    except Exception as e:   # e.g. cuDNN not available for this shape, dtype or backend
      row.update(runs=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    emit(**row)


def stacked_attention_check(runs: int = 4):
  """The runner's stacked runs (jax.vmap over runs, each with its own prior) with cuDNN: output and the
  priors' gradients against XLA's, bfloat16 (the path that failed to trace before the run axis was
  folded into the heads)."""
  q = jax.random.normal(jax.random.key(0), (4, 64, 128), jnp.bfloat16)
  ref = None
  for impl in ("xla", "cudnn"):
    m = mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_1d(), dtype=jnp.bfloat16, implementation=impl)
    row = {"check": "attention_stacked", "implementation": impl, "runs": runs}
    try:
      vs = jax.vmap(lambda k: m.clone(implementation="xla").init(k, q))(jax.random.split(jax.random.key(1), runs))
      vs = {**vs, mp.MASK_PRIOR: jax.tree.map(lambda b: b * jnp.arange(1, runs + 1).reshape(-1, 1, 1, 1),
                                                vs[mp.MASK_PRIOR])}   # a different prior per run
      out = jax.jit(jax.vmap(lambda v: m.apply(v, q)))(vs)
      grad = jax.jit(jax.vmap(jax.grad(lambda v: jnp.sum(m.apply(v, q).astype(jnp.float32) ** 2))))(vs)
      grad = grad[mp.MASK_PRIOR]["bias"]
      if impl == "xla":
        ref = (out, grad)
      row.update(runs_ok=True, max_out_diff_vs_xla=float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref[0].astype(jnp.float32)))),
                 max_bias_grad_diff_vs_xla=float(jnp.max(jnp.abs(grad - ref[1]))),
                 bias_grad_scale=float(jnp.max(jnp.abs(ref[1]))))
    except Exception as e:
      row.update(runs_ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    emit(**row)


QUICK_BATCH = 8


def config_shape(name: str, quick: bool) -> tuple:
  """`throughput.CONFIGS[name]`, its batch (index 5) at most QUICK_BATCH under --quick."""
  shape = list(throughput.CONFIGS[name])
  if quick:
    shape[5] = min(shape[5], QUICK_BATCH)
  return tuple(shape)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help=f"few steps, batch at most {QUICK_BATCH} (a smoke test, also on a CPU)")
  p.add_argument("--configs", default="boolean_small,boolean_paper,vit_tiny,lm_small")
  args = p.parse_args()
  t0 = time.perf_counter()
  emit(check="devices", backend=jax.default_backend(), count=jax.device_count(),
       kinds=sorted({d.device_kind for d in jax.devices()}), jax=jax.__version__)
  attention_check()
  stacked_attention_check()
  steps = 20 if args.quick else 200
  for dtype in (None, jnp.bfloat16):
    peak, source = peak_flops(dtype)
    for name in args.configs.split(","):
      row = throughput.measure(name, config_shape(name, args.quick), 1, steps, 10, dtype, peak)
      emit(check="throughput", peak_source=source, **row)
  small = config_shape("boolean_small", args.quick)
  one = throughput.measure("boolean_small", small, 1, steps, 10, None, None)
  eight = throughput.measure("boolean_small", small, 8, steps, 10, None, None)
  emit(check="seed_vmap", seeds_1_steps_per_s=one["steps_per_s"], seeds_8_steps_per_s=eight["steps_per_s"],
       seed_steps_speedup=8 * eight["steps_per_s"] / one["steps_per_s"])
  emit(check="done", wall_s=round(time.perf_counter() - t0, 1), ok=bool(np.isfinite(one["steps_per_s"])))


if __name__ == "__main__":
  main()
