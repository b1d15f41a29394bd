"""Whole benchmark runs over several processes (JAX's distributed runtime on localhost, CPU
collectives over gloo): `maskprior boolean` data parallel in 2 processes x 2 devices against
1 process x 4 devices: with XLA's all-reduce equal within float32 rounding; with the "ordered"
reduction bit for bit, checked on a two-process run killed mid-run (SIGKILL) then resumed in one
process and on a SLURM-started run stopped by SIGTERM then resumed by rerunning the same two commands.
Also a process lost at each fault point, and run-parallel training over two processes. Slow (several two-process runs): `pytest -m slow
tests/test_multiprocess.py`; CI's slow step spreads the groups (`xdist_group`) over its workers."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_args import DEFAULT_XLA, SMALL_BOOLEAN, free_port, xla_flags

pytestmark = pytest.mark.slow

STEPS = 100
ARGS = ["boolean", "--task", "f2", "--methods", "mask", "--seeds", "2", "--config.train.data_parallel=True",
        f"--config.train.steps={STEPS}", "--config.train.steps_per_call=25", "--config.eval.every_steps=50",
        "--config.checkpoint.every_steps=25", "--config.checkpoint.max_to_keep=3",
        *SMALL_BOOLEAN]
# With XLA's all-reduce, one and two processes reduce the gradient over the 4 devices in
# different orders (in-process sum vs gloo all-reduce), so their float32 states differ by
# rounding: each step can differ by a few units of float32 rounding (2^-23 relative), and such
# differences grow at most about linearly over these few steps; 10x that bound is the tolerance.
# With train.grad_reduction=ordered the sum's order is fixed, and the runs must agree bit for bit.
RTOL = 10 * STEPS * 2.0 ** -23


# Every run here compiles under XLA's defaults (not the tests' cli_args.TEST_XLA): the equivalences
# of one and two processes are claims about the programs users run, and a run compared bit for bit
# with another is compiled like it. The runs share their compiled programs through the session's
# compilation cache, and every test and worker the one-process reference runs (conftest's shared_run).
def _env(devices):
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices, DEFAULT_XLA)}


def _args(reduction):
  return [*ARGS, f"--config.train.grad_reduction={reduction}"]


def _cmd(workdir, extra=(), reduction="xla"):
  return [sys.executable, "-m", "maskprior_jax.bench.cli", *_args(reduction), "--workdir", str(workdir), *extra]


def _one(workdir, reduction="ordered"):
  """The command in one process over the 4 devices (a rerun of a folder two processes left)."""
  return subprocess.run(_cmd(workdir, reduction=reduction), env=_env(4), capture_output=True, text=True, timeout=900)


def _two(workdir, port, reduction="xla"):
  return [subprocess.Popen(_cmd(workdir, ["--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
                                          "--process_id", str(i)], reduction),
                           env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]


def _finish(procs):
  outs = [p.communicate(timeout=900) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return outs


def _results(workdir):
  return json.loads((pathlib.Path(workdir) / "results.json").read_text())


def _numbers(res):
  keys = ("seen_mse", "unseen_mse_true", "unseen_mse_mdi")
  return np.array([[r[k] for k in keys] for r in sorted(res["runs"], key=lambda r: (r["method"], r["seed"]))])


def _one_process(shared_run, reduction):
  """The uninterrupted one-process run (1 process x 4 devices), built once per pytest run and shared
  by every test and worker that compares against it."""
  return _results(shared_run(f"multiprocess_one_{reduction}", _args(reduction), env=_env(4)))


def _printed_by_process_0_only(outs):
  """Process 0 printed the table; process 1 printed none (gloo's own lines aside)."""
  assert "results in" in outs[0][0] and "| mask |" in outs[0][0]
  assert "results in" not in outs[1][0] and "| mask |" not in outs[1][0]


@pytest.mark.xdist_group("multiprocess_xla")
def test_two_processes_equal_one_process_within_float32_rounding(shared_run, tmp_path):
  """XLA's all-reduce (the default): 2 processes x 2 devices end within the float32-rounding bound of
  1 process x 4 devices, every number and curve. (With the ordered reduction the two layouts agree
  bit for bit: checked after an interruption, by the SLURM test (resumed in two processes) and the
  kill -9 test (resumed in one).)"""
  one_process = _one_process(shared_run, "xla")
  outs = _finish(_two(tmp_path, free_port(), "xla"))
  res = _results(tmp_path)
  assert len(res["environment"]["devices"]) == len(one_process["environment"]["devices"]) == 4
  assert (res["environment"]["processes"], one_process["environment"]["processes"]) == (2, 1)
  assert [(r["method"], r["seed"]) for r in res["runs"]] == [(r["method"], r["seed"]) for r in one_process["runs"]]
  np.testing.assert_allclose(_numbers(res), _numbers(one_process), rtol=RTOL)
  for a, b in zip(res["curves"]["mask"]["unseen_mse_true"], one_process["curves"]["mask"]["unseen_mse_true"]):
    np.testing.assert_allclose(a, b, rtol=RTOL)
  _printed_by_process_0_only(outs)
  assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "table.md", "run_config.json", "checkpoints"}


