"""Training throughput of the library's Transformer: one JSON line per measured config.

  python experiments/throughput.py                                    # Boolean small + paper sizes
  python experiments/throughput.py --configs boolean_small --seeds 1,8 --steps 200
  python experiments/throughput.py --configs custom --dim 128 --depth 4 --heads 4 --batch 128 --seq 64
  python experiments/throughput.py --configs vit_tiny,lm_small --peak-flops 989e12   # on a GPU

Keys: config, steps_per_s, examples_per_s, flops_per_step (XLA's cost analysis of the compiled
step), flops_per_s, mfu (against --peak-flops, or a measured matmul probe with --probe), peak_memory_bytes
(null where the backend does not report it), seeds (vmapped runs per step), backend, and the shapes.
A step is a full training step: forward, backward and the optimizer update, with the mask prior on.
"""
import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import maskprior_jax as mp
from maskprior_jax import priors, train
from maskprior_jax.models import Transformer

CONFIGS = {
    # name: (dim, depth, heads, head_dim, mlp, batch, seq without CLS, vocab, causal)
    "boolean_small": (64, 2, 4, 64, 256, 64, 15, 2, False),
    "boolean_paper": (256, 12, 6, 64, 256, 256, 15, 2, False),
    "vit_tiny": (192, 12, 3, 64, 768, 512, 256, None, False),
    "lm_small": (384, 6, 6, 64, 1536, 64, 256, 256, True),
}


def build(dim, depth, heads, head_dim, mlp, batch, seq, vocab, causal, dtype):
  total = seq + (0 if causal else 1)
  prior = priors.locality_1d() if causal else priors.interaction_groups([[1, 2, 3], [4, 5]], readers=[0])
  model = Transformer(vocab_size=vocab, dim=dim, depth=depth, num_heads=heads, head_dim=head_dim, mlp_dim=mlp,
                      max_len=seq, causal=causal, pooling="none" if causal else "cls",
                      head="lm" if causal else "regression", num_outputs=vocab if causal else 1,
                      mask=mp.MaskSettings(prior) if prior is not None else None, dtype=dtype)
  del total
  rng = np.random.default_rng(0)
  if vocab is None:
    x = rng.normal(size=(batch, seq, 3 * 4)).astype(np.float32)  # 2x2 RGB patches
  else:
    x = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
  y = rng.integers(0, vocab, (batch, seq)).astype(np.int32) if causal else rng.normal(size=(batch,)).astype(np.float32)

  def loss_fn(v, b, r):
    out = model.apply(v, b["x"])
    if causal:
      logp = jax.nn.log_softmax(out)
      return -jnp.mean(jnp.take_along_axis(logp, b["y"][..., None], -1)), {}
    return jnp.mean((out - b["y"]) ** 2), {}
  return model, loss_fn, {"x": x, "y": y}


def matmul_probe(dtype) -> float:
  n = 4096 if jax.default_backend() != "cpu" else 1024
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda a: a @ a)
  f(a).block_until_ready()
  t, reps = time.perf_counter(), 0
  while time.perf_counter() - t < 1.0:
    f(a).block_until_ready()
    reps += 1
  return 2 * n ** 3 * reps / (time.perf_counter() - t)


def model_flops(shape) -> float:
  """Model FLOPs of one training step (forward + backward = 3x forward), counting matmuls:
  2 * tokens * (weights of q, k, v, out, MLP, head) + 4 * tokens * seq * qkv width (scores, mix)."""
  dim, depth, heads, head_dim, mlp, batch, seq, vocab, causal = shape
  tokens = batch * (seq + (0 if causal else 1))
  width = heads * head_dim
  per_layer = 2 * tokens * (4 * dim * width + 2 * dim * mlp) + 4 * tokens * (seq + 1) * width
  head = 2 * tokens * dim * (vocab if causal else 1)
  return 3.0 * (depth * per_layer + head)


