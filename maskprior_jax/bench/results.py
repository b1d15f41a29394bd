"""Run folders and what is read back from them: results.json (one record per finished
method and seed), metrics.jsonl, TensorBoard events, Markdown tables and plots.

Every results.json carries a `benchmark` field ("boolean", "arithmetic", "vision",
"language") so that `maskprior report` knows how to read it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import time
from typing import Any, Sequence

import jax
import numpy as np

from maskprior_jax.bench import console
from maskprior_jax.bench import workdir as workdir_lib
from maskprior_jax import distributed
from maskprior_jax.distributed import barrier, is_main_process

BENCHMARKS = ("boolean", "arithmetic", "vision", "language")


class ReportError(ValueError):
  """Run folders that cannot be reported together (reported as one line)."""


def _differences(there: dict, here: dict, limit: int = 3) -> str:
  """The keys in which two run records differ, as "key: there -> here" (absent: a key one lacks,
  e.g. one added to the config after that folder was recorded), the first `limit` of them."""
  from flax import traverse_util
  a, b = traverse_util.flatten_dict(there, sep="."), traverse_util.flatten_dict(here, sep=".")
  keys = [k for k in sorted(set(a) | set(b)) if a.get(k, "absent") != b.get(k, "absent")]
  shown = ", ".join(f"{k}: {a.get(k, 'absent')!r} there, {b.get(k, 'absent')!r} here" for k in keys[:limit])
  return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


@contextlib.contextmanager
def open_workdir(workdir: str | os.PathLike, record: dict, fresh: bool, command: str):
  """The run folder for one command, held for the command's whole run. Entered once every input
  is known good, before anything is written:

  - a workdir that cannot be created or written is a one-line error (`config.UsageError`);
  - the folder is locked (`workdir.WorkdirLock`, taken by process 0, the others follow): another
    command on it stops with one line naming the holder (`workdir.WorkdirBusy`);
  - a workdir that holds a run of a different config or command is an error unless `fresh` (then
    its contents are deleted). Seeds and methods are not part of the record: more of either can
    be added to a workdir (finished (method, seed) runs are kept). A damaged run_config.json is
    set aside and written anew.
  Writes run_config.json; process 0 alone writes."""
  from maskprior_jax.bench.config import UsageError
  from maskprior_jax.distributed import broadcast_flag
  workdir = workdir_lib.path(workdir)
  cfg_path = workdir / "run_config.json"
  record = json.loads(json.dumps(record, sort_keys=True))  # as stored: tuples become lists
  if workdir.exists() and not workdir.is_dir():
    raise UsageError(f"--workdir {workdir} is a file, not a folder")
  if workdir_lib.is_local(workdir):   # on cloud storage, access shows at the first write
    existing = next(p for p in [workdir, *workdir.absolute().parents] if p.exists())
    if not existing.is_dir():
      raise UsageError(f"cannot create --workdir {workdir}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
      raise UsageError(f"cannot write in --workdir {workdir}: {existing} is not writable")
  def check_record(move: bool) -> None:
    old = None if fresh else workdir_lib.read_json(cfg_path, lambda r: isinstance(r, dict), move=move)
    if old is not None and old != record:
      raise UsageError(f"{workdir} holds a run with a different config or command ({_differences(old, record)}); "
                       f"use another --workdir, or --fresh to start over there")
  check_record(move=False)   # before the lock: a refused command leaves the folder as it was
  lock, busy = workdir_lib.WorkdirLock(workdir, command), None
  if is_main_process():
    try:
      lock.acquire()
    except workdir_lib.WorkdirBusy as e:
      busy = e
  if broadcast_flag(busy is not None):   # every process stops when process 0 could not take the folder
    raise busy or workdir_lib.WorkdirBusy(f"{workdir} is in use by another command")
  try:
    check_record(move=is_main_process())   # again under the lock; a damaged record is set aside
    if is_main_process():   # with several processes, only process 0 writes
      if fresh:
        for child in workdir.iterdir():
          if child.name != workdir_lib.LOCK_NAME:   # the lock this command holds
            child.rmtree() if child.is_dir() else child.unlink()
      workdir_lib.write_text(cfg_path, json.dumps(record, indent=1, sort_keys=True))
    barrier("maskprior_workdir_ready")
    yield workdir
  finally:
    lock.release()


@dataclasses.dataclass
class RunRecord:
  """One finished (method, seed) run, as stored in results.json["runs"].

  metrics: the benchmark's final numbers (flattened into the row); persistence: the eval
  history's per-run persistence measurements; info: per-run init info (e.g. qk_fit_tv).
  """
  method: str
  seed: int
  metrics: dict
  persistence: list
  state_sha256: str
  info: dict = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return {"method": self.method, "seed": int(self.seed), **self.metrics, "persistence": self.persistence,
            "state_sha256": self.state_sha256, **self.info}


def write_json(path: str | os.PathLike, obj: Any) -> None:
  """Write atomically (`workdir.write_json`: temp file named after host and process, then a
  rename), so an interrupted write never leaves half a file. Only process 0 writes."""
  if is_main_process():
    workdir_lib.write_json(path, obj)


def _is_results(obj) -> bool:
  return isinstance(obj, dict) and isinstance(obj.get("runs"), list) and isinstance(obj.get("curves"), dict) \
      and obj.get("benchmark") in BENCHMARKS


def open_results(workdir: str | os.PathLike, cfg, digest: str, benchmark: str, header: dict) -> dict:
  """The run folder's results.json if it holds a run of the same config (`digest`), so that
  finished methods are kept; otherwise a new record of `benchmark` and `header` with empty
  runs. Writes config.json."""
  if benchmark not in BENCHMARKS:
    raise ValueError(f"unknown benchmark {benchmark!r}")
  workdir = workdir_lib.path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  from maskprior_jax.bench.config import attention_record
  results = {"benchmark": benchmark, **header, "config_digest": digest, "runs": [], "curves": {}, "wall_s": {},
             "environment": environment(), "attention": attention_record(cfg)}
  main = is_main_process()   # process 0 sets damaged files aside; the others read them as absent
  old = workdir_lib.read_json(workdir / "results.json", _is_results, move=main)
  if old is not None and old.get("config_digest") == digest:
    results = old
  workdir_lib.read_json(workdir / "config.json", lambda c: isinstance(c, dict), move=main)
  if workdir_lib.read_jsonl(workdir / "metrics.jsonl", move=main) is None and results["curves"]:
    _write_metrics(workdir, results)   # rebuilt from results.json's curves
  write_json(workdir / "config.json", cfg.to_dict())
  return results


def _write_metrics(workdir: str | os.PathLike, results: dict) -> None:
  write_jsonl(workdir / "metrics.jsonl", [
      {"method": m, "runs": c.get("runs"), **{k: c[k][t] for k in c if k != "runs"}}
      for m, c in results["curves"].items() for t in range(len(c["step"]))])


def record_method(results: dict, method: str, history: Sequence[dict], wall_s: float,
                  workdir: str | os.PathLike, run_labels: Sequence | None = None) -> None:
  """Store a finished batch of a method's runs: its eval curves (appended run-wise to the curves
  of earlier seeds of the same method, which share the eval steps) and wall time; rewrite
  results.json and metrics.jsonl (one row per method and evaluation; `run_labels` name the runs
  of each curve, the seeds by default)."""
  workdir = workdir_lib.path(workdir)
  new = {k: [h[k] for h in history] for k in history[0]}
  new["runs"] = [list(r) if isinstance(r, (tuple, list)) else r for r in (run_labels or [])]
  old = results["curves"].get(method)
  if old is not None and old["step"] == new["step"]:
    new = {k: (v if k == "step" else (old[k] + v if k == "runs" else [a + b for a, b in zip(old[k], v)]))
           for k, v in new.items()}
  results["curves"][method] = new
  results["wall_s"][method] = results["wall_s"].get(method, 0.0) + wall_s
  write_json(workdir / "results.json", results)
  _write_metrics(workdir, results)


def seeds_to_run(results: dict, method: str, seeds: Sequence[int]) -> list[int]:
  """The seeds of `method` that results.json does not hold yet (a rerun, or more seeds, runs only those)."""
  done = {r["seed"] for r in results["runs"] if r["method"] == method}
  return [s for s in seeds if s not in done]


def seeds_dir(seeds: Sequence[int]) -> str:
  """A folder name for one batch of seeds (checkpoints, TensorBoard): the seeds themselves, or for
  more than 16 the range, count and a digest of the list (a file name has at most 255 bytes)."""
  if len(seeds) <= 16:
    return "seeds_" + "_".join(str(s) for s in seeds)
  import hashlib
  digest = hashlib.sha256(",".join(map(str, seeds)).encode()).hexdigest()[:8]
  return f"seeds_{min(seeds)}-{max(seeds)}_n{len(seeds)}_{digest}"


def environment() -> dict:
  import flax
  import optax
  from maskprior_jax import __version__, version
  code = version.source()
  return {"maskprior_jax": __version__, "commit": code["commit"], "dirty": code["dirty"], "jax": jax.__version__, "flax": flax.__version__,
          "optax": optax.__version__, "python": platform.python_version(),
          "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
          "processes": jax.process_count(), "distributed": distributed.started()}


def write_jsonl(path: str | os.PathLike, rows: Sequence[dict]) -> None:
  """Rewrite a JSON-lines file atomically (one row per line); only process 0 writes."""
  if is_main_process():
    workdir_lib.write_jsonl(path, rows)


class TensorBoardLog:
  """One method's TensorBoard events (tensorboardX), written as they come: evaluation rows (the
  mean over seeds of every metric, per layer if a vector), training windows (`train`: loss,
  gradient norm, learning rate; mean over seeds under "train/", each seed under
  "train_seed/<label>/"), and the run's config as hparams when the writer opens. Opened lazily,
  so a run that never logs writes nothing; only process 0 writes."""

  def __init__(self, logdir: str | os.PathLike, hparams: dict | None = None, labels: Sequence | None = None):
    self.logdir, self.writer, self.hparams, self.labels = workdir_lib.path(logdir), None, hparams, labels

  def _open(self):
    if self.writer is None:
      from tensorboardX import SummaryWriter
      if not workdir_lib.is_local(self.logdir):
        _register_event_writer(os.fspath(self.logdir).split(":")[0])
      self.writer = SummaryWriter(os.fspath(self.logdir))
      if self.hparams:
        from tensorboardX.summary import hparams
        for summary in hparams(self.hparams, {"unseen_mse_true": 0.0, "train/loss": 0.0}):
          self.writer.file_writer.add_summary(summary)
    return self.writer

  def train(self, step: int, row: dict) -> None:
    """A training window: per-seed arrays ("loss", "grad_norm") and scalars ("learning_rate")."""
    if not is_main_process():
      return
    writer = self._open()
    for k, v in row.items():
      a = np.asarray(v, float).reshape(-1)
      writer.add_scalar(f"train/{k}", float(a.mean()), step)
      if a.size > 1:
        for i, value in enumerate(a):
          label = self.labels[i] if self.labels is not None and i < len(self.labels) else i
          writer.add_scalar(f"train_seed/{label}/{k}", float(value), step)
    writer.flush()

  def __call__(self, step: int, row: dict) -> None:
    if not is_main_process():
      return
    self._open()
    for k, v in row.items():
      if k == "step":
        continue
      a = np.asarray(v, float)
      if a.ndim <= 1:
        self.writer.add_scalar(k, float(a.mean()), step)
      else:  # (seeds, layers)
        for layer, value in enumerate(a.mean(0)):
          self.writer.add_scalar(f"{k}/layer_{layer}", float(value), step)
    self.writer.flush()

  def close(self, report_errors: bool = True) -> None:
    """Flush and close; a write error names the event folder (or is dropped when another error is
    already being reported: `report_errors=False`)."""
    if self.writer is None:
      return
    writer, self.writer = self.writer, None
    try:
      writer.close()
    except OSError as e:
      if report_errors:
        raise OSError(e.errno, e.strerror or str(e), os.fspath(self.logdir)) from None


class _EpathEventFile:
  """An event file on cloud storage, through epath: the whole file is rewritten at each flush (an
  object cannot be appended to), as tensorboardX's own GCS writer does."""

  def __init__(self, p: str):
    self.path, self.data = workdir_lib.path(p), bytearray()

  def write(self, b: bytes) -> None:
    self.data += b

  def flush(self) -> None:
    self.path.write_bytes(bytes(self.data))

  def close(self) -> None:
    self.flush()


