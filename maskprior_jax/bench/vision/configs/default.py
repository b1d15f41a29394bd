"""Vision benchmark (ViT classifier), small CPU default on the embedded 8x8 digits.

  maskprior vision --workdir runs/vision                          # digits, 4 methods x 3 seeds
  maskprior vision --dataset mnist --data-dir ~/tensorflow_datasets --config.data.patch=4 --workdir runs/mnist
  maskprior vision --config experiments/vision_cifar10.py --dataset cifar10 --workdir runs/cifar10   # GPU/TPU
"""
import ml_collections

from maskprior_jax.bench.config import base_config


def get_config() -> ml_collections.ConfigDict:
  c = base_config()   # the loop's keys (train, eval, checkpoint, prior.mode, qk, mimetic): see there
  c.data = dict(dataset="digits", data_dir="", patch=2, train_split="train", test_split="test")
  c.model.update(dim=64, depth=2, num_heads=4, head_dim=16, mlp_dim=128, pooling="cls", pos_embedding="learned")
  # 2-D locality over the patch grid, learnable (a relative-offset table per head):
  # "distance": logit -slope_h * distance, slopes 4 * 2^(-8h/H) (per-head neighbourhood widths);
  # "impulse": head h favours one offset of a 3x3 kernel (logit 0 there, `outside` elsewhere).
  c.prior.update(kind="distance", outside=-4.0, mode="learned", mask_lr_multiplier=1.0)
  c.train.update(steps=1500, batch_size=64, learning_rate=1e-3, optimizer="adamw", weight_decay=0.05,
                 steps_per_call=50)
  c.eval.update(every_steps=250, probe_size=64, max_test=10000)
  c.checkpoint.update(every_steps=500, max_to_keep=2)
  return c
