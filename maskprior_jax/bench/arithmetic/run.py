"""The low-data arithmetic benchmark: for each method, train one causal decoder per
(training-set size, seed) in one vmapped program, then measure test exact match, digit
accuracy, steps to 99% train exact match, and persistence of the prior.

Writes into `workdir`: config.json, metrics.jsonl, results.json, table.md, PNG plots,
checkpoints/. Each method's results are written as soon as it finishes; rerunning the same
command skips finished methods and resumes an interrupted one from its checkpoint.
"""
from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maskprior_jax import priors
from maskprior_jax.attention import MaskSettings
from maskprior_jax.bench import methods as methods_lib
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench.arithmetic import tasks as arithmetic
from maskprior_jax.bench.config import ConfigError, check, config_digest
from maskprior_jax.distributed import take_part
from maskprior_jax.measure import target_attention
from maskprior_jax.models import Transformer

# The shared four, and position coupling (Cho et al., 2024) alone and with the mask prior.
METHODS = methods_lib.METHODS + ("coupling", "mask_coupling")


def task_from_config(cfg) -> arithmetic.ArithmeticTask:
  t = cfg.task
  try:
    return arithmetic.ArithmeticTask(t.name, t.digits, t.modulus, t.reverse)
  except arithmetic.DataError as e:
    raise ConfigError(str(e)) from None


def validate(cfg: ml_collections.ConfigDict) -> None:
  check(cfg, choices={"task.name": arithmetic.TASKS, "prior.mode": ("learned", "frozen"),
                      "prior.kind": ("window", "carry"),
                      "train.optimizer": ("adam", "adamw", "sgd"),
                      "model.pos_embedding": ("learned", "sinusoidal", "none")},
        positive=["model.dim", "model.depth", "model.num_heads", "model.head_dim", "model.mlp_dim",
                  "train.steps", "train.batch_size", "train.learning_rate", "eval.every_steps",
                  "eval.train_eval_size", "eval.probe_size", "task.test_size"])
  task = task_from_config(cfg)
  sizes = cfg.task.train_sizes
  if not sizes or any(not isinstance(s, int) or s <= 0 for s in sizes):
    raise ConfigError(f"task.train_sizes must be positive integers, got {sizes!r}")
  if max(sizes) + cfg.task.test_size > task.base ** 2:
    raise ConfigError(f"{task.name} has {task.base ** 2} distinct pairs: training size {max(sizes)} "
                      f"plus test size {cfg.task.test_size} do not fit")


def build_model(task: arithmetic.ArithmeticTask, cfg, method: str) -> Transformer:
  m = cfg.model
  mask = None
  if method in ("mask", "mask_coupling"):
    mask = MaskSettings(priors.from_matrix(prior_pattern(task, cfg)))
  coupled = task.coupling_ids() if method in ("coupling", "mask_coupling") else None
  return Transformer(vocab_size=task.vocab_size, dim=m.dim, depth=m.depth, num_heads=m.num_heads,
                     head_dim=m.head_dim, mlp_dim=m.mlp_dim, max_len=task.input_len, causal=True,
                     pos_embedding=m.pos_embedding, pooling="none", head="lm",
                     num_outputs=task.vocab_size, mask=mask, position_ids=coupled,
                     attention_implementation=m.get("attention"))


def prior_pattern(task: arithmetic.ArithmeticTask, cfg) -> np.ndarray:
  """The config's prior (prior.kind "window" or "carry"); structure only, never operand values."""
  p = cfg.prior
  return task.prior_pattern(inside=p.inside, outside=p.outside, kind=p.kind, decay=p.carry_decay)


def greedy_answers(model, variables, inputs: np.ndarray, task) -> jax.Array:
  """Greedy decoding of the answer tokens from the prompt (the answer tokens in `inputs` are
  overwritten step by step); (N, answer_len)."""
  rows = task.answer_rows
  x = jnp.asarray(inputs)
  preds = []
  for k, row in enumerate(rows):
    tok = jnp.argmax(model.apply(variables, x)[:, row], -1).astype(jnp.int32)
    preds.append(tok)
    if k + 1 < len(rows):
      x = x.at[:, row + 1].set(tok)
  return jnp.stack(preds, 1)


