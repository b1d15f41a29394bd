"""What the `maskprior` command shows a person: the library's log records on stderr as plain lines,
and `maskprior report --markdown` pages."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import sys
import textwrap


_SCREEN = None   # the terminal's stderr while the libraries' output goes to a log file (LibraryLog)
LOG_NAME = "maskprior.log"


def screen():
  """Where the command's own lines go: stderr as it was when the command started, also while the
  libraries' output is routed to a log file (`LibraryLog`); else whatever `sys.stderr` is now."""
  return _SCREEN or sys.stderr


class LibraryLog:
  """The libraries' own output off the screen: from construction on, file descriptor 2 (and so
  `sys.stderr`, the C++ logs of XLA, absl and tensorstore, Python's logging, background threads'
  tracebacks) goes to a log file, while the command's own lines go to the screen (`screen()`).
  `settle(workdir)` moves what was logged into `<workdir>/maskprior.log` (appended, under a header
  naming the command) where that folder exists on this disk, else leaves it in the temp folder,
  and returns its path ("" when nothing was logged); output after that lands there too."""

  def __init__(self, command: str):
    import tempfile
    import time
    global _SCREEN
    fd, self.path = tempfile.mkstemp(prefix="maskprior-", suffix=".log")
    self.header, self.settled = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {command}\n", False
    sys.stderr.flush()
    screen_fd = os.dup(2)
    _SCREEN = io.TextIOWrapper(io.FileIO(screen_fd, "w"), line_buffering=True, write_through=True,
                               errors="backslashreplace")
    os.dup2(fd, 2)
    os.close(fd)

  def settle(self, workdir) -> str:
    sys.stderr.flush()
    if self.settled or not os.path.getsize(self.path):
      return self.path if self.settled else ""
    from maskprior_jax.paths import is_local
    if workdir is None or not is_local(workdir) or not os.path.isdir(workdir):
      return self.path
    dest = os.path.join(os.fspath(workdir), LOG_NAME)
    try:
      with open(dest, "a") as out, open(self.path) as logged:
        out.write(self.header + logged.read())
      fd = os.open(dest, os.O_WRONLY | os.O_APPEND)
    except OSError:   # (a full disk): it stays where it is
      return self.path
    os.dup2(fd, 2)
    os.close(fd)
    os.unlink(self.path)
    self.path, self.settled = dest, True
    return dest


class _StderrHandler(logging.StreamHandler):
  """Writes to whatever `screen()` is when a record comes (pytest's capture, a redirected stream)."""

  @property
  def stream(self):
    return screen()

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


def _terminal_width() -> int | None:
  """The terminal's width when stdout is one, else None (a pipe or a file)."""
  import shutil
  if sys.stdout.isatty():
    return shutil.get_terminal_size().columns
  return None


def _cells(line: str) -> list[str]:
  import re
  return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _table_lines(rows: list[list[str]]) -> list[str]:
  widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(rows[0]))]
  out = []
  for r in rows:
    if all(set(c) <= set("-:") and c for c in r):   # the header rule
      out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    else:
      out.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
  return out


def _split_table(rows: list[list[str]], width: int) -> list[str]:
  """A Markdown table as one or more tables that fit `width`, each repeating the first column."""
  widths = [max(len(r[i]) for r in rows if i < len(r)) + 3 for i in range(len(rows[0]))]
  groups, current = [], []
  for i in range(1, len(widths)):
    if current and widths[0] + sum(widths[j] for j in current) + widths[i] + 1 > width:
      groups.append(current)
      current = []
    current.append(i)
  groups.append(current)
  out = []
  for g in groups:
    out += _table_lines([[r[0]] + [r[j] if j < len(r) else "" for j in g] for r in rows]) + [""]
  return out[:-1]


def fit_tables(text: str, width: int | None = None) -> str:
  """`text` for a terminal: its Markdown tables aligned, those wider than the terminal split into
  several (each repeating the first column), and long prose lines wrapped. Unchanged when stdout is not a terminal (pipes
  and files keep the Markdown as written) unless `width` is given."""
  width = width or _terminal_width()
  if not width:
    return text
  lines, out, i = text.split("\n"), [], 0
  while i < len(lines):
    if not lines[i].lstrip().startswith("|"):
      prose = len(lines[i]) > width and not lines[i].startswith((" ", "`"))
      out.append(textwrap.fill(lines[i], width, break_on_hyphens=False) if prose else lines[i])
      i += 1
      continue
    j = i
    while j < len(lines) and lines[j].lstrip().startswith("|"):
      j += 1
    rows = [_cells(line) for line in lines[i:j]]
    aligned = _table_lines(rows)
    out += aligned if max(map(len, aligned)) <= width else _split_table(rows, width)
    i = j
  return "\n".join(out)


def where_results(workdir) -> str:
  """The last lines of a run: where its tables, pictures and curves are, and how to view them."""
  import pathlib
  folder = pathlib.Path(str(workdir))
  shown = shlex.quote(str(workdir))
  lines = [f"results in {workdir}:"]
  if (folder / "table.md").exists():
    lines.append("  table.md           the tables above; results.json holds every number behind them")
  elif (folder / "results.json").exists():
    lines.append("  results.json       every number behind the tables above")
  pictures = sorted(p.name for p in folder.glob("*.png"))
  if pictures:
    lines.append(f"  pictures           {', '.join(pictures)}")
  if (folder / "tensorboard").is_dir():
    lines.append(f"  training curves    tensorboard --logdir {shlex.quote(str(folder / 'tensorboard'))}")
  lines.append(f"  tables and plots   maskprior report {shown} [--out FOLDER]   (several run folders at once)")
  return "\n".join(lines)