class _EpathEventFactory:
  def open(self, p: str):
    return _EpathEventFile(p)

  def directory_check(self, p: str) -> None:
    workdir_lib.path(p).mkdir(parents=True, exist_ok=True)


def _register_event_writer(scheme: str) -> None:
  """Event files under `scheme://` go through epath, as every other run-folder file does (the same
  file system and credentials), also where tensorboardX has a writer of its own for the scheme."""
  from tensorboardX import record_writer
  record_writer.register_writer_factory(scheme, _EpathEventFactory())


def mean_std(values: Sequence[float]) -> str:
  v = np.asarray(values, float)
  if v.size == 0:
    return "-"
  return f"{v.mean():.3g} ± {v.std():.2g}" if v.size > 1 else f"{v.mean():.3g}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def new_figure(figsize: tuple[float, float], ncols: int = 1, width_ratios=None):
  """(figure, axes) drawn without pyplot, so that saving plots never changes the caller's
  matplotlib backend or state (a notebook keeps its inline plots)."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=figsize)
  return fig, fig.subplots(1, ncols, width_ratios=width_ratios) if ncols > 1 else fig.subplots()


def metric_curves(curves: dict, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """`plot_curves` input from results["curves"]: method -> (steps, values (seeds, T)) for every
  method that recorded `key`; a per-layer metric (T, seeds, layers) is averaged over layers."""
  out = {}
  for m, c in curves.items():
    if key in c:
      values = np.asarray(c[key], float)
      out[m] = (np.asarray(c["step"]), (values.mean(-1) if values.ndim == 3 else values).T)
  return out


def plot_curves(path: str | os.PathLike, curves: dict[str, tuple[np.ndarray, np.ndarray]], *, title: str,
                ylabel: str, logy: bool = False, hlines: dict[str, float] | None = None,
                note: str | None = None) -> None:
  """curves: label -> (steps (T,), values (seeds, T)); mean line with min-max band; `note`: a line of
  small text under the axes."""
  fig, ax = new_figure((5.5, 3.6))
  for label, (steps, values) in curves.items():
    values = np.asarray(values, float)
    ax.plot(steps, values.mean(0), label=label)
    if values.shape[0] > 1:
      ax.fill_between(steps, values.min(0), values.max(0), alpha=0.2)
  for label, y in (hlines or {}).items():
    ax.axhline(y, ls="--", c="gray", lw=1)
    ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=8, color="gray",
                va="bottom")
  if logy:
    ax.set_yscale("symlog", linthresh=1e-2)
  ax.set(title=title, xlabel="step", ylabel=ylabel)
  ax.legend(fontsize=8)
  if note:
    fig.text(0.01, 0.01, note, fontsize=6.5, color="dimgray", va="bottom", wrap=True)
  fig.tight_layout(rect=(0, 0.09 if note else 0, 1, 1))
  workdir_lib.write_figure(fig, path)


def per_run(history: Sequence[dict], i: int, keys: Sequence[str]) -> list[dict]:
  """Run i's slice of an eval history: [{"step", key: value, ...}, ...]."""
  return [{"step": h["step"], **{k: h[k][i] for k in keys if k in h}} for h in history]


