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

Every run-folder path is an `etils.epath.Path` (`maskprior_jax.paths.path`), the type orbax uses, so a workdir may be
local or on storage orbax writes to (`gs://...`, `s3://...`). On such storage (`is_local` false)
there is no kernel lock and no rename: an object is published only when its upload completes, so
writes go straight to the object, and the lock is a record its holder refreshes (see `WorkdirLock`).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Callable

from etils import epath

from maskprior_jax.bench import console
from maskprior_jax.paths import StorageError, check_reachable, check_storage as check_path, is_local, path

__all__ = ["LOCK_NAME", "StorageError", "WorkdirBusy", "WorkdirLock", "check_storage", "is_local", "path",
           "kept", "read_json", "read_jsonl", "reason", "set_aside", "write_figure", "write_json", "write_jsonl", "write_text"]

LOCK_NAME = ".maskprior.lock"
REMOTE_REFRESH_S = 30   # on cloud storage, the lock's holder rewrites its record this often
REMOTE_STALE_S = 120    # and a record not rewritten for this long is a command that no longer runs
REMOTE_SETTLE_S = 1.0   # after writing its record, a command reads it back this much later


class WorkdirBusy(ValueError):
  """Another command holds the run folder (reported as one line, exit status 2)."""


def _holder_text(holder: dict) -> str:
  return (f"process {holder.get('pid', '?')} on {holder.get('host', '?')} (started {holder.get('started', '?')}: "
          f"{holder.get('command', '?')})")


class WorkdirLock:
  """One command per run folder. `acquire()` creates the folder if needed and takes the lock, or
  raises WorkdirBusy naming the holder; `release()` (or leaving the `with` block) clears it.

  On cloud storage no process can hold a lock that dies with it, so the lock is the record alone,
  rewritten by its holder every `REMOTE_REFRESH_S` seconds. A second command stops with one line
  naming the holder while the holder still runs: while its record is younger than `REMOTE_STALE_S`
  and, on this host, its process exists. A record older than that, or left by a process gone from
  this host, is named in a one-line note and taken over. Two commands that write their records at
  the same moment: the one whose record is read back holds the folder, the other stops."""

  def __init__(self, workdir: str | os.PathLike, command: str, stream=None):
    self.path = path(workdir) / LOCK_NAME
    self.command, self.stream, self.fd, self.remote = command, stream or console.screen(), None, False
    self._object = None

  def _record(self) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": self.command, "refreshed": time.time(), "token": os.urandom(8).hex()}

  def _acquire_remote(self) -> "WorkdirLock":
    record = _GcsObject.of(self.path)
    if record is not None:
      return self._acquire_by_generation(record)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    left = _parse_holder(self.path.read_bytes()) if self.path.exists() else {}
    if left:
      self._take_over(left)
    mine = self._record()
    self.path.write_text(json.dumps(mine))
    time.sleep(REMOTE_SETTLE_S)   # two commands that wrote at once: the last write holds the folder
    now = _parse_holder(self.path.read_bytes())
    if now.get("token") != mine["token"]:
      raise WorkdirBusy(f"{self.path.parent} is in use by {_holder_text(now)}, which took it at the same "
                        "moment; wait for it to finish, or use another --workdir")
    self.remote, self._stop = True, threading.Event()
    threading.Thread(target=self._refresh, args=(mine,), daemon=True).start()
    return self

  def _take_over(self, left: dict) -> None:
    """A record left on cloud storage: WorkdirBusy while its holder still runs, else a one-line note
    that this command takes the folder over."""
    running = _still_running(left)
    if running:
      raise WorkdirBusy(f"{self.path.parent} is in use by {_holder_text(left)}; {running}; wait for it to "
                        "finish, or use another --workdir")
    print(f"maskprior: note: {self.path.parent} was locked by {_holder_text(left)}, which no longer runs "
          f"(no process {left.get('pid')} on this host, or its record not refreshed for {REMOTE_STALE_S} s); "
          "taking it over", file=self.stream)

  def _acquire_by_generation(self, obj: "_GcsObject") -> "WorkdirLock":
    """Cloud Storage: the record is created only where none exists (`ifGenerationMatch=0`), and one
    left by a released or stale holder is replaced only at the generation that was read, so of two
    commands that race exactly one's write succeeds; the other stops naming the winner."""
    mine = self._record()
    try:
      obj.write(json.dumps(mine), 0)
    except FileExistsError:
      left, generation = obj.read()
      if left:
        self._take_over(left)
      try:
        obj.write(json.dumps(mine), generation)
      except FileExistsError:
        raise WorkdirBusy(f"{self.path.parent} is in use by {_holder_text(obj.read()[0])}, which took it at the "
                          "same moment; wait for it to finish, or use another --workdir") from None
    self.remote, self._stop, self._object = True, threading.Event(), obj
    threading.Thread(target=self._refresh, args=(mine,), daemon=True).start()
    return self

  def _refresh(self, record: dict) -> None:
    """Rewrite the record every REMOTE_REFRESH_S seconds while the lock is held: a record older
    than REMOTE_STALE_S belongs to a command that no longer runs. On Cloud Storage only the
    generation this command wrote is replaced: a record another command wrote is left to it."""
    while not self._stop.wait(REMOTE_REFRESH_S):
      text = json.dumps({**record, "refreshed": time.time()})
      try:
        if self._object is None:
          self.path.write_text(text)
        else:
          self._object.write(text, self._object.generation)
      except FileExistsError:
        print(f"maskprior: warning: another command took over {self.path.parent} (this one's lock record was "
              f"not refreshed for {REMOTE_STALE_S} s); stop one of them", file=self.stream)
        return
      except OSError:   # storage unreachable for a moment: the next refresh tries again
        continue

  def acquire(self) -> "WorkdirLock":
    if not is_local(self.path):
      return self._acquire_remote()
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
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(self._record()).encode(), 0)
    os.fsync(fd)
    self.fd = fd
    return self

  def release(self) -> None:
    if self.remote:
      self._stop.set()
      try:   # an empty record: released cleanly (on Cloud Storage, only the record this command wrote)
        self.path.write_text("") if self._object is None else self._object.write("", self._object.generation)
      except FileExistsError:
        pass
      self.remote = False
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


