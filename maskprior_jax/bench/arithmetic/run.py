"""The low-data arithmetic benchmark: for each method, train one causal decoder per
(training-set size, seed) in one vmapped program, then measure test exact match, digit
accuracy, steps to 99% train exact match, and persistence of the prior.

Writes into `workdir`: config.json, metrics.jsonl, results.json, table.md, PNG plots
(`arithmetic.report`), checkpoints/. Each method's results are written as soon as it finishes;
rerunning the same command skips finished methods and resumes an interrupted one from its
checkpoint.
"""
from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from maskprior_jax import measure, priors
from maskprior_jax.attention import MaskSettings
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench import runner
from maskprior_jax.bench.arithmetic import report
from maskprior_jax.bench.arithmetic import tasks as arithmetic
from maskprior_jax.bench.config import ConfigError, UsageError, as_recorded, check, compute_dtype, config_digest, loop_settings
from maskprior_jax.distributed import take_part
from maskprior_jax.measure import target_attention
from maskprior_jax.models import Transformer

# The shared four, and position coupling (Cho et al., 2024) alone and with the mask prior.
# mask_qk: both priors at once (the mask prior plus the QK initialisation, fitted with the prior in place).
METHODS = runner.METHODS + ("coupling", "mask_coupling", "mask_qk")
COUPLED = ("coupling", "mask_coupling")


def task_from_config(cfg) -> arithmetic.ArithmeticTask:
  t = cfg.task
  try:
    return arithmetic.ArithmeticTask(t.name, t.digits, t.modulus, t.reverse)
  except arithmetic.DataError as e:
    raise ConfigError(str(e)) from None


def validate(cfg: ml_collections.ConfigDict) -> None:
  check(cfg, choices={"task.name": arithmetic.TASKS, "prior.kind": ("window", "carry"),
                      "model.pos_embedding": ("learned", "sinusoidal", "none"),
                      "task.coupling": arithmetic.COUPLINGS},
        positive=["model.dim", "model.depth", "model.num_heads", "model.head_dim", "model.mlp_dim",
                  "eval.train_eval_size", "task.test_size"])
  task = task_from_config(cfg)
  sizes = cfg.task.train_sizes
  if not sizes or any(not isinstance(s, int) or s <= 0 for s in sizes):
    raise ConfigError(f"task.train_sizes must be positive integers, got {sizes!r}")
  if cfg.task.val_size < 0:
    raise ConfigError(f"task.val_size must be >= 0, got {cfg.task.val_size}")
  if max(sizes) + cfg.task.test_size + cfg.task.val_size > task.base ** 2:
    raise ConfigError(f"{task.name} has {task.base ** 2} distinct pairs: training size {max(sizes)} "
                      f"plus test size {cfg.task.test_size} and validation size {cfg.task.val_size} do not fit")
  if task.name == "add" and cfg.task.coupling == "published":
    try:
      task.coupling_offsets(cfg.task.coupling_max_position)
    except arithmetic.DataError as e:
      raise ConfigError(f"task.coupling_max_position: {e}") from None


def build_model(task: arithmetic.ArithmeticTask, cfg, method: str) -> Transformer:
  m = cfg.model
  mask = None
  if method in ("mask", "mask_coupling", "mask_qk"):
    mask = MaskSettings(priors.from_matrix(prior_pattern(task, cfg)))
  coupled, max_len = None, task.input_len
  if method in COUPLED:   # the evaluation ids (start 1); training passes offset ids per example
    coupled = task.coupling_ids(cfg.task.coupling)
    if cfg.task.coupling == "published":
      max_len = max(max_len, cfg.task.coupling_max_position + 1)
  return Transformer(vocab_size=task.vocab_size, dim=m.dim, depth=m.depth, num_heads=m.num_heads,
                     head_dim=m.head_dim, mlp_dim=m.mlp_dim, max_len=max_len, causal=True,
                     pos_embedding=m.pos_embedding, pooling="none", head="lm",
                     num_outputs=task.vocab_size, mask=mask, position_ids=coupled,
                     attention_implementation=m.attention, dtype=compute_dtype(cfg))


def prior_pattern(task: arithmetic.ArithmeticTask, cfg) -> np.ndarray:
  """The config's prior (prior.kind "window" or "carry"); structure only, never operand values."""
  p = cfg.prior
  return task.prior_pattern(inside=p.inside, outside=p.outside, kind=p.kind, decay=p.carry_decay)


def select_on_validation(curve: Sequence[dict]) -> dict:
  """The rule every method is scored by: the evaluation step with the highest validation exact
  match (the earliest of ties), and the test and training exact match there (teacher-forced exact
  match equals greedy exact match: an answer is all right under one iff under the other)."""
  best = max(range(len(curve)), key=lambda t: (curve[t]["val_exact"], -t))
  h = curve[best]
  return {"selected_step": int(h["step"]), "selected_val_exact": float(h["val_exact"]),
          "selected_exact": float(h["test_exact"]), "selected_train_exact": float(h["train_exact"])}


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


