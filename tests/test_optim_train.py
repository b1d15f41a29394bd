import chex
import jax
import pytest
import jax.numpy as jnp
import numpy as np

import maskprior_jax as mp
from maskprior_jax import pmap, priors, train
from maskprior_jax.models import Transformer

# Equality tests between differently batched or sharded programs (vmapped, scanned, sharded,
# pmapped) run in float64: the programs sum in different orders, and float32 rounding noise,
# amplified by a few optimizer steps, depends on the CPU. In float64 that noise is ~1e-16, far
# inside the tolerances, so the tolerances still catch any real difference.
def x64():
  # jax.enable_x64 from JAX 0.7; the experimental spelling before (the floors job runs JAX 0.6)
  return jax.enable_x64(True) if hasattr(jax, "enable_x64") else __import__("jax.experimental").experimental.enable_x64()


def _f64(tree):
  return jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _model(**kw):   # one block: what these tests compare (steps, placements, loops) does not need two
  return Transformer(vocab_size=2, dim=16, depth=1, num_heads=2, mlp_dim=32, max_len=6,
                     mask=mp.MaskSettings(priors.interaction_groups([[1, 2], [3, 4, 5]], readers=[0])), **kw)


def _batch(seed, size=16):
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 2, (size, 6)).astype(np.int32)
  y = (2.0 * x[:, 1] - 1) * (2.0 * x[:, 2] - 1)
  return {"x": x, "y": y.astype(np.float32)}


def _loss_fn(model):
  def loss_fn(variables, batch, rng):
    del rng
    pred = model.apply(variables, batch["x"])
    return jnp.mean((pred - batch["y"]) ** 2), {}
  return loss_fn


def _state(model, tx, seed=0, f64=False):
  variables = model.init(jax.random.key(seed), jnp.zeros((1, 6), jnp.int32))
  if f64:
    variables = _f64(variables)
  return train.create_state(variables, tx, jax.random.key(seed))


def test_frozen_mask_is_bit_identical_and_has_no_state():
  model = _model()
  tx = mp.mask_prior_optimizer(1e-2, name="adamw", weight_decay=0.1, freeze_mask=True)
  state = _state(model, tx)
  before = jax.device_get(state.variables)
  assert not jax.tree.leaves(state.opt_state.inner_states[mp.MASK_PRIOR])
  step = train.make_train_step(_loss_fn(model), tx, donate=False)
  for i in range(20):
    state, _ = step(state, _batch(i))
  after = jax.device_get(state.variables)
  chex.assert_trees_all_equal(before[mp.MASK_PRIOR], after[mp.MASK_PRIOR])   # bit for bit, leaf by leaf
  moved = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(before["params"]),
                                              jax.tree.leaves(after["params"]))]
  assert min(moved) > 0


def test_mask_learning_rate_multiplier_under_sgd():
  model = _model()
  k, lr = 7.0, 0.01
  tx = mp.mask_prior_optimizer(lr, name="sgd", mask_lr_multiplier=k)
  state = _state(model, tx)
  batch = _batch(0)
  grads = jax.grad(lambda v: _loss_fn(model)(v, batch, None)[0])(state.variables)
  # Compare updates, not parameter differences: (-8 + u) - (-8) loses u's low bits in float32.
  updates, _ = tx.update(grads, state.opt_state, state.variables)
  d_mask, d_par = updates[mp.MASK_PRIOR], updates["params"]
  chex.assert_trees_all_close(d_mask, jax.tree.map(lambda g: -k * lr * g, grads[mp.MASK_PRIOR]), rtol=1e-4, atol=1e-8)
  chex.assert_trees_all_close(d_par, jax.tree.map(lambda g: -lr * g, grads["params"]), rtol=1e-4, atol=1e-8)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[mp.MASK_PRIOR])) > 0


