"""Device batches (train.batches=device) for every benchmark: the training set is held on the device
and each step's batch is drawn inside the compiled step, from the run's seed and the step. What a
user relies on: a run interrupted after a checkpoint and resumed ends bit for bit where the
uninterrupted run ends (the resumed run draws the batches it would have drawn), and the draw is
a real batch of the benchmark's training data."""
import dataclasses

import chex
import jax
import numpy as np
import pytest

from maskprior_jax.bench import config as C
from maskprior_jax.bench import runner

# Three benchmarks' whole training loops, each run three times: CI's slow step (the default suite keeps
# tests/test_optim_train.py's device-batch resume).
pytestmark = pytest.mark.slow
SPC = 5


def _bench(name):
  cfg = C.builtin_config(name)
  # a small model of one block: the batches, not the model, are under test
  cfg.model.update(depth=1, dim=16, num_heads=2, head_dim=8, mlp_dim=32)
  if name == "vision":
    cfg.eval.max_test = 256
  if name == "language":
    cfg.eval.max_test_windows, cfg.eval.eval_windows = 64, 32
  if name == "arithmetic":
    from maskprior_jax.bench.arithmetic.run import Arithmetic
    cfg.task.test_size, cfg.task.val_size = 256, 64
    return Arithmetic(cfg, [0, 1])
  from maskprior_jax.bench import supervised
  module = __import__(f"maskprior_jax.bench.{name}.run", fromlist=["load_problem"])
  return supervised.Supervised(cfg, module.load_problem(cfg))


def _train(bench, steps, workdir):
  bench.settings = dataclasses.replace(bench.settings, steps=steps, steps_per_call=SPC, eval_every=steps,
                                       checkpoint_every=0, batches="device", parallel="off",
                                       warmup_steps=0, schedule="constant")
  model = bench.model("mask")
  state, history, _, placement = runner.train_method("mask", model, bench, bench.runs([0, 1]), workdir)
  assert placement.mode == "single"
  return state, history


@pytest.mark.parametrize("name", ["arithmetic", "vision", "language"])
def test_device_batch_run_resumes_bit_for_bit(name, tmp_path):
  bench = _bench(name)
  batch = jax.device_get(jax.vmap(bench.device_batches(bench.runs([0, 1])), in_axes=(None, 0))(3, np.arange(2)))
  host = bench.host_batches(bench.runs([0, 1]))(3, [0, 1])
  assert set(batch) == set(host) and all(batch[k].shape == host[k].shape for k in host)
  assert not np.array_equal(batch["x"][0], batch["x"][1])   # each run its own draw
  whole, _ = _train(bench, 4 * SPC, tmp_path / "whole")
  _train(bench, 2 * SPC, tmp_path / "cut")                  # ends (and saves) at step 2 * SPC
  resumed, history = _train(bench, 4 * SPC, tmp_path / "cut")   # finds that checkpoint, goes on
  assert history[-1]["step"] == 4 * SPC
  chex.assert_trees_all_equal(jax.device_get(whole.variables), jax.device_get(resumed.variables))
