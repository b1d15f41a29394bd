"""The language benchmark: a byte-level causal LM (or, for a labelled TFDS text dataset, a
classifier with mean pooling); the prior is 1-D recency, ALiBi's per-head slopes as a
learnable offset table.
"""
from __future__ import annotations


import jax.numpy as jnp
import ml_collections
import numpy as np

from maskprior_jax import priors
from maskprior_jax.attention import MaskSettings
from maskprior_jax.bench import data as data_lib
from maskprior_jax.bench import supervised


def validate(cfg: ml_collections.ConfigDict) -> None:
  supervised.validate_common(cfg, {}, ["data.seq_len", "eval.eval_windows", "prior.scale"])


def load_problem(cfg, process_index: int = 0, process_count: int = 1) -> supervised.Problem:
  d = cfg.data
  name, data_dir, L = d.dataset, d.data_dir or None, d.seq_len
  init = priors.locality_1d(scale=cfg.prior.scale)
  common = dict(kind="language", name=name, seq=L, mask=MaskSettings(init, kind="relative_1d", max_len=L),
                pattern=supervised.dense_pattern(init, (cfg.model.num_heads, L, L)),
                sample=jnp.zeros((1, L), jnp.int32), probe_size=cfg.eval.probe_size)
  if name not in data_lib.EMBEDDED_TEXT and data_lib.is_text_classification(name, data_dir):
    ds = data_lib.tfds_text_classification(name, L, data_dir=data_dir, train_split=d.train_split,
                                           test_split=d.test_split, process_index=process_index,
                                           process_count=process_count)
    return supervised.Problem(
        task="classification", causal=False, train_x=ds.train_x.astype(np.int32), train_y=ds.train_y,
        train_mask=ds.train_mask, test_x=ds.test_x.astype(np.int32), test_y=ds.test_y, test_mask=ds.test_mask,
        model_kwargs=dict(vocab_size=256, max_len=L, pooling="mean", head="classification",
                          num_outputs=ds.num_classes),
        info={"dataset": name, "task": "classification", "num_classes": ds.num_classes,
              "train_examples": len(ds.train_x), "test_examples": len(ds.test_x)}, **common)
  ds = data_lib.pydoc_text() if name in data_lib.EMBEDDED_TEXT else data_lib.tfds_text(
      name, data_dir=data_dir, train_split=d.train_split, test_split=d.test_split,
      process_index=process_index, process_count=process_count)
  if len(ds.train) < L + 2 or len(ds.test) < L + 2:
    raise data_lib.DataError(f"{name}: text too short for data.seq_len={L}")
  test_text = ds.test.astype(np.int32)
  n_win = min((len(ds.test) - 1) // L, cfg.eval.max_test_windows)
  starts = np.arange(n_win) * L
  return supervised.Problem(
      task="lm", causal=True, train_text=ds.train.astype(np.int32),
      test_x=np.stack([test_text[s:s + L] for s in starts]), test_y=np.stack([test_text[s + 1:s + L + 1] for s in starts]),
      model_kwargs=dict(vocab_size=256, max_len=L, causal=True, pooling="none", head="lm", num_outputs=256),
      info={"dataset": name, "task": "lm", "train_bytes": len(ds.train), "test_bytes": len(ds.test),
            "test_windows": n_win, "unigram_bits_per_char": data_lib.unigram_bits(ds.train, ds.test)}, **common)


# run(cfg, methods, seeds, workdir): the benchmark from a config; COMMAND: `maskprior language`.
run, COMMAND = supervised.entry_points("language", "byte-level LM (or text classification) with a 1-D recency prior",
                                       "pydoc (embedded, the default) or a prepared TFDS text dataset: tiny_shakespeare, imdb_reviews",
                                       load_problem, validate)