def test_mask_weight_decay_off_unless_asked():
  model = _model()
  zero_grads = lambda v: jax.tree.map(jnp.zeros_like, v)
  for wd, moves in ((0.0, False), (0.5, True)):
    tx = mp.mask_prior_optimizer(0.1, name="adamw", weight_decay=0.5, mask_weight_decay=wd)
    state = _state(model, tx)
    g = zero_grads(state.variables)
    updates, _ = tx.update(g, state.opt_state, state.variables)
    mask_moved = max(float(jnp.abs(u).max()) for u in jax.tree.leaves(updates[mp.MASK_PRIOR]))
    par_moved = max(float(jnp.abs(u).max()) for u in jax.tree.leaves(updates["params"]))
    assert par_moved > 0 and (mask_moved > 0) == moves


def _run_single(model, tx, batches, f64=False):
  state = _state(model, tx, f64=f64)
  step = train.make_train_step(_loss_fn(model), tx, donate=False)
  for b in batches:
    state, m = step(state, b)
  return state, m


@x64()
def test_data_parallel_step_equals_single_device():
  assert jax.device_count() == 8
  model = _model()
  # SGD: Adam's normalisation would blow float-order noise in near-zero gradients up to lr.
  tx = mp.mask_prior_optimizer(0.1, name="sgd")
  batches = [_batch(i, 32) for i in range(3)]
  single, m1 = _run_single(model, tx, batches, f64=True)
  assert single.variables["params"]["head"]["kernel"].dtype == jnp.float64
  mesh = train.data_mesh()
  state = jax.device_put(_state(model, tx, f64=True), train.replicated(mesh))
  step = train.make_train_step(_loss_fn(model), tx, mesh=mesh)
  for b in batches:
    b = jax.device_put(b, train.batch_sharding(mesh))
    state, m8 = step(state, b)
  assert len(state.variables["params"]["embed"]["embedding"].sharding.device_set) == 8
  np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
  chex.assert_trees_all_close(single.variables, state.variables, rtol=1e-4, atol=1e-6)


@x64()
def test_ordered_reduction_step_equals_single_device_and_reduces_by_gather():
  """grad_reduction="ordered": each device's gradient gathered and summed in shard order (so the
  state does not depend on how the devices are spread over processes) is the single-device step,
  with and without a seed axis; the compiled program reduces by an all-gather, not an all-reduce."""
  model = _model()
  tx = mp.mask_prior_optimizer(0.1, name="sgd")
  batches = [_batch(i, 32) for i in range(3)]
  single, m1 = _run_single(model, tx, batches, f64=True)
  mesh = train.data_mesh()
  step = train.make_train_step(_loss_fn(model), tx, mesh=mesh, grad_reduction="ordered", donate=False)
  state = jax.device_put(_state(model, tx, f64=True), train.replicated(mesh))
  hlo = step.lower(state, jax.device_put(batches[0], train.batch_sharding(mesh))).compile().as_text()
  assert "all-gather" in hlo and "all-reduce" not in hlo
  for b in batches:
    state, m8 = step(state, jax.device_put(b, train.batch_sharding(mesh)))
  np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
  chex.assert_trees_all_close(single.variables, state.variables, rtol=1e-4, atol=1e-6)
  seeded = train.make_train_step(_loss_fn(model), tx, mesh=mesh, seed_axis=True, grad_reduction="ordered")
  stacked = jax.device_put(train.stack_trees([_state(model, tx, f64=True)] * 2), train.replicated(mesh))
  for b in batches:
    stacked, _ = seeded(stacked, jax.device_put(train.stack_trees([b, b]), train.batch_sharding(mesh, 1)))
  chex.assert_trees_all_close(single.variables, jax.tree.map(lambda b: b[1], stacked.variables), rtol=1e-4, atol=1e-6)
  with np.testing.assert_raises_regex(ValueError, "not with a sharded"):
    train.make_train_step(_loss_fn(model), tx, mesh=mesh, grad_reduction="ordered",
                          state_sharding=train.fsdp_sharding(state, mesh))


