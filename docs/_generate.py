"""What the docs build generates (called from conf.py): the config reference and the pictures of the
prior builders (made at build time, into the output folder only), and the API reference's pages
(committed; a test checks that they are what `api_pages` writes). Importable without Sphinx, so the
tests check them too."""
from __future__ import annotations

import pathlib

BENCHMARKS = ("boolean", "boolean_paper", "arithmetic", "vision", "language")


def config_rows():
  """(key, {config: default}, meaning) for every key of every built-in config."""
  from flax import traverse_util

  from maskprior_jax.bench.config import builtin_config
  from maskprior_jax.bench.config_docs import KEY_DOCS
  defaults: dict[str, dict[str, object]] = {}
  for name in BENCHMARKS:
    flat = traverse_util.flatten_dict(builtin_config(name).to_dict(), sep=".")
    for key, value in flat.items():
      defaults.setdefault(key, {})[name] = value
  return [(key, defaults[key], KEY_DOCS.get(key)) for key in sorted(defaults)]


def _cell(value) -> str:
  text = repr(value) if isinstance(value, str) else str(value)
  return "`" + text.replace("|", "\\|") + "`"


def config_table() -> str:
  """The config reference, a Markdown table: every --config key, its default per built-in config and
  its meaning."""
  lines = ["| key | default per built-in config | meaning |", "|---|---|---|"]
  for key, per, meaning in config_rows():
    if meaning is None:
      raise ValueError(f"config key {key} has no entry in maskprior_jax/bench/config_docs.py")
    values = {_cell(v) for v in per.values()}
    shown = values.pop() + " (all)" if len(values) == 1 and len(per) == len(BENCHMARKS) else \
        "<br>".join(f"{name}: {_cell(v)}" for name, v in per.items())
    escaped = meaning.replace("|", "\\|")
    lines.append(f"| `--config.{key}` | {shown} | {escaped} |")
  return "\n".join(lines) + "\n"


PRIOR_EXAMPLES = ("interaction_groups", "from_matrix", "locality_1d", "locality_2d")


def prior_pictures(folder: pathlib.Path) -> None:
  """One PNG per builder in `maskprior_jax.priors`: the initial bias of a small example, per head."""
  import jax
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  from maskprior_jax import priors
  from maskprior_jax.attention import expand_mask
  folder.mkdir(parents=True, exist_ok=True)
  key = jax.random.key(0)
  examples = {
      "interaction_groups": (priors.interaction_groups([[0, 1, 2], [3, 4], [5, 6, 7]], outside=-4.0)(key, (4, 8, 8)),
                             "full", {}),
      "from_matrix": (priors.from_matrix(priors.group_matrix([[0, 2, 4], [1, 3]], 8, num_heads=2))(key, (2, 8, 8)),
                      "full", {}),
      "locality_1d": (priors.locality_1d()(key, (4, 2 * 8 - 1)), "relative_1d", {"max_len": 8}),
      "locality_2d": (priors.locality_2d((4, 4))(key, (4, 7 * 7)), "relative_2d", {"grid": (4, 4)}),
  }
  for name, (stored, kind, kw) in examples.items():
    dense = np.asarray(expand_mask(stored, kind, 16 if kind == "relative_2d" else 8,
                                   16 if kind == "relative_2d" else 8, **kw))
    heads = dense.shape[0]
    fig, axes = plt.subplots(1, heads, figsize=(2.0 * heads, 2.1), squeeze=False)
    low, high = float(dense.min()), float(dense.max())   # one colour scale for every head of the figure
    for h in range(heads):
      im = axes[0, h].imshow(dense[h], cmap="viridis", vmin=low, vmax=high if high > low else low + 1.0)
      axes[0, h].set(title=f"head {h}", xticks=[], yticks=[])
    fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label="initial logit bias")
    fig.suptitle(f"priors.{name} (rows: queries, columns: keys)", fontsize=9)
    target = folder / f"{name}.png"
    fig.savefig(target, dpi=80)
    plt.close(fig)


