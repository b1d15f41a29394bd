"""The `maskprior` command: one subcommand per benchmark, plus `report`.

Errors a user can cause (bad config key or value, bad task spec, unknown method, a workdir
holding a different run) are reported as one line on stderr with exit status 2, before
any work starts.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from maskprior_jax.bench.config import ConfigError, apply_overrides, builtin_config, load_config_file


class UsageError(ValueError):
  pass


def _parse_list(text: str, allowed, what: str) -> list[str]:
  items = [t.strip() for t in text.split(",") if t.strip()]
  bad = [t for t in items if t not in allowed]
  if bad or not items:
    raise UsageError(f"unknown {what} {', '.join(bad) or repr(text)}; choose from {', '.join(allowed)}")
  return items


def parse_seeds(text: str) -> list[int]:
  """--seeds: a count K (seeds 0..K-1), a range "A-B" (A..B inclusive) or a list "A,B,C"."""
  text = text.strip()
  try:
    if "," in text:
      seeds = [int(t) for t in text.split(",") if t.strip()]
    elif "-" in text[1:]:
      lo, hi = (int(t) for t in text.split("-"))
      if hi < lo:
        raise ValueError
      seeds = list(range(lo, hi + 1))
    else:
      seeds = list(range(int(text)))
      if not seeds:
        raise UsageError("--seeds must be at least 1")
  except UsageError:
    raise
  except ValueError:
    raise UsageError(f"--seeds must be a count (5), a range (0-9) or a list (3,5,8), not {text!r}") from None
  if not seeds or min(seeds) < 0:
    raise UsageError(f"--seeds must name non-negative seeds, not {text!r}")
  if len(set(seeds)) != len(seeds):
    raise UsageError(f"--seeds names a seed twice: {text!r}")
  return seeds


def exploration_seeds(text: str, confirmation_seeds) -> list[int]:
  """--seeds of an exploration script: parsed as `parse_seeds`, and refused if any is a
  confirmation seed (those are run once, for the headline)."""
  seeds = parse_seeds(text)
  if set(seeds) & set(confirmation_seeds):
    raise UsageError(f"exploration may not use the confirmation seeds {tuple(confirmation_seeds)}")
  return seeds


def _config(args, name: str):
  cfg = load_config_file(args.config) if args.config else builtin_config(name)
  cfg = apply_overrides(cfg, args.overrides)
  import jax
  if jax.process_count() > 1 and not cfg.train.get("data_parallel", False):
    raise UsageError(f"{jax.process_count()} processes train one run together: add "
                     "--config.train.data_parallel=True (each process then feeds its share of every batch)")
  return cfg


def _check_workdir(workdir: pathlib.Path, record: dict, fresh: bool) -> None:
  """Called once every input is known good, before anything is written. A workdir that holds a
  run of a different config or command is an error unless --fresh; one that cannot be created or
  written is a one-line error. Seeds and methods are not part of the record: more of either can be
  added to a workdir (finished (method, seed) runs are kept)."""
  import os

  from maskprior_jax import distributed
  cfg_path = workdir / "run_config.json"
  record = json.loads(json.dumps(record, sort_keys=True))  # as stored: tuples become lists
  if workdir.exists() and not workdir.is_dir():
    raise UsageError(f"--workdir {workdir} is a file, not a folder")
  existing = next(p for p in [workdir, *workdir.absolute().parents] if p.exists())
  if not existing.is_dir():
    raise UsageError(f"cannot create --workdir {workdir}: {existing} is a file")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(f"cannot write in --workdir {workdir}: {existing} is not writable")
  if cfg_path.exists() and not fresh:
    old = json.loads(cfg_path.read_text())
    if old != record:
      raise UsageError(f"{workdir} holds a run with a different config or command; use another "
                       f"--workdir, or --fresh to start over there")
  if distributed.is_main_process():   # with several processes, only process 0 writes
    workdir.mkdir(parents=True, exist_ok=True)
    if fresh:
      import shutil
      for child in workdir.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    cfg_path.write_text(json.dumps(record, indent=1, sort_keys=True))
  distributed.barrier("maskprior_workdir_ready")


def cmd_boolean(args) -> int:
  from maskprior_jax.bench.boolean import run as boolean_run
  from maskprior_jax.bench.boolean import tasks as boolean
  cfg = _config(args, "boolean")
  boolean_run.validate(cfg)
  methods = _parse_list(args.methods, boolean_run.METHODS, "method")
  seeds = parse_seeds(args.seeds)
  if args.target or args.seen:
    if not (args.target and args.seen):
      raise UsageError("a custom task needs both --target and --seen")
    if args.task:
      raise UsageError("give either --task or --target/--seen, not both")
    tasks = [boolean.custom_task(args.target, args.seen, args.n)]
    if args.n is None:
      print(f"maskprior: note: no --n given, so n = {tasks[0].n} (the largest variable index + 1)", file=sys.stderr)
  elif args.task:
    tasks = [boolean_run.headline_tasks(cfg)[boolean.get_task(args.task).name]]
    if args.n is not None and args.n != tasks[0].n:
      raise UsageError(f"--n applies to custom tasks; {tasks[0].name} has n = {tasks[0].n}")
  else:
    tasks = None
  workdir = pathlib.Path(args.workdir)
  record = {"command": "boolean", "config": cfg.to_dict(),
            "tasks": [[t.name, t.n, t.target, t.seen] for t in tasks] if tasks else "headline"}
  _check_workdir(workdir, record, args.fresh)
  if tasks is None:
    boolean_run.run_headline(cfg, methods, seeds, workdir)
    from maskprior_jax.distributed import is_main_process
    if is_main_process():
      print((workdir / "summary.md").read_text())
  else:
    from maskprior_jax.bench.results import RunProgress
    res = boolean_run.run_task(tasks[0], cfg, methods, seeds, workdir,
                               progress=RunProgress(len(methods), label=tasks[0].name))
    print(boolean_run.task_table(res))
  print(f"results in {workdir}")
  return 0


def _sizes(text: str) -> tuple[int, ...]:
  try:
    sizes = tuple(int(t) for t in text.split(",") if t.strip())
  except ValueError:
    raise UsageError(f"--train-sizes must be comma-separated integers, not {text!r}") from None
  if not sizes or min(sizes) <= 0:
    raise UsageError(f"--train-sizes must be positive integers, not {text!r}")
  return sizes


def cmd_arithmetic(args) -> int:
  from maskprior_jax.bench.arithmetic import run as arithmetic_run
  cfg = _config(args, "arithmetic")
  with cfg.unlocked():
    if args.task:
      cfg.task.name = args.task
    if args.digits is not None:
      cfg.task.digits = args.digits
    if args.train_sizes:
      cfg.task.train_sizes = _sizes(args.train_sizes)
  arithmetic_run.validate(cfg)
  methods = _parse_list(args.methods, arithmetic_run.METHODS, "method")
  if cfg.task.name != "add" and {"coupling", "mask_coupling"} & set(methods):
    raise UsageError("position coupling (methods coupling, mask_coupling) is defined for --task add only")
  seeds = parse_seeds(args.seeds)
  workdir = pathlib.Path(args.workdir)
  _check_workdir(workdir, {"command": "arithmetic", "config": cfg.to_dict()}, args.fresh)
  res = arithmetic_run.run(cfg, methods, seeds, workdir)
  print(arithmetic_run.table(res))
  print(f"results in {workdir}")
  return 0


def _vision_language(args, kind: str) -> int:
  import importlib
  from maskprior_jax.bench import supervised
  runner = importlib.import_module(f"maskprior_jax.bench.{kind}.run")
  cfg = _config(args, kind)
  with cfg.unlocked():
    if args.dataset:
      cfg.data.dataset = args.dataset
    if args.data_dir:
      cfg.data.data_dir = args.data_dir
  runner.validate(cfg)
  methods = _parse_list(args.methods, supervised.METHODS, "method")
  seeds = parse_seeds(args.seeds)
  workdir = pathlib.Path(args.workdir)
  import jax
  problem = runner.load_problem(cfg, jax.process_index(), jax.process_count())   # data found before any write
  _check_workdir(workdir, {"command": kind, "config": cfg.to_dict()}, args.fresh)
  res = supervised.run(cfg, problem, methods, seeds, workdir)
  print(supervised.table(res))
  print(f"results in {workdir}")
  return 0


def cmd_vision(args) -> int:
  return _vision_language(args, "vision")


def cmd_language(args) -> int:
  return _vision_language(args, "language")


def cmd_report(args) -> int:
  """Aggregate run folders: runs of the same task are pooled (mean ± std over seeds per method)."""
  from maskprior_jax.bench import supervised
  from maskprior_jax.bench.arithmetic import run as arithmetic_run
  from maskprior_jax.bench.boolean import run as boolean_run
  from maskprior_jax.bench.boolean import tasks as boolean
  from maskprior_jax.bench.results import BENCHMARKS
  found = []
  for d in args.dirs:
    d = pathlib.Path(d)
    if not d.exists():
      raise UsageError(f"{d} does not exist")
    found += [d / "results.json"] if (d / "results.json").exists() else sorted(d.glob("*/results.json"))
  if not found:
    raise UsageError(f"no results.json in {', '.join(args.dirs)} or their subfolders")
  loaded = [json.loads(p.read_text()) for p in found]
  for path, res in zip(found, loaded):
    if res.get("benchmark") not in BENCHMARKS:
      raise UsageError(f"{path} names no benchmark ({', '.join(BENCHMARKS)}); it was not written by maskprior")
  other = [r for r in loaded if r["benchmark"] != "boolean"]
  out = pathlib.Path(args.out) if args.out else None
  for i, res in enumerate(other):   # arithmetic, vision, language: one table per run folder
    module = arithmetic_run if res["benchmark"] == "arithmetic" else supervised
    print(module.table(res))
    if out is not None:
      dest = out / f"{res['benchmark']}_{i}"
      dest.mkdir(parents=True, exist_ok=True)
      module.write_report(res, dest)
  boolean_found = [(p, r) for p, r in zip(found, loaded) if r["benchmark"] == "boolean"]
  if not boolean_found:
    return 0
  by_task: dict[str, dict] = {}
  source: dict[str, pathlib.Path] = {}
  for path, res in boolean_found:
    if res["task"] in by_task:   # pool seeds of the same task, from runs of the same config only
      merged, first = by_task[res["task"]], source[res["task"]]
      if res["config_digest"] != merged["config_digest"]:
        raise UsageError(f"{first} and {path} ran {res['task']} with different configs; pool only runs of one config")
      have = {(r["method"], r["seed"]) for r in merged["runs"]}
      twice = sorted({(r["method"], r["seed"]) for r in res["runs"]} & have)
      if twice:
        method, seed = twice[0]
        raise UsageError(f"{first} and {path} both hold {res['task']} method {method} seed {seed}; "
                         "pool only disjoint seeds")
      merged = by_task[res["task"]] = {**merged, "runs": merged["runs"] + res["runs"],
                                       "curves": {**res.get("curves", {}), **merged["curves"]}}
    else:
      by_task[res["task"]], source[res["task"]] = res, path
  order = {name: i for i, name in enumerate(boolean.TASKS)}
  results = sorted(by_task.values(), key=lambda r: order.get(r["task"], len(order)))
  if out is not None:
    out.mkdir(parents=True, exist_ok=True)
    for res in results:
      (out / res["task"]).mkdir(exist_ok=True)
      boolean_run.write_task_report(res, out / res["task"])
    boolean_run.write_headline_report(results, out)
  print(boolean_run.headline_table(results))
  for res in results:
    print(boolean_run.task_table(res))
  return 0


CONFIG_HELP = """config overrides:
  --config.SECTION.KEY=VALUE   change one value of the config (built-in, or --config FILE); the
                               config is locked, so an unknown key is an error. Example:
                               maskprior boolean --task f2 --config.train.steps=3000 --config.prior.outside=-8
