"""The committed notebooks are what colab/make_notebooks.py writes (cell kinds and texts)."""
import importlib.util
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"


def test_committed_notebooks_match_the_generator():
  spec = importlib.util.spec_from_file_location("make_notebooks", COLAB / "make_notebooks.py")
  gen = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(gen)
  assert sorted(gen.NOTEBOOKS) == sorted(p.name for p in COLAB.glob("*.ipynb"))
  for name, cells in gen.NOTEBOOKS.items():
    committed = nbformat.read(COLAB / name, as_version=4).cells
    assert [(c.cell_type, c.source) for c in committed] == [(c.cell_type, c.source) for c in cells], name


def _generator():
  spec = importlib.util.spec_from_file_location("make_notebooks", COLAB / "make_notebooks.py")
  gen = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(gen)
  return gen


@pytest.mark.parametrize("name,requirement", [("01_quickstart.ipynb", '"maskprior-jax[bench] @ " + repository'),
                                              ("02_boolean_headline.ipynb", '"maskprior-jax[bench] @ " + repository'),
                                              ("03_bring_your_own_model.ipynb",
                                               '"maskprior-jax @ " + repository, "matplotlib"'),
                                              ("04_vision_language.ipynb", '"maskprior-jax[data] @ " + repository')])
def test_install_cell_takes_the_repository_from_pyproject_and_keeps_jax(name, requirement):
  """The address is pyproject's [project.urls] Repository, stated once; each notebook installs only
  the extras it needs, with the runtime's jax and jaxlib pinned (Colab's accelerator build stays)."""
  import tomllib
  url = tomllib.loads((COLAB.parent / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
  setup = nbformat.read(COLAB / name, as_version=4).cells[1].source
  assert f'os.environ.get("MASKPRIOR_REPOSITORY", "git+{url}")' in setup
  assert requirement + "])" in setup
  assert '"-c", keep' in setup and 'for p in ("jax", "jaxlib")' in setup
  assert f"github/{url.removeprefix('https://github.com/')}/blob/main/colab/{name}" in \
      nbformat.read(COLAB / name, as_version=4).cells[0].source


def test_the_paper_headline_flop_count_is_the_compile_projections():
  """`projection.PAPER_HEADLINE_FLOP` (what notebook 02 states before it starts) equals the sum over
  the compiled programs of experiments/results/accelerator_compile, as the projection page sums it."""
  import json
  import sys
  from maskprior_jax.bench import projection
  from maskprior_jax.bench.config import builtin_config
  sys.path.insert(0, str(COLAB.parent / "experiments"))
  try:
    from accelerator_compile import PAPER_HEADLINE_TASKS
  finally:
    sys.path.pop(0)
  rows = [json.loads(line) for line in
          (COLAB.parent / "experiments/results/accelerator_compile/programs.jsonl").read_text().splitlines() if line]
  steps = builtin_config("boolean_paper").train.steps
  flop = 0.0
  for task, times in PAPER_HEADLINE_TASKS.items():
    mine = [r for r in rows if (r["target"], r["dtype"], r["config"], r["task"]) == ("h100", "float32", "boolean_paper", task)]
    assert mine, task
    flop += times * sum(r["flops_per_call"] * (r["calls_per_step"] * steps + (r["program"] == "eval")) for r in mine)
  assert abs(flop - projection.PAPER_HEADLINE_FLOP) <= 5e-4 * flop, flop
  line = projection.time_statement(flop, "NVIDIA H100 80GB HBM3")
  assert "about 10 min to 46 min" in line   # the projection page: 10.3 min at 45%, 46.4 min at 10%
  assert "time the first task alone" in projection.time_statement(flop, "some new accelerator")
