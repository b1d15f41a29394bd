"""PyTorch reference for experiments/throughput.py's Boolean steps (the CPU speed comparison runs
it on the same machine, in its own environment with torch installed):

  python experiments/torch_reference.py --steps 50                                  # GOTU's size, SDPA
  python experiments/torch_reference.py --config boolean_small --attention matmul --compile

Same shapes as throughput.py's configs: pre-LN encoder, 15 tokens + CLS, a learnable additive
attention bias per layer (heads, 16, 16), regression head on CLS, MSE loss, AdamW; float32.
boolean_paper: dim 256, depth 12, 6 heads of 64, MLP 256, batch 256; boolean_small: dim 64, depth 2,
4 heads of 64, MLP 256, batch 64. --attention sdpa (scaled_dot_product_attention with the bias as a
float mask) or matmul (q.k^T / sqrt(d) + bias, softmax, . v: on CPU often faster than SDPA with a
float mask); --compile wraps the model in torch.compile. Prints one JSON line.
"""
import argparse
import json
import time

import torch
from torch import nn


CONFIGS = {   # name: (dim, depth, heads, head_dim, mlp, batch), as experiments/throughput.py
    "boolean_small": (64, 2, 4, 64, 256, 64),
    "boolean_paper": (256, 12, 6, 64, 256, 256),
}


class Block(nn.Module):
  def __init__(self, dim, heads, head_dim, mlp, seq, attention):
    super().__init__()
    self.h, self.d, self.attention = heads, head_dim, attention
    self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
    self.q, self.k, self.v = (nn.Linear(dim, heads * head_dim) for _ in range(3))
    self.o = nn.Linear(heads * head_dim, dim)
    self.bias = nn.Parameter(torch.zeros(heads, seq, seq))
    self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(approximate="tanh"), nn.Linear(mlp, dim))

  def forward(self, x):
    b, n, _ = x.shape
    h = self.ln1(x)
    split = lambda t: t.view(b, n, self.h, self.d).transpose(1, 2)
    q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
    if self.attention == "sdpa":
      out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[None])
    else:
      out = torch.softmax(q @ k.transpose(-2, -1) * self.d ** -0.5 + self.bias, dim=-1) @ v
    x = x + self.o(out.transpose(1, 2).reshape(b, n, -1))
    return x + self.mlp(self.ln2(x))


class Model(nn.Module):
  def __init__(self, dim=256, depth=12, heads=6, head_dim=64, mlp=256, seq=16, attention="sdpa"):
    super().__init__()
    self.embed, self.pos, self.cls = nn.Embedding(2, dim), nn.Parameter(torch.zeros(seq, dim)), nn.Parameter(torch.zeros(dim))
    self.blocks = nn.ModuleList(Block(dim, heads, head_dim, mlp, seq, attention) for _ in range(depth))
    self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, 1)

  def forward(self, ids):
    x = torch.cat([self.cls.expand(ids.shape[0], 1, -1), self.embed(ids)], 1) + self.pos
    for blk in self.blocks:
      x = blk(x)
    return self.head(self.ln(x[:, 0]))[:, 0]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=50)
  p.add_argument("--warmup", type=int, default=5)
  p.add_argument("--config", default="boolean_paper", choices=sorted(CONFIGS))
  p.add_argument("--attention", default="sdpa", choices=["sdpa", "matmul"])
  p.add_argument("--compile", action="store_true", help="torch.compile the model (warm-up includes compiling)")
  args = p.parse_args()
  torch.manual_seed(0)
  dim, depth, heads, head_dim, mlp, batch = CONFIGS[args.config]
  model = Model(dim, depth, heads, head_dim, mlp, attention=args.attention)
  opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=1e-3)
  forward = torch.compile(model) if args.compile else model
  ids = torch.randint(0, 2, (batch, 15))
  y = torch.randn(batch)

  def step():
    opt.zero_grad(set_to_none=True)
    loss = ((forward(ids) - y) ** 2).mean()
    loss.backward()
    opt.step()
  for _ in range(args.warmup):
    step()
  t0 = time.perf_counter()
  for _ in range(args.steps):
    step()
  dt = time.perf_counter() - t0
  mode = "compile" if args.compile else "eager"
  print(json.dumps({"config": args.config, "framework": f"torch {torch.__version__} {mode}", "attention": args.attention,
                    "threads": torch.get_num_threads(), "steps_per_s": args.steps / dt}), flush=True)


if __name__ == "__main__":
  main()