def run(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int],
        workdir: pathlib.Path, log=print) -> dict:
  validate(cfg)
  task = task_from_config(cfg)
  workdir = pathlib.Path(workdir)
  sizes = sorted(cfg.task.train_sizes)
  splits = arithmetic.make_splits(task, max(sizes), seeds, test_size=cfg.task.test_size,
                                  data_seed=cfg.task.data_seed)
  test_x, test_y = task.encode(splits.test_a, splits.test_b)
  carries = task.carries(splits.test_a, splits.test_b)   # the mechanism: where do errors fall?
  rows = task.answer_rows
  train_xy = {s: task.encode(splits.train_a[s], splits.train_b[s]) for s in seeds}
  n_eval = min(cfg.eval.train_eval_size, min(sizes))
  probe = test_x[:cfg.eval.probe_size]
  target_attn = target_attention(prior_pattern(task, cfg), causal=True)

  results_path = workdir / "results.json"
  results = results_lib.open_results(workdir, cfg, config_digest({"cfg": cfg.to_dict()}),
                                     "arithmetic", {
      "task": task.name, "digits": task.digits, "modulus": task.modulus,
      "reverse": task.reverse, "train_sizes": sizes, "test_size": len(test_x),
      "test_carries": None if carries is None else np.bincount(carries, minlength=task.digits + 1).tolist(),
      "prior_pattern": prior_pattern(task, cfg).tolist()})
  bs = cfg.train.batch_size

  progress = results_lib.RunProgress(len(methods), label=task.name)
  for method in methods:
    todo = results_lib.seeds_to_run(results, method, seeds)
    if not todo:
      progress.skip()
      log(f"[{task.name}] {method}: seeds {list(seeds)} already in {results_path}, skipped")
      continue
    # One run per (training size, seed); run i trains on the first sizes[i] pairs of its seed.
    runs = [(n, s) for n in sizes for s in todo]
    run_data = {"x": np.stack([train_xy[s][0][:n_eval] for _, s in runs]),
                "y": np.stack([train_xy[s][1][:n_eval] for _, s in runs])}

    def batch_fn(step, run_ids, runs=runs, part=(0, 1)):   # part: share of the rows (see train_seeds)
      xs, ys = [], []
      for r in run_ids:
        n, s = runs[r]
        idx = take_part(np.random.default_rng([s, n, step]).integers(0, n, bs), part)
        xs.append(train_xy[s][0][idx])
        ys.append(train_xy[s][1][idx])
      return {"x": np.stack(xs), "y": np.stack(ys)}

    # The same draw on the device: run r's training pairs padded to the largest size.
    table_x = np.stack([train_xy[s][0][:max(sizes)] for _, s in runs])
    table_y = np.stack([train_xy[s][1][:max(sizes)] for _, s in runs])
    run_n = np.asarray([n for n, _ in runs], np.int32)
    run_seed = np.asarray([s for _, s in runs], np.int32)

    def device_batch_fn(step, r):
      key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(jax.random.key(0), jnp.asarray(run_seed)[r]), jnp.asarray(run_n)[r]), step)
      idx = jax.random.randint(key, (bs,), 0, jnp.asarray(run_n)[r])
      return {"x": jnp.asarray(table_x)[r][idx], "y": jnp.asarray(table_y)[r][idx]}

    t_method = results_lib.Timer()
    model = build_model(task, cfg, method)

    def answer_logits(v, x):
      return model.apply(v, x)[:, rows]                                  # (N, answer_len, vocab)

    def loss_fn(v, batch, rng):
      del rng
      logits = answer_logits(v, batch["x"])
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"][:, rows]).mean(), {}

    def metrics_fn(v, data):
      right_tr = jnp.argmax(answer_logits(v, data["x"]), -1) == data["y"][:, rows]
      logits = answer_logits(v, test_x)
      right = jnp.argmax(logits, -1) == test_y[:, rows]
      return {"train_exact": right_tr.all(-1).mean(), "test_exact": right.all(-1).mean(),
              "test_token_accuracy": right.mean(),
              "test_loss": optax.softmax_cross_entropy_with_integer_labels(logits, test_y[:, rows]).mean()}

    state, history, infos, _ = methods_lib.train_method(
        method=method, model=model, tx=methods_lib.make_tx(cfg), cfg=cfg, seeds=[s for _, s in runs],
        run_ids=list(range(len(runs))), sample_input=jnp.zeros((1, task.input_len), jnp.int32),
        probe_input=probe, target_attn=target_attn, attn_rows=rows, loss_fn=loss_fn, batch_fn=batch_fn,
        metrics_fn=metrics_fn, run_data=run_data, label=f"{task.name}/{method}", device_batch_fn=device_batch_fn,
        checkpoint_dir=workdir / "checkpoints" / method / results_lib.seeds_dir(todo),
        tensorboard_dir=workdir / "tensorboard" / method / results_lib.seeds_dir(todo))

    decode = jax.jit(jax.vmap(lambda v: greedy_answers(model, v, test_x, task)))
    answers = np.asarray(decode(state.variables))                           # (runs, N, answer_len)
    right = answers == test_y[None][:, :, rows]
    for i, (n, s) in enumerate(runs):
      curve = results_lib.per_run(history, i, ["train_exact"])
      reached = [h["step"] for h in curve if h["train_exact"] >= 0.99]
      metrics = {"train_size": int(n), "exact_match": float(right[i].all(-1).mean()),
                 "digit_accuracy": float(right[i].mean()), "steps_to_99_train": reached[0] if reached else None,
                 "final_train_exact": curve[-1]["train_exact"]}
      if carries is not None:   # exact match on the test pairs with c carries, c = 0..digits
        metrics["exact_by_carries"] = [float(right[i].all(-1)[carries == c].mean()) if np.any(carries == c)
                                       else None for c in range(task.digits + 1)]
      results["runs"].append(methods_lib.run_record(method, s, i, state, history, infos, metrics).to_json())
    results_lib.record_method(results, method, history, t_method(), workdir, run_labels=runs)
    done = [r for r in results["runs"] if r["method"] == method]
    log(f"[{task.name}] {method}: test exact match by training size " + ", ".join(
        f"{n}: {results_lib.mean_std([r['exact_match'] for r in done if r['train_size'] == n])}" for n in sizes)
        + f" ({t_method():.0f}s)")
    progress.done()
  write_report(results, workdir)
  return results


