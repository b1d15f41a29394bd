"""Faults as users meet them: a crash (kill -9) at chosen moments, every file of a run folder cut
or garbled, two commands on one folder, a full disk. Each case checks the documented outcome: the
rerun ends on the uninterrupted run's state_sha256, or a one-line error that names the file or the
holder, and nothing finished is lost. The whole-run cases are slow (CI's slow step runs them); the
lock, the set-aside and the report cases run in the default suite."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from cli_args import SMALL_BOOLEAN, xla_flags

from maskprior_jax.bench import cli
from maskprior_jax.bench import workdir as W

ARGS = ["boolean", "--task", "f2", "--methods", "mask", "--seeds", "1", "--config.train.steps=100",
        "--config.train.steps_per_call=25", "--config.eval.every_steps=50", "--config.checkpoint.every_steps=50",
        "--config.qk.fit_steps=10", *SMALL_BOOLEAN]
FILES = ("results.json", "metrics.jsonl", "run_config.json", "config.json")


def _run(workdir, fault=None, wait=True, args=ARGS):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags()}
  env.pop("MASKPRIOR_FAULT", None)
  if fault:
    env["MASKPRIOR_FAULT"] = fault
  cmd = [sys.executable, "-m", "maskprior_jax.bench.cli", *args, "--workdir", str(workdir)]
  if not wait:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _digests(workdir):
  res = json.loads((pathlib.Path(workdir) / "results.json").read_text())
  return sorted((r["method"], r["seed"], r["state_sha256"]) for r in res["runs"])


def _own_lines(stderr: str) -> list[str]:
  """stderr without library warnings (absl, XLA), as a user reads it."""
  return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("W0", "I0", "E0", "WARNING"))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  work = tmp_path_factory.mktemp("reference") / "run"
  out = _run(work)
  assert out.returncode == 0, out.stderr
  return work, _digests(work)


# ----------------------------------------------------------------------------- fast cases
def test_second_lock_on_a_folder_names_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
  first = W.WorkdirLock(tmp_path, "maskprior boolean --workdir x").acquire()
  with pytest.raises(W.WorkdirBusy, match=f"in use by process {os.getpid()} on .*maskprior boolean"):
    W.WorkdirLock(tmp_path, "second").acquire()
  first.release()
  with W.WorkdirLock(tmp_path, "third"):   # released cleanly: no note
    pass
  assert "taking it over" not in capsys.readouterr().err
  # A record left in the lock file with no lock held: its process died (kill -9 leaves exactly this).
  (tmp_path / W.LOCK_NAME).write_text(json.dumps({"host": "h", "pid": 12345, "started": "t", "command": "c"}))
  with W.WorkdirLock(tmp_path, "fourth"):
    pass
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "process 12345" in err[0] and "taking it over" in err[0]


@pytest.mark.parametrize("content", [b'{"runs": [', b"\xff\xfe garbage", b'["not", "a", "record"]'])
def test_a_damaged_file_is_set_aside_with_one_warning_and_read_as_absent(tmp_path, capsys, content):
  from maskprior_jax.bench.results import _is_results
  path = tmp_path / "results.json"
  path.write_bytes(content)
  assert W.read_json(path, _is_results) is None
  aside = list(tmp_path.glob("results.json.damaged-*"))
  assert not path.exists() and len(aside) == 1 and aside[0].read_bytes() == content   # nothing deleted
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "results.json is unreadable" in err[0] and aside[0].name in err[0]


def test_atomic_writes_use_a_temporary_name_per_process(tmp_path, monkeypatch):
  seen = []
  real = os.replace
  monkeypatch.setattr(os, "replace", lambda a, b: (seen.append(pathlib.Path(a).name), real(a, b)))
  W.write_json(tmp_path / "results.json", {"a": 1})
  assert json.loads((tmp_path / "results.json").read_text()) == {"a": 1}
  assert seen and str(os.getpid()) in seen[0] and seen[0].endswith(".tmp")


def test_report_names_a_damaged_results_file_in_one_line_and_reports_the_rest(tmp_path, capsys):
  bad, good = tmp_path / "bad", tmp_path / "good"
  bad.mkdir()
  (bad / "results.json").write_text('{"benchmark": "vision", "runs": [')
  assert cli.main(["report", str(bad)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "results.json is unreadable" in err[0]
  src = pathlib.Path(__file__).parents[1] / "experiments" / "results" / "vision" / "results.json"
  good.mkdir()
  shutil.copy(src, good / "results.json")
  assert cli.main(["report", str(bad), str(good)]) == 1     # partial: the rest reported, the skip signalled
  out = capsys.readouterr()
  assert "test accuracy" in out.out and len(out.err.strip().splitlines()) == 1 and "skipped" in out.err


# ----------------------------------------------------------------------------- whole runs (slow)
@pytest.mark.slow
@pytest.mark.parametrize("fault", ["compile", "step:3", "eval:2", "save:2", "write:3"])
def test_kill9_at_a_chosen_moment_then_rerun_ends_on_the_reference_state(reference, tmp_path, fault):
  """compile: before the first compiled call; step:3: mid-training; eval:2: right after an
  evaluation; save:2: a checkpoint save begun, not on disk; write:3: results.json written under
  its temporary name, not renamed (the first method finished, not yet recorded)."""
  out = _run(tmp_path, fault)
  assert out.returncode == -9, out.stderr
  again = _run(tmp_path)
  assert again.returncode == 0, again.stderr
  assert "Traceback" not in again.stderr
  assert "taking it over" in again.stderr          # the crashed command's lock, taken over with a note
  assert _digests(tmp_path) == reference[1]
  assert not list(tmp_path.glob(".*.tmp")) or fault == "write:3"   # only a crash mid-write leaves one


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cut", "garble"])
def test_damaged_run_folder_files_are_set_aside_and_the_rerun_rebuilds_them(reference, tmp_path, how):
  """Every file of a finished run folder (results.json, metrics.jsonl, run_config.json,
  config.json, table.md) cut to half its bytes, or garbled: each JSON file is set aside with one
  warning naming it, the finished run is rebuilt from its final checkpoint (the same
  state_sha256), and every file is written anew."""
  work = tmp_path / "run"
  shutil.copytree(reference[0], work)
  for name in (*FILES, "table.md"):
    data = (work / name).read_bytes()
    (work / name).write_bytes(data[: len(data) // 2] if how == "cut" else b"\x00\xff" + data[2:][::-1])
  out = _run(work)
  assert out.returncode == 0, out.stderr
  assert "Traceback" not in out.stderr
  assert _digests(work) == reference[1]                 # finished runs rebuilt from their checkpoints
  warned = [ln for ln in out.stderr.splitlines() if "is unreadable" in ln]
  for name in FILES:
    assert len(list(work.glob(f"{name}.damaged-*"))) == 1
    assert sum(f"/{name} is unreadable" in ln for ln in warned) == 1
  for name in ("results.json", "run_config.json", "config.json"):
    assert isinstance(json.loads((work / name).read_text()), dict)    # written anew
  assert W.read_jsonl(work / "metrics.jsonl", move=False)
  assert (work / "table.md").read_text() == (reference[0] / "table.md").read_text()


@pytest.mark.slow
def test_two_commands_on_one_folder_the_second_stops_naming_the_holder(reference, tmp_path):
  first = _run(tmp_path, wait=False)
  lock = tmp_path / W.LOCK_NAME
  deadline = time.time() + 120
  while time.time() < deadline and not (lock.exists() and lock.read_text().strip()) and first.poll() is None:
    time.sleep(0.05)
  second = _run(tmp_path)
  out, err = first.communicate(timeout=600)
  assert first.returncode == 0, err
  assert second.returncode == 2
  lines = _own_lines(second.stderr)
  assert 1 <= len(lines) <= 3 and "in use by process" in lines[-1] and f"process {first.pid}" in lines[-1], lines
  assert _digests(tmp_path) == reference[1]


@pytest.mark.slow
def test_a_full_disk_is_one_line_naming_what_is_kept_and_the_rerun_resumes_exactly(reference, tmp_path):
  """A 400 KiB tmpfs (needs the right to mount one; skipped otherwise): the step-50 checkpoint
  (about 0.2 MiB) fits, the step-100 one does not. The run stops, status 2, its last line naming the
  folder, the checkpoint kept and the space to free; the files finished before stay readable. With
  the space grown, the same command resumes from step 50 and ends on the uninterrupted run's state."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)], capture_output=True).returncode:
    pytest.skip("cannot mount a small tmpfs here")
  try:
    out = _run(disk / "run")
    assert out.returncode == 2, out.stderr
    # orbax's save threads report the failure themselves (absl ERROR lines, tracebacks): into the
    # log file the command's line names, not onto the screen, where the line is the last one
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("maskprior: error: No space left on device") and str(disk) in last, out.stderr[-2000:]
    assert "kept: the checkpoint at step 50; free at least " in last and "MiB" in last, last
    assert "Traceback" not in out.stderr and "ERROR" not in out.stderr and len(out.stderr.splitlines()) <= 5, out.stderr
    logged = last.split("(the libraries' messages: ")[1].rstrip(")")
    assert "Traceback" in pathlib.Path(logged).read_text()   # what orbax's threads printed
    pathlib.Path(logged).unlink()
    for name in FILES:
      path = disk / "run" / name
      if path.exists():
        json.loads(path.read_text()) if name != "metrics.jsonl" else W.read_jsonl(path, move=False)
    assert subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], capture_output=True).returncode == 0
    again = _run(disk / "run")
    assert again.returncode == 0 and "resumed from the checkpoint at step 50" in again.stderr, again.stderr[-2000:]
    assert _digests(disk / "run") == reference[1]
  finally:
    subprocess.run(["umount", str(disk)], capture_output=True)


