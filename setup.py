"""Only a build hook: a built wheel records the git commit it was built from
(maskprior_jax/_build_commit.json, read by `maskprior_jax.version.source()`). Everything else is in
pyproject.toml."""
import json
import pathlib
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent


def _git(*args):
  return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True,
                        timeout=10).stdout.strip()


class BuildPyWithCommit(build_py):
  def run(self):
    super().run()
    try:
      info = {"commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):   # an sdist outside git: the commit is unknown
      info = {"commit": None, "dirty": None}
    target = pathlib.Path(self.build_lib) / "maskprior_jax" / "_build_commit.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(info) + "\n")


setup(cmdclass={"build_py": BuildPyWithCommit})
