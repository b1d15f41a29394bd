"""The `maskprior` command: one subcommand per benchmark, plus `report`. Parses and dispatches only:
each benchmark's `run.COMMAND` (`runner.Command`) adds its flags, checks its input and runs; its
`report` module writes its tables. Errors a user can cause (bad config key or value, bad task spec,
unknown method, a workdir holding another run) are one line on stderr, exit status 2, before any work.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from maskprior_jax.bench.args import SEEDS_HELP, exploration_seeds, parse_list, parse_seeds
from maskprior_jax.bench import compiles, config as config_lib, console, failures, supervise, workdir as workdir_lib
from maskprior_jax.bench.config import UsageError, apply_overrides
from maskprior_jax.bench.results import BENCHMARKS, open_workdir
from maskprior_jax.bench.workdir import reason
__all__ = ["main", "build_parser", "parse_seeds", "exploration_seeds", "UsageError"]


def _command(name: str):
  return importlib.import_module(f"maskprior_jax.bench.{name}.run").COMMAND


def cmd_benchmark(args) -> int:
  """Any benchmark: config, methods and seeds, the benchmark's own checks, the run folder, the run."""
  command = _command(args.command)
  cfg = apply_overrides(config_lib.resolve(args.config, args.command), args.overrides)
  compiles.enable_cache(args.compilation_cache)
  import jax
  if jax.process_count() > 1 and cfg.train.parallel == "off" and not cfg.train.data_parallel:
    raise UsageError(f"train.parallel=off trains on one device, but this is one of {jax.process_count()} processes: "
                     "use --config.train.parallel=auto, runs or data")
  methods, seeds = parse_list(args.methods, command.methods, "method"), parse_seeds(args.seeds)
  record, context = command.prepare(args, cfg, methods)
  with open_workdir(workdir_lib.path(args.workdir), record, args.fresh, " ".join(["maskprior", *args.argv])) as workdir:
    print(console.fit_tables(command.run(cfg, context, methods, seeds, workdir)))
  print(console.where_results(workdir))
  return 0


def cmd_report(args) -> int:
  """Tables (--out: plots, --chart: the headline chart, --markdown: a page) from run folders; Boolean runs
  of one task are pooled; an unreadable results.json is named in one line and skipped (exit status 1)."""
  status, text = console.captured(_report, args)
  print(text if args.markdown else console.fit_tables(text), end="")
  if args.markdown:
    workdir_lib.write_text(workdir_lib.path(args.markdown), console.report_page(args, text))
  return status


def _report(args) -> int:
  found = []
  for d in map(workdir_lib.path, args.dirs):
    if not d.exists():
      raise UsageError(f"{d} does not exist")
    found += [d / "results.json"] if (d / "results.json").exists() else sorted(d.glob("*/results.json"))
  if not found:
    raise UsageError(f"no results.json in {', '.join(args.dirs)} or their subfolders")
  loaded, damaged = [], []
  for p in found:
    try:
      loaded.append((p, json.loads(p.read_text())))
    except ValueError as e:   # unparsable: named in one line and skipped
      damaged.append(f"{p} is unreadable ({reason(e)})")
  if not loaded:
    raise UsageError("; ".join(damaged) + "; nothing else to report")
  for line in damaged:
    print(f"maskprior: warning: {line}; skipped", file=console.screen())
  for path, res in loaded:
    if res.get("benchmark") not in BENCHMARKS:
      raise UsageError(f"{path} names no benchmark ({', '.join(BENCHMARKS)}); it was not written by maskprior")
  out = workdir_lib.path(args.out) if args.out else None
  report = lambda name: importlib.import_module(f"maskprior_jax.bench.{name}.report")
  for i, (_, res) in enumerate(r for r in loaded if r[1]["benchmark"] != "boolean"):   # one table per run folder
    print(report(res["benchmark"]).table(res))
    if out is not None:
      dest = out / f"{res['benchmark']}_{i}"
      dest.mkdir(parents=True, exist_ok=True)
      report(res["benchmark"]).write_report(res, dest)
  boolean = [r for r in loaded if r[1]["benchmark"] == "boolean"]
  if boolean:
    print(report("boolean").report(boolean, out))
  if args.chart:
    importlib.import_module("maskprior_jax.bench.charts").write(loaded, workdir_lib.path(args.chart))
  return 1 if damaged else 0


