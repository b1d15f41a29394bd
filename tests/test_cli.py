import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import cli_args
from cli_args import ONE_DEVICE

from maskprior_jax.bench import args, cli

REPO = pathlib.Path(__file__).resolve().parents[1]

SHORT = cli_args.SHORT_BOOLEAN


def _run(args, cwd):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)


def _snapshot(d):
  return {p: p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_run(shared_run):
  """f2, the four methods, seeds 0 and 1, 100 steps of the small model: built once per pytest run."""
  return shared_run("f2_four_methods", cli_args.F2_FOUR_METHODS)


def test_a_fresh_runs_results_name_the_commit_of_its_code(finished_run):
  """results.json's environment: the package version, and the commit `git rev-parse HEAD` prints."""
  import maskprior_jax
  from test_package import head_commit
  env = json.loads((finished_run / "results.json").read_text())["environment"]
  assert env["commit"] == head_commit() and isinstance(env["dirty"], bool)
  assert env["maskprior_jax"] == maskprior_jax.__version__


def test_end_to_end_writes_results_table_and_plots(finished_run):
  res = json.loads((finished_run / "results.json").read_text())
  assert res["task"] == "f2_2parity" and res["n"] == 15 and res["mdi_unseen_mse_true"] == pytest.approx(16)
  assert {(r["method"], r["seed"]) for r in res["runs"]} == {(m, s) for m in ("vanilla", "mimetic", "qk", "mask")
                                                             for s in (0, 1)}
  for r in res["runs"]:
    assert len(r["degree_profile"]) == 16
    assert sum(r["degree_profile"]) > 0
    assert [p["step"] for p in r["persistence"]] == [0, 50, 100]
    assert ("mask_drift" in r["persistence"][-1]) == (r["method"] == "mask")
    for k in ("seen_mse", "unseen_mse_true", "unseen_mse_mdi"):
      assert r[k] >= 0
  mask_runs = [r for r in res["runs"] if r["method"] == "mask"]
  assert all(r["persistence"][0]["mask_drift"] == 0 for r in mask_runs)
  assert all(r["persistence"][-1]["mask_drift"] > 0 for r in mask_runs)
  qk_runs = [r for r in res["runs"] if r["method"] == "qk"]
  vanilla = [r for r in res["runs"] if r["method"] == "vanilla"]
  # the fitted QK init starts closer to the prior's pattern than vanilla does
  assert min(sum(r["persistence"][0]["attn_tv"]) for r in vanilla) > max(
      sum(r["persistence"][0]["attn_tv"]) for r in qk_runs)
  for name in ("table.md", "unseen_loss.png", "persistence.png", "degree_profiles.png", "mask_drift.png",
               "metrics.jsonl", "config.json"):
    assert (finished_run / name).stat().st_size > 0
  assert "| mask |" in (finished_run / "table.md").read_text()
  assert all(len(r["state_sha256"]) == 64 for r in res["runs"])
  assert {"jax", "flax", "maskprior_jax", "devices", "processes"} <= set(res["environment"])
  assert res["attention"] == {"requested": "auto", "dtype": "float32", "training_path": "xla"}   # no cuDNN on a CPU
  for m in ("vanilla", "mimetic", "qk", "mask"):
    assert any((finished_run / "tensorboard" / m).glob("seeds_0_1/events.out.tfevents.*"))
  rows = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
  assert len(rows) == 4 * 3 and {r["method"] for r in rows} == {"vanilla", "mimetic", "qk", "mask"}


def _events(folder):
  """Every event in a TensorBoard folder, read back from the record files (length, crc, event, crc)."""
  import struct

  from tensorboardX.proto import event_pb2
  out = []
  for path in sorted(folder.glob("events.out.tfevents.*")):
    data, i = path.read_bytes(), 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[i + 12:i + 12 + n])
      out.append(event)
      i += 12 + n + 4
  return out


def test_tensorboard_shows_training_evaluation_and_the_config(finished_run):
  """Each method's event files: training loss, gradient norm and learning rate at every log window
  (mean over seeds and per seed), the evaluation scalars, and the run's config as hparams."""
  events = _events(finished_run / "tensorboard" / "mask" / "seeds_0_1")
  scalars = {}
  for e in events:
    for v in e.summary.value:
      if v.HasField("simple_value"):
        scalars.setdefault(v.tag, {})[e.step] = v.simple_value
  for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "train_seed/0/loss", "train_seed/1/grad_norm"):
    assert sorted(scalars[tag]) == [50, 100], tag
  assert all(v == pytest.approx(3e-4) for v in scalars["train/learning_rate"].values())
  assert scalars["train/loss"][100] == pytest.approx((scalars["train_seed/0/loss"][100]
                                                      + scalars["train_seed/1/loss"][100]) / 2, rel=1e-5)
  assert sorted(scalars["unseen_mse_true"]) == [0, 50, 100] and "attn_tv/layer_0" in scalars
  plugins = [v.metadata.plugin_data.plugin_name for e in events for v in e.summary.value if v.HasField("metadata")]
  assert "hparams" in plugins
  blob = b"".join(v.metadata.plugin_data.content for e in events for v in e.summary.value if v.HasField("metadata"))
  assert b"train.learning_rate" in blob and b"prior.token_rows" in blob