def _wait_for_checkpoint(procs, ckpt, step):
  """Wait until `ckpt` holds a checkpoint at `step` or later, while every process still runs."""
  deadline = time.time() + 600
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if ckpt.exists() and any(d.name.isdigit() and int(d.name) >= step for d in ckpt.iterdir()):
      break
    time.sleep(0.05)
  assert all(p.poll() is None for p in procs), "the run ended before the checkpoint"


def _kill_two_after_a_checkpoint(tmp_path, reduction):
  """Start the two-process run, SIGKILL both processes once a checkpoint (step >= 25) exists."""
  procs = _two(tmp_path, free_port(), reduction)
  _wait_for_checkpoint(procs, tmp_path / "checkpoints" / "mask" / "seeds_0_1", 25)
  for p in procs:
    p.send_signal(signal.SIGKILL)
  for p in procs:
    p.communicate(timeout=60)
  assert not (tmp_path / "results.json").exists()


@pytest.mark.xdist_group("multiprocess_ordered")
def test_ordered_run_killed_in_two_processes_resumes_in_one(shared_run, tmp_path):
  """With grad_reduction=ordered the state does not depend on the process layout, so a run
  killed in 2 processes x 2 devices and resumed by 1 process x 4 devices ends bit for bit where
  the uninterrupted one-process run ends."""
  one_process = _one_process(shared_run, "ordered")
  _kill_two_after_a_checkpoint(tmp_path, "ordered")
  out = _one(tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from the checkpoint at step" in out.stderr
  resumed = _results(tmp_path)
  assert resumed["environment"]["processes"] == 1
  assert [r["state_sha256"] for r in resumed["runs"]] == [r["state_sha256"] for r in one_process["runs"]]
  assert resumed["runs"] == one_process["runs"]


def _slurm_env(rank, job):
  """Only the SLURM variables JAX's cluster detection reads (2 tasks on this host), no flags."""
  env = {k: v for k, v in _env(2).items() if not k.startswith(("SLURM_", "MASKPRIOR_"))}
  return {**env, "SLURM_JOB_ID": str(job), "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
          "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}


def _slurm_job_id():
  """A job id whose coordinator port (JAX: job id mod 4096 + 61440) is free here."""
  for job in np.random.default_rng().integers(1, 10**6, 200):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", int(job) % 4096 + 61440))
        return int(job)
      except OSError:
        continue
  pytest.skip("no free port in JAX's SLURM coordinator range")


def _slurm_two(workdir, job):
  return [subprocess.Popen(_cmd(workdir, reduction="ordered"), env=_slurm_env(i, job), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for i in range(2)]


@pytest.mark.xdist_group("multiprocess_ordered")
def test_slurm_variables_start_the_run_and_sigterm_to_one_process_stops_both_at_one_step(shared_run, tmp_path):
  """Two processes that carry only SLURM's variables join one run by JAX's own detection
  (--distributed auto, the default). Only process 1 then gets SIGTERM: JAX's preemption service
  tells process 0, both save the same step and exit 143. Rerunning the same commands resumes and
  ends on the one-process run's states, numbers and curves bit for bit (ordered reduction), and only
  process 0 prints the table; results.json says 2 processes, started by detection."""
  one_process = _one_process(shared_run, "ordered")
  assert one_process["environment"]["distributed"] == "single process"
  ckpt = tmp_path / "checkpoints" / "mask" / "seeds_0_1"
  procs = _slurm_two(tmp_path, _slurm_job_id())
  _wait_for_checkpoint(procs, ckpt, 25)
  procs[1].send_signal(signal.SIGTERM)
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [143, 143], [o[1][-2000:] for o in outs]
  steps = [int(line.split("SIGTERM at step ")[1].split(":")[0]) for _, err in outs for line in err.splitlines()
           if "SIGTERM at step" in line]
  assert len(steps) == 2 and steps[0] == steps[1] > 25     # each process says where it saved: the same step
  assert max(int(d.name) for d in ckpt.iterdir() if d.name.isdigit()) == steps[0]
  outs = _finish(_slurm_two(tmp_path, _slurm_job_id()))
  res = _results(tmp_path)
  assert res["environment"]["processes"] == 2 and res["environment"]["distributed"] == "detected: slurm"
  assert len(res["environment"]["devices"]) == 4
  # The same float32 sums in the same order: every state, number and curve equal bit for bit.
  assert [r["state_sha256"] for r in res["runs"]] == [r["state_sha256"] for r in one_process["runs"]]
  assert res["runs"] == one_process["runs"] and res["curves"] == one_process["curves"]
  _printed_by_process_0_only(outs)


RUNS_ARGS = ["boolean", "--task", "f2", "--methods", "mask", "--seeds", "2", "--config.train.parallel=runs",
             "--config.train.steps=50", "--config.train.steps_per_call=25", "--config.eval.every_steps=25",
             "--config.checkpoint.every_steps=25", *SMALL_BOOLEAN]


@pytest.mark.xdist_group("multiprocess_xla")
def test_run_parallel_two_processes_give_the_one_process_digests(tmp_path):
  """2 runs, one per device: 2 processes x 1 device (each process holds and steps its own run) end on
  the states of 1 process x 2 devices bit for bit; nothing is reduced across devices. (That
  run-parallel runs equal the same runs on one device is checked in one process, by
  tests/test_run_parallel.py; 2 devices, not 8: on a CPU each device compiles its own program, and
  what is claimed does not depend on the count.)"""
  one = tmp_path / "one"
  subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", *RUNS_ARGS, "--workdir", str(one)],
                 env=_env(2), check=True, capture_output=True, timeout=900)
  two = tmp_path / "two"
  port = free_port()
  procs = [subprocess.Popen([sys.executable, "-m", "maskprior_jax.bench.cli", *RUNS_ARGS, "--workdir", str(two),
                             "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
                             "--process_id", str(i)], env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = _finish(procs)
  assert "run-parallel: 2 runs over 2 devices, 1 per device" in outs[0][1]
  a, b = _results(one), _results(two)
  assert (a["environment"]["processes"], b["environment"]["processes"]) == (1, 2)
  assert a["environment"]["placement"]["mask"]["mode"] == b["environment"]["placement"]["mask"]["mode"] == "runs"
  assert [r["state_sha256"] for r in b["runs"]] == [r["state_sha256"] for r in a["runs"]]
  assert b["runs"] == a["runs"]


def _two_with_fault(workdir, port, victim, fault):
  """The two-process ordered run with `MASKPRIOR_FAULT=fault` in process `victim` only."""
  procs = []
  for i in range(2):
    env = {k: v for k, v in _env(2).items() if k != "MASKPRIOR_FAULT"}
    if i == victim:
      env["MASKPRIOR_FAULT"] = fault
    procs.append(subprocess.Popen(_cmd(workdir, ["--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
                                                 "--process_id", str(i)], "ordered"),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return procs


# JAX's runtime calls a process lost after distributed.HEARTBEAT_TIMEOUT (10 s) without a heartbeat;
# the survivor must have ended by then, plus the time to stop and to write its line.
LOST_BOUND_S = 10 + 15


@pytest.mark.xdist_group("multiprocess_lost")
@pytest.mark.parametrize("fault,victim", [("compile", 1), ("step:3", 0), ("eval:2", 1), ("save:2", 0),
                                          ("step:3:raise", 1)])
def test_a_process_killed_at_each_fault_point_ends_the_other_with_one_line_and_the_rerun_is_exact(
    shared_run, tmp_path, fault, victim):
  """One of two processes dies of SIGKILL (compile: before the first compiled call; step:3: mid-
  training; eval:2: right after an evaluation; save:2: a checkpoint save begun, not on disk;
  process 0 is the coordinator). The other ends within the bound, exit status 75, with one line of
  its own that names the lost process, the checkpoint step on disk and the command to rerun, and no
  C++ stack; the checkpoint it names is on disk, and the rerun ends bit for bit on the uninterrupted
  run's states. The rerun is one process over the same 4 devices: with the ordered reduction the
  states do not depend on the process layout (test_ordered_run_killed_in_two_processes_resumes_in_one),
  so it checks what the lost process left on disk at each point; rerunning both commands after an
  interruption is checked by the SLURM test. `step:3:raise`: an exception instead (a bug in one
  process): that process prints its traceback and ends at once with status 1, not in JAX's
  shutdown barrier, and the other reports it lost as above."""
  from maskprior_jax.bench import supervise
  one_process = _one_process(shared_run, "ordered")
  procs = _two_with_fault(tmp_path, free_port(), victim, fault)
  procs[victim].wait(timeout=600)
  lost_at = time.monotonic()
  survivor = procs[1 - victim]
  out, err = survivor.communicate(timeout=300)
  waited = time.monotonic() - lost_at
  _, victim_err = procs[victim].communicate()
  if fault.endswith(":raise"):
    assert procs[victim].returncode == 1, victim_err[-3000:]
    assert "Traceback" in victim_err and "InjectedFault: injected fault at step:3" in victim_err, victim_err[-3000:]
  else:
    assert procs[victim].returncode == -9
  assert survivor.returncode == supervise.LOST_PROCESS, err[-3000:]
  assert waited < LOST_BOUND_S, waited
  assert "Check failure stack trace" not in err and "    @ " not in err and "Traceback" not in err, err[-3000:]
  line = err.strip().splitlines()[-1]
  assert line.startswith("maskprior: error: lost process ") and f"--process_id {1 - victim}" in line, line
  assert ("process 0 (the coordinator)" if victim == 0 else "lost process 1 ") in line, line
  assert "run the same command in every process: maskprior boolean" in line, line
  steps = supervise.checkpoint_steps(str(tmp_path))
  if steps:
    assert f"{steps[0][0]} at step {steps[0][1]}" in line and steps[0][1] >= 25
  else:
    assert fault == "compile" and "no checkpoint on disk yet" in line
  out = _one(tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert ("resumed from the checkpoint at step" in out.stderr) == bool(steps)
  res = _results(tmp_path)
  assert [r["state_sha256"] for r in res["runs"]] == [r["state_sha256"] for r in one_process["runs"]]
