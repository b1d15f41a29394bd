"""Pages the docs build generates (called from conf.py): the config reference and the pictures of
the prior builders. Importable without Sphinx, so the tests check them too."""
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


def config_reference(path: pathlib.Path) -> None:
  lines = ["| key | default per built-in config | meaning |", "|---|---|---|"]
  for key, per, meaning in config_rows():
    if meaning is None:
      raise ValueError(f"config key {key} has no entry in maskprior_jax/bench/config_docs.py")
    values = {_cell(v) for v in per.values()}
    shown = values.pop() + " (all)" if len(values) == 1 and len(per) == len(BENCHMARKS) else \
        "<br>".join(f"{name}: {_cell(v)}" for name, v in per.items())
    escaped = meaning.replace("|", "\\|")
    lines.append(f"| `--config.{key}` | {shown} | {escaped} |")
  text = "\n".join(lines) + "\n"
  if not path.exists() or path.read_text() != text:
    path.write_text(text)


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
    for h in range(heads):
      im = axes[0, h].imshow(dense[h], cmap="viridis")
      axes[0, h].set(title=f"head {h}", xticks=[], yticks=[])
    fig.colorbar(im, ax=list(axes[0]), shrink=0.8, label="initial logit bias")
    fig.suptitle(f"priors.{name} (rows: queries, columns: keys)", fontsize=9)
    target = folder / f"{name}.png"
    fig.savefig(target, dpi=80)
    plt.close(fig)