def test_rerun_skips_finished_methods(finished_run, tmp_path, capsys):
  work = shutil.copytree(finished_run, tmp_path / "f2")
  before = json.loads((work / "results.json").read_text())["runs"]
  rc = cli.main([*cli_args.F2_FOUR_METHODS, "--workdir", str(work), *ONE_DEVICE])
  assert rc == 0
  assert json.loads((work / "results.json").read_text())["runs"] == before
  assert "already in" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--task", "f9"], "unknown task 'f9'"),
    (["--target", "x0 ** x1", "--seen", "x0 == 1"], "target 'x0 \\*\\* x1'"),
    (["--target", "x0x1", "--seen", "x0 === 1"], "seen condition"),
    (["--target", "x0x1"], "needs both --target and --seen"),
    (["--task", "f2", "--methods", "vanilla,magic"], "unknown method magic"),
    (["--task", "f2_2parit"], "unknown task 'f2_2parit' \\(did you mean f2_2parity\\?\\)"),
    (["--task", "f2", "--methods", "vanila"], "unknown method vanila \\(did you mean vanilla\\?\\)"),
    (["--task", "f2", "--config.train.step=10"], "unknown config key 'train.step' \\(did you mean steps\\?\\)"),
    (["--task", "f2", "--config.trian.steps=10"], "no section 'trian' \\(did you mean train\\?\\)"),
    (["--task", "f2", "--config", "boolean_papr"], "\\(did you mean boolean_paper\\?\\)"),
    (["--task", "f2", "--config.train.stepz=10"], "unknown config key 'train.stepz'"),
    (["--task", "f2", "--config.train.steps=many"], "expected an integer"),
    (["--task", "f2", "--config.prior.mode=melted"], "prior.mode must be learned or frozen"),
    (["--task", "f2", "--config.model.attention=flash"], "model.attention must be xla or cudnn or blockwise or auto"),
    (["--task", "f2", "--num_processes", "2"], "need --coordinator_address"),
    (["--task", "f2", "--config.eval.every_steps=75"], "must be a multiple of train.steps_per_call"),
    (["--task", "f2", "--config.train.learning_rate_by_task=f2:1e-3"], "bad entry"),
    (["--task", "f2", "--seeds", "0"], "--seeds must be at least 1"),
    (["--task", "f2", "--seeds", "5-2"], "a range"),
    (["--task", "f2", "--seeds", "1,1"], "names a seed twice"),
    (["--task", "f2", "--config.train.steps=5000"], "different config or command .config.train.steps: [0-9]+ there, 5000 here"),
])
def test_bad_input_is_one_line_and_leaves_the_workdir_alone(finished_run, args, message, capsys):
  """In this process (each case a whole command but no Python start); the first case also as a
  command of its own, as a user runs it, whose whole stderr is the one line."""
  before = _snapshot(finished_run)
  command = (["boolean", "--workdir", str(finished_run), "--methods", "vanilla,mimetic,qk,mask", "--seeds", "2",
              *SHORT, *args] if "--methods" not in args else
             ["boolean", "--workdir", str(finished_run), "--seeds", "2", *SHORT, *args])
  assert cli.main(command) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("maskprior: error:"), lines
  assert re.search(message, lines[0]), lines[0]
  if args == ["--task", "f9"]:
    out = _run(command, finished_run.parent)
    assert out.returncode == 2 and out.stderr.strip() == lines[0], out.stderr
  assert _snapshot(finished_run) == before


def test_non_finite_loss_stops_with_the_step_and_keeps_good_checkpoints(tmp_path):
  args = ["boolean", "--task", "f2", "--methods", "vanilla", "--seeds", "1", "--workdir", str(tmp_path),
          "--config.train.optimizer=sgd", "--config.train.learning_rate=1e4", "--config.train.steps=400",
          "--config.train.steps_per_call=1", "--config.eval.every_steps=1", "--config.checkpoint.every_steps=1",
          "--config.eval.num_points=256", "--config.eval.probe_size=16", *ONE_DEVICE]
  out = _run(args, tmp_path)
  assert out.returncode == 1, out.stderr
  line = out.stderr.strip().splitlines()[-1]
  assert "non-finite" in line and "between steps" in line and "Traceback" not in out.stderr
  assert not (tmp_path / "results.json").exists()
  last_good = int(re.search(r"between steps (\d+) and", line).group(1))
  ckpt = tmp_path / "checkpoints" / "vanilla" / "seeds_0"
  saved = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []
  assert all(s <= last_good for s in saved)
  assert last_good >= 1 and saved and saved[-1] == last_good


