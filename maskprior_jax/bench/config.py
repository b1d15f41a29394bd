"""Config files and command-line overrides.

A config file is a Python file with `get_config() -> ml_collections.ConfigDict`. Overrides
use one syntax everywhere: `--config.train.steps=2000`. The config is locked, so an unknown
key is an error; a value is parsed to the type of the value it replaces.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import importlib.util
import os
import json
import pathlib

import ml_collections


class ConfigError(ValueError):
  """A bad config file, key or value (reported as one line)."""


class UsageError(ValueError):
  """A bad command line or run folder (reported as one line, exit status 2)."""


def did_you_mean(name: str, choices, rename: dict | None = None) -> str:
  """" (did you mean X?)" for the closest of `choices` to a misspelled `name`, or ""; `rename` maps a
  choice to the name shown (an alias to what it stands for)."""
  import difflib
  close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
  return f" (did you mean {(rename or {}).get(close[0], close[0])}?)" if close else ""


def builtin_names() -> list[str]:
  """The built-in configs' names: "boolean", "boolean_paper", "arithmetic", ..."""
  root = pathlib.Path(__file__).parent
  return sorted(p.parent.parent.name + ("" if p.stem == "default" else "_" + p.stem)
                for p in root.glob("*/configs/*.py") if not p.stem.startswith("_"))


def load_config_file(path: str | pathlib.Path) -> ml_collections.ConfigDict:
  path = pathlib.Path(path)
  if not path.is_file():
    raise ConfigError(f"config file {path} does not exist")
  spec = importlib.util.spec_from_file_location(f"_maskprior_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config file {path} has no get_config()")
  return module.get_config()


def builtin_config(name: str) -> ml_collections.ConfigDict:
  """A benchmark's built-in config: "boolean" is bench/boolean/configs/default.py, "boolean_paper"
  is bench/boolean/configs/paper.py, and so on."""
  bench, _, variant = name.partition("_")
  path = pathlib.Path(__file__).parent / bench / "configs" / f"{variant or 'default'}.py"
  if not path.is_file():
    raise ConfigError(f"no built-in config {name!r}{did_you_mean(name, builtin_names())}")
  return load_config_file(path)


def resolve(given: str | None, benchmark: str) -> ml_collections.ConfigDict:
  """--config: a file with get_config(), or a built-in config's name (e.g. boolean_paper); none: the
  benchmark's built-in default."""
  if not given:
    return builtin_config(benchmark)
  if not os.path.exists(given) and os.sep not in given and not given.endswith(".py"):
    try:
      return builtin_config(given)
    except ConfigError:
      raise ConfigError(f"config file {given} does not exist, nor is there a built-in config of that name"
                        f"{did_you_mean(given, builtin_names())}; built-in: {', '.join(builtin_names())}") from None
  return load_config_file(given)


def _parse_value(text: str, old, key: str):
  """`text` as a value of the type of `old`, with the parsers ml_collections' config flags use."""
  from absl import flags
  from ml_collections.config_flags import tuple_parser
  if isinstance(old, bool):
    low = {"yes": "true", "no": "false"}.get(text.lower(), text.lower())
    parser, expected = flags.BooleanParser(), "true or false"
  elif isinstance(old, int):
    low, parser, expected = text, flags.IntegerParser(), "an integer"
  elif isinstance(old, float):
    low, parser, expected = text, flags.FloatParser(), "a number"
  elif isinstance(old, (tuple, list)):
    low, parser, expected = text, tuple_parser.TupleParser(), "a tuple"
  elif old is None:
    try:
      return ast.literal_eval(text)
    except (ValueError, SyntaxError):
      return text
  else:
    return text
  try:
    return parser.parse(low)
  except (ValueError, TypeError, SyntaxError):
    raise ConfigError(f"--config.{key}={text}: expected {expected}") from None


