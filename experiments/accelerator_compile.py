"""Every benchmark's programs compiled for TPU and GPU targets on this CPU (`maskprior compile`), as
JSON lines: experiments/results/accelerator_compile/programs.jsonl (one line per program).

  pip install ".[bench,compile]"
  python experiments/accelerator_compile.py                       # the whole matrix, resumable
  python experiments/accelerator_compile.py --targets h200 --dtypes bfloat16
  python experiments/accelerator_compile.py --markdown experiments/results/accelerator_compile/programs.jsonl

The matrix: each benchmark's default command (the Boolean one is the main job: the headline's five tasks)
and the paper-size Boolean config (boolean_paper, what notebook 02 runs on a GPU or TPU runtime) at f1
(n = 15, as f2, f3 and f4 there: the same programs) and frozen_coordinate (n = 18), in float32 and
bfloat16, for each target. A command already in the file is not run again.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent
OUT = ROOT / "results" / "accelerator_compile" / "programs.jsonl"
TARGETS = ("h200", "v5e-8", "h100", "v5e-1", "cpu")
DTYPES = ("bfloat16", "float32")
COMMANDS = (
    ("boolean", "boolean_paper", ["--task", "f1_threesym"]),
    ("boolean", "boolean_paper", ["--task", "frozen_coordinate"]),
    ("boolean", None, []),
    ("arithmetic", None, []),
    ("vision", None, []),
    ("language", None, []),
)
PAPER_HEADLINE_TASKS = {"f1_threesym": 4, "frozen_coordinate": 1}   # f1..f4 have n = 15 in boolean_paper


def argv(benchmark, config, extra, target, dtype):
  args = [benchmark, *extra, "--topology", target, f"--config.model.dtype={dtype}"]
  return args + (["--config", config] if config else [])


def done_commands(path: pathlib.Path) -> set:
  if not path.exists():
    return set()
  return {json.loads(line)["command"] for line in path.read_text().splitlines() if line.strip()}


def run_matrix(targets, dtypes, out: pathlib.Path):
  out.parent.mkdir(parents=True, exist_ok=True)
  for dtype in dtypes:
    for target in targets:
      for benchmark, config, extra in COMMANDS:
        args = argv(benchmark, config, extra, target, dtype)
        command = " ".join(["maskprior", "compile", *args])
        if command in done_commands(out):
          continue
        t0 = time.perf_counter()
        tmp = out.with_suffix(f".{os.getpid()}.part")   # this process's own: several may fill one file
        tmp.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", "compile", *args, "--json", str(tmp)],
                              capture_output=True, text=True)
        lines = [json.loads(line) for line in tmp.read_text().splitlines()] if tmp.exists() else []
        tmp.unlink(missing_ok=True)
        if proc.returncode not in (0, 1) or not lines:   # 1: compiled, something does not fit (recorded)
          lines_err = proc.stderr.strip().splitlines() or ["?"]
          err = next((x for x in reversed(lines_err) if x.startswith(("maskprior:", "Traceback"))), lines_err[-1])
          print(f"FAILED {command}: {err}", flush=True)
          continue
        with open(out, "a") as f:
          for row in lines:
            row["command"] = command
            f.write(json.dumps(row) + "\n")
        print(f"{command}: {len(lines)} programs in {time.perf_counter() - t0:.0f} s", flush=True)


def _mib(x):
  return f"{x / (1 << 20):,.0f}"


def _gib(x):
  return f"{x / (1 << 30):,.0f}"


def _steps(config: str) -> int:
  from maskprior_jax.bench.config import builtin_config
  return int(builtin_config(config).train.steps)


def _name(row) -> str:
  """A command's short name: benchmark, config and task flag."""
  cmd = row["command"].split()
  task = cmd[cmd.index("--task") + 1] if "--task" in cmd else None
  config = row["config"] if row["config"] != "default" else row["benchmark"]
  return config + (f" --task {task}" if task else "")


def _commands(rows):
  out = {}
  for r in rows:
    out.setdefault((r["target"], r["dtype"], _name(r)), []).append(r)
  return out


def _headline(groups, target, dtype, config, tasks):
  """Rows of a Boolean headline from its tasks' commands ({task: times}), or None if one is missing."""
  rows = []
  for task, times in tasks.items():
    got = groups.get((target, dtype, f"{config} --task {task}"))
    if got is None:
      return None
    rows += got * times
  return rows


def markdown(rows) -> str:
  """The docs table: every command's programs, per target and dtype."""
  from maskprior_jax.bench.compile import TARGETS
  groups = _commands(rows)
  targets = [t for t in TARGETS if t != "cpu" and any(k[0] == t for k in groups)]
  targets += ["cpu"] if any(k[0] == "cpu" for k in groups) else []
  lines = ["| target | dtype | command | programs | runs per program | GFLOP per run-step | largest memory per device, MiB "
           "(device: GiB) | fit | collectives per program | attention | compile s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for (target, dtype, name), rs in sorted(groups.items(), key=lambda kv: (targets.index(kv[0][0]), kv[0][1], kv[0][2])):
    trains = [r for r in rs if r["program"] == "train"]
    per_run = sorted({f"{r['flops'] / r['runs'] / 1e9:,.2f}" for r in trains}, key=lambda x: float(x.replace(",", "")))
    per_op = {}
    for r in rs:
      for k, v in r["collectives"].items():
        per_op.setdefault(k, set()).add(v)
    coll = [f"{k} x{min(v)}" + (f"-{max(v)}" if max(v) > min(v) else "") for k, v in sorted(per_op.items())]
    runs = sorted({r["runs"] for r in trains})
    lines.append(f"| {target} | {dtype} | {name} | {len(rs)} | {', '.join(map(str, runs))} | {' / '.join(per_run)} | "
                 f"{_mib(max(r['memory_per_device'] for r in rs))} ({_gib(rs[0]['device_memory'])}) | "
                 f"{'all' if all(r['fits'] for r in rs) else 'NO'} | {', '.join(coll) or 'none'} | "
                 f"{', '.join(sorted({r['attention'] for r in rs}))} | {sum(r['compile_seconds'] for r in rs):,.0f} |")
  return "\n".join(lines) + "\n"


def load(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--targets", default=",".join(TARGETS))
  p.add_argument("--dtypes", default=",".join(DTYPES))
  p.add_argument("--out", default=str(OUT))
  p.add_argument("--markdown", help="print the docs tables of this JSON-lines file and stop")
  a = p.parse_args()
  if a.markdown:
    print(markdown(load(pathlib.Path(a.markdown))), end="")
    return
  run_matrix(a.targets.split(","), a.dtypes.split(","), pathlib.Path(a.out))


if __name__ == "__main__":
  main()
