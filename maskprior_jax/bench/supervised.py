"""What the vision and language benchmarks share: a `Problem` (a dataset as arrays, the
model's shape, the prior), its `runner.Benchmark`, the final evaluation and the command.
`bench.vision` and `bench.language` each build a Problem from their config.

The question both ask: does a locality mask prior stay competitive where the task's
structure is only "nearby things interact"? Methods vanilla / mimetic / qk / mask share the
model and budget; `qk` fits the query/key weights so that the initial attention matches the
same pattern the mask starts from.

Writes into `workdir`: config.json, metrics.jsonl, results.json, table.md, PNG plots
(`supervised_report`), checkpoints/; finished methods are skipped when the same command is rerun.
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

from maskprior_jax import measure, train
from maskprior_jax.attention import MaskSettings
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench import data as data_lib
from maskprior_jax.bench import runner
from maskprior_jax.bench import supervised_report as report
from maskprior_jax.bench.config import as_recorded, compute_dtype, config_digest, loop_settings
from maskprior_jax.distributed import take_part
from maskprior_jax.measure import target_attention
from maskprior_jax.models import Transformer

METHODS = runner.METHODS
# Controls (run with --methods): bias_zero, the mask model's learnable bias initialised at zero (the
# bias without the prior); alibi (language), the prior's ALiBi slopes as a fixed bias (frozen).
CONTROLS = {"vision": ("bias_zero",), "language": ("bias_zero", "alibi")}


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
  check(cfg, choices={"model.pos_embedding": ("learned", "sinusoidal", "none"), **choices},
        positive=["model.dim", "model.depth", "model.num_heads", "model.head_dim", "model.mlp_dim", *positive])


def build_model(pb: Problem, cfg, method: str) -> Transformer:
  m = cfg.model
  mask = None
  if method in ("mask", "alibi"):
    mask = pb.mask
  elif method == "bias_zero":
    mask = dataclasses.replace(pb.mask, init=jax.nn.initializers.zeros)
  return Transformer(dim=m.dim, depth=m.depth, num_heads=m.num_heads, head_dim=m.head_dim, mlp_dim=m.mlp_dim,
                     pos_embedding=m.pos_embedding, mask=mask,
                     attention_implementation=m.attention, dtype=compute_dtype(cfg), **pb.model_kwargs)


def _apply(model, v, x, mask=None):
  if mask is not None:
    return model.apply(v, x, padding_mask=mask)
  return model.apply(v, x)


def _loss_and_metric(logits, y):
  """Mean cross-entropy (nats) and accuracy (classification) for a batch."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return ce, (jnp.argmax(logits, -1) == y).mean()


