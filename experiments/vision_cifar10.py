"""ViT-Tiny-like CIFAR-10 recipe for GPUs and TPUs (the structured-initialization papers' setup):
dim 192, depth 12, 3 heads of 64, MLP 768, patch 2 on 32x32 (a 16x16 grid, 257 tokens with CLS),
AdamW lr 1e-3, weight decay 0.05, batch 512, 20k steps (about 200 epochs). No data augmentation
in this pipeline, so expect less than the papers' augmented numbers.

  tfds build cifar10 --file_format=array_record --data_dir ~/tensorflow_datasets   # once, with network
  maskprior vision --config experiments/vision_cifar10.py --dataset cifar10 --data-dir ~/tensorflow_datasets \
      --seeds 3 --workdir runs/cifar10
"""
from maskprior_jax.bench.config import builtin_config


def get_config():
  c = builtin_config("vision")
  c.data.update(dataset="cifar10", patch=2)
  c.model.update(dim=192, depth=12, num_heads=3, head_dim=64, mlp_dim=768)
  c.train.update(steps=20000, batch_size=512, learning_rate=1e-3, weight_decay=0.05, steps_per_call=100)
  c.eval.update(every_steps=1000, probe_size=128)
  c.checkpoint.update(every_steps=2000)
  return c
