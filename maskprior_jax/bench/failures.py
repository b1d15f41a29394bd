"""How a benchmark command ends when something fails: the errors a user can cause become one line
of the project's own and an exit status, and the libraries' own output (XLA's and absl's logs,
orbax's background threads, tracebacks from C++ callbacks) stays off the screen, in a log file the
line names (`console.LibraryLog`)."""
from __future__ import annotations

import errno
import os
import shlex
import sys

from maskprior_jax.bench import console, supervise, workdir as workdir_lib
from maskprior_jax.bench.config import ConfigError, UsageError
from maskprior_jax.bench.results import BENCHMARKS, ReportError
from maskprior_jax.bench.workdir import WorkdirBusy

__all__ = ["dispatch"]


def dispatch(args, as_program: bool) -> int:
  """Run the subcommand; the errors a user can cause become one line and an exit status. A
  benchmark run as a program keeps the libraries' own output off the screen (`console.LibraryLog`:
  in <workdir>/maskprior.log), unless --verbose or MASKPRIOR_RUNTIME_LOG=1."""
  log = console.LibraryLog(shlex.join(["maskprior", *args.argv])) if _routed(args, as_program) else None
  try:
    return _run(args, as_program, log)
  finally:
    if log is not None:
      log.settle(args.workdir)


def _routed(args, as_program: bool) -> bool:
  return (as_program and args.command in BENCHMARKS and not supervise.in_child() and not args.verbose
          and os.environ.get("MASKPRIOR_RUNTIME_LOG") != "1")


def _run(args, as_program: bool, log) -> int:
  from maskprior_jax.bench.arithmetic.tasks import DataError
  from maskprior_jax.bench.boolean.tasks import TaskSpecError
  from maskprior_jax.bench.data import DataError as DatasetError
  from maskprior_jax.checkpoint import Preempted
  from maskprior_jax.train import NonFiniteLoss
  screen = console.screen()
  try:
    return args.fn(args)
  except (ConfigError, UsageError, TaskSpecError, DataError, DatasetError, ReportError, WorkdirBusy) as e:
    print(f"maskprior: error: {e}", file=screen)
    return 2
  except NonFiniteLoss as e:
    print(f"maskprior: error: {e}", file=screen)
    return 1
  except Preempted as e:
    print(f"maskprior: {e}", file=screen)
    return 143
  except BrokenPipeError:   # the output's reader went away (`maskprior report DIR | head`): stop quietly
    if as_program:
      console.to_devnull(sys.stdout.fileno())
    return 1
  except OSError as e:   # disk full, permissions, a path that became a file: the last checkpoint stays
    supervise.await_lost_process()
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    held = workdir_lib.kept(args.workdir, e.errno == errno.ENOSPC) if args.command in BENCHMARKS else ""
    logged = log.settle(args.workdir) if log is not None else ""
    print(f"maskprior: error: {e.strerror or e}{where}" + (f"; {held}" if held else "")
          + (f" (the libraries' messages: {logged})" if logged else ""), file=screen)
    if as_program:
      sys.stdout.flush()
      sys.stderr.flush()
      if log is None:
        console.to_devnull(sys.stderr.fileno())
    return 2
  except KeyboardInterrupt:
    print("maskprior: interrupted; finished methods are saved, rerun the same command to continue", file=screen)
    return 130
  except Exception as e:
    supervise.end_child_on(e)   # a watched child ends here, at once, with its traceback
    if log is None:
      raise
    import traceback
    traceback.print_exception(e, file=screen)   # not the libraries' output: this command's own failure
    logged = log.settle(args.workdir)
    if logged:
      print(f"maskprior: the libraries' messages: {logged}", file=screen)
    return 1