def apply_overrides(config: ml_collections.ConfigDict, overrides: list[str]) -> ml_collections.ConfigDict:
  """Apply `--config.a.b=value` strings to a copy of `config`, locked against new keys: each value
  parsed to the type of the one it replaces and set through `ml_collections.config_flags.config_path`
  (the machinery of `config_flags`), each bad key or value one ConfigError."""
  from ml_collections.config_flags import config_path
  config = ml_collections.ConfigDict(config.to_dict())
  config.lock()
  for item in overrides:
    if not item.startswith("--config.") or "=" not in item:
      raise ConfigError(f"bad override {item!r}; use --config.section.key=value")
    key, text = item[len("--config."):].split("=", 1)
    node, parts = config, key.split(".")
    for p in parts[:-1]:
      if p not in node or not isinstance(node[p], ml_collections.ConfigDict):
        sections = [k for k, v in node.items() if isinstance(v, ml_collections.ConfigDict)]
        raise ConfigError(f"unknown config key {key!r}: no section {p!r}{did_you_mean(p, sections)}; "
                          f"sections here: {', '.join(sorted(sections))}")
      node = node[p]
    if parts[-1] not in node:
      raise ConfigError(f"unknown config key {key!r}{did_you_mean(parts[-1], node.keys())}; known in this "
                        f"section: {', '.join(sorted(node.keys()))}")
    old = config_path.get_value(key, config)
    if isinstance(old, ml_collections.ConfigDict):
      raise ConfigError(f"config key {key!r} is a section, not a value")
    value = _parse_value(text, old, key)
    try:
      config_path.set_value(key, config, value)
    except TypeError:   # ConfigDict's own type check (e.g. a tuple where a number was)
      raise ConfigError(f"--config.{key}={text}: expected a {type(old).__name__}") from None
  return config


def base_config() -> ml_collections.ConfigDict:
  """Every key the training loop and the method baselines read, declared once; each benchmark's
  config starts from this and changes values (and adds its own task, data, model and prior keys).

  train: steps, batch size, optimizer ("adam", "adamw" or "sgd"), steps per compiled call; the
    recipe (warmup_steps, schedule, grad_clip_norm, b2, decay_on, qk_mask_decay: see
    `train.LoopSettings`; the defaults are a constant rate, no clipping, decay on every weight);
    parallel: where a method's stacked runs go: "auto" (whole runs spread over several devices for
    a small model, see `train.LoopSettings.placement`), "runs", "data" (every run's batch split
    over all devices) or "off" (one device); run_block: how many of a device's runs are stepped
    together ("auto": one at a time on a CPU, all at once on an accelerator; "all"; or a number:
    see `train.LoopSettings`); stack_methods: "auto", "on" or "off", whether methods that share a
    model, loop settings and seeds (vanilla, mimetic, qk) train as one program (`runner.stacks_methods`:
    auto is on except with run_block=all on a CPU); data_parallel=true is the older spelling of
    parallel="data", and splits every run's batch over all devices (a mesh over jax.devices()); fsdp also
    shards large weights and optimizer state over them (with data_parallel); batches: "host"
    (built by numpy), "device" (drawn inside the compiled step from the training set held on the
    device) or "auto" (device for every benchmark's generated or embedded data; host for data read
    from TFDS, which is split over processes and may not fit a device: see `runner.batch_source`); grad_reduction (with data_parallel): "xla" (XLA's all-reduce) or "ordered" (every
    device's gradient gathered and summed in a fixed order: bit for bit the same state however the
    devices are spread over processes; not with fsdp).
  eval: every_steps (evaluation cadence), probe_size (inputs the attention persistence is measured on).
  checkpoint: every_steps, max_to_keep.
  prior: mode "learned" (the mask trains, at mask_lr_multiplier x the base rate) or "frozen".
  model.attention: "xla", "cudnn" or "auto" (cuDNN on a GPU where it can); see results.json "attention".
  model.dtype: "float32", or "bfloat16" (computations in bfloat16; parameters, the mask prior and the
    optimizer state stay float32, the prior is added in the logits' dtype; `compute_dtype`).
  qk, mimetic: the baselines' settings. qk.fit_inputs: 0 fits qk on the evaluation's probe inputs, all
    of them at every step; N > 0 on N inputs of its own, drawn from the run's seed alone
    (`Benchmark.qk_fit_inputs`; Boolean), qk.fit_batch of them per step.
  """
  c = ml_collections.ConfigDict()
  c.train = dict(steps=1500, batch_size=64, learning_rate=1e-3, optimizer="adamw", weight_decay=0.0,
                 steps_per_call=50, parallel="auto", run_block="auto", stack_methods="auto", data_parallel=False, fsdp=False, batches="auto", grad_reduction="xla",
                 warmup_steps=0, schedule="constant", grad_clip_norm=0.0, b2=0.999, decay_on="all",
                 qk_mask_decay="legacy")
  c.eval = dict(every_steps=250, probe_size=64)
  c.checkpoint = dict(every_steps=500, max_to_keep=2)
  c.prior = dict(mode="learned", mask_lr_multiplier=1.0)
  c.model = dict(attention="auto", dtype="float32")
  c.qk = dict(fit_steps=300, fit_learning_rate=1e-2, fit_inputs=0, fit_batch=256)
  c.mimetic = dict(alpha=0.7, beta=0.7, alpha_v=0.4, beta_v=0.4)
  return c


