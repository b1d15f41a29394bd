"""The one run loop of every benchmark: for each method and the seeds it has not run yet, build
the model (with its prior for the mask methods), initialise every run, train them together
(`train.train_seeds`), evaluate, record each run, checkpoint, report progress, and at the end
write the benchmark's report.

A benchmark plugs in by subclassing `Benchmark`: how to build the model, the batches, the loss,
the evaluation during and after training, and the report. Everything else (the loop settings,
results.json, checkpoints, TensorBoard, resume) is shared.

The methods every benchmark compares: vanilla (the model as initialised), mimetic (mimetic QK/VO
weights), qk (query/key weights fitted so that the initial attention matches the prior's
pattern), mask (the model with the mask prior). Same model, budget and optimizer for all.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maskprior_jax import baselines, distributed, measure, sharding, train
from maskprior_jax.attention import MASK_PRIOR
from maskprior_jax.bench import compiles
from maskprior_jax.bench import results as results_lib
from maskprior_jax.bench import workdir as workdir_lib
from maskprior_jax.checkpoint import Checkpointer, tree_sha256

METHODS = ("vanilla", "mimetic", "qk", "mask")


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a method. seed: its initialisation; key: what the loop and the batch functions
  index it by (the seed, unless runs differ by more than the seed); label: how results.json's
  curves name it."""
  seed: int
  key: int
  label: Any


@dataclasses.dataclass
class Probe:
  """Where persistence is measured: attention on `inputs` against `target_attn` (heads, q, kv),
  only on rows `rows` if given."""
  inputs: Any
  target_attn: Any
  rows: Any = None


@dataclasses.dataclass(frozen=True)
class Method:
  """One method as a benchmark trains it, asked once per method (`Benchmark.method`).

  Attributes:
    name: the method's name (results.json's "method").
    model: the Flax module its runs train (with its prior, for the mask methods).
    settings: its loop settings (`train.LoopSettings`).
    probe: where its persistence is measured.
    init: which of METHODS' initialisations its runs get (`initial_variables`).
  """
  name: str
  model: Any
  settings: train.LoopSettings
  probe: Probe
  init: str


@dataclasses.dataclass(frozen=True)
class Training:
  """What one program of runs trains on and is measured with during training (`Benchmark.training`).

  Attributes:
    loss_fn: `loss_fn(variables, batch, rng) -> (loss, metrics)`.
    batches: the host batch function `batch_fn(step, keys, part=(i, n))`, or `train.DeviceBatches`,
      as `batch_source` says (results.json records that source).
    eval_metrics: `metrics_fn(variables, data) -> dict of scalars` for one run.
    eval_data: the runs' stacked evaluation data (a leading run axis), or None.
  """
  loss_fn: train.LossFn
  batches: Any
  eval_metrics: Callable[[dict, Any], dict]
  eval_data: Any = None


