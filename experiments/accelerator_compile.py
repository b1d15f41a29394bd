"""Every benchmark's programs compiled for TPU and GPU targets on this CPU (`maskprior compile`), as
JSON lines: experiments/results/accelerator_compile/programs.jsonl (one line per program).

  pip install ".[bench,compile]"
  python experiments/accelerator_compile.py                       # the whole matrix, resumable
  python experiments/accelerator_compile.py --targets h200 --dtypes bfloat16
  python experiments/accelerator_compile.py --markdown            # the docs tables from the lines

The matrix: each benchmark's default command (the Boolean default at task f1: its other tasks' programs
have the same sizes or fewer tokens) and the paper-size Boolean config (boolean_paper, what notebook 02
runs on a GPU or TPU runtime) at f1 (n = 15, like f2, f3 and f4 there) and frozen_coordinate (n = 18),
in float32 and bfloat16, for each target. A command already in the file is not run again.
"""
import argparse
import json
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
    ("boolean", None, ["--task", "f1_threesym"]),
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
        tmp = out.with_suffix(".part")
        tmp.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", "compile", *args, "--json", str(tmp)],
                              capture_output=True, text=True)
        lines = [json.loads(line) for line in tmp.read_text().splitlines()] if tmp.exists() else []
        tmp.unlink(missing_ok=True)
        if proc.returncode not in (0, 1) or not lines:   # 1: compiled, something does not fit (recorded)
          err = (proc.stderr.strip().splitlines() or ["?"])[-1]
          print(f"FAILED {command}: {err}", flush=True)
          continue
        with open(out, "a") as f:
          for row in lines:
            row["command"] = command
            f.write(json.dumps(row) + "\n")
        print(f"{command}: {len(lines)} programs in {time.perf_counter() - t0:.0f} s", flush=True)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--targets", default=",".join(TARGETS))
  p.add_argument("--dtypes", default=",".join(DTYPES))
  p.add_argument("--out", default=str(OUT))
  p.add_argument("--markdown", action="store_true", help="print the docs tables from the JSON lines and stop")
  a = p.parse_args()
  if a.markdown:
    from maskprior_jax.bench import compile_report
    print(compile_report.markdown(compile_report.load(pathlib.Path(a.out))), end="")
    return
  run_matrix(a.targets.split(","), a.dtypes.split(","), pathlib.Path(a.out))


if __name__ == "__main__":
  main()
