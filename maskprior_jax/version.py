"""The package's version (its one source: pyproject.toml reads it) and the code a run came from.

`source()` names the git commit of the code that is running, and whether the tree held uncommitted
changes to tracked files: from git where the package runs from a checkout (an editable install, a
`PYTHONPATH` checkout), else from `_build_commit.json`, which `setup.py` writes into a built wheel.
"""
from __future__ import annotations

import functools
import json
import pathlib
import subprocess

__version__ = "0.3.0"

_PACKAGE = pathlib.Path(__file__).resolve().parent


def _git(*args: str) -> str:
  return subprocess.run(["git", "-C", str(_PACKAGE.parent), *args], capture_output=True, text=True,
                        check=True, timeout=10).stdout.strip()


@functools.lru_cache(maxsize=1)
def source() -> dict:
  """{"commit": the 40-hex commit, or None where unknown; "dirty": True/False/None}.

  A checkout counts only where the git work tree's top is the folder holding this package, so a
  wheel installed inside some other repository never reports that repository's commit."""
  try:
    if pathlib.Path(_git("rev-parse", "--show-toplevel")).resolve() == _PACKAGE.parent:
      return {"commit": _git("rev-parse", "HEAD"),
              "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}
  except (OSError, subprocess.SubprocessError):
    pass
  stamp = _PACKAGE / "_build_commit.json"
  if stamp.exists():
    info = json.loads(stamp.read_text())
    return {"commit": info.get("commit"), "dirty": info.get("dirty")}
  return {"commit": None, "dirty": None}
