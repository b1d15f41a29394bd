"""The attention function's implementations side by side: equality with XLA's attention (output
and every gradient: query, key, value, bias) at T=1,024, the compiled temporary memory of forward +
backward at B=8, N=8, T=2,048, H=64 (a bias shared by the batch, as a mask prior is), and on this
machine the speed of forward + backward at a few lengths.

  python experiments/attention_memory.py              # the figures the README quotes
  python experiments/attention_memory.py --smoke      # small sizes (a test runs this)
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import maskprior_jax as mp


def inputs(b, t, n, h, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  q, k, v = (jax.random.normal(kk, (b, t, n, h), jnp.float32) for kk in ks[:3])
  bias = jax.random.normal(ks[3], (1, n, t, t), jnp.float32)       # one prior for the whole batch
  return q, k, v, bias


def loss(impl, block):
  def f(q, k, v, bias):
    out = mp.dot_product_attention(q, k, v, bias, implementation=impl, block_size=block)
    return jnp.sum(out * jnp.cos(out))                               # any scalar that reads every output
  return jax.value_and_grad(f, argnums=(0, 1, 2, 3))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--smoke", action="store_true", help="small sizes")
  p.add_argument("--block", type=int, default=128)
  args = p.parse_args()
  eq_t, (b, n, t, h) = (128, (2, 2, 256, 16)) if args.smoke else (1024, (8, 8, 2048, 64))
  block = min(args.block, eq_t // 2)

  x = inputs(2, eq_t, 4, 32)
  (lx, gx), (lb, gb) = (jax.jit(loss(impl, block))(*x) for impl in ("xla", "blockwise"))
  rel = [float(jnp.abs(a - c).max() / jnp.abs(c).max()) for a, c in zip(gb, gx)]
  print(f"equality at T={eq_t} (B=2, N=4, H=32, block {block}): loss {float(lb):.6g} vs {float(lx):.6g}; "
        "max |grad - XLA's| / max |XLA's| for query, key, value, bias: " + ", ".join(f"{r:.1e}" for r in rel))

  shapes = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in inputs(b, t, n, h)[:3]]
  shapes.append(jax.ShapeDtypeStruct((1, n, t, t), jnp.float32))
  mem = {}
  for impl in ("xla", "blockwise"):
    compiled = jax.jit(loss(impl, args.block)).lower(*shapes).compile()
    mem[impl] = compiled.memory_analysis().temp_size_in_bytes
  print(f"compiled temporaries, forward + backward at B={b}, N={n}, T={t}, H={h}, float32: XLA "
        f"{mem['xla'] / 2**20:.0f} MiB, blockwise (block {args.block}) {mem['blockwise'] / 2**20:.0f} MiB "
        f"({mem['blockwise'] / mem['xla']:.1%} of XLA's)")

  print(f"speed on {jax.devices()[0].platform} (forward + backward, B=2, N=4, H=32, median of 5):")
  for t_len in ((128, 256) if args.smoke else (256, 512, 1024, 2048)):
    x = inputs(2, t_len, 4, 32)
    times = {}
    for impl in ("xla", "blockwise"):
      f = jax.jit(loss(impl, args.block))
      jax.block_until_ready(f(*x))
      runs = []
      for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*x))
        runs.append(time.perf_counter() - t0)
      times[impl] = float(np.median(runs))
    print(f"  T={t_len}: XLA {1e3 * times['xla']:.1f} ms, blockwise {1e3 * times['blockwise']:.1f} ms "
          f"({times['blockwise'] / times['xla']:.2f}x)")


if __name__ == "__main__":
  main()
