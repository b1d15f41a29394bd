"""The Boolean extrapolation benchmark: train vanilla / mimetic / qk / mask models (and the
attribution controls of `boolean.methods`) on the seen domain of a GOTU task, then measure
extrapolation, degree profiles and persistence.

Writes into `workdir`: config.json, metrics.jsonl, results.json, table.md and PNG plots
(`boolean.report`). Each method's results are written as soon as it finishes; rerunning the
same command with the same workdir skips finished methods.
"""
from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from maskprior_jax.bench import console
from maskprior_jax import measure, priors, train
from maskprior_jax.attention import MASK_PRIOR, MaskSettings
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench import workdir as workdir_lib
from maskprior_jax.bench import runner
from maskprior_jax.bench.boolean import algebra, designs, mechanism, methods as boolean_methods, report
from maskprior_jax.bench.boolean import data as boolean_data
from maskprior_jax.bench.boolean import tasks as boolean
from maskprior_jax.bench.config import (ConfigError, UsageError, as_recorded, check, compute_dtype, config_digest,
                                        loop_settings)
from maskprior_jax.distributed import is_main_process, take_part
from maskprior_jax.measure import target_attention
from maskprior_jax.models import Transformer

METHODS = boolean_methods.METHODS


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Every value the benchmark reads, checked before any work starts (ConfigError names it)."""
  check(cfg, choices={"model.pos_embedding": ("learned", "sinusoidal", "none"), "model.pos_where": ("input", "qk"),
                      "prior.pos_embedding": ("model", "learned", "sinusoidal", "none"),
                      "prior.layers": ("all", "first", "layered"),
                      "prior.token_rows": ("group", "self", "noself"), "prior.spare_heads": ("cycle", "union")},
        positive=["model.dim", "model.depth", "model.num_heads", "model.head_dim", "model.mlp_dim",
                  "eval.num_points", "eval.fit_threshold"])
  learning_rate(cfg, "")
  task_sizes(cfg)
  if not isinstance(cfg.qk.fit_inputs, int) or cfg.qk.fit_inputs < 0:
    raise ConfigError(f"qk.fit_inputs must be 0 (the evaluation's probe) or a number of inputs, not {cfg.qk.fit_inputs!r}")
  if not 0.0 <= cfg.prior.corruption <= 1.0:
    raise ConfigError(f"prior.corruption must be in [0, 1], not {cfg.prior.corruption}")
  if cfg.prior.corruption and cfg.prior.layers == "layered":
    raise ConfigError("prior.corruption needs prior.layers 'all' or 'first' (one pattern for every layer)")


def _by_task(cfg, key: str, cast) -> dict:
  """Parse a "task=value,task=value" config string (train.learning_rate_by_task, task.n_by_task)."""
  section, name = key.split(".")
  out = {}
  for item in filter(None, (i.strip() for i in cfg[section][name].split(","))):
    task, sep, value = item.partition("=")
    task = boolean.ALIASES.get(task.strip(), task.strip())
    try:
      if not sep or task not in boolean.TASKS:
        raise ValueError
      out[task] = cast(value)
    except ValueError:
      raise ConfigError(f"{key}: bad entry {item!r}; use task=value,task=value with tasks "
                        f"from {', '.join(boolean.TASKS)}") from None
  return out


def task_sizes(cfg) -> dict:
  """task.n_by_task: the dimension n of a built-in task where the config changes it."""
  sizes = _by_task(cfg, "task.n_by_task", int)
  for name, n in sizes.items():
    try:
      boolean.resized(boolean.TASKS[name], n)
    except boolean.TaskSpecError as e:
      raise ConfigError(f"task.n_by_task: {e}") from None
  return sizes


def headline_tasks(cfg) -> dict:
  """The five GOTU tasks at the config's sizes."""
  sizes = task_sizes(cfg)
  return {name: boolean.resized(t, sizes[name]) if name in sizes else t for name, t in boolean.TASKS.items()}


