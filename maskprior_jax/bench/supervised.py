"""What the vision and language benchmarks share: a `Problem` (a dataset as arrays, the
model's shape, the prior), the run over methods and seeds, the final evaluation and the
table. `bench.vision` and `bench.language` each build a Problem from their config.

The question both ask: does a locality mask prior stay competitive where the task's
structure is only "nearby things interact"? Methods vanilla / mimetic / qk / mask share the
model and budget; `qk` fits the query/key weights so that the initial attention matches the
same pattern the mask starts from.

Writes into `workdir`: config.json, metrics.jsonl, results.json, table.md, PNG plots,
checkpoints/; finished methods are skipped when the same command is rerun.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maskprior_jax.attention import MaskSettings
from maskprior_jax.bench import methods as methods_lib
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.config import config_digest
from maskprior_jax import train
from maskprior_jax.distributed import take_part
from maskprior_jax.measure import target_attention
from maskprior_jax.models import Transformer

METHODS = methods_lib.METHODS


@dataclasses.dataclass
class Problem:
  """A supervised benchmark's data and model shape.

  task: "classification" (train_x/train_y, optional padding masks) or "lm" (train_text, a
  byte array; windows of `seq` bytes are drawn from it). test_x/test_y: the fixed test set.
  pattern: the prior's dense logits (heads, seq, seq); mask: how the model stores the prior;
  model_kwargs: the Transformer arguments the data fixes (vocabulary, pooling, head, ...);
  sample: an input for `model.init`; probe: the inputs persistence is measured on;
  info: what results.json records about the dataset.
  """
  kind: str
  name: str
  task: str
  causal: bool
  seq: int
  test_x: np.ndarray
  test_y: np.ndarray
  pattern: np.ndarray
  mask: MaskSettings
  model_kwargs: dict
  sample: Any
  info: dict
  probe_size: int
  train_x: np.ndarray | None = None
  train_y: np.ndarray | None = None
  train_mask: np.ndarray | None = None
  test_mask: np.ndarray | None = None
  train_text: np.ndarray | None = None

  @property
  def probe(self) -> np.ndarray:
    return self.test_x[:self.probe_size]

  @property
  def target_attn(self) -> np.ndarray:
    return np.asarray(target_attention(self.pattern, causal=self.causal))


def dense_pattern(init, shape) -> np.ndarray:
  """A prior initializer's values as a dense array of `shape`."""
  return np.asarray(init(jax.random.key(0), shape, jnp.float32))


def validate_common(cfg: ml_collections.ConfigDict, choices: dict, positive: list) -> None:
  from maskprior_jax.bench.config import check
  check(cfg, choices={"prior.mode": ("learned", "frozen"), "train.optimizer": ("adam", "adamw", "sgd"),
                      "model.pos_embedding": ("learned", "sinusoidal", "none"), **choices},
        positive=["model.dim", "model.depth", "model.num_heads", "model.head_dim", "model.mlp_dim", "train.steps",
                  "train.batch_size", "train.learning_rate", "eval.every_steps", "eval.probe_size", *positive])


def build_model(pb: Problem, cfg, method: str) -> Transformer:
  m = cfg.model
  return Transformer(dim=m.dim, depth=m.depth, num_heads=m.num_heads, head_dim=m.head_dim, mlp_dim=m.mlp_dim,
                     pos_embedding=m.pos_embedding, mask=pb.mask if method == "mask" else None,
                     attention_implementation=m.get("attention"), **pb.model_kwargs)


# ----------------------------------------------------------------------------- run
def _apply(model, v, x, mask=None):
  if mask is not None:
    return model.apply(v, x, padding_mask=mask)
  return model.apply(v, x)


