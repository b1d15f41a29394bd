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