def prior_pattern(task: boolean.Task, cfg: ml_collections.ConfigDict, layer: int = 0,
                  groups: Sequence[Sequence[int]] | None = None) -> np.ndarray:
  """(heads, n+1, n+1) logit bias from the task's interaction groups; token 0 is CLS.

  prior.token_rows: "group" (a variable token attends inside its groups, itself included),
  "noself" (to the other members of its groups, not itself), "self" (only itself).
  prior.layers="layered": layer 0 holds the token rows only (CLS attends to itself), later layers
  the CLS rows only (variable tokens attend to themselves). `groups`: other supports than the
  task's (mask_shuffled)."""
  groups = [[i + 1 for i in g] for g in (task.groups if groups is None else groups)]
  rows = cfg.prior.token_rows
  layered = cfg.prior.layers == "layered"
  return priors.group_matrix(groups, task.n + 1, num_heads=cfg.model.num_heads if cfg.prior.per_head else None,
                             inside=cfg.prior.inside, outside=cfg.prior.outside,
                             readers=[] if layered and layer == 0 else [0],
                             member_rows=rows != "self" and not (layered and layer > 0),
                             member_self=rows != "noself", spare_heads=cfg.prior.spare_heads)


def method_pattern(task: boolean.Task, cfg: ml_collections.ConfigDict, method: str, layer: int = 0) -> np.ndarray:
  """The initial bias of a bias method (`boolean_methods.BIAS_METHODS`): the prior's pattern from
  the task's supports, from shuffled supports (mask_shuffled), or zeros (bias_zero)."""
  groups = (boolean_methods.shuffled_groups(task.groups, task.n, cfg.prior.shuffle_seed)
            if method == "mask_shuffled" else None)
  pattern = prior_pattern(task, cfg, layer, groups)
  return np.zeros_like(pattern) if method == "bias_zero" else pattern


def design_pattern(task: boolean.Task, cfg: ml_collections.ConfigDict, design: str) -> np.ndarray:
  """A reader design's initial bias: the mask prior's token rows among the variables, readers'
  rows open on their supports (`designs.reader_pattern`)."""
  return designs.reader_pattern(prior_pattern(task, cfg)[:, 1:, 1:], task.groups, design, cfg.prior.outside)


def build_model(task: boolean.Task, cfg: ml_collections.ConfigDict, method: str):
  m = cfg.model
  design = boolean_methods.design_of(method)
  if design is not None:
    return designs.ReaderModel(n=task.n, supports=task.groups, design=design, pattern=design_pattern(task, cfg, design),
                               dim=m.dim, depth=m.depth, num_heads=m.num_heads, head_dim=m.head_dim,
                               mlp_dim=m.mlp_dim, attention_implementation=m.attention,
                               dtype=compute_dtype(cfg))
  mask = None
  if method in boolean_methods.BIAS_METHODS:
    mask = MaskSettings(priors.from_matrix(method_pattern(task, cfg, method)))
    if cfg.prior.layers == "first":
      mask = [mask] + [None] * (cfg.model.depth - 1)
    elif cfg.prior.layers == "layered":
      mask = [MaskSettings(priors.from_matrix(method_pattern(task, cfg, method, layer)))
              for layer in range(cfg.model.depth)]
  # The mask method may drop positions (prior.pos_embedding): its prior tells variables apart by
  # itself. The other methods keep model.pos_embedding; without positions they could not. The
  # controls mask_shuffled, bias_zero and qk_nopos take the mask's setting, mask_positions the model's.
  pos = (cfg.prior.pos_embedding if method in boolean_methods.MASK_POSITIONS and cfg.prior.pos_embedding != "model"
         else m.pos_embedding)
  return Transformer(vocab_size=2, dim=m.dim, depth=m.depth, num_heads=m.num_heads, head_dim=m.head_dim,
                     mlp_dim=m.mlp_dim, max_len=task.n, pos_embedding=pos,
                     pos_where=m.pos_where, pooling="cls", head="regression", mask=mask,
                     attention_implementation=m.attention, dtype=compute_dtype(cfg))


def seen_rows(n: int, count: int) -> int:
  """The rows a task's seen domain is padded to on the device: the cube's 2^n up to n = 20 (every
  task of one n has one shape, so one training program), else the next power of two."""
  return 1 << n if n <= 20 else 1 << max(count - 1, 0).bit_length()


