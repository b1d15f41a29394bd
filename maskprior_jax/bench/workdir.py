"""Run folders as users meet them: one command per folder at a time, atomic writes under
per-process names, and damaged files set aside instead of stopping the run.

- `WorkdirLock`: an advisory lock (`fcntl.flock`) on `<workdir>/.maskprior.lock`, holding the
  host, PID, start time and command. A second command on the folder stops with one line naming
  the holder. The kernel drops the lock when its process dies (kill -9 included); a later command
  finds the dead holder's record, takes the lock over and says so in one line.
- `read_json` / `read_jsonl`: a file that cannot be parsed is renamed `<name>.damaged-<time>`
  with a one-line warning, and the caller continues as if it were absent (finished runs are then
  rebuilt from their checkpoints, or rerun).
- `write_text` / `write_json` / `write_jsonl`: temp file + rename, the temp file named after the
  host and process so that two writers never share one.
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import sys
import time
from typing import Any, Callable

LOCK_NAME = ".maskprior.lock"


class WorkdirBusy(ValueError):
  """Another command holds the run folder (reported as one line, exit status 2)."""


def _holder_text(holder: dict) -> str:
  return (f"process {holder.get('pid', '?')} on {holder.get('host', '?')} (started {holder.get('started', '?')}: "
          f"{holder.get('command', '?')})")


class WorkdirLock:
  """One command per run folder. `acquire()` creates the folder if needed and takes the lock, or
  raises WorkdirBusy naming the holder; `release()` (or leaving the `with` block) clears it."""

  def __init__(self, workdir: pathlib.Path, command: str, stream=None):
    self.path = pathlib.Path(workdir) / LOCK_NAME
    self.command, self.stream, self.fd = command, stream or sys.stderr, None

  def acquire(self) -> "WorkdirLock":
    import fcntl
    self.path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = _read_holder(fd)
      os.close(fd)
      raise WorkdirBusy(f"{self.path.parent} is in use by {_holder_text(holder)}; wait for it to finish, "
                        "or use another --workdir") from None
    left = _read_holder(fd)
    if left:   # its holder ended without releasing it: killed, or its machine went down
      same_host = left.get("host") == socket.gethostname()
      gone = "no longer running" if same_host else "on another host; its lock is free"
      print(f"maskprior: note: {self.path.parent} was locked by {_holder_text(left)}, {gone}; taking it over",
            file=self.stream)
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": self.command}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    os.fsync(fd)
    self.fd = fd
    return self

  def release(self) -> None:
    if self.fd is None:
      return
    import fcntl
    os.ftruncate(self.fd, 0)   # an empty lock file: released cleanly (a record left means a crash)
    fcntl.flock(self.fd, fcntl.LOCK_UN)
    os.close(self.fd)
    self.fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


def _read_holder(fd: int) -> dict:
  try:
    data = os.pread(fd, 4096, 0)
    return json.loads(data) if data.strip() else {}
  except (OSError, ValueError):
    return {"pid": "?", "host": "?", "command": "unreadable lock record"}


def _tmp(path: pathlib.Path) -> pathlib.Path:
  return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def write_text(path: pathlib.Path, text: str) -> None:
  """Write atomically: a temp file named after this host and process, then a rename, so an
  interrupted write never leaves half a file and two writers never share a temp file."""
  path = pathlib.Path(path)
  tmp = _tmp(path)
  try:
    tmp.write_text(text)
  except OSError:   # e.g. a full disk: no half-written temporary file is left behind
    tmp.unlink(missing_ok=True)
    raise
  from maskprior_jax import faults
  faults.point("write")
  os.replace(tmp, path)


def _json_default(o):
  import numpy as np
  if isinstance(o, (np.floating, np.integer)):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  return str(o)


def write_json(path: pathlib.Path, obj: Any) -> None:
  write_text(path, json.dumps(obj, indent=1, default=_json_default))


def write_jsonl(path: pathlib.Path, rows) -> None:
  write_text(path, "".join(json.dumps(r, default=_json_default) + "\n" for r in rows))


def set_aside(path: pathlib.Path, why: str, stream=None) -> pathlib.Path:
  """Rename a damaged file `<name>.damaged-<time>` (nothing is deleted) and say so in one line."""
  path = pathlib.Path(path)
  aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
  os.replace(path, aside)
  print(f"maskprior: warning: {path} is unreadable ({why}); moved to {aside.name}, continuing from what "
        "is intact", file=stream or sys.stderr)
  return aside


def reason(e: Exception) -> str:
  """An exception's first line, short enough for a one-line message."""
  return str(e).splitlines()[0][:120] if str(e).strip() else type(e).__name__


def _read(path: pathlib.Path, parse: Callable[[str], Any], move: bool):
  """`parse(text)` of the file, or None when it is absent or `parse` raises ValueError (a damaged
  file, set aside when `move`)."""
  path = pathlib.Path(path)
  if not path.exists():
    return None
  try:
    return parse(path.read_text())
  except (ValueError, UnicodeDecodeError) as e:
    if move:
      set_aside(path, reason(e))
    return None


def read_json(path: pathlib.Path, check: Callable[[Any], bool] = lambda obj: True, *, move: bool = True):
  """The parsed file, or None when it is absent or damaged (unparsable, or `check` says its
  content is not what this file holds). A damaged file is set aside when `move` (the process
  that writes the folder), and left in place otherwise."""
  def parse(text):
    obj = json.loads(text)
    if not check(obj):
      raise ValueError("not the content this file holds")
    return obj
  return _read(path, parse, move)


def read_jsonl(path: pathlib.Path, *, move: bool = True) -> list | None:
  """As `read_json`, for a JSON-lines file."""
  def parse(text):
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(r, dict) for r in rows):
      raise ValueError("a line is not a record")
    return rows
  return _read(path, parse, move)