class Benchmark:
  """What one benchmark supplies to `run`. Subclasses set `name` (log label), `kind` (results.json
  "benchmark"), `cfg`, `settings` (`train.LoopSettings`), `sample_input` and `probe`, and
  implement the methods below that raise NotImplementedError.

  The runner asks about each method once (`method`: its model, settings, probe and initialisation)
  and about each program of runs once (`training`: loss, batches, evaluation); their defaults are
  built from the finer hooks below, which a benchmark overrides where it needs to, or it overrides
  `method` or `training` as a whole."""
  name: str
  kind: str
  cfg: Any
  settings: train.LoopSettings
  sample_input: Any
  probe: Probe

  def header(self) -> dict:
    """The results.json fields that describe the task (written once)."""
    raise NotImplementedError

  def digest(self) -> str:
    """Identifies the config and task: a run folder holding another digest starts over."""
    raise NotImplementedError

  def method(self, name: str) -> Method:
    """Everything the runner needs about one method (default: from `model`, `settings_for`,
    `probe_for` and `init_method`)."""
    return Method(name, self.model(name), self.settings_for(name), self.probe_for(name), self.init_method(name))

  def training(self, method: Method, runs: Sequence[Run]) -> Training:
    """What `runs` of `method` (and of the methods stacked with it) train on and are measured with
    (default: from `loss_fn`, `host_batches` or `device_batches` as `batch_source` says,
    `eval_metrics` and `eval_data`)."""
    if batch_source(self, method.settings) == "device":
      drawn = self.device_batches(runs)   # fn(step, run), or DeviceBatches with its data
      batches = drawn if isinstance(drawn, train.DeviceBatches) else train.DeviceBatches(drawn)
    else:
      batches = self.host_batches(runs)
    return Training(self.loss_fn(method.model), batches, self.eval_metrics(method.model), self.eval_data(runs))

  def runs(self, seeds: Sequence[int]) -> list[Run]:
    """The runs of one method for `seeds` (default: one per seed)."""
    return [Run(seed=s, key=s, label=s) for s in seeds]

  def model(self, method: str):
    raise NotImplementedError

  def probe_for(self, method: str) -> Probe:
    """Where a method's persistence is measured (default: `probe`, the prior's pattern); a method
    whose model has another token layout gives its own."""
    del method
    return self.probe

  def qk_fit_inputs(self, seed: int):
    """The inputs the qk method's query/key weights are fitted on for the run of `seed` (default: the
    probe's inputs, `qk.fit_inputs` 0). A benchmark that draws inputs of its own for `qk.fit_inputs`
    N > 0, independent of the evaluation's settings, overrides this."""
    del seed
    return self.probe.inputs

  def settings_for(self, method: str) -> train.LoopSettings:
    """The loop settings a method trains with (default: `settings`; e.g. a fixed-bias control
    freezes its mask)."""
    del method
    return self.settings

  def init_method(self, method: str) -> str:
    """Which of METHODS' initialisations a method's runs get (`initial_variables`); a benchmark
    with control methods maps them here."""
    return method

  def seed_variables(self, method: str, variables: dict, seed: int) -> dict:
    """One run's variables after `model.init`, before any baseline initialisation: a benchmark whose
    prior differs per seed (e.g. a seeded corruption of its supports) sets it here (default: as is)."""
    del method, seed
    return variables

  def loss_fn(self, model) -> train.LossFn:
    raise NotImplementedError

  def host_batches(self, runs: Sequence[Run]) -> Callable:
    """`batch_fn(step, keys, part=(i, n))`: the batch of every run (by its key) for `step`."""
    raise NotImplementedError

  def device_batches(self, runs: Sequence[Run]) -> Callable | train.DeviceBatches | None:
    """`fn(step, run_index)` drawing the same kind of batch inside the compiled step, or a
    `train.DeviceBatches` whose `data` (the training set) the step takes as an argument, so that
    tasks whose data have the same shapes share one program. A benchmark that does not override
    this has no device batches (train.batches="device" is then refused)."""
    return None

  def device_data(self) -> bool:
    """Whether train.batches=auto draws on the device: the training set is small and held whole by
    every process (default: wherever the benchmark has device batches; a benchmark whose data may be
    large or split over processes says no)."""
    return type(self).device_batches is not Benchmark.device_batches

  def eval_metrics(self, model) -> Callable[[dict, Any], dict]:
    """`metrics_fn(variables, data) -> dict of scalars` for one run during training (`data`: the
    run's slice of `eval_data`, or None)."""
    raise NotImplementedError

  def eval_data(self, runs: Sequence[Run]) -> Any:
    return None

  def final_metrics(self, model, variables: dict, runs: Sequence[Run], history: list[dict]) -> list[dict]:
    """Per run, the numbers results.json records, from the stacked final variables (and the eval
    history, if the benchmark reads its curves)."""
    raise NotImplementedError

  def summary(self, results: dict, method: str, runs: Sequence[Run]) -> str:
    """One line on the method's new runs, for the log."""
    raise NotImplementedError

  def write_report(self, results: dict, workdir: str | os.PathLike) -> None:
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Command:
  """A benchmark's `maskprior` subcommand (see `bench.cli`): its name and help, the methods it
  can compare (`methods`; `default_methods` run without --methods, all of them if None), `add_arguments(parser)` for its own flags, `prepare(args, cfg, methods) -> (record,
  context)` (every check, before anything is written; `record` identifies the run folder's
  command and config), `run(cfg, context, methods, seeds, workdir) -> text` to print, and
  `benchmarks(cfg, context, seeds)`: the (task, `Benchmark`) pairs `run` trains (`maskprior compile`)."""
  name: str
  help: str
  methods: tuple[str, ...]
  add_arguments: Callable
  prepare: Callable
  run: Callable
  default_seeds: str = "3"
  description: str | None = None
  default_methods: tuple[str, ...] | None = None
  # benchmarks(cfg, context, seeds) -> [(task label, Benchmark)]: what `run` trains, in order, for
  # `maskprior compile` (which builds their programs without training).
  benchmarks: Callable | None = None


