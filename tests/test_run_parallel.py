"""Run-parallel training (`train.parallel`): whole runs spread over the devices of a "runs" mesh.
What a user relies on: "auto" picks it by itself on a host with several devices for a small model;
the compiled step holds no cross-device collective (each device steps its own runs); a run's result
does not depend on the other runs; a resumed run-parallel run equals an uninterrupted one; and a run
computed on its own device equals the same run among others on one device, bit for bit
(`train.run_block`: every block of runs is stepped by the same compiled one-device program; on a CPU
"auto" steps one run at a time). With all of a device's runs in one vmapped block
(`train.run_block=all`) the results agree within float32 rounding only: XLA compiles a vmapped
reduction differently for different numbers of runs. Runs under 8 forced host devices (the README's
test command)."""
import json
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from cli_args import SMALL_MODEL

from maskprior_jax import sharding, train
from maskprior_jax.bench import cli

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (forced host) devices")

COLLECTIVES = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all|collective-broadcast)"
                         r"(-start|-done)?\(")
STEPS = 6


def _loss(v, batch, rng):
  del rng
  h = jnp.tanh(batch["x"] @ v["params"]["w"])
  pred = (h * v["params"]["u"]).sum(-1)
  return ((pred - batch["y"]) ** 2).mean(), {}


def _variables(seed):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {"params": {"w": jax.random.normal(k1, (16, 32)) * 0.3, "u": jax.random.normal(k2, (32,)) * 0.3}}


def _batch_fn(step, seeds):
  out = []
  for s in seeds:
    rng = np.random.default_rng([s, step])
    x = rng.normal(size=(64, 16)).astype(np.float32)
    out.append({"x": x, "y": np.sin(x[:, 0]).astype(np.float32)})
  return train.stack_trees([jax.tree.map(np.asarray, b) for b in out])


def _device_fn(step, run):
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), run), step)
  x = jax.random.normal(key, (64, 16))
  return {"x": x, "y": jnp.sin(x[:, 0])}


def _settings(**kw):
  return train.LoopSettings(steps=STEPS, batch_size=64, steps_per_call=2, log_every=STEPS, **kw)


def _train(seeds, batches, mesh=None, placement=None, checkpointer=None, settings=None):
  settings = settings or _settings()
  state, _ = train.train_seeds(loss_fn=_loss, tx=optax.adam(1e-2), variables=[_variables(s) for s in seeds],
                               seeds=seeds, batches=batches, settings=settings, eval_fn=lambda step, v: {},
                               mesh=placement or mesh, checkpointer=checkpointer)
  return jax.device_get(state)


def test_runs_mesh_takes_the_largest_even_split():
  assert sharding.runs_mesh(8).devices.size == 8
  assert sharding.runs_mesh(3).devices.size == 3
  assert sharding.runs_mesh(12).devices.size == 6 and sharding.runs_mesh(20).devices.size == 5
  assert sharding.runs_mesh(1) is None and sharding.runs_mesh(7, jax.devices()[:1]) is None


def test_auto_placement_picks_runs_for_small_models_and_data_for_large():
  s = _settings()
  assert s.placement(8, 10_000).mode == "runs" and s.placement(8, 10_000).devices == 8
  assert s.placement(1, 10_000).mode == "single"
  assert s.placement(8, train.RUNS_MAX_PARAMS + 1).mode == "data"
  assert _settings(parallel="off").placement(8, 10).mode == "single"
  assert _settings(parallel="data").placement(8, 10).mode == "data"
  assert _settings(data_parallel=True).placement(8, 10).mode == "data"
  # train.parallel=runs with nothing to spread (one run): one device, and the reason says why
  one = _settings(parallel="runs").placement(1, 10)
  assert (one.mode, one.mesh, one.reason) == ("single", None, "train.parallel=runs, but 1 run(s) on 8 device(s)")
  with pytest.raises(ValueError, match="train.parallel must be"):
    _settings(parallel="both")
  with pytest.raises(ValueError, match="not with train.parallel=runs"):
    _settings(parallel="runs", data_parallel=True)