CONFIG_HELP = """config overrides:
  --config.SECTION.KEY=VALUE   change one value of the config (built-in, or --config FILE); the
                               config is locked, so an unknown key is an error. Example:
                               maskprior boolean --task f2 --config.train.steps=3000 --config.prior.outside=-8
"""


def _benchmark_flags(p, name: str, command) -> None:
  """The flags a benchmark's command and its `maskprior compile` share."""
  command.add_arguments(p)
  p.add_argument("--methods", default=",".join(command.default_methods or command.methods),
                 help=f"comma-separated, from {', '.join(command.methods)} (default: %(default)s)")
  p.add_argument("--seeds", default=command.default_seeds, metavar="N | A-B | A,B,C", help=SEEDS_HELP)
  p.add_argument("--config", help="config file with get_config(), or a built-in config's name (default: the "
                 "built-in config of this benchmark)")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="maskprior", description="Mask-prior experiments.", epilog=CONFIG_HELP,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--version", action="version", version=console.version_line())
  sub = parser.add_subparsers(dest="command", required=True)
  for name in BENCHMARKS:
    command = _command(name)
    p = sub.add_parser(name, help=command.help, description=command.description, epilog=CONFIG_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _benchmark_flags(p, name, command)
    p.add_argument("--workdir", default=f"runs/{name}", help="run folder; a rerun continues there (default: %(default)s)")
    p.add_argument("--fresh", action="store_true", help="delete what the workdir holds and start over (default: off)")
    p.add_argument("--verbose", action="store_true", help="show the libraries' own messages (XLA, absl, orbax, "
                   "tracebacks of background threads) as they come, instead of in <workdir>/maskprior.log "
                   "(default: off; also MASKPRIOR_RUNTIME_LOG=1)")
    compiles.add_flag(p)
    g = p.add_argument_group("several processes (JAX's distributed runtime)")
    g.add_argument("--distributed", default="auto", choices=["auto", "on", "off"],
                   help="auto: start the runtime where JAX recognises a cluster (Cloud TPU VM slice, SLURM, Open "
                   "MPI, Kubernetes) or the flags below are given, else run as one process; on: the same, an error "
                   "where neither; off: one process (default: %(default)s)")
    g.add_argument("--coordinator_address", help="HOST:PORT of process 0 (or $MASKPRIOR_COORDINATOR)")
    g.add_argument("--num_processes", type=int, help="number of processes (or $MASKPRIOR_NUM_PROCESSES)")
    g.add_argument("--process_id", type=int, help="this process's index, 0..N-1 (or $MASKPRIOR_PROCESS_ID)")
    p.set_defaults(fn=cmd_benchmark)
  from maskprior_jax.bench import compile as compile_lib   # `maskprior compile BENCHMARK`, there
  compile_lib.add_parser(sub, BENCHMARKS, _command, _benchmark_flags, CONFIG_HELP,
                         lambda a: apply_overrides(config_lib.resolve(a.config, a.benchmark), a.overrides))
  r = sub.add_parser("report", help="tables and plots from run folders")
  r.add_argument("dirs", nargs="+", help="run folders (or folders of run folders)")
  r.add_argument("--out", help="write summary.md, headline.png and per-task plots here (default: print only)")
  r.add_argument("--markdown", help="also write the tables as a Markdown page to this file (default: off)")
  r.add_argument("--title", help="the page's title (default: the folders' names)")
  r.add_argument("--chart", help="also draw the headline comparison to this PNG, every seed a dot (default: off)")
  r.set_defaults(fn=cmd_report)
  return parser


def main(argv: list[str] | None = None) -> int:
  console.configure_logging()
  as_program = argv is None   # the console script or `python -m` (in-process callers keep their stderr)
  argv = list(sys.argv[1:] if argv is None else argv)
  args = build_parser().parse_args([a for a in argv if not a.startswith("--config.")])
  args.overrides, args.argv = [a for a in argv if a.startswith("--config.")], argv
  try:
    workdir_lib.check_storage(args)
    if args.command not in ("report", "compile"):
      if as_program and supervise.wanted(args):
        return supervise.supervise(argv, args.workdir)   # several processes: the work runs watched
      supervise.start_processes(args)
  except (ValueError, RuntimeError) as e:
    what = "" if isinstance(e, workdir_lib.StorageError) else "cannot start the distributed runtime: "
    print(f"maskprior: error: {what}{e}", file=sys.stderr)
    return 2
  return supervise.child_exit(failures.dispatch(args, as_program)) if as_program else failures.dispatch(args, as_program)


if __name__ == "__main__":
  sys.exit(main())
