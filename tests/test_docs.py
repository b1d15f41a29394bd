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
           "maskprior_jax.attention", "maskprior_jax.train", "maskprior_jax.checkpoint", "maskprior_jax.distributed"]


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


SCRIPT_BLOCK = re.compile(r"<!-- generated: (python experiments/\S+\.py --markdown \S+) -->\n(.*?)<!-- end -->", re.S)


@pytest.mark.parametrize("path", ["README.md", "docs/results/speed.md", "docs/results/boolean.md",
                                  "docs/results/accelerator_compile.md"])
def test_speed_tables_equal_what_their_script_prints(path):
  """Speed tables (loop efficiency, run scaling) are the `--markdown` output of the script named
  above them, from the committed JSON lines."""
  import subprocess
  blocks = SCRIPT_BLOCK.findall((REPO / path).read_text())
  assert blocks, f"{path}: no generated speed table"
  for command, text in blocks:
    out = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == text.strip(), f"rerun: {command}"