class _GcsObject:
  """One object on Cloud Storage written under generation preconditions (gcsfs's JSON API), the
  way Cloud Storage makes a create or a replace atomic."""

  def __init__(self, fs, p: epath.Path):
    self.fs, self.generation = fs, None
    self.bucket, _, self.key = os.fspath(p)[len("gs://"):].partition("/")

  @classmethod
  def of(cls, p: epath.Path) -> "_GcsObject | None":
    """For a gs:// path that gcsfs serves; None otherwise (another store, or a stand-in file system)."""
    if not os.fspath(p).startswith("gs://"):
      return None
    try:
      import fsspec
      import gcsfs
    except ImportError:
      return None
    fs = fsspec.filesystem("gs")
    return cls(fs, p) if isinstance(fs, gcsfs.GCSFileSystem) else None

  def read(self) -> tuple[dict, int]:
    """The record and its generation ({} for an empty record; generation 0 where there is none)."""
    try:
      headers, data = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, alt="media")
    except FileNotFoundError:
      return {}, 0
    return _parse_holder(data), int(headers.get("X-Goog-Generation") or headers.get("x-goog-generation"))

  def write(self, text: str, if_generation: int) -> None:
    """Write the object only where its generation is `if_generation` (0: only where it does not
    exist); FileExistsError (HTTP 412) otherwise. Remembers the generation written."""
    meta = json.dumps({"name": self.key})
    body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
            f"Content-Type: application/json\n\n{text}\n--==0==--").encode()
    out = self.fs.call("POST", f"{self.fs._location}/upload/storage/v1/b/{self.bucket}/o", uploadType="multipart",
                       headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body, json_out=True,
                       ifGenerationMatch=str(if_generation))
    self.generation = int(out["generation"])


def _still_running(holder: dict) -> str:
  """Why a lock record left on cloud storage belongs to a command that still runs ("" if it does
  not): its record was refreshed in the last REMOTE_STALE_S seconds (the hosts' clocks agree to
  within seconds, as NTP keeps them) and, where it was written on this host, its process exists."""
  age = time.time() - float(holder.get("refreshed", 0) or 0)
  if age >= REMOTE_STALE_S:
    return ""
  if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
    try:
      os.kill(holder["pid"], 0)
    except ProcessLookupError:
      return ""
    except PermissionError:   # another user's process: it exists
      pass
    return "its process runs on this host"
  return f"its record was refreshed {max(age, 0):.0f} s ago"


def _parse_holder(data: bytes) -> dict:
  try:
    return json.loads(data) if data.strip() else {}
  except ValueError:
    return {"pid": "?", "host": "?", "command": "unreadable lock record"}


def _read_holder(fd: int) -> dict:
  try:
    return _parse_holder(os.pread(fd, 4096, 0))
  except OSError:
    return {"pid": "?", "host": "?", "command": "unreadable lock record"}


