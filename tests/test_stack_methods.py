"""Methods stacked into one program (`train.stack_methods`, `runner.method_groups`): vanilla, mimetic
and qk share the model and differ only in their initial weights, so one command trains them as one
program of runs. What a user relies on: every run ends on the same state, bit for bit, as when each
method trains by itself (runs stepped in blocks of a fixed size, the CPU default), also after the
stacked program was interrupted and resumed; results.json records each method as before, with the
methods that shared its program; and `off` (or one vmapped block on a CPU) keeps one program per
method."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_args import ONE_DEVICE, SMALL_BOOLEAN, xla_flags

from maskprior_jax.bench import cli
from maskprior_jax.bench import config as C
from maskprior_jax.bench import runner
from maskprior_jax.bench.boolean import run as BR
from maskprior_jax.bench.boolean import tasks

SHORT = ["--config.train.steps=100", "--config.train.steps_per_call=25", "--config.eval.every_steps=50",
         "--config.checkpoint.every_steps=50", *SMALL_BOOLEAN]
ARGS = ["boolean", "--task", "f2", "--seeds", "2", "--methods", "vanilla,qk", *SHORT]


def _results(path):
  return json.loads((path / "results.json").read_text())


def _by_run(res):
  return {(r["method"], r["seed"]): r for r in res["runs"]}


@pytest.mark.slow   # CI's slow step
def test_a_stacked_program_interrupted_and_resumed_ends_on_the_states_each_method_gives_alone(tmp_path):
  """vanilla and qk stacked into one program, killed (SIGKILL) at the evaluation of step 100 before
  its save and rerun: it resumes from step 50 and every run ends on the state, bit for bit, that its
  method gives trained alone (`train.stack_methods=off`); its metrics equal within float32 rounding
  (programs over 4 stacked runs against 2). Two claims in three commands: a stacked run equals the
  runs alone, and an interrupted stacked program resumes exactly (an uninterrupted stacked run that
  differed from the runs alone could not resume onto them). Which methods stack (not mask, whose model
  differs) is test_which_methods_stack's."""
  assert cli.main([*ARGS, "--workdir", str(tmp_path / "alone"), "--config.train.stack_methods=off", *ONE_DEVICE]) == 0
  # the stacked program on a runs mesh of 2 host devices (each device compiles its own program)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(2)}
  cmd = [sys.executable, "-m", "maskprior_jax.bench.cli", *ARGS, "--workdir", str(tmp_path / "stacked")]
  cut = subprocess.run(cmd, env={**env, "MASKPRIOR_FAULT": "eval:2"}, capture_output=True, text=True, timeout=600)
  assert cut.returncode != 0 and not (tmp_path / "stacked" / "results.json").exists()
  assert "[f2_2parity/vanilla+qk]" in cut.stderr   # the progress log names the stacked program
  again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr
  assert "resumed from the checkpoint at step 50" in again.stderr
  stacked, alone = _results(tmp_path / "stacked"), _results(tmp_path / "alone")
  place = stacked["environment"]["placement"]
  assert place["vanilla"]["methods"] == ["vanilla", "qk"] == place["qk"]["methods"]
  assert "methods" not in alone["environment"]["placement"]["vanilla"]
  assert place["vanilla"]["mode"] == "runs" and place["vanilla"]["devices"] == 2
  assert place["vanilla"]["runs"] == 4 and alone["environment"]["placement"]["vanilla"]["runs"] == 2
  s, a = _by_run(stacked), _by_run(alone)
  assert set(s) == set(a) == {(m, k) for m in ("vanilla", "qk") for k in (0, 1)}
  for key in s:
    assert s[key]["state_sha256"] == a[key]["state_sha256"], key
    for name in ("seen_mse", "unseen_mse_true", "unseen_mse_mdi"):
      np.testing.assert_allclose(s[key][name], a[key][name], rtol=2.0 ** -16)
  for seed in (0, 1):   # each qk run's own fit, as alone
    assert s[("qk", seed)]["qk_fit_tv"] == a[("qk", seed)]["qk_fit_tv"]
  assert stacked["curves"]["qk"]["step"] == alone["curves"]["qk"]["step"] == [0, 50, 100]
  np.testing.assert_allclose(stacked["curves"]["qk"]["unseen_mse_true"], alone["curves"]["qk"]["unseen_mse_true"],
                             rtol=2.0 ** -16)
  assert (tmp_path / "stacked" / "checkpoints" / "vanilla+qk" / "seeds_0_1").is_dir()
  assert (tmp_path / "stacked" / "tensorboard" / "qk" / "seeds_0_1").is_dir()


def _bench(**train):
  cfg = C.builtin_config("boolean")
  with cfg.unlocked():
    cfg.train.update(train)
  return BR.BooleanTask(tasks.TASKS["f2_2parity"], cfg)


def test_which_methods_stack():
  todo = {m: [0, 1] for m in ("vanilla", "mimetic", "qk", "mask")}
  assert runner.method_groups(_bench(), todo) == [["vanilla", "mimetic", "qk"], ["mask"]]
  assert runner.method_groups(_bench(stack_methods="off"), todo) == [[m] for m in todo]
  # other seeds to run (a rerun that adds seeds to one method only): not stacked
  assert runner.method_groups(_bench(), {**todo, "qk": [2]}) == [["vanilla", "mimetic"], ["qk"], ["mask"]]
  # one vmapped block on a CPU: a program of more runs would change every run's bits, so auto keeps one
  # program per method (the committed folders' layout); on an accelerator auto stacks
  expected = [[m] for m in todo] if runner.jax.default_backend() == "cpu" else [["vanilla", "mimetic", "qk"], ["mask"]]
  assert runner.method_groups(_bench(run_block="all"), todo) == expected
  assert runner.method_groups(_bench(run_block="all", stack_methods="on"), todo) == [["vanilla", "mimetic", "qk"],
                                                                                      ["mask"]]


def test_a_model_holding_arrays_is_compared_without_error():
  """Flax modules compare as dataclasses; a field holding an array has no truth value, so such models
  are not stacked rather than stopping the command."""
  import dataclasses

  @dataclasses.dataclass
  class WithPattern:
    pattern: object
  assert not runner._same_model(WithPattern(np.ones(3)), WithPattern(np.ones(3)))
  assert runner._same_model(WithPattern(1.0), WithPattern(1.0))