_INIT_PROGRAMS: dict[int, tuple] = {}


def init_program(model) -> Callable:
  """`model.init` as one compiled program, kept per model (and traced once per input shape): a run's
  start-up then loads one executable, where `model.init` called directly runs each initializer's
  operations one by one (hundreds of small programs, each compiled or read from the cache in a new
  process). Its values equal the direct call's within float32 rounding, not bit for bit (XLA fuses
  an initializer's scale and shift)."""
  hit = _INIT_PROGRAMS.get(id(model))
  if hit is None or hit[0] is not model:
    if len(_INIT_PROGRAMS) >= 64:
      _INIT_PROGRAMS.clear()
    hit = _INIT_PROGRAMS[id(model)] = (model, jax.jit(model.init))
  return hit[1]


def initial_variables(method: Method | str, model, bench: Benchmark, seed: int) -> tuple[dict, dict]:
  """One run's starting variables for a method (a `Method`, or its name): `model.init` (compiled:
  `init_program`), then for "mimetic" the mimetic QK/VO weights (cfg.mimetic), for "qk" query/key
  weights fitted so that the initial attention on `Benchmark.qk_fit_inputs` matches the prior's pattern
  (cfg.qk). The other methods differ only in the model (the mask model carries its prior). Returns
  (variables, info)."""
  name, init = (method.name, method.init) if isinstance(method, Method) else (method, bench.init_method(method))
  variables = bench.seed_variables(name, init_program(model)(jax.random.key(seed), bench.sample_input), seed)
  info = {}
  if init == "mimetic":
    m = bench.cfg.mimetic
    variables = {**variables, "params": baselines.mimetic(
        variables["params"], np.random.default_rng(seed), alpha=m.alpha, beta=m.beta,
        alpha_v=m.alpha_v, beta_v=m.beta_v)}
  elif init == "qk":
    q = bench.cfg.qk
    variables, tv = baselines.fit_qk(model.apply, variables, bench.qk_fit_inputs(seed), bench.probe.target_attn,
                                     steps=q.fit_steps, learning_rate=q.fit_learning_rate,
                                     batch_size=q.fit_batch if q.fit_inputs else None, seed=seed)
    info["qk_fit_tv"] = tv
  return variables, info


def batch_source(bench: Benchmark, settings: train.LoopSettings) -> str:
  """Where a method's batches come from: its `settings.batches`, with "auto" resolved to "device"
  where the benchmark holds its training set on the device (`Benchmark.device_data`) and "host"
  elsewhere. The two are different streams, so different runs: results.json records the one used."""
  if settings.batches == "auto":
    return "device" if bench.device_data() else "host"
  return settings.batches


