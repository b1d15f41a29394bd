"""The watcher of a multi-process command (`maskprior_jax.bench.supervise`), in parts: which
commands run watched, how JAX's fatal report is read (two reports as JAX 0.10 wrote them here, in
tests/data: a peer lost, the coordinator lost), and the stream the user sees. The whole behaviour,
with two real processes and one killed, is in tests/test_multiprocess.py (slow)."""
import argparse
import io
import os
import pathlib
import sys
import threading

import pytest

from maskprior_jax.bench import supervise

DATA = pathlib.Path(__file__).parent / "data"


def test_the_runtime_report_names_the_lost_process():
  peer = (DATA / "runtime_report_peer_lost.txt").read_text()
  coordinator = (DATA / "runtime_report_coordinator_lost.txt").read_text()
  assert supervise.lost_process(peer) == ("process 1", "it stopped sending heartbeats")
  assert supervise.lost_process(coordinator) == ("process 0 (the coordinator)", "the connection to it failed")
  assert supervise.lost_process("F1206 client.h:80] something else\n") is None
  assert supervise.lost_process("") is None


def _args(**kw):
  base = dict(distributed="auto", coordinator_address=None, num_processes=None, process_id=None)
  return argparse.Namespace(**{**base, **kw})


def test_only_multi_process_commands_run_watched(monkeypatch):
  for k in ("MASKPRIOR_COORDINATOR", "MASKPRIOR_NUM_PROCESSES", supervise.CHILD_ENV):
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setattr("maskprior_jax.distributed.detect_cluster", lambda: None)
  assert not supervise.wanted(_args())
  assert supervise.wanted(_args(coordinator_address="h:1", num_processes=2, process_id=0))
  assert not supervise.wanted(_args(coordinator_address="h:1", num_processes=1, process_id=0))
  assert not supervise.wanted(_args(distributed="off", coordinator_address="h:1", num_processes=2))
  monkeypatch.setattr("maskprior_jax.distributed.detect_cluster", lambda: "slurm")
  assert supervise.wanted(_args())
  monkeypatch.setenv(supervise.CHILD_ENV, "1")   # the child itself does not start another
  assert not supervise.wanted(_args())


@pytest.mark.parametrize("show", [False, True])
def test_the_stream_hides_the_runtime_report_and_passes_everything_else(show):
  """Progress lines (ended by a carriage return) and the project's own lines pass as they come;
  the runtime's report (absl lines from its sources, their continuation lines, the C++ stack) is
  kept aside, or shown too with MASKPRIOR_RUNTIME_LOG=1."""
  report = (DATA / "runtime_report_peer_lost.txt").read_bytes()
  ours = b"[f2/mask] step 25/100 loss=0.1\r[f2/mask] step 50/100 loss=0.05\n"
  warning = b"W1206 13:18:00.000000   1 some_other_library.cc:12] an unrelated warning\n"
  read, write = os.pipe()
  out = io.BytesIO()
  filt = supervise._Filter(read, out, show)
  os.write(write, ours + warning + report + b"maskprior: after the report\n")
  os.close(write)
  hidden = filt.report()
  assert supervise.lost_process(hidden) == ("process 1", "it stopped sending heartbeats")
  assert hidden.encode() == report
  seen = out.getvalue()
  assert seen.startswith(ours + warning) and seen.endswith(b"maskprior: after the report\n")
  assert (b"Check failure stack trace" in seen) == show and (b"client.h:80" in seen) == show


def test_a_failed_child_ends_at_once_and_a_finished_one_returns(monkeypatch):
  monkeypatch.delenv(supervise.CHILD_ENV, raising=False)
  assert supervise.child_exit(2) == 2   # not a watched child: an ordinary return
  monkeypatch.setenv(supervise.CHILD_ENV, "1")
  ended = []
  monkeypatch.setattr(supervise.os, "_exit", ended.append)
  assert supervise.child_exit(0) == 0 and supervise.child_exit(143) == 143 and not ended
  supervise.child_exit(2)
  assert ended == [2]


def test_the_checkpoint_steps_on_disk_are_the_finished_ones(tmp_path):
  """orbax's own rule: a step folder still under its temporary name does not count."""
  group = tmp_path / "checkpoints" / "mask" / "seeds_0_1"
  (group / "25").mkdir(parents=True)
  (group / "50.orbax-checkpoint-tmp-1234").mkdir()
  (tmp_path / "checkpoints" / "vanilla" / "seeds_0_1").mkdir(parents=True)
  assert supervise.checkpoint_steps(str(tmp_path)) == [("mask/seeds_0_1", 25)]
  assert supervise.checkpoint_steps(str(tmp_path / "nothing")) == []


def test_signals_reach_the_child_and_its_status_is_the_commands(tmp_path, monkeypatch):
  """A child that exits 3 (here a tiny stand-in for the command, through the same entry point)
  gives the watcher status 3; one told to stop by SIGTERM sent to the watcher ends as SIGTERM
  tells it to."""
  script = tmp_path / "child.py"
  script.write_text("import signal, sys, time\n"
                    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
                    "print('ready', file=sys.stderr, flush=True)\n"
                    "sys.exit(3) if sys.argv[1] == 'three' else time.sleep(60)\n")
  real = supervise.subprocess.Popen

  def popen(cmd, **kw):   # the same watcher, with the stand-in for `python -m maskprior_jax.bench.cli`
    return real([sys.executable, str(script), *cmd[3:]], **kw)
  monkeypatch.setattr(supervise.subprocess, "Popen", popen)
  out = io.BytesIO()
  assert supervise.supervise(["three"], str(tmp_path), stderr=out) == 3
  assert out.getvalue() == b"ready\n"
  import signal
  timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
  timer.start()
  assert supervise.supervise(["wait"], str(tmp_path), stderr=io.BytesIO()) == 143
  timer.join()
