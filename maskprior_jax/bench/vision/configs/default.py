"""Vision benchmark (ViT classifier), small CPU default on the embedded 8x8 digits.

  maskprior vision --workdir runs/vision                          # digits, 4 methods x 3 seeds
  maskprior vision --dataset mnist --data-dir ~/tensorflow_datasets --config.data.patch=4 --workdir runs/mnist
  maskprior vision --config experiments/vision_cifar10.py --dataset cifar10 --workdir runs/cifar10   # GPU/TPU
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.data = dict(dataset="digits", data_dir="", patch=2, train_split="train", test_split="test")
  c.model = dict(dim=64, depth=2, num_heads=4, head_dim=16, mlp_dim=128, pooling="cls",
                 pos_embedding="learned",
                 attention="auto")   # "xla", "cudnn" or "auto" (cuDNN on a GPU where it can); see results.json "attention"
  # 2-D locality over the patch grid, learnable (a relative-offset table per head):
  # "distance": logit -slope_h * distance, slopes 4 * 2^(-8h/H) (per-head neighbourhood widths);
  # "impulse": head h favours one offset of a 3x3 kernel (logit 0 there, `outside` elsewhere).
  c.prior = dict(kind="distance", outside=-4.0, mode="learned", mask_lr_multiplier=1.0)
  # data_parallel: split every seed's batch over all devices (a mesh over jax.devices());
  # fsdp: also split large weights and optimizer state over them (with data_parallel).
  # grad_reduction (with data_parallel): "xla" (XLA's all-reduce) or "ordered" (every device's
  # gradient gathered and summed in a fixed order: bit for bit the same state however the
  # devices are spread over processes; not with fsdp).
  c.train = dict(steps=1500, batch_size=64, learning_rate=1e-3, optimizer="adamw", weight_decay=0.05,
                 steps_per_call=50, data_parallel=False, fsdp=False, grad_reduction="xla")
  c.eval = dict(every_steps=250, probe_size=64, max_test=10000)
  c.qk = dict(fit_steps=300, fit_learning_rate=1e-2)
  c.mimetic = dict(alpha=0.7, beta=0.7, alpha_v=0.4, beta_v=0.4)
  c.checkpoint = dict(every_steps=500, max_to_keep=2)
  return ml_collections.ConfigDict(c)
