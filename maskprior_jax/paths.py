"""Paths of run folders and checkpoints: `etils.epath.Path`, the type orbax uses, so a folder may
be local or on storage orbax writes to (`gs://bucket/...`, `s3://...`)."""
from __future__ import annotations

import os
import re

from etils import epath

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def path(p: str | os.PathLike) -> epath.Path:
  """A run-folder path: local (`runs/x`, `/data/x`) or on cloud storage (`gs://bucket/x`)."""
  return p if isinstance(p, epath.Path) else epath.Path(p)


def is_local(p: str | os.PathLike) -> bool:
  """Whether `p` is on the local file system (no `scheme://` prefix)."""
  return not _URI.match(os.fspath(p))


# What epath needs to open each kind of cloud folder (TensorFlow's file system opens all of them),
# and the package extra that installs it.
_STORAGE = {"gs": ("gcsfs", "gcs"), "s3": ("s3fs", None)}


class StorageError(ValueError):
  """A cloud folder whose file-system package is not installed."""


def check_storage(p: str | os.PathLike, flag: str = "--workdir") -> None:
  """Raise StorageError (one line, naming the package and the extra that installs it) where `p` is
  on cloud storage that nothing installed here can open; before any work is done."""
  import importlib.util
  scheme = os.fspath(p).split("://", 1)[0] if not is_local(p) else None
  if scheme not in _STORAGE:
    return
  package, extra = _STORAGE[scheme]
  if importlib.util.find_spec(package) is None and importlib.util.find_spec("tensorflow") is None:
    how = f"pip install 'maskprior-jax[{extra}]'" if extra else f"pip install {package}"
    raise StorageError(f"{flag} {os.fspath(p)} is on {scheme}:// storage, which needs {package} (not installed): "
                       f"{how}")