def _tmp(p: epath.Path) -> epath.Path:
  return p.with_name(f".{p.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def write_text(p: str | os.PathLike, text: str) -> None:
  """Write atomically: a temp file named after this host and process, then a rename, so an
  interrupted write never leaves half a file and two writers never share a temp file. On cloud
  storage the object itself is written (it appears only once its upload completes)."""
  from maskprior_jax import faults
  p = path(p)
  if not is_local(p):
    faults.point("write")
    p.write_text(text)
    return
  _write_local(p, text.encode(), lambda: faults.point("write"))


def _write_local(p: epath.Path, data: bytes, before_rename=lambda: None) -> None:
  """Temp file + rename; an OSError (e.g. a full disk, whose write errors carry no file name)
  leaves no temporary file behind and names the file it was writing."""
  tmp = _tmp(p)
  try:
    with open(tmp, "wb") as f:
      f.write(data)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    if e.filename is None:
      raise OSError(e.errno, e.strerror or str(e), os.fspath(p)) from None
    raise
  before_rename()
  os.replace(tmp, p)


def _json_default(o):
  import numpy as np
  if isinstance(o, (np.floating, np.integer)):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  return str(o)


def write_json(p: str | os.PathLike, obj: Any) -> None:
  write_text(p, json.dumps(obj, indent=1, default=_json_default))


def write_jsonl(p: str | os.PathLike, rows) -> None:
  write_text(p, "".join(json.dumps(r, default=_json_default) + "\n" for r in rows))


def write_figure(fig, p: str | os.PathLike, dpi: int = 110) -> None:
  """Save a matplotlib figure as PNG to a local or cloud path."""
  import io
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=dpi)
  p = path(p)
  if is_local(p):
    _write_local(p, buf.getvalue())
  else:
    p.write_bytes(buf.getvalue())


def check_storage(args) -> None:
  """Every cloud folder a command names (its --workdir; report's folders, --out and --markdown)
  can be opened here, and a benchmark's gs:// run folder can be written (`paths.check_reachable`):
  a `paths.StorageError` in one line otherwise, before any work."""
  named = [("a run folder", d) for d in args.dirs] + [("--out", args.out), ("--markdown", args.markdown)] \
      if args.command == "report" else [("--workdir", getattr(args, "workdir", None))]
  for flag, value in named:
    if value:
      check_path(value, flag)
  if args.command not in ("report", "compile") and getattr(args, "workdir", None):
    check_reachable(args.workdir)   # a run folder on Cloud Storage: credentials, bucket, write access


def kept(workdir: str | os.PathLike, full_disk: bool = False) -> str:
  """What a run folder holds after a failure, for the command's last line: its finished runs and
  its newest checkpoint step, or that it holds neither; with `full_disk`, the space a rerun needs
  free (the newest checkpoint's size). "" where the folder cannot be read."""
  try:
    p = path(workdir)
    if not p.exists():
      return "nothing was written"
    runs = sum(len((read_json(r, move=False) or {}).get("runs", []))   # a folder, or a folder of tasks'
               for r in [p / "results.json", *p.glob("*/results.json")])
    steps = [d for pattern in ("checkpoints/*/*/*", "*/checkpoints/*/*/*") for d in p.glob(pattern) if d.name.isdigit()]
    newest = max(steps, key=lambda d: int(d.name)) if steps else None
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(newest) for f in files) \
        if newest is not None and full_disk and is_local(newest) else 0
  except (OSError, ValueError, NotImplementedError):
    return ""
  parts = ([f"{runs} finished run{'s' * (runs != 1)}"] if runs else []) + \
      ([f"the checkpoint at step {newest.name}"] if newest else [])
  text = "kept: " + " and ".join(parts) if parts else "no run had finished and no checkpoint was saved"
  if size:
    text += f"; free at least {max(size / 2**20, 0.1):.1f} MiB (the last checkpoint's size) and rerun to resume"
  return text


def set_aside(p: str | os.PathLike, why: str, stream=None) -> epath.Path:
  """Rename a damaged file `<name>.damaged-<time>` (nothing is deleted) and say so in one line."""
  p = path(p)
  aside = p.with_name(f"{p.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
  if is_local(p):
    p.replace(aside)
  else:   # cloud storage has no rename: a copy, then the original removed
    aside.write_bytes(p.read_bytes())
    p.unlink()
  print(f"maskprior: warning: {p} is unreadable ({why}); moved to {aside.name}, continuing from what "
        "is intact", file=stream or console.screen())
  return aside


def reason(e: Exception) -> str:
  """An exception's first line, short enough for a one-line message."""
  return str(e).splitlines()[0][:120] if str(e).strip() else type(e).__name__


def _read(p: str | os.PathLike, parse: Callable[[str], Any], move: bool):
  """`parse(text)` of the file, or None when it is absent or `parse` raises ValueError (a damaged
  file, set aside when `move`)."""
  p = path(p)
  if not p.exists():
    return None
  try:
    return parse(p.read_text())
  except (ValueError, UnicodeDecodeError) as e:
    if move:
      set_aside(p, reason(e))
    return None


def read_json(p: str | os.PathLike, check: Callable[[Any], bool] = lambda obj: True, *, move: bool = True):
  """The parsed file, or None when it is absent or damaged (unparsable, or `check` says its
  content is not what this file holds). A damaged file is set aside when `move` (the process
  that writes the folder), and left in place otherwise."""
  def parse(text):
    obj = json.loads(text)
    if not check(obj):
      raise ValueError("not the content this file holds")
    return obj
  return _read(p, parse, move)


def read_jsonl(p: str | os.PathLike, *, move: bool = True) -> list | None:
  """As `read_json`, for a JSON-lines file."""
  def parse(text):
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not all(isinstance(r, dict) for r in rows):
      raise ValueError("a line is not a record")
    return rows
  return _read(p, parse, move)
