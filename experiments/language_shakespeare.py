"""Character-level LM on tiny_shakespeare for GPUs and TPUs (a nanoGPT-like small model):
dim 384, depth 6, 6 heads of 64, MLP 1536, context 256, batch 64, AdamW lr 1e-3, 5000 steps.

  tfds build tiny_shakespeare --file_format=array_record --data_dir ~/tensorflow_datasets   # once
  maskprior language --config experiments/language_shakespeare.py --data-dir ~/tensorflow_datasets \
      --seeds 3 --workdir runs/shakespeare
"""
from maskprior_jax.bench.config import builtin_config


def get_config():
  c = builtin_config("language")
  c.data.update(dataset="tiny_shakespeare", seq_len=256)
  c.model.update(dim=384, depth=6, num_heads=6, head_dim=64, mlp_dim=1536)
  c.train.update(steps=5000, batch_size=64, learning_rate=1e-3, weight_decay=0.1, steps_per_call=100)
  c.eval.update(every_steps=500, probe_size=32, eval_windows=256)
  c.checkpoint.update(every_steps=1000)
  return c