@pytest.mark.parametrize("source", ["host", "device"])
def test_the_run_parallel_step_has_no_collective(source):
  mesh = sharding.runs_mesh(8)
  tx = optax.adam(1e-2)
  state = train.stack_trees([train.create_state(_variables(s), tx, jax.random.key(s)) for s in range(8)])
  if source == "host":
    step = train.make_train_step(_loss, tx, seed_axis=True, steps_per_call=2, mesh=mesh, donate=False)
    batch = train.stack_trees([_batch_fn(0, range(8)), _batch_fn(1, range(8))])
    hlo = step.lower(state, batch).compile().as_text()
  else:
    step = train.make_generating_train_step(_loss, tx, _device_fn, 8, steps_per_call=2, mesh=mesh, donate=False)
    hlo = step.lower(state, np.int32(0)).compile().as_text()
  assert "sharding={devices=[8" in hlo or "num_partitions=8" in hlo   # really split over 8 devices
  assert not COLLECTIVES.search(hlo), COLLECTIVES.search(hlo).group(0)
  # The data-parallel step of the same loss does reduce across devices (the check can fail).
  dp = train.make_train_step(_loss, tx, seed_axis=True, mesh=sharding.data_mesh(), donate=False)
  assert COLLECTIVES.search(dp.lower(state, _batch_fn(0, range(8))).compile().as_text())


def test_the_run_block_step_is_a_one_device_program_with_no_collective():
  """With run blocks (the CPU default) each device's blocks run the one k-run program compiled for
  that device alone: no partitions, no collective."""
  tx = optax.adam(1e-2)
  device = jax.devices()[5]
  state = jax.device_put(train.stack_trees([train.create_state(_variables(3), tx, jax.random.key(3))]), device)
  step = train.make_generating_train_step(_loss, tx, _device_fn, 1, steps_per_call=2, donate=False,
                                          runs_argument=True)
  compiled = step.lower(state, np.int32(0), jax.device_put(np.arange(3, 4, dtype=np.int32), device)).compile()
  hlo = compiled.as_text()
  assert "num_partitions=1" in hlo or "num_partitions" not in hlo
  assert not COLLECTIVES.search(hlo), COLLECTIVES.search(hlo).group(0)
  out, _ = step(state, np.int32(0), jax.device_put(np.arange(3, 4, dtype=np.int32), device))
  assert jax.tree.leaves(out)[0].devices() == {device}   # ran where its runs lie


def _assert_states_equal(a, b):
  chex.assert_trees_all_equal(jax.device_get(a), jax.device_get(b))   # the same tree, every leaf bit for bit


def _runs(devices, run_block):
  """8 runs over the first `devices` devices, `run_block` at a time (0: all of a device's runs)."""
  return train.Placement("runs", sharding.runs_mesh(8, jax.devices()[:devices]), 8, "test", run_block=run_block)


@pytest.mark.parametrize("source", ["host", "device"])
@pytest.mark.parametrize("run_block", [1, 2, 0])
def test_runs_are_independent_and_agree_with_one_device(source, run_block):
  batches = _batch_fn if source == "host" else train.DeviceBatches(_device_fn)
  seeds = list(range(8))
  # two runs on each of 4 devices (each device compiles its own program: 4 compiles, not 8), in blocks of
  # one or two, or one vmapped block of two
  spread = 4
  par = _train(seeds, batches, placement=_runs(spread, run_block))
  # Another run in slot 5: every other run is unchanged bit for bit (nothing crosses runs).
  other = _train(seeds[:5] + [50] + seeds[6:], batches, placement=_runs(spread, run_block))
  for a, b in zip(jax.tree.leaves(par.variables), jax.tree.leaves(other.variables)):
    keep = [i for i in range(8) if i != 5]
    assert np.array_equal(np.asarray(a)[keep], np.asarray(b)[keep])
    assert not np.array_equal(np.asarray(a)[5], np.asarray(b)[5])
  one = _train(seeds, batches, placement=train.Placement("single", None, 8, "test", run_block=run_block))
  if not run_block:   # one vmapped block per device (2 runs) against one of 8: within float32 rounding
    for a, b in zip(jax.tree.leaves(par.variables), jax.tree.leaves(one.variables)):
      np.testing.assert_allclose(a, b, rtol=10 * STEPS * 2.0 ** -23, atol=10 * STEPS * 2.0 ** -23)
    return
  # A fixed block: each run is the same run, bit for bit, on its own device (or with its block's
  # other run), among all eight on one device, over 2 devices, and with only its block's runs.
  _assert_states_equal(par, one)
  _assert_states_equal(par, _train(seeds, batches, placement=_runs(2, run_block)))
  k = run_block
  alone = _train(seeds[2:2 + k], batches if source == "host" else train.DeviceBatches(
      lambda step, run: _device_fn(step, run + 2)), placement=train.Placement("single", None, k, "test", run_block=k))
  _assert_states_equal(jax.tree.map(lambda a: a[2:2 + k], par), alone)