def to_ids(x: np.ndarray) -> np.ndarray:
  """{-1,+1} bits -> token ids {0, 1}."""
  return (np.asarray(x) > 0).astype(np.int32)


# The qk fit's own generator: its inputs depend on the run's seed (and a draw index) only.
QK_STREAM = 0x716B


def qk_fit_points(n: int, size: int, seed: int, draw: int = 0) -> np.ndarray:
  """`size` points of the cube {-1, +1}^n (uniform, with replacement) that the qk method's run of
  `seed` is fitted on (`qk.fit_inputs`): drawn from a generator keyed by the seed, QK_STREAM and
  `draw` alone, so that no evaluation setting moves them. Returns int8 (size, n)."""
  rng = np.random.default_rng([seed, QK_STREAM, draw])
  return (1 - 2 * rng.integers(0, 2, (size, n))).astype(np.int8)


def learning_rate(cfg, task_name: str) -> float:
  """train.learning_rate, unless train.learning_rate_by_task ("task=lr,task=lr") names the task."""
  return _by_task(cfg, "train.learning_rate_by_task", float).get(task_name, cfg.train.learning_rate)


def _relevant_profile(task: boolean.Task, g) -> list[float]:
  """Degree profile of g over the relevant variables' cube (g reads only those)."""
  _, full = boolean_data.relevant_points(task)
  return algebra.degree_profile(algebra.walsh_coefficients(g(full))).tolist()


def _predict(model, stacked, ids, chunk=8192):
  fn = jax.jit(jax.vmap(lambda v, x: model.apply(v, x), in_axes=(0, None)))
  return np.concatenate([np.asarray(fn(stacked, ids[i:i + chunk])) for i in range(0, len(ids), chunk)], 1)


