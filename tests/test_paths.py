"""Run folders given as `etils.epath.Path` (the type orbax uses): a whole benchmark on one, and
every run-folder file (lock, run_config.json, results.json, damaged files, TensorBoard events,
plots, `maskprior report`) on a `gs://` folder, here an in-memory file system standing in for
Cloud Storage (no network)."""
import json
import pathlib
import re
import struct

import fsspec
import pytest
from cli_args import SHORT_BOOLEAN
from etils import epath
from fsspec.implementations.memory import MemoryFileSystem

from maskprior_jax import paths
from maskprior_jax.bench import cli, results as results_lib, workdir as W
from maskprior_jax.bench.boolean import run as boolean_run, tasks as boolean_tasks
from maskprior_jax.bench.config import apply_overrides, builtin_config

# the shared run's settings (its programs are in the session's compilation cache), checkpoints every 50 steps
SHORT = [*SHORT_BOOLEAN, "--config.checkpoint.every_steps=50"]


class _MemoryGCS(MemoryFileSystem):
  """Cloud Storage's stand-in: what epath opens for `gs://` (its fsspec backend asks for "gcs")."""
  protocol = ("gcs", "gs")
  store, pseudo_dirs = {}, [""]

  def __init__(self, *args, finalize_on_close=None, **kwargs):
    del finalize_on_close
    super().__init__(*args, **kwargs)


@pytest.fixture
def gcs(monkeypatch):
  for protocol in _MemoryGCS.protocol:   # both names, as gcsfs (installed or not) takes both
    fsspec.register_implementation(protocol, _MemoryGCS, clobber=True)
  monkeypatch.setattr("etils.epath.gpath._is_tf_installed", lambda: False)   # epath's fsspec backend
  _MemoryGCS.store.clear()
  _MemoryGCS.pseudo_dirs[:] = [""]
  yield epath.Path("gs://bucket/run")
  _MemoryGCS.store.clear()


def _events(folder: epath.Path) -> dict:
  """tag -> {step: value} read back from a folder's TensorBoard record files."""
  from tensorboardX.proto import event_pb2
  scalars = {}
  for p in sorted(q for q in folder.iterdir() if q.name.startswith("events.out.tfevents.")):
    data, i = p.read_bytes(), 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[i + 12:i + 12 + n])
      for v in event.summary.value:
        if v.HasField("simple_value"):
          scalars.setdefault(v.tag, {})[event.step] = v.simple_value
      i += 12 + n + 4
  return scalars


def test_paths_tell_local_from_cloud_storage():
  assert paths.is_local("runs/x") and paths.is_local(pathlib.Path("/tmp/x")) and paths.is_local(epath.Path("x"))
  assert not paths.is_local("gs://bucket/run") and not paths.is_local(epath.Path("s3://b/x"))
  assert isinstance(paths.path("gs://bucket/run"), epath.Path) and str(paths.path("gs://bucket/run")) == "gs://bucket/run"


def test_a_benchmark_runs_on_an_epath_workdir(tmp_path, capsys):
  """The Boolean benchmark given its workdir as an epath.Path writes the same folder as with a
  string: results, table, plots, TensorBoard, checkpoints; a rerun finds the finished run."""
  work = epath.Path(tmp_path) / "f2"
  cfg = apply_overrides(builtin_config("boolean"), SHORT)
  task = boolean_tasks.get_task("f2")
  res = boolean_run.run_task(task, cfg, ["mask"], [0], work, log=print)
  assert [r["method"] for r in res["runs"]] == ["mask"]
  local = pathlib.Path(tmp_path) / "f2"
  for name in ("results.json", "metrics.jsonl", "config.json", "table.md", "degree_profiles.png", "unseen_loss.png"):
    assert (local / name).stat().st_size > 0, name
  assert json.loads((local / "results.json").read_text())["runs"][0]["state_sha256"] == res["runs"][0]["state_sha256"]
  assert sorted(_events(work / "tensorboard" / "mask" / "seeds_0")["train/loss"]) == [50, 100]
  assert (local / "checkpoints" / "mask" / "seeds_0" / "100").is_dir()
  again = boolean_run.run_task(task, cfg, ["mask"], [0], work, log=print)
  assert again["runs"] == res["runs"] and "already in" in capsys.readouterr().out


