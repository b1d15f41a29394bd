"""The vision benchmark: a ViT classifier over a patch grid; the prior is 2-D locality (per-head
distance decay, or 3x3 impulse offsets) stored as a learnable relative-offset table. For
kind="impulse", the `qk` method is the structured "impulse" initialization.
"""
from __future__ import annotations


import jax.numpy as jnp
import ml_collections

from maskprior_jax import priors
from maskprior_jax.attention import MaskSettings
from maskprior_jax.bench import data as data_lib
from maskprior_jax.bench import supervised

IMPULSE_OFFSETS = [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]


def validate(cfg: ml_collections.ConfigDict) -> None:
  supervised.validate_common(cfg, {"prior.kind": ("distance", "impulse"), "model.pooling": ("cls", "mean")},
                             ["data.patch"])


def vision_prior(cfg, grid, num_prefix):
  p = cfg.prior
  if p.kind == "impulse":
    offsets = [IMPULSE_OFFSETS[h % len(IMPULSE_OFFSETS)] for h in range(cfg.model.num_heads)]
    return priors.locality_2d(grid, offsets=offsets, outside=p.outside, num_prefix=num_prefix)
  return priors.locality_2d(grid, num_prefix=num_prefix)


def load_problem(cfg, process_index: int = 0, process_count: int = 1) -> supervised.Problem:
  d = cfg.data
  if d.dataset in data_lib.EMBEDDED_VISION:
    ds = data_lib.digits()
  else:
    ds = data_lib.tfds_images(d.dataset, data_dir=d.data_dir or None, train_split=d.train_split,
                              test_split=d.test_split, process_index=process_index, process_count=process_count)
  h, w = ds.train_x.shape[1:3]
  grid = (h // d.patch, w // d.patch)
  prefix = 1 if cfg.model.pooling == "cls" else 0
  seq = grid[0] * grid[1] + prefix
  init = vision_prior(cfg, grid, prefix)
  train_x = data_lib.patchify(ds.train_x, d.patch)
  test_x = data_lib.patchify(ds.test_x, d.patch)[:cfg.eval.max_test]
  test_y = ds.test_y[:cfg.eval.max_test]
  return supervised.Problem(
      kind="vision", name=ds.name, task="classification", causal=False, seq=seq,
      train_x=train_x, train_y=ds.train_y, test_x=test_x, test_y=test_y,
      pattern=supervised.dense_pattern(init, (cfg.model.num_heads, seq, seq)),
      mask=MaskSettings(init, kind="relative_2d", grid=grid),
      model_kwargs=dict(vocab_size=None, max_len=grid[0] * grid[1], pooling=cfg.model.pooling,
                        head="classification", num_outputs=ds.num_classes),
      sample=jnp.zeros((1,) + train_x.shape[1:], jnp.float32), probe_size=cfg.eval.probe_size,
      info={"dataset": ds.name, "grid": list(grid), "patch": d.patch, "num_classes": ds.num_classes,
            "train_examples": len(train_x), "test_examples": len(test_x)})


# run(cfg, methods, seeds, workdir): the benchmark from a config; COMMAND: `maskprior vision`.
run, COMMAND = supervised.entry_points("vision", "ViT classification with a 2-D locality prior",
                                       "digits (embedded, the default) or a prepared TFDS image dataset: mnist, cifar10, ...",
                                       load_problem, validate)