class BooleanTask(runner.Benchmark):
  """One GOTU task: training on the seen domain, evaluation on the whole cube (or a sample),
  the MDI and the structure-only references, for `runner.run`."""
  kind = "boolean"

  def __init__(self, task: boolean.Task, cfg: ml_collections.ConfigDict):
    validate(cfg)
    self.task, self.cfg, self.name = task, cfg, task.name
    self.settings = loop_settings(cfg, learning_rate(cfg, task.name))
    self.mdi = algebra.minimum_degree_interpolator(task)
    self.mdi_unseen = algebra.unseen_mse(task, self.mdi)
    rng = np.random.default_rng(0)
    seen_x = boolean_data.seen_points(task, rng)
    self.seen_ids, self.seen_f = to_ids(seen_x), task.f(seen_x).astype(np.float32)
    # A method fits the seen domain when its seen MSE is below this share of f's variance there.
    self.fit_mse = cfg.eval.fit_threshold * float(np.var(self.seen_f.astype(np.float64)))
    self.mech = mechanism.describe(task, self.mdi)
    self.full = task.n <= cfg.eval.full_cube_max_n
    self.test_x = boolean_data.cube(task.n) if self.full else (1 - 2 * rng.integers(0, 2, (1 << 16, task.n))).astype(np.int8)
    self.test_seen, self.test_f, self.test_mdi = task.is_seen(self.test_x), task.f(self.test_x), self.mdi(self.test_x)
    # A fixed subset for curves during training: half unseen, half seen points.
    ev_rng = np.random.default_rng(1)
    half = cfg.eval.num_points // 2
    ev_idx = np.concatenate([ev_rng.choice(np.flatnonzero(~self.test_seen), half),
                             ev_rng.choice(np.flatnonzero(self.test_seen), half)])
    self.ev = (to_ids(self.test_x[ev_idx]), self.test_f[ev_idx], self.test_mdi[ev_idx], ~self.test_seen[ev_idx])
    assert self.ev[3][:half].all() and not self.ev[3][half:].any()   # eval_metrics reads the halves by position
    probe_ids = to_ids(self.test_x[ev_rng.choice(len(self.test_x), cfg.eval.probe_size)])
    self.probe = runner.Probe(probe_ids, target_attention(prior_pattern(task, cfg)))
    self.sample_input = jnp.zeros((1, task.n), jnp.int32)
    by, keys = mechanism.unseen_groups(task)
    self.group_of = mechanism.group_ids(task, self.test_x, by, keys)

  def digest(self) -> str:
    return config_digest({"cfg": self.cfg.to_dict(), "task": [self.task.target, self.task.seen, self.task.n]})

  def header(self) -> dict:
    task = self.task
    return {"task": task.name, "n": task.n, "target": task.target, "seen": task.seen,
            "groups": [list(g) for g in task.groups], "mdi": self.mdi.pretty(), "mdi_unseen_mse_true": self.mdi_unseen,
            "fit_threshold_seen_mse": self.fit_mse, "mechanism": self.mech,
            "truth_degree_profile": _relevant_profile(task, task.f),
            "mdi_degree_profile": _relevant_profile(task, self.mdi)}

  def method(self, name: str) -> runner.Method:
    """The method's model, settings, probe and initialisation, in one answer to the runner."""
    return runner.Method(name, self.model(name), self.settings, self.probe_for(name), self.init_method(name))

  def model(self, method: str):
    return build_model(self.task, self.cfg, method)

  def init_method(self, method: str) -> str:
    return boolean_methods.init_method(method)

  def seed_variables(self, method: str, variables: dict, seed: int) -> dict:
    """With `prior.corruption` > 0, the prior of `boolean_methods.CORRUPTIBLE` methods is built from
    this seed's corrupted supports (`boolean_methods.corrupted_supports`), in every layer that holds one."""
    if not self.cfg.prior.corruption or method not in boolean_methods.CORRUPTIBLE:
      return variables
    groups = boolean_methods.corrupted_supports(self.task.groups, self.task.n, self.cfg.prior.corruption, seed)
    pattern = jnp.asarray(prior_pattern(self.task, self.cfg, 0, groups))
    def swap(leaf):
      if leaf.shape != pattern.shape:
        raise ConfigError("prior.corruption needs prior.layers 'all' or 'first' (one pattern for every layer)")
      return pattern.astype(leaf.dtype)
    return {**variables, MASK_PRIOR: jax.tree.map(swap, variables[MASK_PRIOR])}

  def qk_fit_inputs(self, seed: int, draw: int = 0):
    """qk's fit inputs for the run of `seed` (token ids): `qk.fit_inputs` points of the cube from
    `qk_fit_points`, or with 0 the evaluation's probe (as before 0.4)."""
    size = self.cfg.qk.fit_inputs
    return to_ids(qk_fit_points(self.task.n, size, seed, draw)) if size else self.probe.inputs

  def probe_for(self, method: str) -> runner.Probe:
    design = boolean_methods.design_of(method)
    if design is None:
      return self.probe
    allowed = designs.reader_mask(self.task.n, self.task.groups, design)
    pattern = np.where(allowed, design_pattern(self.task, self.cfg, design), -np.inf)
    return runner.Probe(self.probe.inputs, target_attention(pattern))

  def loss_fn(self, model):
    def loss_fn(v, batch, rng):
      del rng
      pred = model.apply(v, batch["x"])
      return jnp.mean((pred - batch["y"]) ** 2), {}
    return loss_fn

  def host_batches(self, runs):
    bs, seen_ids, seen_f = self.settings.batch_size, self.seen_ids, self.seen_f

    def batch_fn(step, seeds, part=(0, 1)):   # part: (i, n), share i of n of the rows (see train_seeds)
      idx = np.stack([take_part(np.random.default_rng([s, step]).integers(0, len(seen_ids), bs), part)
                      for s in seeds])
      return {"x": seen_ids[idx], "y": seen_f[idx]}
    return batch_fn

  def device_batches(self, runs):
    """Batches drawn in the step from the seen domain, which the step takes as an argument (padded
    to `seen_rows` rows, its size a number): tasks of the same n share the compiled program."""
    bs, count, rows = self.settings.batch_size, len(self.seen_ids), seen_rows(self.task.n, len(self.seen_ids))
    run_seeds = np.asarray([r.seed for r in runs], np.int32)
    pad = lambda a: np.concatenate([a, np.zeros((rows - count,) + a.shape[1:], a.dtype)])
    data = {"x": pad(self.seen_ids), "y": pad(self.seen_f), "count": np.int32(count)}

    def device_batch_fn(step, run, data):
      key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), jnp.asarray(run_seeds)[run]), step)
      idx = jax.random.randint(key, (bs,), 0, data["count"])
      return {"x": data["x"][idx], "y": data["y"][idx]}
    return train.DeviceBatches(device_batch_fn, data)

  def eval_data(self, runs):
    """Every run's evaluation points (the same for all runs of the task), an argument of the
    evaluation rather than its constants: tasks of one n share the program."""
    ev_ids, ev_f, ev_mdi, _ = self.ev
    return {k: np.repeat(np.asarray(a, dt)[None], len(runs), 0)
            for k, a, dt in (("x", ev_ids, np.int32), ("f", ev_f, np.float32), ("mdi", ev_mdi, np.float32))}

  def eval_metrics(self, model):
    half = len(self.ev[0]) // 2   # the first half of the points unseen, the second seen (see __init__)

    def metrics_fn(v, data):
      pred = measure.apply_in_chunks(lambda x: model.apply(v, x), data["x"])
      err_t, err_m = (pred - data["f"]) ** 2, (pred - data["mdi"]) ** 2
      return {"unseen_mse_true": err_t[:half].mean(), "unseen_mse_mdi": err_m[:half].mean(),
              "seen_mse": err_t[half:].mean()}
    return metrics_fn

  def final_metrics(self, model, variables, runs, history):
    del runs, history
    pred = _predict(model, variables, to_ids(self.test_x))
    readouts = self._readouts(model, variables) if isinstance(model, designs.ReaderModel) else None
    test_f, test_mdi, test_seen = self.test_f, self.test_mdi, self.test_seen
    out = []
    for p in pred:
      seen_mse = float(np.mean((p - test_f)[test_seen] ** 2))
      out.append({"seen_mse": seen_mse, "fitted": seen_mse <= self.fit_mse,
                  "unseen_group_means": mechanism.group_means(p.astype(np.float64), self.group_of,
                                                              len(self.mech["groups"])),
                  "unseen_mse_true": float(np.mean((p - test_f)[~test_seen] ** 2)),
                  "unseen_mse_mdi": float(np.mean((p - test_mdi)[~test_seen] ** 2)),
                  "degree_profile": (algebra.degree_profile(algebra.walsh_coefficients(p)).tolist()
                                     if self.full else None)})
    if readouts is not None:
      for record, by_support in zip(out, readouts):
        record["reader_readout_by_count"] = by_support
    return out

  def _readouts(self, model, variables) -> list[list[dict]]:
    """Per run and support: the reader's mean readout at each count of +1 entries over the test
    points, and whether that count occurs on the seen domain."""
    ids = to_ids(self.test_x)
    fn = jax.jit(jax.vmap(lambda v, x: model.apply(v, x, mutable=["intermediates"])[1]["intermediates"][designs.READOUT][0],
                          in_axes=(0, None)))
    contrib = np.concatenate([np.asarray(fn(variables, ids[i:i + 8192])) for i in range(0, len(ids), 8192)], 1)
    out = []
    for c in contrib:                                     # (N, R) per run
      per_support = []
      for k, support in enumerate(self.task.groups):
        counts = ids[:, list(support)].sum(1)
        seen_counts = set(np.unique(counts[self.test_seen]).tolist())
        per_support.append({"support": list(support), "by_count": [
            {"count": int(cnt), "seen": int(cnt) in seen_counts, "readout": float(c[counts == cnt, k].mean())}
            for cnt in range(len(support) + 1) if np.any(counts == cnt)]})
      out.append(per_support)
    return out

  def summary(self, results, method, runs):
    seeds = [r.seed for r in runs]
    done = [r for r in results["runs"] if r["method"] == method and r["seed"] in seeds]
    return f"seeds {seeds}: unseen MSE / MDI's " + ", ".join(
        f"{report.mdi_share(r['unseen_mse_true'], self.mdi_unseen):.2f}" if r["fitted"] else "did not fit" for r in done)

  def write_report(self, results, workdir):
    report.write_task_report(results, workdir)