"""


def _common(p: argparse.ArgumentParser, workdir: str, seeds: str = "3",
            methods: str = "vanilla,mimetic,qk,mask") -> None:
  p.add_argument("--methods", default=methods,
                 help=f"comma-separated, from {methods.replace(',', ', ')} (default: %(default)s)")
  p.add_argument("--seeds", default=seeds, help="a count K (seeds 0..K-1), a range A-B, or a list A,B,C "
                 "(default: %(default)s)")
  p.add_argument("--workdir", default=workdir, help="run folder; a rerun continues there (default: %(default)s)")
  p.add_argument("--config", help="config file with get_config() (default: the built-in config of this benchmark)")
  p.add_argument("--fresh", action="store_true", help="delete what the workdir holds and start over (default: off)")
  _distributed(p)


def _distributed(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("several processes (JAX's distributed runtime; found by itself on TPU VMs)")
  g.add_argument("--coordinator_address", help="HOST:PORT of process 0 (or $MASKPRIOR_COORDINATOR)")
  g.add_argument("--num_processes", type=int, help="number of processes (or $MASKPRIOR_NUM_PROCESSES)")
  g.add_argument("--process_id", type=int, help="this process's index, 0..N-1 (or $MASKPRIOR_PROCESS_ID)")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="maskprior", description="Mask-prior experiments.", epilog=CONFIG_HELP,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  b = sub.add_parser("boolean", help="Boolean extrapolation (GOTU) benchmark", epilog=CONFIG_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     description="Without --task or --target: the headline, all five tasks.")
  b.add_argument("--task", help="f1_threesym, f2_2parity, f3_cyclic, f4_majority, frozen_coordinate (or f1..f4, "
                 "frozen) at the config's sizes (default: the headline, all five)")
  b.add_argument("--target", help='custom target, e.g. "x0x1x2 + x1x2" (default: none)')
  b.add_argument("--seen", help='custom seen domain, e.g. "x0 == 1" (default: none)')
  b.add_argument("--n", type=int, help="dimension of a custom task (default: largest variable + 1)")
  _common(b, "runs/boolean", seeds="0-4")
  b.set_defaults(fn=cmd_boolean)
  a = sub.add_parser("arithmetic", help="low-data arithmetic benchmark (addition, modular addition)",
                     epilog=CONFIG_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  a.add_argument("--task", choices=("add", "modadd"), help="default: the config's (add)")
  a.add_argument("--digits", type=int, help="operand digits for add (default: the config's, 3)")
  a.add_argument("--train-sizes", help="comma-separated training-set sizes (default: the config's, "
                 "250,500)")
  _common(a, "runs/arithmetic", seeds="0-4", methods="vanilla,mimetic,qk,mask,coupling,mask_coupling")
  a.set_defaults(fn=cmd_arithmetic)
  v = sub.add_parser("vision", help="ViT classification with a 2-D locality prior", epilog=CONFIG_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  v.add_argument("--dataset", help="digits (embedded, the default) or a prepared TFDS image dataset: mnist, cifar10, ...")
  v.add_argument("--data-dir", dest="data_dir", help="TFDS data_dir holding the prepared dataset (array_record; "
                 "default: the config's data.data_dir, else ~/tensorflow_datasets)")
  _common(v, "runs/vision")
  v.set_defaults(fn=cmd_vision)
  lang = sub.add_parser("language", help="byte-level LM (or text classification) with a 1-D recency prior",
                        epilog=CONFIG_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  lang.add_argument("--dataset", help="pydoc (embedded, the default) or a prepared TFDS text dataset: "
                    "tiny_shakespeare, imdb_reviews")
  lang.add_argument("--data-dir", dest="data_dir", help="TFDS data_dir holding the prepared dataset (array_record; "
                    "default: the config's data.data_dir, else ~/tensorflow_datasets)")
  _common(lang, "runs/language")
  lang.set_defaults(fn=cmd_language)
  r = sub.add_parser("report", help="tables and plots from run folders")
  r.add_argument("dirs", nargs="+", help="run folders (or folders of run folders)")
  r.add_argument("--out", help="write summary.md, headline.png and per-task plots here (default: print only)")
  r.set_defaults(fn=cmd_report)
  return parser


def _start_processes(args) -> None:
  """Join the other processes of a multi-process run (no-op for one process). Processes other
  than 0 print nothing to stdout: process 0 writes and prints the results."""
  from maskprior_jax import distributed
  given = [args.coordinator_address, args.num_processes, args.process_id]
  if any(v is not None for v in given) and args.coordinator_address is None:
    raise ValueError("--num_processes/--process_id need --coordinator_address HOST:PORT")
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
  if not distributed.is_main_process():
    import os
    sys.stdout = open(os.devnull, "w")


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in argv if a.startswith("--config.")]
  rest = [a for a in argv if not a.startswith("--config.")]
  parser = build_parser()
  args = parser.parse_args(rest)
  args.overrides = overrides
  if args.command != "report":
    try:
      _start_processes(args)
    except (ValueError, RuntimeError) as e:
      print(f"maskprior: error: cannot start the distributed runtime: {e}", file=sys.stderr)
      return 2
  from maskprior_jax.bench.arithmetic.tasks import DataError
  from maskprior_jax.bench.boolean.tasks import TaskSpecError
  from maskprior_jax.bench.data import DataError as DatasetError
  from maskprior_jax.checkpoint import Preempted
  from maskprior_jax.train import NonFiniteLoss
  try:
    return args.fn(args)
  except (ConfigError, UsageError, TaskSpecError, DataError, DatasetError) as e:
    print(f"maskprior: error: {e}", file=sys.stderr)
    return 2
  except NonFiniteLoss as e:
    print(f"maskprior: error: {e}", file=sys.stderr)
    return 1
  except Preempted as e:
    print(f"maskprior: {e}", file=sys.stderr)
    return 143
  except OSError as e:   # disk full, permissions, a path that became a file: the last checkpoint stays
    where = f" ({e.filename})" if getattr(e, "filename", None) else ""
    print(f"maskprior: error: {e.strerror or e}{where}; finished runs and the last checkpoint are kept",
          file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("maskprior: interrupted; finished methods are saved, rerun the same command to continue",
          file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