class Arithmetic(runner.Benchmark):
  """One run per (training size, seed): run i trains on the first sizes[i] pairs of its seed."""
  kind = "arithmetic"

  def __init__(self, cfg: ml_collections.ConfigDict, seeds: Sequence[int]):
    validate(cfg)
    self.cfg, self.settings = cfg, loop_settings(cfg)
    task = self.task = task_from_config(cfg)
    self.name = task.name
    self.sizes = sorted(cfg.task.train_sizes)
    splits = arithmetic.make_splits(task, max(self.sizes), seeds, test_size=cfg.task.test_size,
                                    data_seed=cfg.task.data_seed, val_size=cfg.task.val_size)
    self.test_x, self.test_y = task.encode(splits.test_a, splits.test_b)
    self.val_x, self.val_y = task.encode(splits.val_a, splits.val_b)
    # Published position coupling draws a starting id per training example (Cho et al.).
    self.offsets = (task.coupling_offsets(cfg.task.coupling_max_position)
                    if task.name == "add" and cfg.task.coupling == "published" else 0)
    self.carries = task.carries(splits.test_a, splits.test_b)   # the mechanism: where do errors fall?
    self.rows = task.answer_rows
    self.train_xy = {s: task.encode(splits.train_a[s], splits.train_b[s]) for s in seeds}
    self.n_eval = min(cfg.eval.train_eval_size, min(self.sizes))
    self.probe = runner.Probe(self.test_x[:cfg.eval.probe_size],
                              target_attention(prior_pattern(task, cfg), causal=True), rows=self.rows)
    self.sample_input = jnp.zeros((1, task.input_len), jnp.int32)

  def digest(self) -> str:
    return config_digest({"cfg": self.cfg.to_dict()})

  def header(self) -> dict:
    task, carries = self.task, self.carries
    return {"task": task.name, "digits": task.digits, "modulus": task.modulus, "reverse": task.reverse,
            "train_sizes": self.sizes, "test_size": len(self.test_x),
            "test_carries": None if carries is None else np.bincount(carries, minlength=task.digits + 1).tolist(),
            "prior_pattern": prior_pattern(task, self.cfg).tolist()}

  def runs(self, seeds):
    return [runner.Run(seed=s, key=i, label=(n, s)) for i, (n, s) in enumerate((n, s) for n in self.sizes for s in seeds)]

  def model(self, method: str):
    return build_model(self.task, self.cfg, method)

  def init_method(self, method: str) -> str:
    return "qk" if method == "mask_qk" else method

  def eval_data(self, runs):
    return {"x": np.stack([self.train_xy[r.seed][0][:self.n_eval] for r in runs]),
            "y": np.stack([self.train_xy[r.seed][1][:self.n_eval] for r in runs])}

  def host_batches(self, runs):
    bs, train_xy, sizes = self.settings.batch_size, self.train_xy, [r.label for r in runs]
    task, offsets = self.task, self.offsets

    def batch_fn(step, run_ids, part=(0, 1)):   # part: share of the rows (see train_seeds)
      xs, ys, pos = [], [], []
      for r in run_ids:
        n, s = sizes[r]
        idx = take_part(np.random.default_rng([s, n, step]).integers(0, n, bs), part)
        xs.append(train_xy[s][0][idx])
        ys.append(train_xy[s][1][idx])
        if offsets:   # its own stream: the pairs drawn are those without coupling
          pos.append(take_part(task.coupled_positions(np.random.default_rng([s, n, step, 1]).integers(
              1, offsets + 1, bs)), part))
      batch = {"x": np.stack(xs), "y": np.stack(ys)}
      return {**batch, "pos": np.stack(pos)} if offsets else batch
    return batch_fn

  def device_batches(self, runs):
    # The same draw on the device: run r's training pairs padded to the largest size.
    bs, biggest = self.settings.batch_size, max(self.sizes)
    table_x = np.stack([self.train_xy[r.seed][0][:biggest] for r in runs])
    table_y = np.stack([self.train_xy[r.seed][1][:biggest] for r in runs])
    run_n = np.asarray([r.label[0] for r in runs], np.int32)
    run_seed = np.asarray([r.seed for r in runs], np.int32)
    offsets, base = self.offsets, jnp.asarray(self.task.coupled_positions(np.ones(1))[0])

    def device_batch_fn(step, r):
      key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(jax.random.key(0), jnp.asarray(run_seed)[r]),
                                                  jnp.asarray(run_n)[r]), step)
      idx = jax.random.randint(key, (bs,), 0, jnp.asarray(run_n)[r])
      batch = {"x": jnp.asarray(table_x)[r][idx], "y": jnp.asarray(table_y)[r][idx]}
      if offsets:
        starts = jax.random.randint(jax.random.fold_in(key, 1), (bs,), 1, offsets + 1)
        batch["pos"] = (base[None] + starts[:, None] - 1).astype(jnp.int32)
      return batch
    return device_batch_fn

  def loss_fn(self, model):
    rows = self.rows
    offset = bool(self.offsets) and model.position_ids is not None   # published coupling: ids per example

    def loss_fn(v, batch, rng):
      del rng
      logits = model.apply(v, batch["x"], position_ids=batch["pos"] if offset else None)[:, rows]
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"][:, rows]).mean(), {}
    return loss_fn

  def eval_metrics(self, model):
    rows, test_x, test_y, val_x, val_y = self.rows, self.test_x, self.test_y, self.val_x, self.val_y

    def metrics_fn(v, data):
      apply = lambda x: measure.apply_in_chunks(lambda c: model.apply(v, c)[:, rows], x)
      right_tr = jnp.argmax(apply(data["x"]), -1) == data["y"][:, rows]
      logits = apply(test_x)
      right = jnp.argmax(logits, -1) == test_y[:, rows]
      out = {"train_exact": right_tr.all(-1).mean(), "test_exact": right.all(-1).mean(),
             "test_token_accuracy": right.mean(),
             "test_loss": optax.softmax_cross_entropy_with_integer_labels(logits, test_y[:, rows]).mean()}
      if len(val_x):
        out["val_exact"] = (jnp.argmax(apply(val_x), -1) == val_y[:, rows]).all(-1).mean()
      return out
    return metrics_fn

  def final_metrics(self, model, variables, runs, history):
    decode = jax.jit(jax.vmap(lambda v: greedy_answers(model, v, self.test_x, self.task)))
    answers = np.asarray(decode(variables))                           # (runs, N, answer_len)
    right = answers == self.test_y[None][:, :, self.rows]
    carries, out = self.carries, []
    for i, r in enumerate(runs):
      n = r.label[0]
      keys = ["train_exact", "test_exact"] + (["val_exact"] if len(self.val_x) else [])
      curve = results_lib.per_run(history, i, keys)
      reached = [h["step"] for h in curve if h["train_exact"] >= 0.99]
      metrics = {"train_size": int(n), "exact_match": float(right[i].all(-1).mean()),
                 "digit_accuracy": float(right[i].mean()), "steps_to_99_train": reached[0] if reached else None,
                 "final_train_exact": curve[-1]["train_exact"]}
      if len(self.val_x):
        metrics.update(select_on_validation(curve))
      if carries is not None:   # exact match on the test pairs with c carries, c = 0..digits
        metrics["exact_by_carries"] = [float(right[i].all(-1)[carries == c].mean()) if np.any(carries == c)
                                       else None for c in range(self.task.digits + 1)]
      out.append(metrics)
    return out

  def summary(self, results, method, runs):
    done = [r for r in results["runs"] if r["method"] == method]
    return "test exact match by training size " + ", ".join(
        f"{n}: {results_lib.mean_std([r['exact_match'] for r in done if r['train_size'] == n])}" for n in self.sizes)

  def write_report(self, results, workdir):
    report.write_report(results, workdir)