def evaluation(method: Method, training: Training, mesh):
  """The jitted evaluation of every run during training, `eval_all(stacked_variables, data,
  initial_variables, *probe_arguments(method.probe))`: the benchmark's metrics
  (`training.eval_metrics` on `training.eval_data`), `attn_tv` (each layer's mean total-variation distance between attention rows on the method's
  probe and the prior's pattern) and, for a model with a prior, `mask_drift` ||B_t-B_0||/||B_0||."""
  model, probe, metrics_fn = method.model, method.probe, training.eval_metrics
  rows = slice(None) if probe.rows is None else np.asarray(probe.rows)

  def eval_one(v, data, probe_inputs, target_attn):
    out = dict(metrics_fn(v, data))
    maps = jnp.stack(measure.attention_maps(model.apply, v, probe_inputs))   # (layers, B, H, q, kv)
    out["attn_tv"] = measure.total_variation(maps[..., rows, :], target_attn[..., rows, :])
    return out

  def eval_all(stacked, data, init0, probe_inputs, target_attn):
    out = jax.vmap(eval_one, in_axes=(0, None if data is None else 0, None, None))(
        stacked, data, probe_inputs, target_attn)
    if MASK_PRIOR in stacked:
      out["mask_drift"] = measure.mask_drift(stacked, init0)
    return out
  # Over a mesh the metrics come back replicated, so that every process can read them.
  return jax.jit(eval_all, **({} if mesh is None else {"out_shardings": train.replicated(mesh)}))


def probe_arguments(probe: Probe) -> tuple:
  """The evaluation's last two arguments (`evaluation`): the probe's inputs and the prior's attention
  pattern, as arguments rather than constants of the program, so that tasks of one shape share it."""
  return jax.tree.map(np.asarray, probe.inputs), np.asarray(probe.target_attn)


def stacks_methods(bench: Benchmark) -> bool:
  """Whether methods that share a model, loop settings, probe and seeds train as one program
  (train.stack_methods): "on", "off", or "auto": on, except where a CPU steps a device's runs as one
  vmapped block (train.run_block=all there). With run blocks of a fixed size every run is stepped by
  the same compiled program whatever trains beside it, so stacking changes no run's bits and saves
  every further method's compilation and loop; on an accelerator one program of more runs fills the
  device (one vmapped block: the same runs within float32 rounding)."""
  choice = bench.cfg.train.get("stack_methods", "auto")
  if choice == "auto":
    return not (sharding.platform() == "cpu" and bench.settings.run_block == "all")
  return choice == "on"


def _same_model(a, b) -> bool:
  """Flax modules compare as dataclasses; one holding arrays (a fixed pattern) has no truth value: not
  stacked."""
  try:
    return bool(a == b)
  except (ValueError, TypeError):
    return False


def _same_probe(a: Probe, b: Probe) -> bool:
  if a is b:
    return True
  pairs = ((a.inputs, b.inputs), (a.target_attn, b.target_attn), (a.rows, b.rows))
  return all(jax.tree.structure(x) == jax.tree.structure(y)
             and all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(jax.tree.leaves(x), jax.tree.leaves(y)))
             for x, y in pairs)


def method_groups(bench: Benchmark, todo: dict, described: dict | None = None) -> list[list[str]]:
  """The methods that train together (`stacks_methods`), in the order given: those with equal models
  (Flax modules compare as dataclasses), loop settings, probes and seeds to run, e.g. vanilla,
  mimetic and qk, which differ only in their initial weights. `todo`: {method: seeds}; `described`:
  {method: `Method`} where the caller has them (else asked here)."""
  groups: list[list[str]] = []
  if not stacks_methods(bench):
    return [[m] for m in todo]
  described = described or {m: bench.method(m) for m in todo}
  for m in todo:
    for g in groups:
      a, b = described[g[0]], described[m]
      if (todo[g[0]] == todo[m] and _same_model(a.model, b.model) and a.settings == b.settings
          and _same_probe(a.probe, b.probe)):
        g.append(m)
        break
    else:
      groups.append([m])
  return groups


def _runs_part(row: dict, part: slice, total: int) -> dict:
  """One method's share of a row of per-run values (arrays or the history's lists with `total` runs
  first; the rest, e.g. the step, as is)."""
  return {k: (v[part] if len(np.shape(v)) and np.shape(v)[0] == total else v) for k, v in row.items()}