def run_task(task: boolean.Task, cfg: ml_collections.ConfigDict, methods: Sequence[str],
             seeds: Sequence[int], workdir: str | os.PathLike, log=print, progress=None) -> dict:
  """Train every method on the task's seen domain for every seed not yet in `workdir`, and
  measure extrapolation, fit, mechanism and persistence. `progress` (`results.RunProgress`)
  counts finished method runs."""
  return runner.run(BooleanTask(task, cfg), methods, seeds, workdir, log=log, progress=progress)


def run_headline(cfg, methods, seeds, workdir: str | os.PathLike, tasks: Sequence[str] = tuple(boolean.TASKS), log=print):
  """Every headline task (or `tasks`), each in its folder under `workdir`, then summary.md and
  headline.png over them."""
  all_tasks = headline_tasks(cfg)
  progress = results_lib.RunProgress(len(tasks) * len(methods), label="boolean")
  all_results = [run_task(all_tasks[name], cfg, methods, seeds, workdir_lib.path(workdir) / name, log=log,
                          progress=progress) for name in tasks]
  if is_main_process():   # process 0 writes the report
    report.write_headline_report(all_results, workdir_lib.path(workdir))
  return all_results


def add_arguments(p) -> None:
  p.add_argument("--task", help="f1_threesym, f2_2parity, f3_cyclic, f4_majority, frozen_coordinate (or f1..f4, "
                 "frozen) at the config's sizes (default: the headline, all five)")
  p.add_argument("--target", help='custom target, e.g. "x0x1x2 + x1x2" (default: none)')
  p.add_argument("--seen", help='custom seen domain, e.g. "x0 == 1" (default: none)')
  p.add_argument("--n", type=int, help="dimension of a custom task (default: largest variable + 1)")


