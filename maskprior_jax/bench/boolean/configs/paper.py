"""Boolean benchmark at GOTU's scale, for GPUs and TPUs.

GOTU's Transformer: dim 256, depth 12, 6 heads of 64, MLP 256, batch 256, Adam with weight
decay 1e-3, lr 2e-5 (f1, f3) or 1e-5 (f2, f4); about 2k to 9k steps. About an hour per run
on a 2-core CPU; minutes on an accelerator.

  maskprior boolean --config experiments/boolean_paper.py --seeds 10 --workdir runs/boolean_paper   # the same as this built-in config
"""
from maskprior_jax.bench.config import builtin_config


def get_config():
  c = builtin_config("boolean")
  c.task.n_by_task = ""                                  # GOTU's sizes: n = 15, frozen-coordinate 18
  c.model.update(dim=256, depth=12, num_heads=6, head_dim=64, mlp_dim=256)
  c.train.update(steps=8000, batch_size=256, learning_rate=2e-5, weight_decay=1e-3, optimizer="adamw",
                 learning_rate_by_task="f2_2parity=1e-5,f4_majority=1e-5,frozen_coordinate=1e-5",
                 steps_per_call=100, batches="device")
  c.eval.update(every_steps=500, num_points=16384, probe_size=512)
  return c
