import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from cli_args import SMALL_BOOLEAN, xla_flags

# Whole CLI runs, killed and resumed: CI's slow step, the three on one worker (one uninterrupted run).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("resume")]

ARGS = ["boolean", "--task", "f2", "--methods", "mask", "--seeds", "2", "--config.train.steps=300",
        "--config.train.steps_per_call=50", "--config.eval.every_steps=50", "--config.checkpoint.every_steps=50",
        "--config.checkpoint.max_to_keep=3", *SMALL_BOOLEAN]


def _cmd(workdir):
  return [sys.executable, "-m", "maskprior_jax.bench.cli", *ARGS, "--workdir", str(workdir)]


def _env():
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags()}


def _digests(workdir):
  res = json.loads((pathlib.Path(workdir) / "results.json").read_text())
  return [r["state_sha256"] for r in res["runs"]], res


def _steps(workdir):
  d = pathlib.Path(workdir) / "checkpoints" / "mask" / "seeds_0_1"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def _start_and_stop_after(workdir, min_step, sig):
  proc = subprocess.Popen(_cmd(workdir), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if any(s >= min_step for s in _steps(workdir)):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "the run ended before it could be interrupted"
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=120)
  return proc.returncode, err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  work = tmp_path_factory.mktemp("full")
  subprocess.run(_cmd(work), env=_env(), check=True, capture_output=True, timeout=600)
  return _digests(work)


def test_sigterm_saves_and_exits_cleanly_then_resumes(uninterrupted, tmp_path):
  rc, err = _start_and_stop_after(tmp_path, 50, signal.SIGTERM)
  assert rc == 143, err
  assert "checkpoint saved" in err and "Traceback" not in err
  saved = _steps(tmp_path)
  assert saved and max(saved) >= 50
  out = subprocess.run(_cmd(tmp_path), env=_env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr
  assert _digests(tmp_path)[0] == uninterrupted[0]


def test_kill9_then_resume_is_bit_identical_and_a_truncated_latest_checkpoint_falls_back_to_the_previous(
    uninterrupted, tmp_path):
  """A run killed (SIGKILL) after its checkpoint at step 150, its latest checkpoint then cut to a
  third: the rerun says that checkpoint is unreadable, resumes from an earlier one, and ends on the
  uninterrupted run's states, numbers and curves bit for bit."""
  rc, _ = _start_and_stop_after(tmp_path, 150, signal.SIGKILL)
  assert rc == -signal.SIGKILL
  assert not (tmp_path / "results.json").exists()
  steps = _steps(tmp_path)
  assert len(steps) >= 2
  latest = tmp_path / "checkpoints" / "mask" / "seeds_0_1" / str(steps[-1])
  for f in latest.rglob("*"):
    if f.is_file():
      f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 3])
  out = subprocess.run(_cmd(tmp_path), env=_env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr
  assert f"checkpoint at step {steps[-1]}" in out.stderr and "unreadable" in out.stderr
  assert "resumed from the checkpoint at step" in out.stderr, out.stderr[-2000:]
  digests, res = _digests(tmp_path)
  assert digests == uninterrupted[0]
  full = uninterrupted[1]
  assert [r["unseen_mse_true"] for r in res["runs"]] == [r["unseen_mse_true"] for r in full["runs"]]
  assert res["curves"] == full["curves"]