def test_a_cloud_workdir_holds_every_run_folder_file(gcs, capsys):
  """On gs:// (an in-memory stand-in): the advisory lock record, run_config.json, atomic-by-object
  writes, a damaged file set aside, TensorBoard events, plots, and `maskprior report` reading it."""
  record = {"command": ["vision"], "config": {"a": 1}}
  with results_lib.open_workdir(str(gcs), record, fresh=False, command="maskprior vision") as work:
    assert isinstance(work, epath.Path) and str(work) == "gs://bucket/run"
    assert json.loads((gcs / W.LOCK_NAME).read_text())["command"] == "maskprior vision"
    assert json.loads((gcs / "run_config.json").read_text()) == record
    src = pathlib.Path(__file__).parents[1] / "experiments" / "results" / "vision" / "results.json"
    results = json.loads(src.read_text())
    results_lib.write_json(work / "results.json", results)
    assert W.read_json(work / "results.json", results_lib._is_results) == results
    log = results_lib.TensorBoardLog(work / "tensorboard" / "mask", hparams={"method": "mask", "lr": 1e-3})
    log.train(10, {"loss": [0.5, 0.7], "learning_rate": 1e-3})
    log(10, {"step": 10, "test_accuracy": [0.8, 0.9]})
    log.train(20, {"loss": [0.25, 0.35], "learning_rate": 1e-3})
    log.close()
    scalars = _events(work / "tensorboard" / "mask")
    assert scalars["train/loss"] == pytest.approx({10: 0.6, 20: 0.3})
    assert scalars["test_accuracy"] == pytest.approx({10: 0.85})
    results_lib.plot_curves(work / "curve.png", {"mask": ([0, 1], [[1.0, 0.5]])}, title="t", ylabel="y")
    assert (work / "curve.png").read_bytes()[:4] == b"\x89PNG"
  assert (gcs / W.LOCK_NAME).read_text() == ""   # released
  # A second command while the first holds the record (its process runs on this host): stopped,
  # naming the holder; released, the folder is free again.
  held = W.WorkdirLock(gcs, "first").acquire()
  with pytest.raises(W.WorkdirBusy, match="in use by process .*first.*its process runs on this host"):
    W.WorkdirLock(gcs, "second").acquire()
  held.release()
  W.WorkdirLock(gcs, "third").acquire().release()
  # `maskprior report` reads the folder where it lies.
  assert cli.main(["report", str(gcs)]) == 0
  assert "test accuracy" in capsys.readouterr().out
  # A damaged file there is set aside (nothing deleted) and read as absent.
  (gcs / "metrics.jsonl").write_text("{not json")
  assert W.read_jsonl(gcs / "metrics.jsonl") is None
  aside = [p.name for p in gcs.iterdir() if p.name.startswith("metrics.jsonl.damaged-")]
  assert len(aside) == 1 and (gcs / aside[0]).read_text() == "{not json"
  assert "metrics.jsonl is unreadable" in capsys.readouterr().err


def test_a_held_cloud_lock_keeps_its_record_fresh(gcs, monkeypatch):
  """While a command holds a gs:// folder, its record's `refreshed` time moves on (a record older
  than REMOTE_STALE_S is taken over); released, the record is emptied."""
  import time
  monkeypatch.setattr(W, "REMOTE_SETTLE_S", 0.0)
  monkeypatch.setattr(W, "REMOTE_REFRESH_S", 0.05)
  held = W.WorkdirLock(gcs, "first").acquire()
  first = json.loads((gcs / W.LOCK_NAME).read_text())["refreshed"]
  deadline = time.time() + 10
  while json.loads((gcs / W.LOCK_NAME).read_text())["refreshed"] == first and time.time() < deadline:
    time.sleep(0.05)
  assert json.loads((gcs / W.LOCK_NAME).read_text())["refreshed"] > first
  held.release()
  assert (gcs / W.LOCK_NAME).read_text() == ""


def test_two_commands_taking_a_cloud_folder_at_once_leave_one_holder(gcs, monkeypatch):
  """A second record written while the first command waits to read its own back: the first
  command stops, naming the one whose record it read."""
  def other_writes(_):
    (gcs / W.LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": 7, "command": "maskprior arithmetic",
                                               "refreshed": 0.0, "token": "theirs"}))
  monkeypatch.setattr(W.time, "sleep", other_writes)
  with pytest.raises(W.WorkdirBusy, match="maskprior arithmetic.*at the same moment"):
    W.WorkdirLock(gcs, "maskprior boolean").acquire()
  assert json.loads((gcs / W.LOCK_NAME).read_text())["token"] == "theirs"


def test_fresh_empties_the_folder_but_keeps_its_own_lock(tmp_path):
  """--fresh over a folder of another config: every earlier file and folder is removed, then the
  new run's record written; the lock file this command holds stays."""
  work = tmp_path / "run"
  (work / "checkpoints" / "mask").mkdir(parents=True)
  (work / "results.json").write_text("{}")
  (work / "run_config.json").write_text(json.dumps({"command": ["old"]}))
  record = {"command": ["boolean"], "config": {"a": 1}}
  with pytest.raises(Exception, match="different config"):
    with results_lib.open_workdir(str(work), record, fresh=False, command="maskprior boolean"):
      pass
  assert (work / "results.json").exists()   # refused: nothing touched
  with results_lib.open_workdir(str(work), record, fresh=True, command="maskprior boolean") as w:
    assert sorted(p.name for p in pathlib.Path(w).iterdir()) == sorted([W.LOCK_NAME, "run_config.json"])
  assert json.loads((work / "run_config.json").read_text()) == record


