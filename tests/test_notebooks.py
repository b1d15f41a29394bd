"""Every Colab notebook runs headless, offline, in smoke mode (MASKPRIOR_SMOKE=1)."""
import pathlib

import pytest
from cli_args import xla_flags

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
pytestmark = pytest.mark.notebook


def test_every_notebook_is_here():
  assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_boolean_headline.ipynb",
                                         "03_bring_your_own_model.ipynb", "04_vision_language.ipynb"]


def _execute(nb, tmp_path):
  """Run every cell of `nb` in place (its outputs are filled in), from `tmp_path`; no cell may fail."""
  nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}}).execute()
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
  assert not errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
  """Each notebook, executed headless and offline in smoke mode. The vision notebook takes the path
  Colab takes for MNIST (tfds.builder(...).download_and_prepare(), then the benchmark's
  tfds.data_source reader) on a small image dataset prepared here as array_record files, which the
  notebook's kernel finds in MASKPRIOR_TFDS_DIR (nothing downloaded; the builder class is not even
  imported there). Its other dataset, the embedded digits (outside Colab), differs only in the
  dataset's name; that benchmark is tested in tests/test_vision_language.py."""
  monkeypatch.setenv("MASKPRIOR_SMOKE", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("XLA_FLAGS", xla_flags())
  vision = path.name == "04_vision_language.ipynb"
  if vision:
    tfds = pytest.importorskip("tensorflow_datasets")
    PIL = pytest.importorskip("PIL.Image")
    from test_vision_language import _builders
    images, _ = _builders(tfds, PIL)
    images(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
    monkeypatch.setenv("MASKPRIOR_VISION_DATASET", "maskprior_tiny_images")
    monkeypatch.setenv("MASKPRIOR_TFDS_DIR", str(tmp_path / "tfds"))
  nb = nbformat.read(path, as_version=4)
  first = nb.cells[0]
  assert first.cell_type == "markdown" and "colab-badge.svg" in first.source
  assert "pip" in nb.cells[1].source                       # installs what it needs first
  _execute(nb, tmp_path)
  if vision:
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "vision dataset: maskprior_tiny_images" in text
