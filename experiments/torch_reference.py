"""PyTorch eager reference for experiments/throughput.py's GOTU-size step (the CPU speed target
compares against it; run it on the same machine, in its own environment with torch installed):

  python experiments/torch_reference.py --steps 50

Same shapes as throughput.py's boolean_paper: pre-LN encoder, dim 256, depth 12, 6 heads of 64,
MLP 256, 15 tokens + CLS, batch 256, a learnable additive attention bias per layer (heads, 16, 16),
regression head on CLS, MSE loss, AdamW; float32, eager. Prints one JSON line.
"""
import argparse
import json
import time

import torch
from torch import nn


class Block(nn.Module):
  def __init__(self, dim, heads, head_dim, mlp, seq):
    super().__init__()
    self.h, self.d = heads, head_dim
    self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
    self.q, self.k, self.v = (nn.Linear(dim, heads * head_dim) for _ in range(3))
    self.o = nn.Linear(heads * head_dim, dim)
    self.bias = nn.Parameter(torch.zeros(heads, seq, seq))
    self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(approximate="tanh"), nn.Linear(mlp, dim))

  def forward(self, x):
    b, n, _ = x.shape
    h = self.ln1(x)
    split = lambda t: t.view(b, n, self.h, self.d).transpose(1, 2)
    out = nn.functional.scaled_dot_product_attention(split(self.q(h)), split(self.k(h)), split(self.v(h)),
                                                     attn_mask=self.bias[None])
    x = x + self.o(out.transpose(1, 2).reshape(b, n, -1))
    return x + self.mlp(self.ln2(x))


class Model(nn.Module):
  def __init__(self, dim=256, depth=12, heads=6, head_dim=64, mlp=256, seq=16):
    super().__init__()
    self.embed, self.pos, self.cls = nn.Embedding(2, dim), nn.Parameter(torch.zeros(seq, dim)), nn.Parameter(torch.zeros(dim))
    self.blocks = nn.ModuleList(Block(dim, heads, head_dim, mlp, seq) for _ in range(depth))
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
  args = p.parse_args()
  torch.manual_seed(0)
  model = Model()
  opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=1e-3)
  ids = torch.randint(0, 2, (256, 15))
  y = torch.randn(256)

  def step():
    opt.zero_grad(set_to_none=True)
    loss = ((model(ids) - y) ** 2).mean()
    loss.backward()
    opt.step()
  for _ in range(args.warmup):
    step()
  t0 = time.perf_counter()
  for _ in range(args.steps):
    step()
  dt = time.perf_counter() - t0
  print(json.dumps({"config": "boolean_paper", "framework": f"torch {torch.__version__} eager",
                    "threads": torch.get_num_threads(), "steps_per_s": args.steps / dt}), flush=True)


if __name__ == "__main__":
  main()