def measure(name, shape, seeds, steps, steps_per_call, dtype, peak):
  model, loss_fn, batch = build(*shape, dtype)
  tx = mp.mask_prior_optimizer(1e-4, name="adamw")
  states = [train.create_state(model.init(jax.random.key(s), batch["x"][:1]), tx, jax.random.key(s))
            for s in range(seeds)]
  seed_axis = seeds > 1
  state = jax.tree.map(lambda *x: jnp.stack(x), *states) if seed_axis else states[0]
  b = jax.tree.map(lambda x: np.stack([x] * seeds), batch) if seed_axis else batch
  if steps_per_call > 1:
    b = jax.tree.map(lambda x: np.stack([x] * steps_per_call), b)
  b = jax.device_put(b)
  step = train.make_train_step(loss_fn, tx, seed_axis=seed_axis, steps_per_call=steps_per_call)
  compiled = step.lower(state, b).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  xla_flops = float(cost.get("flops", 0.0)) / steps_per_call if cost else None
  flops = model_flops(shape) * seeds
  state, m = compiled(state, b)
  jax.block_until_ready(m)
  calls = max(1, steps // steps_per_call)
  t = time.perf_counter()
  for _ in range(calls):
    state, m = compiled(state, b)
  jax.block_until_ready(m)
  dt = time.perf_counter() - t
  sps = calls * steps_per_call / dt
  mem = None
  try:
    stats = jax.devices()[0].memory_stats()
    mem = stats.get("peak_bytes_in_use") if stats else None
  except Exception:
    mem = None
  dim, depth, heads, head_dim, mlp, batch_size, seq, vocab, causal = shape
  return {"config": name, "steps_per_s": sps, "examples_per_s": sps * batch_size * seeds,
          "flops_per_step": flops, "xla_flops_per_step": xla_flops, "flops_per_s": flops * sps,
          "mfu": flops * sps / peak if flops and peak else None, "peak_memory_bytes": mem, "seeds": seeds,
          "steps_per_call": steps_per_call, "backend": jax.default_backend(), "device": str(jax.devices()[0]),
          "dtype": str(jnp.dtype(dtype).name) if dtype else "float32",
          "shape": dict(dim=dim, depth=depth, heads=heads, head_dim=head_dim, mlp=mlp, batch=batch_size,
                        seq=seq + (0 if causal else 1))}


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--configs", default="boolean_small,boolean_paper")
  p.add_argument("--seeds", default="1", help="comma list of seed counts (vmapped runs per step)")
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--steps-per-call", type=int, default=10)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--peak-flops", type=float, default=None, help="device peak FLOP/s for MFU")
  p.add_argument("--probe", action="store_true", help="measure the peak with a matmul probe")
  p.add_argument("--dim", type=int)
  p.add_argument("--depth", type=int)
  p.add_argument("--heads", type=int)
  p.add_argument("--head-dim", type=int)
  p.add_argument("--mlp", type=int)
  p.add_argument("--batch", type=int)
  p.add_argument("--seq", type=int)
  args = p.parse_args()
  dtype = jnp.bfloat16 if args.dtype == "bfloat16" else None
  peak = args.peak_flops or (matmul_probe(dtype or jnp.float32) if args.probe else None)
  for name in args.configs.split(","):
    base = CONFIGS.get(name, CONFIGS["boolean_small"])
    if name not in CONFIGS and name != "custom":
      p.error(f"unknown config {name!r}; choose from {', '.join(CONFIGS)} or custom")
    dim, depth, heads, head_dim, mlp, batch, seq, vocab, causal = base
    shape = (args.dim or dim, args.depth or depth, args.heads or heads, args.head_dim or head_dim,
             args.mlp or mlp, args.batch or batch, args.seq or seq, vocab, causal)
    label = name if shape == base else f"{name}+flags"
    for s in (int(x) for x in args.seeds.split(",")):
      print(json.dumps(measure(label, shape, s, args.steps, args.steps_per_call, dtype, peak)), flush=True)


if __name__ == "__main__":
  main()
