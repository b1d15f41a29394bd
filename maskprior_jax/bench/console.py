"""What the `maskprior` command shows a person: the library's log records on stderr as plain lines,
and `maskprior report --markdown` pages."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import sys


class _StderrHandler(logging.StreamHandler):
  """Writes to whatever `sys.stderr` is when a record comes (pytest's capture, a redirected stream)."""

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, value):
    pass


class _Formatter(logging.Formatter):
  def format(self, record):
    line = super().format(record)
    return f"warning: {line}" if record.levelno >= logging.WARNING else line


def configure_logging() -> None:
  """The command shows the library's notes (progress, resumes, checkpoint warnings) on stderr as
  plain lines, once per process; a level already set on the "maskprior_jax" logger is kept."""
  logger = logging.getLogger("maskprior_jax")
  if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    logger.addHandler(handler)
    logger.propagate = False
  if logger.level == logging.NOTSET:
    logger.setLevel(logging.INFO)


def captured(fn, *args):
  """(fn(*args), what it printed to stdout)."""
  buffer = io.StringIO()
  with contextlib.redirect_stdout(buffer):
    status = fn(*args)
  return status, buffer.getvalue()


def report_page(args, tables: str) -> str:
  """A results page: the title, the `maskprior report` command that rebuilds it, the tables."""
  argv = [*args.dirs] + (["--out", args.out] if args.out else []) + ["--markdown", args.markdown] \
      + (["--title", args.title] if args.title else [])
  title = args.title or "Tables from " + ", ".join(args.dirs)
  command = shlex.join(["maskprior", "report", *argv])
  return (f"# {title}\n\nGenerated from the committed `results.json` files by\n\n```bash\n{command}\n```\n\n"
          "Do not edit: rerun the command.\n\n" + tables.rstrip("\n") + "\n")


def version_line() -> str:
  """`maskprior --version`: the package version and the commit of its code where known."""
  from maskprior_jax import __version__, version
  commit = version.source()["commit"]
  return f"maskprior {__version__}" + (f" (commit {commit[:12]})" if commit else "")


def to_devnull(fd: int) -> None:
  """From here on, what is written to file descriptor `fd` goes to /dev/null. Used after the
  command's last line: after a failed save orbax's writer threads may still be finishing and print
  while the interpreter shuts down (asyncio's "never retrieved" futures, "Event loop is closed"), so
  stderr goes quiet and the line stays the last one; after a closed pipe, stdout does."""
  os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