_LIBRARY_LOG = """
import os, sys, threading
from maskprior_jax.bench import console
log = console.LibraryLog("maskprior boolean --task f2")
print("maskprior: the command's own line", file=console.screen())
print("WARNING:absl:a library's Python-level message", file=sys.stderr)
os.write(2, b"E0101 00:00:00.000000 1 client.cc:1] a C++ log line\\n")
thread = threading.Thread(target=lambda: 1 / 0)   # a background thread's traceback
thread.start()
thread.join()
print(log.settle(sys.argv[1]), file=console.screen())
print("after settling", file=sys.stderr)
"""


def test_the_libraries_output_goes_to_the_run_folders_log_and_the_commands_own_lines_to_the_screen(tmp_path):
  """console.LibraryLog, which a benchmark command run as a program starts: Python's stderr, C++
  writes to file descriptor 2 and background threads' tracebacks land in <workdir>/maskprior.log
  (under a header naming the command, also after it is settled there); the screen shows only the
  command's own lines."""
  out = subprocess.run([sys.executable, "-c", _LIBRARY_LOG, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr
  log = tmp_path / "maskprior.log"
  assert out.stderr.splitlines() == ["maskprior: the command's own line", str(log)], out.stderr
  text = log.read_text()
  assert text.startswith("--- ") and "maskprior boolean --task f2\n" in text.splitlines()[0] + "\n"
  for line in ("a library's Python-level message", "a C++ log line", "ZeroDivisionError", "after settling"):
    assert line in text, (line, text)