@x64()
def test_pmap_step_equals_single_device():
  """The legacy pmap step equals the single-device step."""
  model = _model()
  # SGD: Adam's normalisation would blow float-order noise in near-zero gradients up to lr.
  tx = mp.mask_prior_optimizer(0.1, name="sgd")
  batches = [_batch(i, 32) for i in range(3)]
  single, m1 = _run_single(model, tx, batches, f64=True)
  n = jax.local_device_count()
  state = pmap.replicate_for_pmap(_state(model, tx, f64=True))
  step = pmap.make_pmap_train_step(_loss_fn(model), tx)
  for b in batches:
    state, mp_metrics = step(state, jax.tree.map(lambda x: x.reshape(n, -1, *x.shape[1:]), b))
  np.testing.assert_allclose(mp_metrics["loss"][0], m1["loss"], rtol=1e-5)
  chex.assert_trees_all_close(single.variables, jax.tree.map(lambda b: b[0], state.variables), rtol=1e-4, atol=1e-6)


@x64()
def test_seed_vmap_and_scan_equal_sequential_runs():
  model = _model()
  tx = mp.mask_prior_optimizer(0.1, name="sgd")
  seeds = [0, 1, 2]
  batches = {s: [_batch(100 * s + i) for i in range(4)] for s in seeds}
  sequential = []
  for s in seeds:
    state = _state(model, tx, seed=s, f64=True)
    step = train.make_train_step(_loss_fn(model), tx, donate=False)
    for b in batches[s]:
      state, _ = step(state, b)
    sequential.append(state)
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[_state(model, tx, seed=s, f64=True) for s in seeds])
  step = train.make_train_step(_loss_fn(model), tx, seed_axis=True, steps_per_call=2)
  for k in range(2):  # two calls of two scanned steps
    chunk = [jax.tree.map(lambda *xs: np.stack(xs), *[batches[s][2 * k + j] for s in seeds])
             for j in range(2)]
    stacked, metrics = step(stacked, jax.tree.map(lambda *xs: np.stack(xs), *chunk))
  assert metrics["loss"].shape == (2, 3)
  for i, seq in enumerate(sequential):
    chex.assert_trees_all_close(seq.variables, jax.tree.map(lambda b: b[i], stacked.variables), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("run_block", ["all", "1"])
def test_training_loop_equals_the_compiled_step_called_by_hand_and_eval_step_shards(run_block):
  """train.train_seeds (the one loop) runs exactly the compiled step: the same state, bit for bit,
  as calling the seed-vmapped step by hand (train.run_block=all: on both seeds at once; 1: on each
  seed alone); it evaluates at 0, every eval_every steps and the end."""
  model = _model()
  tx = mp.mask_prior_optimizer(0.1, name="sgd")
  seeds = [0, 1]
  batch_fn = lambda step, seeds_: train.stack_trees([_batch(100 * s + step, 32) for s in seeds_])
  variables = [model.init(jax.random.key(s), jnp.zeros((1, 6), jnp.int32)) for s in seeds]
  step = train.make_train_step(_loss_fn(model), tx, seed_axis=True, donate=False)
  blocks = [seeds] if run_block == "all" else [[s] for s in seeds]
  expected = []
  for block in blocks:
    st = train.stack_trees([train.create_state(variables[s], tx, jax.random.key(s)) for s in block])
    for i in range(6):
      st, _ = step(st, batch_fn(i, block))
    expected.append(st)
  expected = jax.tree.map(lambda *a: np.concatenate(a), *expected)
  state, history = train.train_seeds(
      loss_fn=_loss_fn(model), tx=tx, variables=variables, seeds=seeds, batches=batch_fn,
      settings=train.LoopSettings(steps=6, batch_size=32, steps_per_call=1, eval_every=2, log_every=3, parallel="off",
                                  run_block=run_block),
      eval_fn=lambda s, v: {"loss0": jax.vmap(lambda w: _loss_fn(model)(w, _batch(0, 32), None)[0])(v)}, label="loop")
  assert [h["step"] for h in history] == [0, 2, 4, 6] and all(np.all(np.isfinite(h["loss0"])) for h in history)
  chex.assert_trees_all_equal(jax.device_get(expected.variables), jax.device_get(state.variables))
  mesh = train.data_mesh()
  one = jax.tree.map(lambda a: a[0], state.variables)
  eval_step = train.make_eval_step(lambda v, b: _loss_fn(model)(v, b, None)[0], mesh=mesh)
  single = _loss_fn(model)(jax.device_get(one), _batch(0, 32), None)[0]
  np.testing.assert_allclose(eval_step(jax.device_put(one, train.replicated(mesh)), _batch(0, 32)), single, rtol=1e-5)


@x64()
def test_benchmark_loop_data_parallel_equals_single_device():
  """train.train_seeds with a mesh (seeds vmapped, each seed's batch split over all devices)
  ends where the one-device loop ends."""
  assert jax.device_count() > 1, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
  model = _model()
  tx = mp.mask_prior_optimizer(0.02, name="sgd")
  seeds = [0, 1]
  variables = [_f64(model.init(jax.random.key(s), jnp.zeros((1, 6), jnp.int32))) for s in seeds]
  batch_fn = lambda step, seeds_: train.stack_trees([_batch(100 * s + step, 32) for s in seeds_])
  runs = {}
  for name, mesh in (("single", None), ("mesh", train.data_mesh())):
    state, history = train.train_seeds(
        loss_fn=_loss_fn(model), tx=tx, variables=variables, seeds=seeds, batches=batch_fn,
        settings=train.LoopSettings(steps=6, batch_size=32, steps_per_call=2, eval_every=6),
        eval_fn=lambda step, v: {"n": jnp.zeros(2)}, label=name, mesh=mesh)
    runs[name] = jax.device_get(state.variables)
  moved = max(float(np.abs(np.asarray(a) - np.asarray(b)[None]).max()) for a, b in
              zip(jax.tree.leaves(runs["single"]), jax.tree.leaves(train.stack_trees(variables))))
  assert moved > 1e-3
  chex.assert_trees_all_close(runs["single"], runs["mesh"], rtol=1e-5, atol=1e-6)


@x64()
def test_fsdp_sharded_step_equals_replicated_step():
  """Parameters and optimizer state split over 8 devices (FSDP rule) give the replicated result."""
  model = Transformer(vocab_size=2, dim=64, depth=2, num_heads=4, mlp_dim=256, max_len=6,
                      mask=mp.MaskSettings(priors.interaction_groups([[1, 2], [3, 4, 5]], readers=[0])))
  tx = mp.mask_prior_optimizer(0.02, name="sgd")
  mesh = train.data_mesh()
  state0 = _state(model, tx, f64=True)
  shardings = train.fsdp_sharding(state0, mesh, min_size=1024)
  sharded_leaves = [s for s in jax.tree.leaves(shardings) if "data" in tuple(s.spec)]
  assert len(sharded_leaves) >= 8                       # the kernels (and their mask-free peers) are split
  fsdp = train.make_train_step(_loss_fn(model), tx, mesh=mesh, state_sharding=shardings, donate=False)
  repl = train.make_train_step(_loss_fn(model), tx, mesh=mesh, donate=False)
  a = jax.device_put(state0, shardings)
  b = jax.device_put(state0, train.replicated(mesh))
  assert tuple(a.variables["params"]["block_0"]["mlp_in"]["kernel"].sharding.spec) == (None, "data")
  for i in range(3):
    a, _ = fsdp(a, _batch(i, 32))
    b, _ = repl(b, _batch(i, 32))
  chex.assert_trees_all_close(jax.device_get(a.variables), jax.device_get(b.variables), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(tuple(int(x) for x in jax.__version__.split(".")[:2]) < (0, 7),
                    reason="JAX 0.6's CPU client returned each call finished (seen in the floors job); the "
                    "loop's own dispatch is checked on the current JAX")
def test_loop_dispatches_the_next_call_before_the_previous_one_finishes(monkeypatch):
  """No host sync per call: the loop builds and dispatches the next call while earlier ones still
  run on the device, waiting only at the log/eval point at the end. Checked by state, not by
  wall-clock ratios: each call does ~0.1 s of device work, and when the loop asks for batch k+1
  the test records whether call k's output is ready yet (`jax.Array.is_ready`, which never
  waits). A loop that waits on each call always finds it ready; this one builds the next batch
  in microseconds, while the call still runs."""
  model = _model()
  tx = mp.mask_prior_optimizer(1e-2)
  outputs, ready = [], []
  make = train.make_train_step

  def recording_step(*args, **kwargs):
    step = make(*args, **kwargs)

    def call(state, batch):
      out = step(state, batch)
      outputs.append(out[0].step)
      return out
    return call
  monkeypatch.setattr(train.steps, "make_train_step", recording_step)   # where loop_step finds it

  def slow_loss(variables, batch, rng):
    loss, aux = _loss_fn(model)(variables, batch, rng)
    busy = jax.lax.fori_loop(0, 200, lambda i, y: jnp.tanh(y @ y), jnp.full((256, 256), 0.01) + loss * 0)
    return loss + 0.0 * jax.lax.stop_gradient(busy).sum(), aux

  def batch_fn(step, seeds):
    if outputs:
      ready.append(outputs[-1].is_ready())
    return jax.tree.map(lambda *xs: np.stack(xs), *[_batch(step * 10 + s) for s in seeds])
  variables = [model.init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))]
  train.train_seeds(loss_fn=slow_loss, tx=tx, variables=variables, seeds=[0], batches=batch_fn,
                    settings=train.LoopSettings(steps=10, batch_size=16, eval_every=10, log_every=10),
                    eval_fn=lambda s, v: {}, label="trace")
  assert len(outputs) == 10 and len(ready) == 9
  assert not all(ready), ready   # at least one batch was built while the previous call still ran


