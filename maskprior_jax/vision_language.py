"""The vision and language benchmarks: does a locality mask prior stay competitive where
the task's structure is only "nearby things interact"?

- vision: a ViT classifier over a patch grid; the prior is 2-D locality (per-head distance
  decay or 3x3 impulse offsets) stored as a learnable relative-offset table.
- language: a byte-level causal LM (or, for a labelled TFDS text dataset, a classifier with
  mean pooling); the prior is 1-D recency, ALiBi's per-head slopes as a learnable offset table.
Methods vanilla / mimetic / qk / mask share the model and budget; `qk` fits the query/key
weights so that the initial attention matches the same pattern the mask starts from (for
vision with kind="impulse", the structured "impulse" initialization).

Writes into `workdir`: config.json, metrics.jsonl, results.json, table.md, PNG plots,
checkpoints/; finished methods are skipped when the same command is rerun.
"""
from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maskprior_jax import data as data_lib
from maskprior_jax import experiment, optim, priors
from maskprior_jax.checkpoint import tree_sha256
from maskprior_jax.config import check, config_digest
from maskprior_jax.models import Transformer

METHODS = experiment.METHODS
IMPULSE_OFFSETS = [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]


def validate(cfg: ml_collections.ConfigDict, kind: str) -> None:
  choices = {"prior.mode": ("learned", "frozen"), "train.optimizer": ("adam", "adamw", "sgd"),
             "model.pos_embedding": ("learned", "sinusoidal", "none")}
  positive = ["model.dim", "model.depth", "model.num_heads", "model.head_dim", "model.mlp_dim", "train.steps",
              "train.batch_size", "train.learning_rate", "eval.every_steps", "eval.probe_size"]
  if kind == "vision":
    choices |= {"prior.kind": ("distance", "impulse"), "model.pooling": ("cls", "mean")}
    positive += ["data.patch"]
  else:
    positive += ["data.seq_len", "eval.eval_windows", "prior.scale"]
  check(cfg, choices=choices, positive=positive)


# ----------------------------------------------------------------------------- priors
def vision_prior(cfg, grid, num_prefix):
  p = cfg.prior
  if p.kind == "impulse":
    offsets = [IMPULSE_OFFSETS[h % len(IMPULSE_OFFSETS)] for h in range(cfg.model.num_heads)]
    return priors.locality_2d(grid, offsets=offsets, outside=p.outside, num_prefix=num_prefix)
  return priors.locality_2d(grid, num_prefix=num_prefix)


def dense_pattern(init, shape) -> np.ndarray:
  return np.asarray(init(jax.random.key(0), shape, jnp.float32))


def softmax_pattern(pattern: np.ndarray, causal: bool) -> np.ndarray:
  if causal:
    allowed = np.tril(np.ones(pattern.shape[-2:], bool))
    pattern = np.where(allowed, pattern, -np.inf)
  return np.asarray(jax.nn.softmax(jnp.asarray(pattern), axis=-1))


# ----------------------------------------------------------------------------- tasks
class _Problem:
  """What a benchmark needs from a dataset: shapes, the model, loss and evaluation."""