class _Observer:
  """train_seeds' eval_fn: every run's evaluation, fetched once for the history and for each method's
  TensorBoard log (its share of the runs), and the training windows (`log_train`)."""

  def __init__(self, evaluate, logs, runs_per_method: int):
    self.evaluate, self.logs, self.k = evaluate, logs, runs_per_method
    self.total = runs_per_method * len(logs)

  def _each(self, row):
    return [(log, _runs_part(row, slice(i * self.k, (i + 1) * self.k), self.total)) for i, log in enumerate(self.logs)]

  def __call__(self, step, stacked):
    out = self.evaluate(stacked)
    for log, part in self._each(out):
      log(step, part)
    return out

  def log_train(self, step, row):
    for log, part in self._each(row):
      log.train(step, part)


def _close(checkpointer, logs, trained: bool) -> None:
  closed = False
  try:
    checkpointer.close()
    closed = True
  finally:   # a failure already on its way (e.g. a full disk) is the one reported, not the events'
    with contextlib.ExitStack() as stack:   # every log closed, even after one fails
      for log in logs:
        stack.callback(log.close, report_errors=trained and closed)


def train_method(methods: str | Method | Sequence[str | Method], model, bench: Benchmark, runs: Sequence[Run],
                 workdir: str | os.PathLike):
  """Train the runs of one method, or of several methods stacked (`method_groups`: the same model,
  loop settings and runs; each method's runs start from its own initial variables), in one program,
  with the persistence measurements; every evaluation reaches each method's TensorBoard as it is
  made, checkpoints go under workdir/checkpoints (METHOD/seeds_..., or A+B+.../seeds_... for stacked
  methods). `methods`: `Method`s (or names, asked of the benchmark). Returns (final stacked state on
  the host, eval history, per-run init info, `train.Placement`), the runs in the order of
  `methods`, then of `runs`."""
  group = [m if isinstance(m, Method) else bench.method(m)
           for m in ([methods] if isinstance(methods, (str, Method)) else methods)]
  names, settings = [m.name for m in group], group[0].settings
  inits = [initial_variables(m, model, bench, r.seed) for m in group for r in runs]
  stacked_runs = list(runs) * len(group)   # every method's runs have the same keys and batches
  init0 = jax.tree.map(lambda *xs: np.stack(xs), *[v for v, _ in inits])   # on the host: any mesh and process
  placement = settings.placement(len(stacked_runs), train.num_params(inits[0][0]))
  training = bench.training(group[0], stacked_runs)
  eval_all = evaluation(dataclasses.replace(group[0], model=model), training, placement.mesh)
  seeds = results_lib.seeds_dir(list(dict.fromkeys(r.seed for r in runs)))
  logs = [results_lib.TensorBoardLog(workdir / "tensorboard" / workdir_lib.path(m) / seeds, labels=[r.label for r in runs],
                                     hparams=results_lib.run_hparams(bench.cfg, m)) for m in names]
  probe = probe_arguments(group[0].probe)
  observer = _Observer(lambda st: jax.device_get(eval_all(st, training.eval_data, init0, *probe)), logs, len(runs))
  checkpointer = Checkpointer(workdir / "checkpoints" / workdir_lib.path("+".join(names)) / seeds,
                              max_to_keep=settings.max_to_keep)
  trained = False
  try:
    state, history = train.train_seeds(
        loss_fn=training.loss_fn, tx=settings.optimizer(), variables=[v for v, _ in inits],
        seeds=[r.key for r in stacked_runs], batches=training.batches, settings=settings, eval_fn=observer,
        label=f"{bench.name}/{'+'.join(names)}", checkpointer=checkpointer, mesh=placement)
    trained = True
  finally:
    _close(checkpointer, logs, trained)
  # On the host in every process: what comes next (test metrics, digests) reads it locally.
  return distributed.host_tree(state), history, [i for _, i in inits], placement


