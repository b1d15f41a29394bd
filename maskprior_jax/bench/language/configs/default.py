"""Language benchmark (byte-level causal LM, or text classification), small CPU default on
the embedded pydoc corpus.

  maskprior language --workdir runs/language                      # pydoc LM, 4 methods x 3 seeds
  maskprior language --dataset tiny_shakespeare --data-dir ~/tensorflow_datasets --workdir runs/shakespeare
  maskprior language --dataset imdb_reviews --data-dir ~/tensorflow_datasets --workdir runs/imdb   # classification
"""
import ml_collections

from maskprior_jax.bench.config import base_config


def get_config() -> ml_collections.ConfigDict:
  c = base_config()   # the loop's keys (train, eval, checkpoint, prior.mode, qk, mimetic): see there
  # seq_len: LM context; classification reads the first seq_len bytes of each text.
  c.data = dict(dataset="pydoc", data_dir="", seq_len=64, train_split="train", test_split="test")
  c.model.update(dim=64, depth=2, num_heads=4, head_dim=16, mlp_dim=256, pos_embedding="learned")
  # 1-D recency/locality: B[h, q, k] = -scale * slope_h * |k - q|, ALiBi's slopes 2^(-8h/H),
  # stored as a learnable per-head offset table (each head learns its own width).
  c.prior.update(scale=1.0, mode="learned", mask_lr_multiplier=1.0)
  c.train.update(steps=1500, batch_size=32, learning_rate=1e-3, optimizer="adamw", weight_decay=0.05,
                 steps_per_call=50)
  c.eval.update(every_steps=250, probe_size=32, eval_windows=128, max_test_windows=4096)
  c.checkpoint.update(every_steps=500, max_to_keep=2)
  return c