def loop_settings(cfg: ml_collections.ConfigDict, learning_rate: float | None = None):
  """The config's `train.LoopSettings` (the loop's keys of `base_config`), built once and passed
  whole; `learning_rate` replaces train.learning_rate (e.g. a per-task rate). Progress lines and
  TensorBoard's training windows come every 250 steps, or at every evaluation if that is more often."""
  from maskprior_jax.train import LoopSettings
  t = cfg.train
  try:
    return LoopSettings(
        steps=t.steps, log_every=min(250, cfg.eval.every_steps or t.steps), batch_size=t.batch_size, steps_per_call=t.steps_per_call, eval_every=cfg.eval.every_steps,
        checkpoint_every=cfg.checkpoint.every_steps, max_to_keep=cfg.checkpoint.max_to_keep,
        parallel=t.parallel, run_block=str(t.run_block), data_parallel=t.data_parallel, fsdp=t.fsdp, grad_reduction=t.grad_reduction, batches=t.batches,
        optimizer_name=t.optimizer, learning_rate=t.learning_rate if learning_rate is None else learning_rate,
        weight_decay=t.weight_decay, mask_lr_multiplier=cfg.prior.mask_lr_multiplier,
        freeze_mask=cfg.prior.mode == "frozen", warmup_steps=t.warmup_steps, schedule=t.schedule,
        grad_clip_norm=t.grad_clip_norm, b2=t.b2, decay_on=t.decay_on, qk_mask_decay=t.qk_mask_decay)
  except ValueError as e:
    raise ConfigError(str(e)) from None


# Config keys added after run folders had been recorded, each with the value that reproduces the
# behaviour from before it existed. At that value a key is left out of the run record and of the
# config digest, so a folder recorded before the key existed still resumes, takes more seeds or
# methods, and pools in reports; at any other value it is recorded like every other key.
LATER_KEYS = {
    "train.warmup_steps": 0, "train.schedule": "constant", "train.grad_clip_norm": 0.0,
    "train.b2": 0.999, "train.decay_on": "all", "train.qk_mask_decay": "legacy",
    "task.val_size": 0, "task.coupling": "rows", "task.coupling_max_position": 20, "prior.corruption": 0.0,
    "train.parallel": "auto", "train.run_block": "all",
    # One program for several methods changes no run's bits with run blocks of a fixed size, and
    # "auto" stacks none with one vmapped block on a CPU (runner.stacks_methods): the committed folders'
    # bits either way.
    "train.stack_methods": "auto",
    "model.dtype": "float32",
    "qk.fit_inputs": 0, "qk.fit_batch": 256,
}


def as_recorded(config: ml_collections.ConfigDict | dict) -> dict:
  """A config as run records and digests hold it: a plain dict without the `LATER_KEYS` that are at
  their earlier behaviour's value."""
  d = copy.deepcopy(config.to_dict() if hasattr(config, "to_dict") else dict(config))
  for key, value in LATER_KEYS.items():
    *parents, leaf = key.split(".")
    node = d
    for part in parents:
      node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and leaf in node and node[leaf] == value and type(node[leaf]) is type(value):
      del node[leaf]
  return d


