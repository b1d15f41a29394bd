"""XLA compiles, counted, and the persistent compilation cache the `maskprior` command keeps.

Counting reads JAX's own monitoring events: every executable JAX obtains outside its in-memory cache
records one backend-compile duration (a compile, or a read from the persistent cache, which also
records a cache hit). `counted()` gives what happened inside a `with` block:

    with compiles.counted() as c:
      ...
    c.programs, c.cache_hits, c.seconds      # compiled, read from the cache, seconds in both

The cache: `enable_cache(folder)` points JAX's persistent compilation cache there and caches every
program whatever its size or compile time (JAX's defaults skip compiles under one second, which are
most of a run's). The command's folder: `--compilation_cache FOLDER`, else JAX_COMPILATION_CACHE_DIR,
else `default_cache_dir()` ($MASKPRIOR_COMPILATION_CACHE, else $XDG_CACHE_HOME/maskprior/xla or
~/.cache/maskprior/xla); `--compilation_cache off` turns it off. A gs:// folder works on a TPU slice
(JAX reads and writes it through etils.epath).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import threading

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass(eq=False)   # counts nest: each is itself, not its figures
class Count:
  """Executables obtained outside JAX's in-memory cache: `programs` compiled, `cache_hits` read from
  the persistent cache, `seconds` spent in both; `names` the programs' names (jit(f)) with
  how many of each, `compiled` those of them compiled (not read from the cache)."""
  programs: int = 0
  cache_hits: int = 0
  seconds: float = 0.0
  names: dict = dataclasses.field(default_factory=dict)
  compiled: dict = dataclasses.field(default_factory=dict)   # the names compiled, not read from the cache

  def record(self) -> dict:
    return {"programs": self.programs, "cache_hits": self.cache_hits, "seconds": round(self.seconds, 3)}

  def line(self) -> str:
    hits = f", {self.cache_hits} read from the cache" if self.cache_hits else ""
    return f"{self.programs} programs compiled{hits}, {self.seconds:.1f} s"


_lock = threading.Lock()
_active: list[Count] = []
_registered = False
_hit = threading.local()   # a cache hit is reported just before its executable's duration, in one thread


def _on_duration(event: str, duration: float, **kwargs) -> None:
  if event == BACKEND_COMPILE_EVENT:
    hit, _hit.pending = getattr(_hit, "pending", False), False
    with _lock:
      for c in _active:
        c.programs += 1
        c.seconds += duration
        name = str(kwargs.get("fun_name", "?"))
        c.names[name] = c.names.get(name, 0) + 1
        if not hit:
          c.compiled[name] = c.compiled.get(name, 0) + 1


def _on_event(event: str, **kwargs) -> None:
  if event == CACHE_HIT_EVENT:   # recorded before the duration event of the same executable
    _hit.pending = True
    with _lock:
      for c in _active:
        c.cache_hits += 1
        c.programs -= 1


def _register() -> None:
  global _registered
  if not _registered:
    import jax
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_event)
    _registered = True


@contextlib.contextmanager
def counted():
  """Count the compiles inside the block (blocks may nest; each counts what happens inside it)."""
  _register()
  c = Count()
  with _lock:
    _active.append(c)
  try:
    yield c
  finally:
    with _lock:
      _active.remove(c)


def default_cache_dir() -> str:
  if os.environ.get("MASKPRIOR_COMPILATION_CACHE"):
    return os.environ["MASKPRIOR_COMPILATION_CACHE"]
  base = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
  return str(pathlib.Path(base) / "maskprior" / "xla")


def enable_cache(folder: str | None = None) -> str | None:
  """Turn JAX's persistent compilation cache on in `folder` (None: JAX_COMPILATION_CACHE_DIR if set,
  else `default_cache_dir()`; "off": leave it off), caching every program. Returns the folder in use."""
  import jax
  if folder == "off":
    return None
  folder = folder or os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_cache_dir()
  jax.config.update("jax_compilation_cache_dir", folder)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES" not in os.environ:
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return folder


def add_flag(parser) -> None:
  """The benchmark commands' `--compilation_cache FOLDER | off`."""
  parser.add_argument("--compilation_cache", default=None, metavar="FOLDER | off",
                      help="JAX's persistent compilation cache: a rerun or a resumed run compiles nothing it compiled "
                      "before (default: $JAX_COMPILATION_CACHE_DIR, else $MASKPRIOR_COMPILATION_CACHE, else "
                      "~/.cache/maskprior/xla; a gs:// folder on a TPU slice)")
