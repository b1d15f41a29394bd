"""A lost process, as the others report it: one line of the project's own, within seconds.

In a multi-process run (`--coordinator_address ...`, or a cluster JAX detects), `maskprior` runs
the work in a child process and watches it. JAX's distributed runtime notices a process that
stopped sending heartbeats within `distributed.heartbeat_timeout()` seconds (10 by default) and
then ends every other process itself, from C++, with a paragraph and a stack. The watcher keeps
that report off the screen (it goes to a log file instead), and ends with one line: which process
was lost, the checkpoint steps on disk, and the command that resumes; exit status 75
(`LOST_PROCESS`, EX_TEMPFAIL: rerun later). Everything else the child prints passes through
unchanged; its own exit status, or the signal it died of, is the watcher's.

The child dies with its watcher (`PR_SET_PDEATHSIG`: a SIGKILL to the command kills the work),
SIGTERM and SIGHUP sent to the watcher are handed to the child, so a scheduler's SIGTERM still
reaches JAX's preemption service, and Ctrl-C reaches the child from the terminal (the watcher
ignores it). `MASKPRIOR_RUNTIME_LOG=1` shows the runtime's report as it comes.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["LOST_PROCESS", "CHILD_ENV", "start_processes", "wanted", "supervise", "in_child", "child_exit",
           "await_lost_process", "end_child_on", "lost_process", "checkpoint_steps"]

LOST_PROCESS = 75
CHILD_ENV = "MASKPRIOR_SUPERVISED"
# One line of absl's log format: severity, date, time, thread, source file and line.
_ABSL = re.compile(rb"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<file>[\w.\-/]+):\d+\] ")
# Sources of the distributed runtime's reports about other processes (coordination service and its
# agent, the preemption manager, the client that ends the process, gloo's connections).
_RUNTIME_SOURCES = re.compile(rb"coordination|preemption_sync|client\.(h|cc)|pair\.cc|distributed")
_FATAL = "Terminating process because the JAX distributed service detected fatal errors"
_STACK = (b"*** Check failure stack trace", b"    @ ")


def in_child() -> bool:
  """Whether this process is the watched child of a multi-process command."""
  return os.environ.get(CHILD_ENV) == "1"


def wanted(args) -> bool:
  """Whether a benchmark command starts several processes (and so runs watched): coordinator
  flags or variables given, or a cluster that JAX's detection recognises (`--distributed` not off)."""
  if in_child() or getattr(args, "distributed", "off") == "off":
    return False
  if args.coordinator_address or os.environ.get("MASKPRIOR_COORDINATOR"):
    return (args.num_processes or int(os.environ.get("MASKPRIOR_NUM_PROCESSES", "2"))) > 1
  from maskprior_jax import distributed
  return distributed.detect_cluster() is not None


def start_processes(args) -> None:
  """Join the other processes of a multi-process run (no-op for one process). Processes other
  than 0 print nothing to stdout: process 0 writes and prints the results."""
  from maskprior_jax import distributed
  given = [args.coordinator_address, args.num_processes, args.process_id]
  if any(v is not None for v in given) and args.coordinator_address is None:
    raise ValueError("--num_processes/--process_id need --coordinator_address HOST:PORT")
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id, mode=args.distributed)
  if not distributed.is_main_process():
    sys.stdout = open(os.devnull, "w")


def child_exit(status: int) -> int:
  """The exit status of a finished command; in a watched child that failed (status other than 0 or
  143), the process ends here: not in JAX's shutdown barrier, which would wait for processes that
  wait for this one (they then report this process as lost, and it has printed its own error)."""
  if in_child() and status not in (0, 143):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
  return status


def await_lost_process() -> None:
  """In a watched child, before reporting an I/O or runtime error: such an error (a save's
  barrier, a collective) may be the first sign of another process lost, and then JAX's runtime
  ends this process within its heartbeat timeout and the watcher reports the lost process in one
  line. Wait that long; only an error that outlives the wait is this process's own."""
  if in_child():
    from maskprior_jax import distributed
    time.sleep(distributed.heartbeat_timeout() + 5)


def end_child_on(e: BaseException) -> None:
  """In a watched child, an exception the command does not report in a line of its own: print its
  traceback and end the process now (status 1), not through Python's exit, whose JAX shutdown
  barrier waits for the other processes (they report this one as lost within their heartbeat
  timeout). An error from JAX's runtime may be the first sign of another process lost: for that
  one, wait as `await_lost_process` does first. Elsewhere, returns (the caller re-raises)."""
  if not in_child():
    return
  import traceback
  from jax.errors import JaxRuntimeError
  if isinstance(e, JaxRuntimeError):
    await_lost_process()
  traceback.print_exception(e)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(1)


def lost_process(report: str) -> tuple[str, str] | None:
  """Which process the runtime's report says was lost, and how it knew: ("process N", "it stopped
  sending heartbeats") or ("process 0 (the coordinator)", "the connection to it closed"); None
  where the report is not the runtime ending this process over another one."""
  if _FATAL not in report:
    return None
  ids = re.findall(r"Task (\d+) heartbeat timeout", report)
  unhealthy = re.search(r"stopped sending heartbeats\):\s*([\d,\s]+?)\s*(?:\n\S|$)", report)
  if unhealthy:
    ids += re.findall(r"\d+", unhealthy.group(1))
  if ids:
    ids = sorted(set(ids), key=int)
    return "process" + ("es " if len(ids) > 1 else " ") + ", ".join(ids), "it stopped sending heartbeats"
  if "coordination service" in report or "leader task" in report:
    return "process 0 (the coordinator)", "the connection to it failed"
  return "another process", "the distributed runtime reported a fatal error"


