"""The docs: results pages are what `maskprior report` writes from the committed runs, every public
name has a docstring, every config key has a meaning, and the README stays a landing page."""
import importlib
import inspect
import pathlib
import re
import shlex
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
GENERATED = REPO / "docs" / "results" / "generated"
PAGES = sorted(GENERATED.glob("*.md"))
MODULES = ["maskprior_jax", "maskprior_jax.linen", "maskprior_jax.nnx", "maskprior_jax.priors", "maskprior_jax.optim",
           "maskprior_jax.attention", "maskprior_jax.train", "maskprior_jax.checkpoint", "maskprior_jax.distributed",
           "maskprior_jax.blockwise", "maskprior_jax.measure"]
# The modules whose docstrings hold runnable examples (a public name's home module, where doctest finds it).
DOCTEST_MODULES = ["maskprior_jax.attention", "maskprior_jax.layouts", "maskprior_jax.dot_product", "maskprior_jax.linen", "maskprior_jax.nnx",
                   "maskprior_jax.priors", "maskprior_jax.optim", "maskprior_jax.train.settings",
                   "maskprior_jax.train.state", "maskprior_jax.checkpoint", "maskprior_jax.distributed",
                   "maskprior_jax.measure"]
# The names a user reaches first: each has an example that runs.
HEADLINE = ["maskprior_jax.MaskPriorAttention", "maskprior_jax.linen.MultiHeadDotProductAttention",
            "maskprior_jax.nnx.MultiHeadAttention", "maskprior_jax.nnx.MaskPriorAttention",
            "maskprior_jax.mask_prior_optimizer", "maskprior_jax.nnx.mask_prior_optimizer",
            "maskprior_jax.dot_product_attention", *(f"maskprior_jax.priors.{n}" for n in
                                                      ("from_matrix", "group_matrix", "interaction_groups",
                                                       "locality_1d", "locality_2d"))]
SECTION = re.compile(r"^(Args|Attributes|Returns|Raises):$", re.M)


CHART_LINES = [line for line in (GENERATED / "REBUILD.sh").read_text().splitlines()
               if line.startswith("maskprior report") and "--chart" in line]


@pytest.mark.parametrize("line", CHART_LINES, ids=lambda line: line.split("--chart $G/")[1].split(".")[0])
def test_results_chart_draws_what_maskprior_report_draws(line, tmp_path, monkeypatch, capsys):
  """Each committed chart's numbers (its .json) are what `maskprior report --chart` draws from the
  committed runs; the picture is beside them."""
  from maskprior_jax.bench import cli
  argv = shlex.split(line.split(" > ")[0])[1:]
  name = argv[argv.index("--chart") + 1].replace("$G/", "")
  argv = [a.replace("$R", str(REPO / "experiments" / "results")) for a in argv]
  argv[argv.index("--chart") + 1] = str(tmp_path / name)
  assert cli.main(argv) == 0
  capsys.readouterr()
  committed = GENERATED / name
  assert committed.exists() and committed.stat().st_size > 10_000
  assert (tmp_path / name.replace(".png", ".json")).read_text() == committed.with_suffix(".json").read_text()


def test_speed_chart_draws_what_its_script_draws(tmp_path):
  import subprocess
  line = next(line for line in (GENERATED / "REBUILD.sh").read_text().splitlines()
              if line.startswith("python experiments/loop_efficiency.py") and "--chart" in line)
  argv = [a.replace("$R", "experiments/results") for a in shlex.split(line.split(" > ")[0])[1:]]
  name = argv[argv.index("--chart") + 1].replace("$G/", "")
  argv[argv.index("--chart") + 1] = str(tmp_path / name)
  subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, check=True)
  committed = GENERATED / name
  assert committed.exists() and committed.stat().st_size > 10_000
  assert (tmp_path / name.replace(".png", ".json")).read_text() == committed.with_suffix(".json").read_text()


def test_every_generated_page_has_a_rebuild_line():
  script = (GENERATED / "REBUILD.sh").read_text()
  assert len(PAGES) >= 8
  for page in PAGES:
    assert f"$G/{page.name}" in script, page.name


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_results_page_equals_what_maskprior_report_writes(page, tmp_path, monkeypatch, capsys):
  """The page names its own command; run it (in a scratch tree whose experiments/results is the
  repository's) and compare bytes."""
  from maskprior_jax.bench import cli
  command = re.search(r"```bash\n(maskprior report .*)\n```", page.read_text()).group(1)
  argv = shlex.split(command)[1:]
  (tmp_path / "experiments").mkdir()
  (tmp_path / "experiments" / "results").symlink_to(REPO / "experiments" / "results")
  (tmp_path / "docs" / "results" / "generated").mkdir(parents=True)
  monkeypatch.chdir(tmp_path)
  assert cli.main(argv) == 0
  capsys.readouterr()
  rebuilt = tmp_path / "docs" / "results" / "generated" / page.name
  assert rebuilt.read_bytes() == page.read_bytes(), f"rerun: {command}"


def _public(module):
  for name in module.__all__:
    obj = getattr(module, name)
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj):
      yield name, obj


@pytest.mark.parametrize("name", MODULES)
def test_every_public_name_has_a_docstring(name):
  module = importlib.import_module(name)
  assert module.__doc__ and module.__doc__.strip()
  missing = [n for n, obj in _public(module) if not (inspect.getdoc(obj) or "").strip()]
  assert not missing, f"{name}: {missing}"