def prepare(args, cfg, methods) -> tuple[dict, list | None]:
  """`maskprior boolean`'s checks: returns (the run folder's record, the task list, or None for
  the headline)."""
  del methods
  validate(cfg)
  if args.target or args.seen:
    if not (args.target and args.seen):
      raise UsageError("a custom task needs both --target and --seen")
    if args.task:
      raise UsageError("give either --task or --target/--seen, not both")
    tasks = [boolean.custom_task(args.target, args.seen, args.n)]
    if args.n is None:
      print(f"maskprior: note: no --n given, so n = {tasks[0].n} (the largest variable index + 1)", file=console.screen())
  elif args.task:
    tasks = [headline_tasks(cfg)[boolean.get_task(args.task).name]]
    if args.n is not None and args.n != tasks[0].n:
      raise UsageError(f"--n applies to custom tasks; {tasks[0].name} has n = {tasks[0].n}")
  else:
    tasks = None
  record = {"command": "boolean", "config": as_recorded(cfg),
            "tasks": [[t.name, t.n, t.target, t.seen] for t in tasks] if tasks else "headline"}
  return record, tasks


def run_command(cfg, tasks, methods, seeds, workdir) -> str:
  """`maskprior boolean` after `prepare`: the headline or one task; returns the table to print."""
  if tasks is None:
    return report.headline_table(run_headline(cfg, methods, seeds, workdir))
  res = run_task(tasks[0], cfg, methods, seeds, workdir, progress=results_lib.RunProgress(len(methods), label=tasks[0].name))
  return report.task_table(res)


def benchmarks(cfg, tasks, seeds) -> list[tuple[str, BooleanTask]]:
  """The tasks `run_command` trains, in order (the headline's, or the one given)."""
  del seeds
  tasks = list(headline_tasks(cfg).values()) if tasks is None else tasks
  return [(t.name, BooleanTask(t, cfg)) for t in tasks]


COMMAND = runner.Command(name="boolean", help="Boolean extrapolation (GOTU) benchmark", methods=METHODS,
                         default_methods=runner.METHODS, benchmarks=benchmarks,
                         default_seeds="0-4", add_arguments=add_arguments, prepare=prepare, run=run_command,
                         description="Without --task or --target: the headline, all five tasks.")