# The API reference: one page per public function or class under its canonical (shortest public)
# name, grouped by topic as Optax's reference is. `api_pages` writes the pages (committed;
# tests/test_docs.py checks that they are what it writes and that every public name has one).
API_TOPICS = [
    ("Attention modules", "The mask prior inside attention: the library's own module, the exact drop-ins for "
     "Flax's Linen and NNX classes, and the NNX variable type.",
     ["maskprior_jax.MaskPriorAttention", "maskprior_jax.MaskSettings", "maskprior_jax.linen.MultiHeadDotProductAttention",
      "maskprior_jax.linen.SelfAttention", "maskprior_jax.nnx.MaskPriorAttention", "maskprior_jax.nnx.MultiHeadAttention",
      "maskprior_jax.nnx.MaskPrior"]),
    ("Priors", "Initializers built from a task's structure (which positions interact).",
     ["maskprior_jax.priors.interaction_groups", "maskprior_jax.priors.group_matrix", "maskprior_jax.priors.from_matrix",
      "maskprior_jax.priors.locality_1d", "maskprior_jax.priors.locality_2d", "maskprior_jax.priors.alibi_slopes"]),
    ("Optimizers", "optax rules that give the mask prior its own learning rate and decay, or freeze it.",
     ["maskprior_jax.mask_prior_optimizer", "maskprior_jax.nnx.mask_prior_optimizer", "maskprior_jax.with_mask_transform",
      "maskprior_jax.optim.mask_rules", "maskprior_jax.optim.base_optimizer", "maskprior_jax.optim.DecayRule",
      "maskprior_jax.optim.clipped", "maskprior_jax.optim.collection_labels", "maskprior_jax.optim.weight_matrices",
      "maskprior_jax.optim.query_key_kernels", "maskprior_jax.optim.add_decayed_weights_toward_init",
      "maskprior_jax.optim.DecayTowardInitState"]),
    ("Attention functions", "Dot-product attention with an additive bias, by implementation (XLA, cuDNN, blockwise).",
     ["maskprior_jax.dot_product_attention", "maskprior_jax.blockwise.blockwise_attention",
      "maskprior_jax.attention.heads_folded_attention", "maskprior_jax.attention.with_prior_bias",
      "maskprior_jax.attention.attention_implementation", "maskprior_jax.attention.cudnn_unsupported",
      "maskprior_jax.attention.for_platform", "maskprior_jax.attention.target_platform"]),
    ("Mask layouts", "How each mask kind stores its bias and expands it; the decoding cache step.",
     ["maskprior_jax.attention.MaskLayout", "maskprior_jax.attention.mask_shape", "maskprior_jax.attention.expand_mask",
      "maskprior_jax.attention.dense_mask_bias", "maskprior_jax.attention.relative_1d_index",
      "maskprior_jax.attention.relative_2d_index", "maskprior_jax.attention.decode_step",
      "maskprior_jax.attention.dropout_shape"]),
    ("Training loop", "Many runs in one compiled program: settings, state, steps, placements and the loop.",
     ["maskprior_jax.train.train_seeds", "maskprior_jax.train.LoopSettings", "maskprior_jax.train.TrainState",
      "maskprior_jax.train.create_state", "maskprior_jax.train.make_train_step",
      "maskprior_jax.train.make_generating_train_step", "maskprior_jax.train.make_eval_step",
      "maskprior_jax.train.DeviceBatches", "maskprior_jax.train.Placement", "maskprior_jax.train.loop_step",
      "maskprior_jax.train.Stepper", "maskprior_jax.train.stepper", "maskprior_jax.train.RunBlocks",
      "maskprior_jax.train.stack_trees", "maskprior_jax.train.Progress", "maskprior_jax.train.NonFiniteLoss"]),
    ("Sharding", "Meshes and shardings for data-parallel and FSDP runs.",
     ["maskprior_jax.train.data_mesh", "maskprior_jax.train.batch_sharding", "maskprior_jax.train.replicated",
      "maskprior_jax.train.fsdp_sharding"]),
    ("Checkpoints", "Exact resume and preemption.",
     ["maskprior_jax.checkpoint.Checkpointer", "maskprior_jax.checkpoint.Preempted",
      "maskprior_jax.checkpoint.SigtermFlag", "maskprior_jax.checkpoint.tree_sha256"]),
    ("Multi-host", "JAX's distributed runtime, and each process's share of the work.",
     ["maskprior_jax.distributed.initialize", "maskprior_jax.distributed.detect_cluster",
      "maskprior_jax.distributed.started", "maskprior_jax.distributed.heartbeat_timeout",
      "maskprior_jax.distributed.is_main_process", "maskprior_jax.distributed.process_slice",
      "maskprior_jax.distributed.process_part", "maskprior_jax.distributed.take_part",
      "maskprior_jax.distributed.global_batch", "maskprior_jax.distributed.barrier",
      "maskprior_jax.distributed.broadcast_flag", "maskprior_jax.distributed.host_tree"]),
    ("Measurements", "How persistent a prior is: attention maps, their distance to a pattern, the mask's drift.",
     ["maskprior_jax.measure.attention_maps", "maskprior_jax.measure.total_variation",
      "maskprior_jax.measure.target_attention", "maskprior_jax.measure.mask_drift",
      "maskprior_jax.measure.apply_in_chunks"]),
]
# Constants under the module that assigns them (where autodoc reads their `#:` comments); each is
# also importable from the module named in its own line.
API_CONSTANTS = ["maskprior_jax.attention.MASK_PRIOR", "maskprior_jax.attention.ATTENTION_WEIGHTS",
                 "maskprior_jax.layouts.MASK_KINDS", "maskprior_jax.layouts.MASK_LAYOUTS",
                 "maskprior_jax.dot_product.IMPLEMENTATIONS", "maskprior_jax.dot_product.PLATFORMS",
                 "maskprior_jax.optim.PRIOR_LEAF", "maskprior_jax.nnx.WRT",
                 "maskprior_jax.train.settings.GRAD_REDUCTIONS", "maskprior_jax.train.state.UPDATED_COLLECTIONS"]


