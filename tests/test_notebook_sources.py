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