@x64()
def test_batches_drawn_on_the_device_equal_the_same_batches_fed_from_the_host():
  """make_generating_train_step (batches drawn inside the step from a table on the device) equals
  make_train_step fed the same batches, with and without a data-parallel mesh (either gradient
  reduction)."""
  model = _model()
  tx = mp.mask_prior_optimizer(1e-2)
  table = {k: np.asarray(v, np.float64 if k == "y" else np.int32) for k, v in _batch(0, 64).items()}
  run_seeds = np.asarray([3, 7], np.int32)

  def draw(step, run):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), jnp.asarray(run_seeds)[run]), step)
    idx = jax.random.randint(key, (16,), 0, 64)
    return {k: jnp.asarray(v)[idx] for k, v in table.items()}
  fresh = lambda: train.stack_trees([_state(model, tx, s, f64=True) for s in (0, 1)])
  host_step = train.make_train_step(_loss_fn(model), tx, seed_axis=True, donate=False)
  expected = fresh()
  for step in range(4):
    batch = jax.vmap(draw, in_axes=(None, 0))(jnp.int32(step), jnp.arange(2, dtype=jnp.int32))
    expected, _ = host_step(expected, jax.device_get(batch))
  for mesh, reduction in ((None, "xla"), (train.data_mesh(), "xla"), (train.data_mesh(), "ordered")):
    gen = train.make_generating_train_step(_loss_fn(model), tx, draw, 2, steps_per_call=2, mesh=mesh, donate=False,
                                           grad_reduction=reduction)
    state = fresh() if mesh is None else jax.device_put(fresh(), train.replicated(mesh))
    for first in (0, 2):
      state, metrics = gen(state, np.int32(first))
    assert metrics["loss"].shape == (2, 2) and int(state.step[0]) == 4
    # atol: leaves whose gradient is zero up to float64 rounding (~1e-16) still move by up to
    # lr * g / adam_eps = 1e-2 * 1e-16 / 1e-8 = 1e-10 per step, so they may differ by ~1e-9 after 4 steps.
    chex.assert_trees_all_close(jax.device_get(state.variables), jax.device_get(expected.variables), rtol=1e-9, atol=1e-8)