def config_digest(config: ml_collections.ConfigDict | dict) -> str:
  """A short digest of a config (or of a dict holding one under "cfg"), as recorded (`as_recorded`)."""
  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  d = {**d, "cfg": as_recorded(d["cfg"])} if "cfg" in d else as_recorded(d)
  return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _get(cfg, key: str):
  node = cfg
  for part in key.split("."):
    node = node[part]
  return node


# model.attention: XLA's attention, cuDNN's fused kernel, the blockwise pure-JAX path, or "auto" (cuDNN
# only on a GPU, for bfloat16/float16 and a bias with batch dimension 1; see maskprior_jax.attention).
ATTENTION = ("xla", "cudnn", "blockwise", "auto")


# model.dtype: what the benchmark models compute in (parameters and optimizer state stay float32).
DTYPES = ("float32", "bfloat16")


def compute_dtype(cfg):
  """model.dtype as the models' `dtype` attribute: None for float32 (the inputs' dtype, as every
  committed run), jnp.bfloat16 for bfloat16."""
  import jax.numpy as jnp
  dtype = cfg.model.get("dtype", "float32")
  return None if dtype == "float32" else jnp.dtype(dtype).type


def attention_record(cfg) -> dict:
  """What results.json records of the attention path: the config's request, the models' compute
  dtype and the path the training step takes on this backend (one bias shared by the batch)."""
  requested = cfg.model.attention
  import jax.numpy as jnp

  from maskprior_jax.attention import attention_implementation
  dtype = cfg.model.get("dtype", "float32")
  path = attention_implementation(requested, jnp.dtype(dtype), 1)
  if path == "cudnn" and requested == "auto":   # decided per call by its sizes (attention.cudnn_unsupported)
    path = "cudnn where its sizes allow, else xla"
  return {"requested": requested, "dtype": dtype, "training_path": path}


def check(cfg: ml_collections.ConfigDict, *, choices: dict | None = None, positive=()) -> None:
  """The checks every benchmark's config needs, each failure one ConfigError naming the key:
  the loop's keys (`base_config`), `choices` {key: allowed values} and `positive` keys (> 0)."""
  from maskprior_jax.train import BATCH_SOURCES, GRAD_REDUCTIONS, PARALLEL
  choices = {"model.attention": ATTENTION, "model.dtype": DTYPES, "train.batches": BATCH_SOURCES, "train.grad_reduction": GRAD_REDUCTIONS,
             "train.parallel": PARALLEL, "train.stack_methods": ("auto", "on", "off"),
             "prior.mode": ("learned", "frozen"), "train.optimizer": ("adam", "adamw", "sgd"), **(choices or {})}
  for key, allowed in choices.items():
    if _get(cfg, key) not in allowed:
      raise ConfigError(f"{key} must be {' or '.join(map(str, allowed))}, not {_get(cfg, key)!r}"
                        f"{did_you_mean(_get(cfg, key), allowed)}")
  for key in ("train.steps", "train.batch_size", "train.learning_rate", "eval.every_steps", "eval.probe_size",
              *positive):
    if not _get(cfg, key) > 0:
      raise ConfigError(f"{key} must be positive, got {_get(cfg, key)}")
  loop_settings(cfg)   # cadences that must divide by train.steps_per_call, fsdp with data_parallel, ...
  check_data_parallel(cfg)


def check_data_parallel(cfg: ml_collections.ConfigDict) -> None:
  """train.data_parallel splits each batch over all devices: the batch must divide evenly."""
  if cfg.train.data_parallel or cfg.train.get("parallel") == "data":
    from maskprior_jax import sharding
    n = len(sharding.devices())
    if cfg.train.batch_size % n:
      raise ConfigError(f"train.data_parallel: train.batch_size ({cfg.train.batch_size}) must divide by the "
                        f"{n} devices")