def claim_line(results: dict, threshold: float = 0.9) -> str:
  """The paper's low-data claim at the point where it matters: the largest training size where
  vanilla's mean exact match is below `threshold`, and the mask prior's gain there, with each
  other method's."""
  mean = lambda m, n: [r["exact_match"] for r in results["runs"] if r["method"] == m and r["train_size"] == n]
  sizes = [n for n in sorted(results["train_sizes"], reverse=True) if mean("vanilla", n)]
  below = [n for n in sizes if np.mean(mean("vanilla", n)) < threshold]
  if not below or not mean("mask", below[0]):
    return ""
  n, v = below[0], np.mean(mean("vanilla", below[0]))
  gains = ", ".join(f"{m} {100 * (np.mean(mean(m, n)) - v):+.1f}" for m in results_lib.methods_in(results)
                    if m != "vanilla" and mean(m, n))
  return (f"\nLargest training size where vanilla is below {threshold:.0%}: **{n}** (vanilla "
          f"{100 * v:.1f}%); gain over vanilla there, in points: {gains}.\n")


def table(results: dict) -> str:
  methods, sizes = results_lib.methods_in(results), results["train_sizes"]
  pick = lambda m, n, k: [r[k] for r in results["runs"] if r["method"] == m and r["train_size"] == n]
  name = (f"{results['digits']}-digit addition, answer {'reversed' if results['reverse'] else 'in the usual order'}"
          if results["task"] == "add" else f"addition mod {results['modulus']}")
  out = f"**{name}**; test set {results['test_size']} pairs, none in any training set.\n\n"
  out += "Test exact match (mean ± std over seeds):\n\n"
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [results_lib.mean_std(pick(m, n, "exact_match")) for m in methods]
                                    for n in sizes])
  bypick = lambda m, n: [f"{r['exact_match']:.3f}" for r in sorted(results["runs"], key=lambda r: r["seed"])
                         if r["method"] == m and r["train_size"] == n]
  out += "\nPer seed (seeds " + ", ".join(str(s) for s in sorted({r["seed"] for r in results["runs"]})) + "):\n\n"
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [", ".join(bypick(m, n)) or "-" for m in methods] for n in sizes])
  fits = lambda m, n: [f"{r['final_train_exact']:.2f}" for r in sorted(results["runs"], key=lambda r: r["seed"])
                       if r["method"] == m and r["train_size"] == n]
  out += ("\nTraining-set exact match at the end, per seed (below 0.99: the run no longer fits its "
          "training set, e.g. after a loss spike):\n\n")
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [", ".join(fits(m, n)) or "-" for m in methods] for n in sizes])
  out += claim_line(results)
  out += "\nDigit accuracy (greedy decoding):\n\n"
  out += results_lib.markdown_table(["train size"] + methods,
                                   [[n] + [results_lib.mean_std(pick(m, n, "digit_accuracy")) for m in methods]
                                    for n in sizes])

  def steps99(m, n):
    v = pick(m, n, "steps_to_99_train")
    hit = [x for x in v if x is not None]
    return f"{np.mean(hit):.0f} ({len(hit)}/{len(v)})" if hit else f"never (0/{len(v)})"
  out += "\nSteps to 99% train exact match (mean over the seeds that got there; how many did):\n\n"
  out += results_lib.markdown_table(["train size"] + methods, [[n] + [steps99(m, n) for m in methods] for n in sizes])
  if results.get("test_carries") and all("exact_by_carries" in r for r in results["runs"]):
    counts = results["test_carries"]

    def by_carries(m, n):
      rows = np.asarray([r["exact_by_carries"] for r in results["runs"] if r["method"] == m and r["train_size"] == n],
                        dtype=float)
      return " / ".join("-" if np.isnan(v) else f"{v:.2f}" for v in rows.mean(0)) if len(rows) else "-"
    out += ("\nTest exact match by carries in the pair (0 / 1 / ... carries; test pairs with each count: "
            + " / ".join(map(str, counts)) + "), mean over seeds:\n\n")
    out += results_lib.markdown_table(["train size"] + methods, [[n] + [by_carries(m, n) for m in methods] for n in sizes])
  out += "\nPersistence: attention TV from the prior's pattern on the answer rows, start → end (mean over layers and runs):\n\n"
  out += results_lib.persistence_table(results)
  return out