def run(bench: Benchmark, methods: Sequence[str], seeds: Sequence[int], workdir: str | os.PathLike, log=print,
        progress: results_lib.RunProgress | None = None) -> dict:
  """Train every method for every seed not yet in `workdir`'s results.json, record each run as it
  finishes (a rerun skips finished methods and resumes an interrupted one from its checkpoint),
  then write the benchmark's report. `progress` counts finished method runs. Returns results."""
  workdir = workdir_lib.path(workdir)
  if bench.settings.batches == "device" and type(bench).device_batches is Benchmark.device_batches:
    from maskprior_jax.bench.config import ConfigError
    raise ConfigError(f"train.batches=device: the {bench.kind} benchmark draws its batches on the host only")
  if bench.cfg.qk.fit_inputs and type(bench).qk_fit_inputs is Benchmark.qk_fit_inputs:
    from maskprior_jax.bench.config import ConfigError
    raise ConfigError(f"qk.fit_inputs={bench.cfg.qk.fit_inputs}: the {bench.kind} benchmark fits qk on its probe only; "
                      "set qk.fit_inputs=0")
  results = results_lib.open_results(workdir, bench.cfg, bench.digest(), bench.kind, bench.header())
  progress = progress or results_lib.RunProgress(len(methods), label=bench.name)
  todo = {}
  for method in methods:
    seeds_left = results_lib.seeds_to_run(results, method, seeds)
    if seeds_left:
      todo[method] = seeds_left
    else:
      progress.skip()
      log(f"[{bench.name}] {method}: seeds {list(seeds)} already in {workdir / 'results.json'}, skipped")
  described = {m: bench.method(m) for m in todo}   # each method asked once
  for names in method_groups(bench, todo, described):
    timer = results_lib.Timer()
    group, runs = [described[m] for m in names], bench.runs(todo[names[0]])
    with compiles.counted() as count:   # the group's programs: initialisation, training, evaluation
      trained = train_method(group, group[0].model, bench, runs, workdir)
      _record_group(results, bench, group, runs, trained, timer, workdir, log, progress, count)
    log(f"[{bench.name}] {'+'.join(names)}: {count.line()}")
  if distributed.is_main_process():   # process 0 writes the report
    bench.write_report(results, workdir)
  return results


def _record_group(results, bench, group, runs, trained, timer, workdir, log, progress, count) -> None:
  """Each method's runs of a trained group into results (per-run records with their digests, the
  curves, where the runs went, which batches they drew and what the group compiled: `count`, a
  `compiles.Count`), logged as each is recorded."""
  state, history, infos, placement = trained
  names = [m.name for m in group]
  total, wall = len(runs) * len(group), timer() / len(group)   # stacked methods share the time equally
  env = results.setdefault("environment", {})
  for g, method in enumerate(group):
    part = slice(g * len(runs), (g + 1) * len(runs))
    variables = jax.tree.map(lambda a: a[part], state.variables)
    method_history = [_runs_part(h, part, total) for h in history]
    # Where the runs went (run-parallel, data parallel or one device), on how many devices, and
    # which methods shared the program.
    env.setdefault("placement", {})[method.name] = {**placement.record(), **({"methods": names} if len(group) > 1 else {})}
    # Which batch stream the runs drew (host numpy or in-step device draws: different streams, different runs).
    env.setdefault("batches", {})[method.name] = batch_source(bench, method.settings)
    for i, (r, metrics) in enumerate(zip(runs, bench.final_metrics(method.model, variables, runs, method_history))):
      results["runs"].append(results_lib.RunRecord(
          method=method.name, seed=int(r.seed), metrics=metrics,
          persistence=results_lib.per_run(method_history, i, ["attn_tv", "mask_drift"]),
          state_sha256=tree_sha256(jax.tree.map(lambda a: a[i], variables)), info=infos[part][i]).to_json())
    # the group's compiles so far (stacked methods share one entry, named A+B)
    env.setdefault("compiles", {})["+".join(names)] = count.record()
    results_lib.record_method(results, method.name, method_history, wall, workdir, run_labels=[r.label for r in runs])
    log(f"[{bench.name}] {method.name}: {bench.summary(results, method.name, runs)} ({timer():.0f}s"
        f"{', with ' + '+'.join(m for m in names if m != method.name) if len(group) > 1 else ''})")
    progress.done()