def test_a_lost_metrics_file_is_rebuilt_from_results_curves(tmp_path):
  """metrics.jsonl (one row per method and evaluation) missing from a folder whose results.json
  holds the config's curves: opening the folder writes it again from those curves."""
  src = pathlib.Path(__file__).parents[1] / "experiments" / "results" / "vision" / "results.json"
  results = json.loads(src.read_text())
  results_lib.write_json(tmp_path / "results.json", results)
  cfg = builtin_config("vision")
  opened = results_lib.open_results(tmp_path, cfg, results["config_digest"], "vision", {})
  assert opened["runs"] == results["runs"]
  rows = W.read_jsonl(tmp_path / "metrics.jsonl", move=False)
  assert len(rows) == sum(len(c["step"]) for c in results["curves"].values())
  method, curve = next(iter(results["curves"].items()))
  assert [r["step"] for r in rows if r["method"] == method] == curve["step"]


class _Response:
  def __init__(self, status, message=""):
    self.status_code, self.text, self.reason = status, message, ""

  def json(self):
    return {"error": {"message": self.text}}


class _Session:
  """requests.Session's get/post/delete, answering from a script; records what was asked."""

  def __init__(self, listed, written=200):
    self.answers, self.asked = {"get": listed, "post": written, "delete": 204}, []

  def __getattr__(self, method):
    def call(url, **kw):
      self.asked.append((method, url, kw.get("params")))
      return _Response(*(self.answers[method] if isinstance(self.answers[method], tuple) else (self.answers[method],)))
    return call


@pytest.mark.parametrize("listed,written,said", [
    (404, 200, "bucket gs://b does not exist; create it (`gcloud storage buckets create gs://b`)"),
    ((403, "no list"), 200, "may not list gs://b (HTTP 403: no list); grant them a role"),
    (200, (403, "no write"), "may not write to gs://b (HTTP 403: no write)"),
    ((503, "later"), 200, "Cloud Storage refused to list gs://b (HTTP 503: later)"),
    (200, 200, None)])
def test_a_cloud_folders_check_names_each_refusal_and_leaves_nothing(listed, written, said):
  """paths._probe, the check a gs:// run folder gets before any work, on scripted answers: each
  refusal is its own sentence; a folder that can be listed and written gets its probe object
  written and deleted again."""
  session = _Session(listed, written)
  if said is None:
    paths._probe(session, "http://gcs", "b", "runs/x")
    (_, _, listed_params), (_, _, written_params), (method, url, _) = session.asked
    assert listed_params["prefix"] == "runs/x" and written_params["name"].startswith("runs/x/.maskprior-write-check-")
    assert method == "delete" and url.endswith("/b/o/" + written_params["name"].replace("/", "%2F"))
  else:
    with pytest.raises(paths._Refused, match=re.escape(said)):
      paths._probe(session, "http://gcs", "b", "runs/x")
    assert not any(method == "delete" for method, *_ in session.asked) and len(session.asked) <= 2
  assert paths.check_reachable("runs/x") is None and paths.check_reachable("s3://b/x") is None   # not checked
  assert paths._cause(OSError("[Errno -2] Name or service not known")) == "Name or service not known"
  assert paths._cause(OSError("Connection refused by peer")) == "Connection refused"


def test_what_a_run_folder_keeps_is_read_from_its_files(tmp_path):
  """workdir.kept, the clause a failure's line ends with: nothing written, nothing finished, or the
  finished runs and the newest committed checkpoint step (orbax's temporary folders do not count),
  and on a full disk the newest checkpoint's size as the space to free."""
  assert W.kept(tmp_path / "absent") == "nothing was written"
  work = tmp_path / "run"
  (work / "checkpoints" / "mask" / "seeds_0" / "150.orbax-checkpoint-tmp").mkdir(parents=True)
  assert W.kept(work) == "no run had finished and no checkpoint was saved"
  for step in (50, 100):
    (work / "checkpoints" / "mask" / "seeds_0" / str(step)).mkdir()
  (work / "checkpoints" / "mask" / "seeds_0" / "100" / "state").write_bytes(b"x" * 300_000)
  (work / "results.json").write_text(json.dumps({"runs": [{"seed": 0}, {"seed": 1}]}))
  assert W.kept(work) == "kept: 2 finished runs and the checkpoint at step 100"
  assert W.kept(work, full_disk=True) == ("kept: 2 finished runs and the checkpoint at step 100; free at least "
                                          "0.3 MiB (the last checkpoint's size) and rerun to resume")
