"""What a new user meets: bad input never touches a workdir, OS errors are one line, seeds pool."""
import json
import re
import shutil

import pytest
from cli_args import F2_FOUR_METHODS, ONE_DEVICE, SHORT_BOOLEAN, SMALL_BOOLEAN, SMALL_MODEL

from maskprior_jax.bench import cli

SHORT = [*SMALL_BOOLEAN, "--config.train.steps=50", "--config.train.steps_per_call=50", "--config.eval.every_steps=50",
         "--config.eval.num_points=256", "--config.eval.probe_size=16", "--config.checkpoint.every_steps=50", *ONE_DEVICE]


def _one_line_error(capsys):
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("maskprior: error:"), err
  return err[0]


def test_unknown_dataset_leaves_the_workdir_untouched_and_the_corrected_command_runs(tmp_path, capsys):
  work = tmp_path / "vision"
  assert cli.main(["vision", "--dataset", "mnst", "--methods", "vanilla", "--seeds", "1", "--workdir", str(work),
                   "--config.train.steps=50", "--config.train.steps_per_call=50", "--config.eval.every_steps=50",
                   "--config.checkpoint.every_steps=50", *ONE_DEVICE]) == 2
  line = _one_line_error(capsys)
  assert "'mnst'" in line and "digits" in line and "pydoc" in line and "tfds build mnst" in line
  assert not work.exists()
  assert cli.main(["vision", "--dataset", "digits", "--methods", "vanilla", "--seeds", "1", "--workdir", str(work),
                   "--config.train.steps=50", "--config.train.steps_per_call=50", "--config.eval.every_steps=50",
                   "--config.checkpoint.every_steps=50", *SMALL_MODEL, *ONE_DEVICE]) == 0
  assert json.loads((work / "results.json").read_text())["runs"][0]["method"] == "vanilla"


@pytest.mark.parametrize("case", ["parent_is_file", "workdir_is_file", "unwritable"])
def test_os_errors_a_user_can_cause_are_one_line_exit_2(tmp_path, capsys, case):
  import os
  blocker = tmp_path / "file"
  blocker.write_text("not a folder")
  work = {"parent_is_file": blocker / "run", "workdir_is_file": blocker, "unwritable": tmp_path / "ro" / "run"}[case]
  if case == "unwritable":
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o500)
    if os.access(tmp_path / "ro", os.W_OK):
      pytest.skip("running as a user who can write anywhere (root)")
  assert cli.main(["boolean", "--task", "f2", "--methods", "vanilla", "--seeds", "1", "--workdir", str(work),
                   *SHORT]) == 2
  line = _one_line_error(capsys)
  assert str(blocker if case != "unwritable" else tmp_path / "ro") in line
  assert blocker.read_text() == "not a folder"


def test_more_seeds_in_the_same_workdir_keep_the_finished_ones(shared_run, tmp_path, capsys):
  work = shutil.copytree(shared_run("f2_four_methods", F2_FOUR_METHODS), tmp_path / "f2")
  args = ["boolean", "--task", "f2", "--methods", "mask", "--workdir", str(work), *SHORT_BOOLEAN]
  first = {r["seed"]: r["state_sha256"] for r in json.loads((work / "results.json").read_text())["runs"]
           if r["method"] == "mask"}
  assert sorted(first) == [0, 1]
  assert cli.main([*args, "--seeds", "2-3"]) == 0
  res = json.loads((work / "results.json").read_text())
  mask = {r["seed"]: r["state_sha256"] for r in res["runs"] if r["method"] == "mask"}
  assert sorted(mask) == [0, 1, 2, 3] and {s: mask[s] for s in (0, 1)} == first
  assert len(res["curves"]["mask"]["unseen_mse_true"][-1]) == 4 and res["curves"]["mask"]["runs"] == [0, 1, 2, 3]
  assert cli.main([*args, "--seeds", "0-3"]) == 0           # nothing left to run
  assert "already in" in capsys.readouterr().out


def test_report_refuses_to_pool_a_seed_twice(shared_run, tmp_path, capsys):
  a = shared_run("f2_four_methods", F2_FOUR_METHODS)
  b = tmp_path / "b"
  b.mkdir()
  shutil.copy(a / "results.json", b / "results.json")     # the same runs in a second folder
  capsys.readouterr()
  assert cli.main(["report", str(a), str(b)]) == 2
  line = _one_line_error(capsys)
  assert re.search(r"method \w+ seed [01]", line) and str(a) in line and str(b) in line


def test_custom_task_says_which_n_and_refuses_a_tiny_seen_domain(tmp_path, capsys):
  assert cli.main(["boolean", "--target", "x0x1", "--seen", "x0 == 1 & x1 == 1 & x2 == 1", "--workdir",
                   str(tmp_path / "tiny")]) == 2
  assert "only 1 points" in _one_line_error(capsys) and not (tmp_path / "tiny").exists()
  assert cli.main(["boolean", "--target", "x0x1", "--seen", "x0 == 1 | x1 == 1", "--n", "4", "--methods", "vanilla",
                   "--seeds", "1", "--workdir", str(tmp_path / "ok"), *SHORT]) == 0
  assert "no --n given" not in capsys.readouterr().err
  assert cli.main(["boolean", "--target", "x0x1", "--seen", "x0 == 1 | x3 == 1",
                   "--methods", "vanilla", "--seeds", "1", "--workdir", str(tmp_path / "auto"), *SHORT]) == 0
  assert "no --n given, so n = 4" in capsys.readouterr().err
