"""Language benchmark (byte-level causal LM, or text classification), small CPU default on
the embedded pydoc corpus.

  maskprior language --workdir runs/language                      # pydoc LM, 4 methods x 3 seeds
  maskprior language --dataset tiny_shakespeare --data-dir ~/tensorflow_datasets --workdir runs/shakespeare
  maskprior language --dataset imdb_reviews --data-dir ~/tensorflow_datasets --workdir runs/imdb   # classification
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # seq_len: LM context; classification reads the first seq_len bytes of each text.
  c.data = dict(dataset="pydoc", data_dir="", seq_len=64, train_split="train", test_split="test")
  c.model = dict(dim=64, depth=2, num_heads=4, head_dim=16, mlp_dim=256, pos_embedding="learned",
                 attention="auto")   # "xla", "cudnn" or "auto" (cuDNN on a GPU where it can); see results.json "attention"
  # 1-D recency/locality: B[h, q, k] = -scale * slope_h * |k - q|, ALiBi's slopes 2^(-8h/H),
  # stored as a learnable per-head offset table (each head learns its own width).
  c.prior = dict(scale=1.0, mode="learned", mask_lr_multiplier=1.0)
  # data_parallel: split every seed's batch over all devices (a mesh over jax.devices());
  # fsdp: also split large weights and optimizer state over them (with data_parallel).
  # grad_reduction (with data_parallel): "xla" (XLA's all-reduce) or "ordered" (every device's
  # gradient gathered and summed in a fixed order: bit for bit the same state however the
  # devices are spread over processes; not with fsdp).
  c.train = dict(steps=1500, batch_size=32, learning_rate=1e-3, optimizer="adamw", weight_decay=0.05,
                 steps_per_call=50, data_parallel=False, fsdp=False, grad_reduction="xla")
  c.eval = dict(every_steps=250, probe_size=32, eval_windows=128, max_test_windows=4096)
  c.qk = dict(fit_steps=300, fit_learning_rate=1e-2)
  c.mimetic = dict(alpha=0.7, beta=0.7, alpha_v=0.4, beta_v=0.4)
  c.checkpoint = dict(every_steps=500, max_to_keep=2)
  return ml_collections.ConfigDict(c)