def _loss_and_metric(logits, y):
  """Mean cross-entropy (nats) and accuracy (classification) for a batch."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return ce, (jnp.argmax(logits, -1) == y).mean()


def run(cfg: ml_collections.ConfigDict, pb: Problem, methods: Sequence[str], seeds: Sequence[int],
        workdir: pathlib.Path, log=print) -> dict:
  """Train and evaluate every method on `pb` for every seed; results in `workdir`."""
  kind = pb.kind
  workdir = pathlib.Path(workdir)
  results_path = workdir / "results.json"
  results = results_lib.open_results(workdir, cfg, config_digest({"cfg": cfg.to_dict(), "kind": kind}), kind, pb.info)
  bs, L = cfg.train.batch_size, pb.seq
  is_lm = pb.task == "lm"

  def batch_fn(step, seeds_, part=(0, 1)):   # part: (i, n), share i of n of the rows (see train_seeds)
    out = []
    for s in seeds_:
      rng = np.random.default_rng([s, step])
      if is_lm:
        starts = take_part(rng.integers(0, len(pb.train_text) - L - 1, bs), part)
        idx = starts[:, None] + np.arange(L + 1)[None]
        win = pb.train_text[idx]
        out.append({"x": win[:, :-1], "y": win[:, 1:]})
      else:
        idx = take_part(rng.integers(0, len(pb.train_x), bs), part)
        b = {"x": pb.train_x[idx], "y": pb.train_y[idx]}
        if pb.train_mask is not None:
          b["mask"] = pb.train_mask[idx]
        out.append(b)
    return train.stack_trees(out) if len(out) > 1 else jax.tree.map(lambda a: a[None], out[0])

  n_ev = cfg.eval.eval_windows if is_lm else len(pb.test_x)
  ev_x, ev_y = pb.test_x[:n_ev], pb.test_y[:n_ev]
  ev_mask = None if pb.test_mask is None else pb.test_mask[:n_ev]

  progress = results_lib.RunProgress(len(methods), label=pb.name)
  for method in methods:
    todo = results_lib.seeds_to_run(results, method, seeds)
    if not todo:
      progress.skip()
      log(f"[{pb.name}] {method}: seeds {list(seeds)} already in {results_path}, skipped")
      continue
    t_method = results_lib.Timer()
    model = build_model(pb, cfg, method)

    def loss_fn(v, batch, rng):
      del rng
      ce, acc = _loss_and_metric(_apply(model, v, batch["x"], batch.get("mask")), batch["y"])
      return ce, {"accuracy": acc}

    def metrics_fn(v, data):
      del data
      ce, acc = _loss_and_metric(_apply(model, v, ev_x, ev_mask), ev_y)
      return {"test_loss": ce, **({"test_bits_per_char": ce / np.log(2)} if is_lm else {"test_accuracy": acc})}

    state, history, infos, _ = methods_lib.train_method(
        method=method, model=model, tx=methods_lib.make_tx(cfg), cfg=cfg, seeds=todo, sample_input=pb.sample,
        probe_input=pb.probe, target_attn=pb.target_attn, loss_fn=loss_fn, batch_fn=batch_fn,
        metrics_fn=metrics_fn, label=f"{pb.name}/{method}", checkpoint_dir=workdir / "checkpoints" / method / results_lib.seeds_dir(todo),
        tensorboard_dir=workdir / "tensorboard" / method / results_lib.seeds_dir(todo))
    final = _final_eval(model, pb, state.variables)
    for i, s in enumerate(todo):
      metrics = {k: float(v[i]) for k, v in final.items()}
      results["runs"].append(methods_lib.run_record(method, s, i, state, history, infos, metrics).to_json())
    results_lib.record_method(results, method, history, t_method(), workdir, run_labels=todo)
    key = headline_key(results)
    log(f"[{pb.name}] {method}: {key} "
        f"{results_lib.mean_std([r[key] for r in results['runs'] if r['method'] == method])} ({t_method():.0f}s)")
    progress.done()
  write_report(results, workdir)
  return results


def _final_eval(model, pb, stacked, chunk: int = 512) -> dict:
  """Per seed, on the whole (capped) test set: accuracy, or bits per char and perplexity."""
  is_lm = pb.task == "lm"
  mask = pb.test_mask

  @jax.jit
  def sums(v, x, y, m):
    logits = _apply(model, v, x, m)
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
  methods = results_lib.methods_in(results)
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
    rows.append([m, len(vals), results_lib.mean_std(vals), gap])
  what = "test bits per char (byte)" if lower_better else "test accuracy"
  head = f"**{results['benchmark']}: {results['dataset']}**"
  if "unigram_bits_per_char" in results:
    head += f"; unigram entropy of the test text {results['unigram_bits_per_char']:.3f} bits per char"
  out = head + "\n\n" + results_lib.markdown_table(["method", "seeds", what, "against the best baseline"], rows)
  out += "\nPersistence (attention TV from the prior's pattern, start → end, mean over layers and seeds):\n\n"
  out += results_lib.persistence_table(results)
  return out


def write_report(results: dict, workdir: pathlib.Path) -> None:
  if not results_lib.is_main_process():   # process 0 writes the report
    return
  workdir = pathlib.Path(workdir)
  (workdir / "table.md").write_text(table(results))
  curves = results["curves"]
  if not curves:
    return
  key = headline_key(results)
  ref = {"unigram": results["unigram_bits_per_char"]} if "unigram_bits_per_char" in results else None
  results_lib.plot_curves(workdir / "test_curve.png", results_lib.metric_curves(curves, key),
                         title=f"{results['dataset']}: {key.replace('_', ' ')} (eval subset)", ylabel=key, hlines=ref)
  results_lib.plot_curves(workdir / "persistence.png", results_lib.metric_curves(curves, "attn_tv"),
                         title=f"{results['dataset']}: attention distance from the prior's pattern",
                         ylabel="mean TV distance (layers)")