API_MODULES = ["maskprior_jax", "maskprior_jax.attention", "maskprior_jax.linen", "maskprior_jax.nnx",
               "maskprior_jax.priors", "maskprior_jax.optim", "maskprior_jax.layouts", "maskprior_jax.blockwise",
               "maskprior_jax.train", "maskprior_jax.checkpoint", "maskprior_jax.distributed", "maskprior_jax.measure"]


def _resolve(name: str):
  import importlib
  module, _, attr = name.rpartition(".")
  return importlib.import_module(module), attr, getattr(importlib.import_module(module), attr)


def _members(obj) -> list[str]:
  """The methods a class page documents: `__call__` and the public methods and properties the class
  itself defines (never dataclass fields or inherited Flax members)."""
  import inspect
  names = []
  for n, v in vars(obj).items():
    if n == "__call__" or (not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, property))):
      if (inspect.getdoc(v) or "").strip():
        names.append(n)
  return names


def api_page(name: str) -> str:
  import inspect
  module, attr, obj = _resolve(name)
  kind = "exception" if inspect.isclass(obj) and issubclass(obj, BaseException) else \
      "class" if inspect.isclass(obj) else "function"
  lines = [f"# `{name.removeprefix('maskprior_jax.')}`", "", "```{eval-rst}", f".. currentmodule:: {module.__name__}",
           "", f".. auto{kind}:: {attr}"]
  if kind == "class":
    members = _members(obj)
    lines += ([f"   :members: {', '.join(members)}"] if members else []) + ["   :show-inheritance:"]
  return "\n".join(lines + ["```", ""])


def api_index() -> str:
  lines = ["# API reference", "",
           "Every public function and class, by topic, under its shortest public name (names re-exported by "
           "`maskprior_jax` are documented once, there). Each name links to its own page: signature, "
           "arguments with their shapes, return values, errors and, for the names a user reaches first, an "
           "example that the test suite runs.", ""]
  toc = []
  for title, blurb, names in API_TOPICS:
    lines += [f"## {title}", "", blurb, "", "```{eval-rst}", ".. currentmodule:: maskprior_jax", "",
              ".. autosummary::", ""]
    lines += [f"   {n.removeprefix('maskprior_jax.')}" for n in names]   # shown as written: nnx.X, linen.X
    lines += ["```", ""]
    toc += names
  lines += ["## Constants", "", "```{eval-rst}"]
  for n in API_CONSTANTS:
    module, attr, _ = _resolve(n)
    lines += [f".. autodata:: {n}", *(["   :no-value:"] if attr == "MASK_LAYOUTS" else []), ""]
  lines += ["```", "", "## Modules", "", "What each module holds (its docstring); its public names are above.", "",
            "```{eval-rst}"]
  for module in API_MODULES:
    lines += [f".. automodule:: {module}", "   :no-members:", ""]
  lines += ["```", "", "```{toctree}", ":hidden:", ""] + toc + ["```", ""]
  return "\n".join(lines)


def api_pages(folder: pathlib.Path) -> dict[str, str]:
  """{path: text} of the API reference (index and one page per name) under `folder`."""
  pages = {folder / "index.md": api_index()}
  for _, _, names in API_TOPICS:
    for name in names:
      pages[folder / f"{name}.md"] = api_page(name)
  return pages


if __name__ == "__main__":   # python docs/_generate.py: rewrite docs/api after a public name changes
  folder = pathlib.Path(__file__).resolve().parent / "api"
  for old in folder.glob("*.md"):
    old.unlink()
  for path, text in api_pages(folder).items():
    path.write_text(text)
  print(f"wrote {len(list(folder.glob('*.md')))} pages into {folder}")
