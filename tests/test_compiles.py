"""Compiles counted from JAX's monitoring events, and the command's persistent compilation cache: a
repeated command, in a new process, compiles nothing (tests/conftest.py gives the whole pytest run
one cache folder, which the commands tests start inherit)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
from cli_args import F2_FOUR_METHODS

from maskprior_jax.bench import compiles


def test_counted_sees_a_compile_and_then_a_read_from_the_cache():
  k = float(np.random.default_rng().integers(1, 1 << 30))   # a program no earlier test compiled
  f = lambda x: x * 2.0 + k
  x = np.ones(3, np.float32)
  with compiles.counted() as outer:
    with compiles.counted() as c:
      jax.block_until_ready(jax.jit(f)(x))
    assert (c.programs, c.cache_hits) == (1, 0) and c.seconds > 0 and c.names == {"jit(<lambda>)": 1}
    jax.clear_caches()   # JAX's in-memory caches only: the next call reads the persistent cache
    with compiles.counted() as again:
      jax.block_until_ready(jax.jit(f)(x))
    assert (again.programs, again.cache_hits) == (0, 1)
  assert (outer.programs, outer.cache_hits) == (1, 1)


def test_cache_folder_flag_environment_and_off(monkeypatch, tmp_path):
  monkeypatch.delenv("MASKPRIOR_COMPILATION_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compiles.default_cache_dir() == str(tmp_path / "maskprior" / "xla")
  monkeypatch.setenv("MASKPRIOR_COMPILATION_CACHE", str(tmp_path / "mine"))
  assert compiles.default_cache_dir() == str(tmp_path / "mine")
  assert compiles.enable_cache("off") is None
  # this pytest run's folder (JAX_COMPILATION_CACHE_DIR, tests/conftest.py) is kept where no flag is given
  assert compiles.enable_cache(None) == os.environ["JAX_COMPILATION_CACHE_DIR"]
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0


def test_results_say_what_each_group_compiled_and_a_repeated_command_compiles_nothing(shared_run, tmp_path):
  """The default suite's shared folder says what each program group compiled (or read from this
  pytest run's cache); the same command again, in a new process, compiles nothing."""
  first = json.loads((shared_run("f2_four_methods", F2_FOUR_METHODS) / "results.json").read_text())
  groups = first["environment"]["compiles"]
  assert sorted(m for g in groups for m in g.split("+")) == ["mask", "mimetic", "qk", "vanilla"], groups
  assert all(c["programs"] + c["cache_hits"] > 0 and c["seconds"] > 0 for c in groups.values())
  out = subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", *F2_FOUR_METHODS, "--workdir",
                        str(tmp_path / "again")], capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  again = json.loads((tmp_path / "again" / "results.json").read_text())
  assert {g: c["programs"] for g, c in again["environment"]["compiles"].items()} == {g: 0 for g in groups}, again
  assert all(c["cache_hits"] > 0 for c in again["environment"]["compiles"].values())
  assert "mask: 0 programs compiled, " in out.stdout
  assert [r["state_sha256"] for r in again["runs"]] == [r["state_sha256"] for r in first["runs"]]


def test_boolean_tasks_of_one_n_share_their_training_and_evaluation_programs(tmp_path):
  """f2 and f4 (both n = 15): the training set, the evaluation points and the probe enter the
  programs as arguments, so the second task compiles no training or evaluation program: it reads
  f2's from the cache. (The mask model's initialisation holds its prior's pattern as a constant.)"""
  from cli_args import SHORT_BOOLEAN

  from maskprior_jax.bench import cli
  args = ["--methods", "vanilla", "--seeds", "1", *SHORT_BOOLEAN, "--config.train.steps=50",
          "--config.model.dim=12"]   # a width no other test compiles
  counts = {}
  for task in ("f2", "f4"):
    with compiles.counted() as counts[task]:
      assert cli.main(["boolean", "--task", task, "--workdir", str(tmp_path / task), *args]) == 0
  for name in ("jit(with_runs)", "jit(eval_all)"):
    assert counts["f2"].names.get(name) == 1, counts["f2"].names   # compiled, or read from an earlier run's cache
    assert counts["f4"].names.get(name) == 1 and name not in counts["f4"].compiled, counts["f4"].compiled