def write_report(results: dict, workdir: pathlib.Path) -> None:
  if not results_lib.is_main_process():   # process 0 writes the report
    return
  workdir = pathlib.Path(workdir)
  (workdir / "table.md").write_text(table(results))
  methods, sizes = results_lib.methods_in(results), results["train_sizes"]
  if not methods:
    return
  fig, ax = results_lib.new_figure((5.5, 3.6))
  for m in methods:
    vals = [[r["exact_match"] for r in results["runs"] if r["method"] == m and r["train_size"] == n] for n in sizes]
    ax.errorbar(sizes, [np.mean(v) for v in vals], yerr=[np.std(v) for v in vals], label=m, capsize=3, marker="o")
  ax.set_xscale("log")
  ax.set_xticks(sizes, [str(n) for n in sizes])
  ax.minorticks_off()
  ax.set(xlabel="training-set size", ylabel="test exact match", ylim=(-0.02, 1.02),
         title=f"{results['task']}: test exact match vs training size")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(workdir / "exact_match_vs_train_size.png", dpi=110)
  curves = results["curves"]
  results_lib.plot_curves(workdir / "persistence.png", results_lib.metric_curves(curves, "attn_tv"),
                         title=f"{results['task']}: attention distance from the prior (answer rows)",
                         ylabel="mean TV distance (layers)")
  results_lib.plot_curves(workdir / "test_exact_curves.png", results_lib.metric_curves(curves, "test_exact"),
                         title=f"{results['task']}: test exact match during training (all sizes)",
                         ylabel="test exact match")
