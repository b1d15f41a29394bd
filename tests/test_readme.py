import json
import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"


def _docs_text() -> str:
  """The README and every hand-written docs page (the results' analysis moved there from the README)."""
  return "\n".join([README.read_text()] + [p.read_text() for p in sorted(DOCS.rglob("*.md"))])


def test_readme_example_runs_and_trains_the_mask():
  code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
  scope = {}
  exec(compile(code, "README.md", "exec"), scope)
  import jax
  import maskprior_jax as mp
  import numpy as np
  v0 = scope["model"].init(jax.random.key(0), scope["x"])
  b0 = jax.tree.leaves(v0[mp.MASK_PRIOR])[0]
  b1 = jax.tree.leaves(scope["variables"][mp.MASK_PRIOR])[0]
  assert b0.shape == (4, 16, 16)
  assert not np.array_equal(np.asarray(b0), np.asarray(b1))


def test_readme_nnx_example_runs_and_moves_the_mask():
  code = re.findall(r"```python\n(.*?)```", (DOCS / "guides" / "nnx.md").read_text(), re.S)[0]
  assert "nnx" in code
  scope = {}
  exec(compile(code, "README.md", "exec"), scope)
  import jax
  import numpy as np
  from flax import nnx

  from maskprior_jax import nnx as mpx
  fresh = scope["MyModel"](nnx.Rngs(0))
  b0 = jax.tree.leaves(nnx.state(fresh, mpx.MaskPrior))[0]
  b1 = jax.tree.leaves(nnx.state(scope["model"], mpx.MaskPrior))[0]
  assert b0.shape == (4, 16, 16) and not np.array_equal(np.asarray(b0), np.asarray(b1))


def test_report_on_the_headline_results_reproduces_the_readme_tables(capsys):
  from maskprior_jax.bench import cli
  assert cli.main(["report", str(README.parent / "experiments" / "results" / "boolean_headline")]) == 0
  out = capsys.readouterr().out
  # the headline table, the structure-only bound's note and the excess table: on the README's first page
  tables = out.split("\n\n")[:3]
  text = README.read_text()
  for table in tables:
    assert table.strip() and table.strip() in text
  assert "structure-only bound" in tables[0] and "Excess over the structure-only bound" in tables[1]


def test_report_reads_the_committed_arithmetic_vision_and_language_runs(capsys, tmp_path):
  from maskprior_jax.bench import cli
  results = README.parent / "experiments" / "results"
  assert cli.main(["report", str(results / "arithmetic"), str(results / "vision"), str(results / "language"),
                   "--out", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  # the README's arithmetic tables (final and per seed, selected on validation) and claim lines,
  # rebuilt from results.json
  arith = out[:out.index("Digit accuracy")].split("\n\n")
  shown = [b for before, b in zip(arith, arith[1:]) if before.startswith(("Test exact match", "Per seed"))]
  shown += [b for b in arith if b.startswith(("Largest training size", "Runs ending"))]
  assert len(shown) == 6
  for block in shown:
    assert block.strip() in _docs_text(), block
  assert "| mask | 5 | 0.96 ± 0.01 | -0.2 points vs qk |" in out
  assert "| mask | 5 | 2.01 ± 0.012 | -0.8% vs bias_zero |" in out
  # the README's hand-written vision and language tables: each method's mean ± std and per-seed
  # values, formatted from results.json
  text = (DOCS / "results" / "vision_language.md").read_text()
  section = text[text.index("# Results: vision and language"):]
  tables = {"vision": section[section.index("**Vision**"):section.index("**Language**")],
            "language": section[section.index("**Language**"):section.index("Persistence (attention TV")]}
  for bench, key in (("vision", "test_accuracy"), ("language", "test_bits_per_char")):
    runs = json.loads((results / bench / "results.json").read_text())["runs"]
    for method in sorted({r["method"] for r in runs}):
      vals = [r[key] for r in sorted(runs, key=lambda r: r["seed"]) if r["method"] == method]
      row = next(ln for ln in tables[bench].splitlines() if ln.startswith(f"| {method} "))
      assert f"{np.mean(vals):.3f} ± {np.std(vals):.3f}" in row, (bench, row)
      assert row.rstrip(" |").endswith(", ".join(f"{v:.3f}" for v in vals)), (bench, row)
  assert (tmp_path / "arithmetic_0" / "exact_match_vs_train_size.png").exists()


def test_every_maskprior_command_in_the_cluster_section_and_the_sbatch_script_parses():
  """The commands of "Where to run it" (README) and experiments/cluster/slurm.sbatch are ones the
  CLI accepts: arguments parse and the --config overrides apply to the named config."""
  import shlex

  from maskprior_jax.bench import cli
  from maskprior_jax.bench.config import apply_overrides, load_config_file
  section = (DOCS / "guides" / "running.md").read_text()
  sbatch = (README.parent / "experiments" / "cluster" / "slurm.sbatch").read_text().replace("\\\n", " ")
  blocks = "".join(re.findall(r"```bash\n(.*?)```", section, re.S)) + sbatch
  lines = re.findall(r"maskprior (?:boolean|arithmetic|vision|language) [^'\n]*", blocks)
  assert len(lines) >= 4
  for line in lines:
    argv = shlex.split(line)[1:]
    args = cli.build_parser().parse_args([a for a in argv if not a.startswith("--config.")])
    assert args.distributed == "auto"
    apply_overrides(load_config_file(str(README.parent / args.config)), [a for a in argv if a.startswith("--config.")])


def test_report_on_the_headline_results_rebuilds_the_readme_attribution_table(capsys):
  from maskprior_jax.bench import cli
  assert cli.main(["report", str(README.parent / "experiments" / "results" / "boolean_headline")]) == 0
  out = capsys.readouterr().out
  table = next(c for c in out.split("\n\n") if c.startswith("| task | vanilla (fitted)"))
  assert "| mask_positions (fitted) |" in table and table.strip() in (DOCS / "results" / "boolean.md").read_text()