def checkpoint_steps(workdir: str) -> list[tuple[str, int]]:
  """(run group, last step) of every checkpoint folder under `<workdir>/checkpoints` holding a
  finished step (orbax's own test: unfinished saves do not count)."""
  from etils import epath
  from orbax.checkpoint import utils as ocp_utils
  root = epath.Path(workdir) / "checkpoints"
  found = []
  try:
    if not root.exists():
      return []
    for method in sorted(root.iterdir()):
      for group in sorted(method.iterdir()) if method.is_dir() else []:
        steps = ocp_utils.checkpoint_steps(group) if group.is_dir() else []
        if steps:
          found.append((f"{method.name}/{group.name}", max(steps)))
  except OSError:
    return found
  return found


class _Filter:
  """The child's stderr, line by line (a carriage return ends a line too, so progress bars still
  move): the runtime's reports about other processes, with their continuation lines and C++ stack,
  go to `log` and are kept as text; every other line passes to `out`."""

  def __init__(self, src, out, show: bool):
    self.src, self.out, self.show = src, out, show
    self.hidden: list[bytes] = []
    self._hiding = False
    self.thread = threading.Thread(target=self._pump, daemon=True)
    self.thread.start()

  def _hide(self, line: bytes) -> bool:
    m = _ABSL.match(line)
    if m:
      self._hiding = bool(_RUNTIME_SOURCES.search(m.group("file")))
    elif line.startswith(_STACK):
      self._hiding = True
    elif self._hiding and line.startswith((b"maskprior", b"[")):
      self._hiding = False
    return self._hiding

  def _pump(self):
    buf = b""
    while True:
      chunk = os.read(self.src, 65536)
      if not chunk:
        break
      buf += chunk
      while True:
        cut = min((i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0), default=-1)
        if cut < 0:
          break
        line, buf = buf[:cut + 1], buf[cut + 1:]
        self._emit(line)
    if buf:
      self._emit(buf)
    os.close(self.src)

  def _emit(self, line: bytes):
    if self._hide(line):
      self.hidden.append(line)
      if not self.show:
        return
    self.out.write(line)
    self.out.flush()

  def report(self) -> str:
    self.thread.join(timeout=10)
    return b"".join(self.hidden).decode(errors="replace")


def _die_with_parent():
  """In the child, before exec: SIGKILL when the watcher dies (Linux; elsewhere a no-op)."""
  try:
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def supervise(argv: list[str], workdir: str, stderr=None) -> int:
  """Run `maskprior <argv>` as a watched child (see the module docstring); returns the exit status."""
  stderr = stderr or sys.stderr.buffer
  show = os.environ.get("MASKPRIOR_RUNTIME_LOG") == "1"
  read, write = os.pipe()
  child = subprocess.Popen([sys.executable, "-m", "maskprior_jax.bench.cli", *argv], stderr=write,
                           env={**os.environ, CHILD_ENV: "1"},
                           preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
  os.close(write)
  filt = _Filter(read, stderr, show)
  forward = {s: signal.signal(s, lambda signum, frame: child.send_signal(signum))
             for s in (signal.SIGTERM, signal.SIGHUP)}
  forward[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the child itself
  try:
    rc = child.wait()
  finally:
    for s, old in forward.items():
      signal.signal(s, old)
  report = filt.report()
  lost = lost_process(report) if rc in (-signal.SIGABRT, 128 + signal.SIGABRT) else None
  if lost is None:
    if report and not show:   # hidden lines that turned out to be no lost process: show them after all
      stderr.write(report.encode())
      stderr.flush()
    if rc < 0:   # died of a signal: die of the same one, as a shell would show it
      if -rc != signal.SIGKILL:
        signal.signal(-rc, signal.SIG_DFL)
      os.kill(os.getpid(), -rc)
      time.sleep(1)
      return 128 - rc
    return rc
  stderr.write((_lost_line(lost, argv, workdir, _keep(report)) + "\n").encode())
  stderr.flush()
  return LOST_PROCESS


def _keep(report: str) -> str:
  fd, path = tempfile.mkstemp(prefix="maskprior-runtime-", suffix=".log")
  with os.fdopen(fd, "w") as f:
    f.write(report)
  return path


def _lost_line(lost: tuple[str, str], argv: list[str], workdir: str, log: str) -> str:
  steps = checkpoint_steps(workdir)
  held = ("checkpoints on disk: " + ", ".join(f"{g} at step {s}" for g, s in steps) if steps
          else "no checkpoint on disk yet (the rerun starts at step 0)")
  return (f"maskprior: error: lost {lost[0]} of this run ({lost[1]}; see its own output); this "
          f"process stopped too. {held}; finished methods are kept. To resume, run the same command in every "
          f"process: {shlex.join(['maskprior', *argv])} (the runtime's report: {log})")