def test_run_parallel_resume_equals_an_uninterrupted_run(tmp_path):
  from maskprior_jax.checkpoint import Checkpointer
  seeds = list(range(8))
  placement = _settings(parallel="runs").placement(8)
  whole = _train(seeds, train.DeviceBatches(_device_fn), placement=placement)
  ck = Checkpointer(tmp_path / "ck", max_to_keep=3)
  _train(seeds, train.DeviceBatches(_device_fn), placement=placement, checkpointer=ck,
         settings=train.LoopSettings(steps=STEPS - 2, batch_size=64, steps_per_call=2, log_every=2,
                                     checkpoint_every=2))
  ck.close()
  ck = Checkpointer(tmp_path / "ck", max_to_keep=3)
  resumed = _train(seeds, train.DeviceBatches(_device_fn), placement=placement, checkpointer=ck)
  ck.close()
  _assert_states_equal(whole, resumed)


@pytest.mark.slow   # CI's slow step
def test_the_cli_picks_run_parallel_by_itself(tmp_path, capsys):
  """`maskprior boolean --task f2 --seeds 8 --methods mask` on 8 devices: run-parallel, said in the
  progress output and recorded in results.json's environment, and every run's state and metrics
  the same, bit for bit, as the same seeds trained on one device (`train.parallel=off`)."""
  short = ["--config.train.steps=50", "--config.train.steps_per_call=25", "--config.eval.every_steps=50",
           "--config.checkpoint.every_steps=50", "--config.eval.num_points=256", "--config.eval.probe_size=16",
           *SMALL_MODEL]
  rc = cli.main(["boolean", "--task", "f2", "--seeds", "8", "--methods", "mask", "--workdir", str(tmp_path / "auto"),
                 *short])
  assert rc == 0
  err = capsys.readouterr().err
  assert "run-parallel: 8 runs over 8 devices, 1 per device (auto:" in err and "stepped one run at a time" in err
  par = json.loads((tmp_path / "auto" / "results.json").read_text())
  env = par["environment"]
  assert env["placement"]["mask"]["mode"] == "runs" and env["placement"]["mask"]["devices"] == 8
  assert env["placement"]["mask"]["run_block"] == 1 and env["batches"] == {"mask": "device"}   # train.batches=auto: generated data on the device
  # The same seeds on one device: every run's state the same, bit for bit.
  assert cli.main(["boolean", "--task", "f2", "--seeds", "8", "--methods", "mask", "--workdir", str(tmp_path / "one"),
                   "--config.train.parallel=off", *short]) == 0
  one = json.loads((tmp_path / "one" / "results.json").read_text())
  assert one["environment"]["placement"]["mask"]["mode"] == "single"
  assert [r["state_sha256"] for r in par["runs"]] == [r["state_sha256"] for r in one["runs"]]
  # and every final figure measured of them; the persistence curve's evaluations, a vmapped program
  # over the stacked runs as they lie, agree within float32 rounding.
  drop = lambda r: {k: v for k, v in r.items() if k != "persistence"}   # noqa: E731
  assert [drop(r) for r in par["runs"]] == [drop(r) for r in one["runs"]]
  for a, b in zip(par["runs"], one["runs"]):
    for pa, pb in zip(a["persistence"], b["persistence"]):
      np.testing.assert_allclose(pa["mask_drift"], pb["mask_drift"], rtol=2.0 ** -18)
      np.testing.assert_allclose(pa["attn_tv"], pb["attn_tv"], rtol=2.0 ** -18, atol=2.0 ** -23)