class Supervised(runner.Benchmark):
  """Vision or language on a `Problem`: classification or next-byte prediction, scored on the
  whole (capped) test set at the end."""

  def __init__(self, cfg: ml_collections.ConfigDict, pb: Problem):
    self.cfg, self.pb, self.kind, self.name = cfg, pb, pb.kind, pb.name
    self.settings = loop_settings(cfg)
    self.sample_input = pb.sample
    self.probe = runner.Probe(pb.probe, pb.target_attn)
    self.is_lm = pb.task == "lm"
    n_ev = cfg.eval.eval_windows if self.is_lm else len(pb.test_x)
    self.ev = (pb.test_x[:n_ev], pb.test_y[:n_ev], None if pb.test_mask is None else pb.test_mask[:n_ev])

  def digest(self) -> str:
    return config_digest({"cfg": self.cfg.to_dict(), "kind": self.kind})

  def header(self) -> dict:
    return self.pb.info

  def model(self, method: str):
    return build_model(self.pb, self.cfg, method)

  def settings_for(self, method: str):
    return dataclasses.replace(self.settings, freeze_mask=True) if method == "alibi" else self.settings

  def loss_fn(self, model):
    def loss_fn(v, batch, rng):
      del rng
      ce, acc = _loss_and_metric(_apply(model, v, batch["x"], batch.get("mask")), batch["y"])
      return ce, {"accuracy": acc}
    return loss_fn

  def host_batches(self, runs):
    pb, bs, L, is_lm = self.pb, self.settings.batch_size, self.pb.seq, self.is_lm

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
    return batch_fn

  def device_data(self):
    """Device batches by default only for the embedded datasets (a few MB): a TFDS dataset is read per
    process and can be larger than a device."""
    return self.pb.name in data_lib.EMBEDDED_VISION + data_lib.EMBEDDED_TEXT

  def device_batches(self, runs):
    """The same kind of draw inside the compiled step (train.batches=device): the training set
    (images, or the text) is held on the device once and each step's rows are drawn with a key
    folded from the run's seed and the step, so a resumed run sees the batches it would have seen.
    A different stream from the host batches (numpy's generator): a different run."""
    pb, bs, L, is_lm = self.pb, self.settings.batch_size, self.pb.seq, self.is_lm
    run_seeds = np.asarray([r.seed for r in runs], np.int32)
    if is_lm:
      text = np.asarray(pb.train_text)
    else:
      xs, ys = np.asarray(pb.train_x), np.asarray(pb.train_y)
      masks = None if pb.train_mask is None else np.asarray(pb.train_mask)

    def device_batch_fn(step, run):
      key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), jnp.asarray(run_seeds)[run]), step)
      if is_lm:
        starts = jax.random.randint(key, (bs,), 0, len(text) - L - 1)
        win = jnp.asarray(text)[starts[:, None] + jnp.arange(L + 1)[None]]
        return {"x": win[:, :-1], "y": win[:, 1:]}
      idx = jax.random.randint(key, (bs,), 0, len(xs))
      batch = {"x": jnp.asarray(xs)[idx], "y": jnp.asarray(ys)[idx]}
      if masks is not None:
        batch["mask"] = jnp.asarray(masks)[idx]
      return batch
    return device_batch_fn

  def eval_metrics(self, model):
    ev_x, ev_y, ev_mask = self.ev
    is_lm = self.is_lm

    def metrics_fn(v, data):
      del data
      if ev_mask is None:
        logits = measure.apply_in_chunks(lambda x: _apply(model, v, x), ev_x)
      else:
        logits = measure.apply_in_chunks(lambda x, m: _apply(model, v, x, m), ev_x, ev_mask)
      ce, acc = _loss_and_metric(logits, ev_y)
      return {"test_loss": ce, **({"test_bits_per_char": ce / np.log(2)} if is_lm else {"test_accuracy": acc})}
    return metrics_fn

  def final_metrics(self, model, variables, runs, history):
    del history
    final = _final_eval(model, self.pb, variables)
    return [{k: float(v[i]) for k, v in final.items()} for i in range(len(runs))]

  def summary(self, results, method, runs):
    key = report.headline_key(results)
    return f"{key} {results_lib.mean_std([r[key] for r in results['runs'] if r['method'] == method])}"

  def write_report(self, results, workdir):
    report.write_report(results, workdir)


def run(cfg: ml_collections.ConfigDict, pb: Problem, methods: Sequence[str], seeds: Sequence[int],
        workdir: pathlib.Path, log=print) -> dict:
  """Train and evaluate every method on `pb` for every seed; results in `workdir`."""
  return runner.run(Supervised(cfg, pb), methods, seeds, workdir, log=log)


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


def entry_points(kind: str, help: str, dataset_help: str, load_problem, validate):
  """What `bench.vision` and `bench.language` export: `run(cfg, methods, seeds, workdir, log=print)`
  (validate, load the config's Problem, run) and `COMMAND`, the `maskprior KIND` subcommand
  (--dataset and --data-dir over the config, the data loaded and found before anything is written)."""
  def run_from_config(cfg, methods, seeds, workdir, log=print) -> dict:
    validate(cfg)
    return run(cfg, load_problem(cfg, jax.process_index(), jax.process_count()), methods, seeds, workdir, log=log)

  def add_arguments(p) -> None:
    p.add_argument("--dataset", help=dataset_help)
    p.add_argument("--data-dir", dest="data_dir", help="TFDS data_dir holding the prepared dataset (array_record; "
                   "default: the config's data.data_dir, else ~/tensorflow_datasets)")

  def prepare(args, cfg, methods):
    del methods
    with cfg.unlocked():
      if args.dataset:
        cfg.data.dataset = args.dataset
      if args.data_dir:
        cfg.data.data_dir = args.data_dir
    validate(cfg)
    problem = load_problem(cfg, jax.process_index(), jax.process_count())   # data found before any write
    return {"command": kind, "config": as_recorded(cfg)}, problem

  def run_command(cfg, problem, methods, seeds, workdir) -> str:
    return report.table(run(cfg, problem, methods, seeds, workdir))
  command = runner.Command(name=kind, help=help, methods=METHODS + CONTROLS[kind], default_methods=METHODS,
                           benchmarks=lambda cfg, problem, seeds: [(cfg.data.dataset, Supervised(cfg, problem))],
                           add_arguments=add_arguments, prepare=prepare, run=run_command)
  return run_from_config, command