def test_device_batches_resume_bit_for_bit(tmp_path):
  """train_seeds with batches drawn on the device: stopping after 4 steps and resuming from the
  checkpoint to 8 gives the same state, bit for bit, as 8 steps straight."""
  from maskprior_jax.checkpoint import Checkpointer
  model = _model()
  tx = mp.mask_prior_optimizer(1e-2)
  table = {k: np.asarray(v) for k, v in _batch(0, 64).items()}

  def draw(step, run):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), run), step)
    idx = jax.random.randint(key, (16,), 0, 64)
    return {k: jnp.asarray(v)[idx] for k, v in table.items()}

  def run(steps, directory=None):
    variables = [model.init(jax.random.key(s), jnp.zeros((1, 6), jnp.int32)) for s in (0, 1)]
    ck = None if directory is None else Checkpointer(directory)
    try:
      state, history = train.train_seeds(
          loss_fn=_loss_fn(model), tx=tx, variables=variables, seeds=[0, 1], batches=train.DeviceBatches(draw),
          settings=train.LoopSettings(steps=steps, batch_size=16, steps_per_call=2, eval_every=2, checkpoint_every=2,
                                      batches="device"),
          eval_fn=lambda s, v: {"n": np.zeros(2)}, label="dev", checkpointer=ck)
    finally:
      if ck is not None:
        ck.close()
    return jax.device_get(state.variables), history
  straight, _ = run(8)
  run(4, tmp_path / "ck")
  resumed, history = run(8, tmp_path / "ck")
  assert [h["step"] for h in history] == [0, 2, 4, 6, 8]
  chex.assert_trees_all_equal(straight, resumed)