def _vision_problem(cfg, process_index, process_count) -> _Problem:
  d = cfg.data
  if d.dataset in data_lib.EMBEDDED_VISION:
    ds = data_lib.digits()
  else:
    ds = data_lib.tfds_images(d.dataset, data_dir=d.data_dir or None, train_split=d.train_split,
                              test_split=d.test_split, process_index=process_index, process_count=process_count)
  h, w = ds.train_x.shape[1:3]
  grid = (h // d.patch, w // d.patch)
  pb = _Problem()
  pb.kind, pb.name, pb.causal = "vision", ds.name, False
  pb.train_x, pb.train_y = data_lib.patchify(ds.train_x, d.patch), ds.train_y
  pb.test_x, pb.test_y = data_lib.patchify(ds.test_x, d.patch)[:cfg.eval.max_test], ds.test_y[:cfg.eval.max_test]
  prefix = 1 if cfg.model.pooling == "cls" else 0
  pb.seq = grid[0] * grid[1] + prefix
  init = vision_prior(cfg, grid, prefix)
  pb.pattern = dense_pattern(init, (cfg.model.num_heads, pb.seq, pb.seq))
  m = cfg.model
  pb.model_kwargs = dict(vocab_size=None, max_len=grid[0] * grid[1], pooling=m.pooling, head="classification",
                         num_outputs=ds.num_classes)
  pb.mask_kwargs = dict(mask_init=init, mask_kind="relative_2d", mask_grid=grid)
  pb.sample = jnp.zeros((1,) + pb.train_x.shape[1:], jnp.float32)
  pb.probe = pb.test_x[:cfg.eval.probe_size]
  pb.info = {"dataset": ds.name, "grid": list(grid), "patch": d.patch, "num_classes": ds.num_classes,
             "train_examples": len(pb.train_x), "test_examples": len(pb.test_x)}
  return pb


def _language_problem(cfg, process_index, process_count) -> _Problem:
  d = cfg.data
  name = d.dataset
  data_dir = d.data_dir or None
  L = d.seq_len
  heads = cfg.model.num_heads
  pb = _Problem()
  pb.kind, pb.name = "language", name
  if name not in data_lib.EMBEDDED_TEXT and data_lib.is_text_classification(name, data_dir):
    ds = data_lib.tfds_text_classification(name, L, data_dir=data_dir, train_split=d.train_split,
                                           test_split=d.test_split, process_index=process_index,
                                           process_count=process_count)
    pb.task, pb.causal = "classification", False
    pb.train_x, pb.train_y, pb.train_mask = ds.train_x.astype(np.int32), ds.train_y, ds.train_mask
    pb.test_x, pb.test_y, pb.test_mask = ds.test_x.astype(np.int32), ds.test_y, ds.test_mask
    pb.model_kwargs = dict(vocab_size=256, max_len=L, pooling="mean", head="classification",
                           num_outputs=ds.num_classes)
    pb.info = {"dataset": name, "task": "classification", "num_classes": ds.num_classes,
               "train_examples": len(pb.train_x), "test_examples": len(pb.test_x)}
  else:
    ds = data_lib.pydoc_text() if name in data_lib.EMBEDDED_TEXT else data_lib.tfds_text(
        name, data_dir=data_dir, train_split=d.train_split, test_split=d.test_split,
        process_index=process_index, process_count=process_count)
    if len(ds.train) < L + 2 or len(ds.test) < L + 2:
      raise data_lib.DataError(f"{name}: text too short for data.seq_len={L}")
    pb.task, pb.causal = "lm", True
    pb.train_text, pb.test_text = ds.train.astype(np.int32), ds.test.astype(np.int32)
    n_win = min((len(ds.test) - 1) // L, cfg.eval.max_test_windows)
    starts = np.arange(n_win) * L
    pb.test_x = np.stack([pb.test_text[s:s + L] for s in starts])
    pb.test_y = np.stack([pb.test_text[s + 1:s + L + 1] for s in starts])
    pb.test_mask = None
    pb.unigram_bits = data_lib.unigram_bits(ds.train, ds.test)
    pb.model_kwargs = dict(vocab_size=256, max_len=L, causal=True, pooling="none", head="lm", num_outputs=256)
    pb.info = {"dataset": name, "task": "lm", "train_bytes": len(ds.train), "test_bytes": len(ds.test),
               "test_windows": n_win, "unigram_bits_per_char": pb.unigram_bits}
  pb.seq = L
  init = priors.locality_1d(scale=cfg.prior.scale)
  pb.pattern = dense_pattern(init, (heads, L, L))
  pb.mask_kwargs = dict(mask_init=init, mask_kind="relative_1d", mask_max_len=L)
  pb.sample = jnp.zeros((1, L), jnp.int32)
  pb.probe = pb.test_x[:cfg.eval.probe_size]
  return pb


def load_problem(cfg, kind: str, process_index: int = 0, process_count: int = 1) -> _Problem:
  pb = (_vision_problem if kind == "vision" else _language_problem)(cfg, process_index, process_count)
  pb.target_attn = softmax_pattern(pb.pattern, pb.causal)
  return pb


def build_model(pb: _Problem, cfg, method: str) -> Transformer:
  m = cfg.model
  extra = pb.mask_kwargs if method == "mask" else {}
  return Transformer(dim=m.dim, depth=m.depth, num_heads=m.num_heads, head_dim=m.head_dim, mlp_dim=m.mlp_dim,
                     pos_embedding=m.pos_embedding, **pb.model_kwargs, **extra)


def make_tx(cfg):
  t = cfg.train
  return optim.mask_prior_optimizer(t.learning_rate, name=t.optimizer, weight_decay=t.weight_decay,
                                    mask_lr_multiplier=cfg.prior.mask_lr_multiplier,
                                    freeze_mask=cfg.prior.mode == "frozen")


# ----------------------------------------------------------------------------- run
def _apply(model, pb, v, x, mask=None):
  if getattr(pb, "task", "") == "classification":
    return model.apply(v, x, padding_mask=mask)
  return model.apply(v, x)


def _loss_and_metric(pb, logits, y):
  """Mean cross-entropy (nats) and accuracy (classification) for a batch."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return ce, (jnp.argmax(logits, -1) == y).mean()


def run(cfg: ml_collections.ConfigDict, kind: str, methods: Sequence[str], seeds: Sequence[int],
        workdir: pathlib.Path, log=print) -> dict:
  validate(cfg, kind)
  pb = load_problem(cfg, kind, jax.process_index(), jax.process_count())
  workdir = pathlib.Path(workdir)
  results_path = workdir / "results.json"
  results = experiment.open_results(workdir, cfg, config_digest({"cfg": cfg.to_dict(), "kind": kind,
                                                                 "seeds": list(seeds)}), {"benchmark": kind, **pb.info})
  bs, L = cfg.train.batch_size, getattr(pb, "seq", 0)
  is_lm = getattr(pb, "task", "") == "lm"

  def batch_fn(step, seeds_):
    out = []
    for s in seeds_:
      rng = np.random.default_rng([s, step])
      if is_lm:
        starts = rng.integers(0, len(pb.train_text) - L - 1, bs)
        idx = starts[:, None] + np.arange(L + 1)[None]
        win = pb.train_text[idx]
        out.append({"x": win[:, :-1], "y": win[:, 1:]})
      else:
        idx = rng.integers(0, len(pb.train_x), bs)
        b = {"x": pb.train_x[idx], "y": pb.train_y[idx]}
        if getattr(pb, "train_mask", None) is not None:
          b["mask"] = pb.train_mask[idx]
        out.append(b)
    return experiment.stack_trees(out) if len(out) > 1 else jax.tree.map(lambda a: a[None], out[0])

  n_ev = cfg.eval.eval_windows if is_lm else len(pb.test_x)
  ev_x, ev_y = pb.test_x[:n_ev], pb.test_y[:n_ev]
  ev_mask = None if getattr(pb, "test_mask", None) is None else pb.test_mask[:n_ev]

  for method in methods:
    if any(r["method"] == method for r in results["runs"]):
      log(f"[{pb.name}] {method}: already in {results_path}, skipped")
      continue
    t_method = experiment.Timer()
    model = build_model(pb, cfg, method)

    def loss_fn(v, batch, rng):
      del rng
      ce, acc = _loss_and_metric(pb, _apply(model, pb, v, batch["x"], batch.get("mask")), batch["y"])
      return ce, {"accuracy": acc}

    def metrics_fn(v, data):
      del data
      ce, acc = _loss_and_metric(pb, _apply(model, pb, v, ev_x, ev_mask), ev_y)
      return {"test_loss": ce, **({"test_bits_per_char": ce / np.log(2)} if is_lm else {"test_accuracy": acc})}

    state, history, infos, _ = experiment.train_method(
        method=method, model=model, tx=make_tx(cfg), cfg=cfg, seeds=seeds, sample_input=pb.sample,
        probe_input=pb.probe, target_attn=pb.target_attn, loss_fn=loss_fn, batch_fn=batch_fn,
        metrics_fn=metrics_fn, label=f"{pb.name}/{method}", checkpoint_dir=workdir / "checkpoints" / method)
    final = _final_eval(model, pb, state.variables)
    for i, s in enumerate(seeds):
      run_ = {"method": method, "seed": int(s), **{k: float(v[i]) for k, v in final.items()},
              "persistence": experiment.per_run(history, i, ["attn_tv", "mask_drift"]),
              "state_sha256": tree_sha256(jax.tree.map(lambda a, i=i: a[i], state.variables)), **infos[i]}
      results["runs"].append(run_)
    experiment.record_method(results, method, history, t_method(), workdir)
    key = headline_key(results)
    log(f"[{pb.name}] {method}: {key} "
        f"{experiment.mean_std([r[key] for r in results['runs'] if r['method'] == method])} ({t_method():.0f}s)")
  write_report(results, workdir)
  return results


def _final_eval(model, pb, stacked, chunk: int = 512) -> dict:
  """Per seed, on the whole (capped) test set: accuracy, or bits per char and perplexity."""
  is_lm = getattr(pb, "task", "") == "lm"
  mask = getattr(pb, "test_mask", None)

  @jax.jit
  def sums(v, x, y, m):
    logits = _apply(model, pb, v, x, m)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return ce.sum(), (jnp.argmax(logits, -1) == y).sum(), ce.size
  fn = jax.vmap(sums, in_axes=(0, None, None, None))
  tot_ce = tot_right = tot_n = 0
  for i in range(0, len(pb.test_x), chunk):
    m = None if mask is None else mask[i:i + chunk]
    ce, right, n = fn(stacked, pb.test_x[i:i + chunk], pb.test_y[i:i + chunk], m)
    tot_ce, tot_right, tot_n = tot_ce + np.asarray(ce, np.float64), tot_right + np.asarray(right), tot_n + int(n[0])
  mean_ce = tot_ce / tot_n
  if is_lm:
    return {"test_bits_per_char": mean_ce / np.log(2), "test_perplexity": np.exp(mean_ce), "test_loss": mean_ce}
  return {"test_accuracy": tot_right / tot_n, "test_loss": mean_ce}


def headline_key(results: dict) -> str:
  return "test_bits_per_char" if results.get("task") == "lm" else "test_accuracy"


def table(results: dict) -> str:
  key = headline_key(results)
  lower_better = key == "test_bits_per_char"
  methods = experiment.methods_in(results)
  mean = {m: np.mean([r[key] for r in results["runs"] if r["method"] == m]) for m in methods}
  baselines = [m for m in methods if m != "mask"]
  best = (min if lower_better else max)(baselines, key=lambda m: mean[m]) if baselines else None
  rows = []
  for m in methods:
    vals = [r[key] for r in results["runs"] if r["method"] == m]
    if best is None or m == best:
      gap = "-"
    elif lower_better:
      gap = f"{(mean[m] - mean[best]) / mean[best]:+.1%} vs {best}"
    else:
      gap = f"{100 * (mean[m] - mean[best]):+.1f} points vs {best}"
    rows.append([m, len(vals), experiment.mean_std(vals), gap])
  what = "test bits per char (byte)" if lower_better else "test accuracy"
  head = f"**{results['benchmark']}: {results['dataset']}**"
  if "unigram_bits_per_char" in results:
    head += f"; unigram entropy of the test text {results['unigram_bits_per_char']:.3f} bits per char"
  out = head + "\n\n" + experiment.markdown_table(["method", "seeds", what, "against the best baseline"], rows)
  out += "\nPersistence (attention TV from the prior's pattern, start → end, mean over layers and seeds):\n\n"
  out += experiment.persistence_table(results)
  return out


def write_report(results: dict, workdir: pathlib.Path) -> None:
  workdir = pathlib.Path(workdir)
  (workdir / "table.md").write_text(table(results))
  curves = results["curves"]
  if not curves:
    return
  key = headline_key(results)
  ref = {"unigram": results["unigram_bits_per_char"]} if "unigram_bits_per_char" in results else None
  experiment.plot_curves(workdir / "test_curve.png", experiment.metric_curves(curves, key),
                         title=f"{results['dataset']}: {key.replace('_', ' ')} (eval subset)", ylabel=key, hlines=ref)
  experiment.plot_curves(workdir / "persistence.png", experiment.metric_curves(curves, "attn_tv"),
                         title=f"{results['dataset']}: attention distance from the prior's pattern",
                         ylabel="mean TV distance (layers)")