def methods_in(results: dict, order: Sequence[str] = ("vanilla", "mimetic", "qk", "mask", "coupling",
                                                    "mask_coupling")) -> list[str]:
  """The methods present in a results dict, in `order` (others after, sorted)."""
  present = {r["method"] for r in results["runs"]}
  return [m for m in order if m in present] + sorted(present - set(order))


def persistence_table(results: dict) -> str:
  """Per method: attention TV from the prior's pattern at the first and last evaluation (mean
  over layers and runs), and the mask's final relative change."""
  rows = []
  for m in methods_in(results):
    rs = [r for r in results["runs"] if r["method"] == m]
    tv0 = np.mean([np.mean(r["persistence"][0]["attn_tv"]) for r in rs])
    tv1 = np.mean([np.mean(r["persistence"][-1]["attn_tv"]) for r in rs])
    drift = [r["persistence"][-1]["mask_drift"] for r in rs if "mask_drift" in r["persistence"][-1]]
    rows.append([m, f"{tv0:.2f} → {tv1:.2f}", mean_std(drift) if drift else "-"])
  return markdown_table(["method", "attn TV start → end", "‖B−B0‖/‖B0‖ end"], rows)


class RunProgress:
  """The whole command's progress, one line per finished method run: done/total, elapsed, and an
  ETA from the mean time of the runs trained so far (runs found finished count as done, in no time)."""

  def __init__(self, total: int, label: str = "", stream=None):
    self.total, self.label, self.stream = total, label, stream or console.screen()
    self.trained = self.skipped = 0
    self.t0 = time.perf_counter()

  def skip(self) -> None:
    self.skipped += 1

  def done(self) -> None:
    self.trained += 1
    if not is_main_process():
      return
    elapsed = time.perf_counter() - self.t0
    left = self.total - self.trained - self.skipped
    eta = elapsed / self.trained * left
    print(f"[{self.label}] {self.trained + self.skipped}/{self.total} method runs done, "
          f"{_minutes(elapsed)} elapsed, about {_minutes(eta)} left", file=self.stream, flush=True)


def _minutes(seconds: float) -> str:
  return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


class Timer:
  def __init__(self):
    self.t0 = time.perf_counter()

  def __call__(self) -> float:
    return time.perf_counter() - self.t0


def run_hparams(cfg, method: str) -> dict:
  """The run's config as TensorBoard hparams: flat "section.key" names, plus the method, the
  package version and the code's commit (with "dirty" where tracked files had changes)."""
  from flax import traverse_util

  from maskprior_jax import __version__, version
  flat = traverse_util.flatten_dict(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg), sep=".")
  out = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in sorted(flat.items())}
  code = version.source()
  commit = (code["commit"] or "unknown") + ("-dirty" if code["dirty"] else "")
  return {"method": method, "maskprior_jax": __version__, "commit": commit, **out}
