"""Boolean benchmark at GOTU's scale, for GPUs and TPUs (the built-in config
maskprior_jax/bench/boolean/configs/paper.py, which notebooks load with builtin_config("boolean_paper")).

GOTU's Transformer: dim 256, depth 12, 6 heads of 64, MLP 256, batch 256, Adam with weight
decay 1e-3, lr 2e-5 (f1, f3) or 1e-5 (f2, f4); about 2k to 9k steps. About an hour per run
on a 2-core CPU; minutes on an accelerator.

  maskprior boolean --config experiments/boolean_paper.py --seeds 10 --workdir runs/boolean_paper
"""
from maskprior_jax.bench.config import builtin_config


def get_config():
  return builtin_config("boolean_paper")
