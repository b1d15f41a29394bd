"""Runs a notebook's install cell the way Colab does: in a fresh virtual environment that already has
a JAX of its own, with nothing of this project but the repository's address (a local clone stands in
for GitHub). Checks that maskprior_jax then imports and that the installed jax and jaxlib are the ones
that were there before (Colab's accelerator build must stay).

  python colab/check_install_cell.py [--notebook 03_bring_your_own_model.ipynb] [--jax 0.6.0]

Needs the network to PyPI (the packages the cell installs); takes a few minutes."""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import nbformat

HERE = pathlib.Path(__file__).resolve().parent


def run(cmd, **kw):
  print("$", " ".join(map(str, cmd)), flush=True)
  return subprocess.run(cmd, check=True, text=True, **kw)


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--notebook", default="03_bring_your_own_model.ipynb")
  p.add_argument("--jax", default="0.6.0", help="the JAX the runtime has before the cell runs (default: %(default)s)")
  a = p.parse_args()
  tmp = pathlib.Path(tempfile.mkdtemp())
  clone = tmp / "repository"
  run(["git", "clone", "-q", str(HERE.parent), str(clone)])
  venv = tmp / "venv"
  run([sys.executable, "-m", "venv", str(venv)])
  py = venv / "bin" / "python"
  run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
  run([py, "-m", "pip", "install", "-q", f"jax=={a.jax}", f"jaxlib=={a.jax}"])
  versions = "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in ('jax', 'jaxlib')}))"
  before = json.loads(run([py, "-c", versions], capture_output=True).stdout)
  cell = nbformat.read(HERE / a.notebook, as_version=4).cells[1].source
  env = dict(os.environ, MASKPRIOR_REPOSITORY=f"git+file://{clone}", MASKPRIOR_SMOKE="1", JAX_PLATFORMS="cpu")
  out = run([py, "-c", cell], env=env, cwd=tmp, capture_output=True)
  print(out.stdout.strip())
  after = json.loads(run([py, "-c", versions], capture_output=True).stdout)
  mp = run([py, "-c", "import maskprior_jax, flax, optax; print(maskprior_jax.__version__, 'flax', flax.__version__, "
            "'optax', optax.__version__)"], capture_output=True).stdout.strip()
  print(f"before the cell: {before}; after: {after}; installed: maskprior_jax {mp}")
  if after != before:
    print("the install cell replaced the runtime's JAX")
    return 1
  print(f"{a.notebook}: the install cell installed maskprior-jax from the repository's address and kept jax {a.jax}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