def run(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int],
        workdir: pathlib.Path, log=print) -> dict:
  return runner.run(Arithmetic(cfg, seeds), methods, seeds, workdir, log=log)


def add_arguments(p) -> None:
  p.add_argument("--task", choices=("add", "modadd"), help="default: the config's (add)")
  p.add_argument("--digits", type=int, help="operand digits for add (default: the config's, 3)")
  p.add_argument("--train-sizes", help="comma-separated training-set sizes (default: the config's, 500)")


def _sizes(text: str) -> tuple[int, ...]:
  try:
    sizes = tuple(int(t) for t in text.split(",") if t.strip())
  except ValueError:
    raise UsageError(f"--train-sizes must be comma-separated integers, not {text!r}") from None
  if not sizes or min(sizes) <= 0:
    raise UsageError(f"--train-sizes must be positive integers, not {text!r}")
  return sizes


def prepare(args, cfg, methods) -> tuple[dict, None]:
  """`maskprior arithmetic`'s flags applied to the config, and every check."""
  with cfg.unlocked():
    if args.task:
      cfg.task.name = args.task
    if args.digits is not None:
      cfg.task.digits = args.digits
    if args.train_sizes:
      cfg.task.train_sizes = _sizes(args.train_sizes)
  validate(cfg)
  if cfg.task.name != "add" and {"coupling", "mask_coupling"} & set(methods):
    raise UsageError("position coupling (methods coupling, mask_coupling) is defined for --task add only")
  return {"command": "arithmetic", "config": as_recorded(cfg)}, None


def run_command(cfg, context, methods, seeds, workdir) -> str:
  del context
  return report.table(run(cfg, methods, seeds, workdir))


COMMAND = runner.Command(name="arithmetic", help="low-data arithmetic benchmark (addition, modular addition)",
                         methods=METHODS, default_methods=METHODS[:-1], default_seeds="0-4",
                         benchmarks=lambda cfg, context, seeds: [(cfg.task.name, Arithmetic(cfg, seeds))],
                         add_arguments=add_arguments, prepare=prepare, run=run_command)