def _functions_and_classes():
  """Every public function and class of MODULES, once (by where it is defined)."""
  seen = {}
  for name in MODULES:
    for n, obj in _public(importlib.import_module(name)):
      if not inspect.ismodule(obj):
        seen.setdefault((obj.__module__, obj.__qualname__), (f"{name}.{n}", obj))
  return list(seen.values())


def test_public_docstrings_have_args_or_attributes_sections():
  """Google-style sections (what napoleon renders as Flax's and Optax's pages do) for at least 90%
  of the public functions and classes; the rest are named here so that the list cannot grow."""
  names = _functions_and_classes()
  without = sorted(n for n, obj in names if not SECTION.search(inspect.getdoc(obj) or ""))
  assert len(names) >= 75
  assert len(without) <= 0.1 * len(names), without
  assert set(without) <= {"maskprior_jax.nnx.MaskPrior", "maskprior_jax.train.NonFiniteLoss",
                          "maskprior_jax.checkpoint.Preempted"}, without


@pytest.mark.parametrize("name", HEADLINE)
def test_headline_names_have_an_example(name):
  module, _, attr = name.rpartition(".")
  doc = inspect.getdoc(getattr(importlib.import_module(module), attr))
  assert "Example:" in doc and ">>> " in doc, name


@pytest.mark.parametrize("name", DOCTEST_MODULES)
def test_docstring_examples_run(name):
  """Every `>>>` example of the library's docstrings runs and prints what it shows."""
  import doctest
  result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (output above)"
  assert result.attempted > 0, name


def _generate_module():
  sys.path.insert(0, str(REPO / "docs"))
  try:
    import _generate
  finally:
    sys.path.remove(str(REPO / "docs"))
  return _generate


def test_api_pages_are_what_the_generator_writes():
  """docs/api holds exactly the pages `docs/_generate.py` writes (`python docs/_generate.py` rewrites
  them after a public name changes)."""
  pages = _generate_module().api_pages(REPO / "docs" / "api")
  assert set(pages) == set((REPO / "docs" / "api").glob("*.md"))
  stale = [p.name for p, text in pages.items() if p.read_text() != text]
  assert not stale, stale


def test_every_public_function_and_class_has_one_api_page():
  gen = _generate_module()
  documented = [gen._resolve(n)[2] for _, _, names in gen.API_TOPICS for n in names]
  assert len(documented) == len({id(o) for o in documented}), "an object is documented twice"
  missing = [n for n, obj in _functions_and_classes() if not any(obj is o for o in documented)]
  assert not missing, missing


def test_the_public_modules_declare_all():
  for name in MODULES:
    assert hasattr(importlib.import_module(name), "__all__"), name


def test_every_config_key_has_a_meaning():
  sys.path.insert(0, str(REPO / "docs"))
  try:
    import _generate
    rows = _generate.config_rows()
  finally:
    sys.path.remove(str(REPO / "docs"))
  assert len(rows) > 50
  missing = [key for key, _, meaning in rows if not meaning]
  assert not missing, f"add a line to maskprior_jax/bench/config_docs.py for {missing}"


def test_the_readme_is_a_landing_page():
  text = (REPO / "README.md").read_text()
  assert len(text.splitlines()) <= 250
  first_screen = "\n".join(text.splitlines()[:20])
  assert 'pip install ".[bench]" && maskprior boolean --workdir runs/boolean' in first_screen
  assert ('pip install ".[test]" && XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -q'
          in first_screen)
  for link in re.findall(r"\]\(((?:docs/)[^)#]+)\)", text):
    assert (REPO / link).exists(), link


SCRIPT_BLOCK = re.compile(r"<!-- generated: (python experiments/\S+\.py --markdown \S+(?: --brief)?) -->\n(.*?)<!-- end -->",
                          re.S)


@pytest.mark.parametrize("path", ["README.md", "docs/results/speed.md", "docs/results/boolean.md",
                                  "docs/results/accelerator_compile.md"])
def test_speed_tables_equal_what_their_script_prints(path, monkeypatch):
  """Speed tables (loop efficiency, run scaling) are the `--markdown` output of the script named
  above them, from the committed JSON lines."""
  blocks = SCRIPT_BLOCK.findall((REPO / path).read_text())
  assert blocks, f"{path}: no generated speed table"
  for command, text in blocks:
    assert _script_output(shlex.split(command)[1:], monkeypatch).strip() == text.strip(), f"rerun: {command}"


def _script_output(argv, monkeypatch):
  """What `python ARGV` prints on stdout, run in this process as a command would be (its own
  __main__, argv, working directory and import path): one Python start for every table."""
  import contextlib
  import io
  import runpy
  script = REPO / argv[0]
  out = io.StringIO()
  with monkeypatch.context() as m:
    m.chdir(REPO)
    m.setattr(sys, "argv", [str(script), *argv[1:]])
    m.syspath_prepend(str(script.parent))
    with contextlib.redirect_stdout(out):
      try:
        runpy.run_path(str(script), run_name="__main__")
      except SystemExit as e:
        assert not e.code, f"{argv}: exit status {e.code}"
  return out.getvalue()