def test_seed_ranges_and_lists_reach_results_json(tmp_path):
  assert args.parse_seeds("3") == [0, 1, 2] and args.parse_seeds("2-5") == [2, 3, 4, 5]
  assert args.parse_seeds("3,5,8") == [3, 5, 8] and args.parse_seeds("7-7") == [7]
  rc = cli.main(["boolean", "--task", "f2", "--methods", "vanilla", "--seeds", "3,5", "--workdir", str(tmp_path),
                 *SHORT])
  assert rc == 0
  res = json.loads((tmp_path / "results.json").read_text())
  assert sorted(r["seed"] for r in res["runs"]) == [3, 5]
  assert all(isinstance(r["fitted"], bool) for r in res["runs"])
  assert "Seeds 3, 5;" in (tmp_path / "table.md").read_text()


@pytest.mark.slow   # CI's slow step
def test_attribution_controls_run_and_report(tmp_path, capsys):
  """The controls are methods of `maskprior boolean`; `maskprior report` adds the attribution table."""
  work = tmp_path / "f2"
  controls = "mask,mask_shuffled,bias_zero,qk_nopos"
  short = [*SHORT, "--config.train.steps=50", "--config.checkpoint.every_steps=50"]
  assert cli.main(["boolean", "--task", "f2", "--methods", controls, "--seeds", "1", "--workdir", str(work), *short]) == 0
  res = json.loads((work / "results.json").read_text())
  assert {r["method"] for r in res["runs"]} == set(controls.split(","))
  drift = {r["method"]: r["persistence"][-1].get("mask_drift") for r in res["runs"]}
  assert drift["qk_nopos"] is None and drift["bias_zero"] > 0   # bias_zero: ||B - 0||, finite
  capsys.readouterr()
  assert cli.main(["report", str(work)]) == 0
  out = capsys.readouterr().out
  assert "Attribution" in out and "structure (mask_shuffled → mask)" in out and "| qk_nopos |" in out


def test_many_seeds_get_a_short_folder_name():
  from maskprior_jax.bench.results import seeds_dir
  assert seeds_dir([0, 1]) == "seeds_0_1"
  long = seeds_dir(list(range(100)))
  assert long.startswith("seeds_0-99_n100_") and len(long) < 40 and long != seeds_dir(list(range(1, 101)))


def test_help_says_seeds_is_a_count_or_a_range():
  from maskprior_jax.bench import cli
  parser = cli.build_parser()
  sub = next(a for a in parser._actions if a.dest == "command").choices["boolean"]
  text = " ".join(sub.format_help().split())
  assert "N is a count (seeds 0..N-1; --seeds 1 is seed 0 alone)" in text
  assert "A-B a range (A to B inclusive; --seeds 1-2 is seeds 1 and 2)" in text


def test_wide_tables_are_split_to_the_terminal_and_pipes_keep_markdown():
  from maskprior_jax.bench import console
  header = "| method | " + " | ".join(f"column {i} long header" for i in range(8)) + " |"
  rule = "|---|" + "---|" * 8
  rows = [f"| m{r} | " + " | ".join(f"{r}.{i}" for i in range(8)) + " |" for r in range(3)]
  text = "A line of prose. " * 10 + "\n\n" + "\n".join([header, rule, *rows]) + "\n"
  assert console.fit_tables(text) == text   # not a terminal here: unchanged
  fitted = console.fit_tables(text, 80)
  assert max(map(len, fitted.splitlines())) <= 80
  tables = [block for block in fitted.split("\n\n") if block.startswith("|")]
  assert len(tables) > 1
  for block in tables:   # every part keeps the key column and every row
    lines = block.splitlines()
    assert lines[0].startswith("| method") and [line.split("|")[1].strip() for line in lines[2:]] == ["m0", "m1", "m2"]
  cells = [c.strip() for block in tables for line in block.splitlines()[2:] for c in line.split("|")[2:-1]]
  assert sorted(cells) == sorted(f"{r}.{i}" for r in range(3) for i in range(8))


def test_the_last_lines_of_a_run_say_where_things_are(tmp_path):
  from maskprior_jax.bench import console
  (tmp_path / "table.md").write_text("x")
  (tmp_path / "results.json").write_text("{}")
  (tmp_path / "unseen_loss.png").write_bytes(b"")
  (tmp_path / "tensorboard").mkdir()
  text = console.where_results(tmp_path)
  assert text.startswith(f"results in {tmp_path}:")
  assert "table.md" in text and "unseen_loss.png" in text
  assert f"tensorboard --logdir {tmp_path / 'tensorboard'}" in text
  assert f"maskprior report {tmp_path}" in text


def test_one_seeds_excess_is_shown_without_a_spread():
  from maskprior_jax.bench.boolean import report
  res = json.loads((REPO / "experiments" / "results" / "boolean_headline" / "f2_2parity" / "results.json").read_text())
  one = dict(res, runs=[r for r in res["runs"] if r["seed"] == 0])
  table = report.excess_table([one], ["vanilla", "mask"])
  assert "(one seed)" in table and "± 0.000" not in table
