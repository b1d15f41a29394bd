"""Config files and command-line overrides.

A config file is a Python file with `get_config() -> ml_collections.ConfigDict`. Overrides
use one syntax everywhere: `--config.train.steps=2000`. The config is locked, so an unknown
key is an error; a value is parsed to the type of the value it replaces.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import pathlib

import ml_collections


class ConfigError(ValueError):
  """A bad config file, key or value (reported as one line)."""


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
    raise ConfigError(f"no built-in config {name!r}")
  return load_config_file(path)


def _parse_value(text: str, old, key: str):
  if isinstance(old, bool):
    low = text.lower()
    if low in ("true", "1", "yes"):
      return True
    if low in ("false", "0", "no"):
      return False
    raise ConfigError(f"--config.{key}={text}: expected true or false")
  if isinstance(old, int):
    try:
      return int(text)
    except ValueError:
      raise ConfigError(f"--config.{key}={text}: expected an integer") from None
  if isinstance(old, float):
    try:
      return float(text)
    except ValueError:
      raise ConfigError(f"--config.{key}={text}: expected a number") from None
  if isinstance(old, (tuple, list)):
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = tuple(t.strip() for t in text.split(",") if t.strip())
    if not isinstance(value, (tuple, list)):
      value = (value,)
    return tuple(value)
  if old is None:
    try:
      return ast.literal_eval(text)
    except (ValueError, SyntaxError):
      return text
  return text


def apply_overrides(config: ml_collections.ConfigDict, overrides: list[str]) -> ml_collections.ConfigDict:
  """Apply `--config.a.b=value` strings to a copy of `config`, locked against new keys."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.lock()
  for item in overrides:
    if not item.startswith("--config.") or "=" not in item:
      raise ConfigError(f"bad override {item!r}; use --config.section.key=value")
    key, text = item[len("--config."):].split("=", 1)
    node, parts = config, key.split(".")
    for p in parts[:-1]:
      if p not in node or not isinstance(node[p], ml_collections.ConfigDict):
        raise ConfigError(f"unknown config key {key!r} (no section {p!r})")
      node = node[p]
    if parts[-1] not in node:
      raise ConfigError(f"unknown config key {key!r}; known in this section: {', '.join(sorted(node.keys()))}")
    old = node[parts[-1]]
    if isinstance(old, ml_collections.ConfigDict):
      raise ConfigError(f"config key {key!r} is a section, not a value")
    with config.unlocked():
      node[parts[-1]] = _parse_value(text, old, key)
  return config


def config_digest(config: ml_collections.ConfigDict | dict) -> str:
  d = config.to_dict() if hasattr(config, "to_dict") else config
  return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _get(cfg, key: str):
  node = cfg
  for part in key.split("."):
    node = node[part]
  return node


# model.attention: XLA's attention, cuDNN's fused kernel, or "auto" (cuDNN only on a GPU, for
# bfloat16/float16 and a bias with batch dimension 1; see maskprior_jax.attention).
ATTENTION = ("xla", "cudnn", "auto")


def attention_record(cfg) -> dict | None:
  """What results.json records of the attention path: the config's request and the path the
  training step takes on this backend (float32 benchmark models, one bias shared by the batch)."""
  requested = cfg.get("model", {}).get("attention")
  if requested is None:
    return None
  import jax.numpy as jnp

  from maskprior_jax.attention import attention_implementation
  return {"requested": requested, "training_path": attention_implementation(requested, jnp.float32, 1)}


def check(cfg: ml_collections.ConfigDict, *, choices: dict | None = None, positive=(),
          multiples_of_steps_per_call=("train.steps", "eval.every_steps", "checkpoint.every_steps")) -> None:
  """The checks every benchmark's config needs, each failure one ConfigError naming the key:
  `choices` {key: allowed values}, `positive` keys (> 0), and step counts that must be
  multiples of train.steps_per_call."""
  choices = dict(choices or {})
  if "attention" in cfg.get("model", {}):
    choices["model.attention"] = ATTENTION
  if "batches" in cfg.get("train", {}):
    choices["train.batches"] = ("host", "device")
  if "grad_reduction" in cfg.get("train", {}):
    from maskprior_jax.train import GRAD_REDUCTIONS
    choices["train.grad_reduction"] = GRAD_REDUCTIONS
  for key, allowed in choices.items():
    if _get(cfg, key) not in allowed:
      raise ConfigError(f"{key} must be {' or '.join(map(str, allowed))}, not {_get(cfg, key)!r}")
  for key in positive:
    if not _get(cfg, key) > 0:
      raise ConfigError(f"{key} must be positive, got {_get(cfg, key)}")
  check_data_parallel(cfg)
  spc = cfg.train.steps_per_call
  if spc <= 0:
    raise ConfigError(f"train.steps_per_call must be positive, got {spc}")
  for key in multiples_of_steps_per_call:
    if _get(cfg, key) % spc:
      raise ConfigError(f"{key} ({_get(cfg, key)}) must be a multiple of train.steps_per_call ({spc})")


def check_data_parallel(cfg: ml_collections.ConfigDict) -> None:
  """train.data_parallel splits each batch over all devices: the batch must divide evenly."""
  if cfg.train.get("fsdp", False) and not cfg.train.get("data_parallel", False):
    raise ConfigError("train.fsdp shards the state over the data-parallel mesh: set train.data_parallel=true too")
  if cfg.train.get("fsdp", False) and cfg.train.get("grad_reduction", "xla") == "ordered":
    raise ConfigError("train.grad_reduction=ordered gathers every device's gradient: not with train.fsdp=true")
  if cfg.train.get("data_parallel", False):
    import jax
    n = jax.device_count()
    if cfg.train.batch_size % n:
      raise ConfigError(f"train.data_parallel: train.batch_size ({cfg.train.batch_size}) must divide by the "
                        f"{n} devices")