def test_loop_asks_a_part_taking_batch_fn_for_this_process_rows_only_with_a_mesh():
  """train_seeds hands `part=(process, processes)` to a host batch_fn that takes it (so each
  process builds only its rows) when data parallel, and calls plain batch functions as before."""
  model = _model()
  tx = mp.mask_prior_optimizer(0.02, name="sgd")
  variables = [model.init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))]
  calls = []

  def batch_fn(step, seeds_, part=None):
    calls.append(part)
    return train.stack_trees([_batch(step, 32)])
  for mesh in (None, train.data_mesh()):
    calls.clear()
    train.train_seeds(loss_fn=_loss_fn(model), tx=tx, variables=variables, seeds=[0], batches=batch_fn,
                      settings=train.LoopSettings(steps=2, batch_size=32, eval_every=2),
                      eval_fn=lambda step, v: {"n": jnp.zeros(1)}, label="p", mesh=mesh)
    assert calls == ([None, None] if mesh is None else [(0, 1), (0, 1)])


def test_a_loop_starts_every_runs_state_in_one_program():
  """train_seeds builds its runs' initial states (optimizer zeros, keys, the stacking) in one
  compiled program (`loop._initial_states`), not a small program per leaf shape, and each state
  equals `create_state`'s."""
  from maskprior_jax.bench import compiles
  from maskprior_jax.train import loop as loop_lib
  model = Transformer(vocab_size=2, dim=24, depth=1, num_heads=2, mlp_dim=32, max_len=6)   # a width no other test compiles
  tx = mp.mask_prior_optimizer(1e-2)
  variables = [model.init(jax.random.key(s), jnp.zeros((1, 6), jnp.int32)) for s in (0, 1, 2)]
  keys = tuple(jax.random.key_data(jax.random.key(s)) for s in (0, 1, 2))
  with compiles.counted() as c:
    states = loop_lib._initial_states(tuple(variables), tx, keys)
  assert c.names == {"jit(_initial_states)": 1}, c.names
  expected = train.stack_trees([train.create_state(v, tx, jax.random.key(s)) for v, s in zip(variables, (0, 1, 2))])
  chex.assert_trees_all_equal(jax.device_get(states), jax.device_get(expected))
