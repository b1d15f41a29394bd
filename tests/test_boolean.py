import chex
import os

import numpy as np
import pytest
from cli_args import DEFAULT_XLA, xla_flags

from maskprior_jax.bench.boolean import algebra as BA
from maskprior_jax.bench.boolean import data as BD
from maskprior_jax.bench.boolean import tasks as B

# RESEARCH.md's table: the MDI of each task and its unseen MSE against the truth.
EXPECTED_MDI = {
    "f1_threesym": ({(0,): -1.25, (1,): 1.5, (2,): 1.0}, 19.25),
    "f2_2parity": ({(): -1.0, (0,): 1.0, (1,): 1.0}, 16.0),
    "f4_majority": ({(0,): 0.5, (1,): 0.5, (2,): 1.0, (0, 2): -0.5, (1, 2): -0.5}, 4.0),
    "frozen_coordinate": ({(1, 2): 1.0, (3, 4, 5): 1.0}, 8.0),
}


def _cyclic_mdi():
  terms = {(i, (i + 1) % 15, (i + 2) % 15): 1.0 for i in range(1, 15)}
  terms = {tuple(sorted(k)): v for k, v in terms.items()}
  terms.update({(): 1.0, (0,): -1.0, (1,): -1.0, (2,): -1.0, (0, 1): 1.0, (0, 2): 1.0, (1, 2): 1.0})
  return terms, 64.0


@pytest.mark.parametrize("name", list(B.TASKS))
def test_mdi_matches_the_research_table(name):
  task = B.TASKS[name]
  terms, mse = _cyclic_mdi() if name == "f3_cyclic" else EXPECTED_MDI[name]
  mdi = BA.minimum_degree_interpolator(task)
  got = {k: v for k, v in mdi.terms.items() if abs(v) > 1e-8}
  assert set(got) == set(terms)
  for k, v in terms.items():
    assert got[k] == pytest.approx(v, abs=1e-8)
  assert BA.unseen_mse(task, mdi) == pytest.approx(mse, abs=1e-8)
  # the MDI agrees with f on the seen domain
  x = BD.cube(len(task.relevant()))
  full = np.zeros((len(x), task.n), np.int8)
  full[:, list(task.relevant())] = x
  seen = task.is_seen(full)
  np.testing.assert_allclose(mdi(full[seen]), task.f(full[seen]), atol=1e-8)


def test_task_definitions():
  assert {(0, 13, 14), (0, 1, 14), (0, 1, 2)} <= set(B.TASKS["f3_cyclic"].groups)
  assert len(B.TASKS["f3_cyclic"].groups) == 15
  assert B.TASKS["f4_majority"].groups == ((0, 1, 2),)
  shares = {"f1_threesym": 0.5, "f2_2parity": 0.25, "f3_cyclic": 0.125, "f4_majority": 0.25}
  for name, share in shares.items():
    x = BD.cube(15)
    assert (~B.TASKS[name].is_seen(x)).mean() == share


def test_parser_values_and_groups():
  e = B.parse_target("x0x1 - 1.25 x1*x2 + 1.5 x0x2 + 2")
  x = BD.cube(3).astype(float)
  np.testing.assert_allclose(e.evaluate(x), x[:, 0] * x[:, 1] - 1.25 * x[:, 1] * x[:, 2] + 1.5 * x[:, 0] * x[:, 2] + 2)
  assert set(e.groups) == {frozenset({0, 1}), frozenset({1, 2}), frozenset({0, 2})}
  e = B.parse_target("sign(x0 + x1 + x2) - 0.5*(x3 - x4)")
  np.testing.assert_allclose(e.evaluate(BD.cube(5).astype(float))[:4], [1, 1, 1, -1])
  pred, vars_ = B.parse_condition("x0 == 1 | (x1*x2 == -1 & x3 == 1)")
  x = BD.cube(4)
  np.testing.assert_array_equal(pred(x), (x[:, 0] == 1) | ((x[:, 1] * x[:, 2] == -1) & (x[:, 3] == 1)))
  assert vars_ == {0, 1, 2, 3}


@pytest.mark.parametrize("target,seen,message", [
    ("x0 +* x1", "x0 == 1", "unexpected '\\*'"),
    ("x0 x1 )", "x0 == 1", "unexpected '\\)'"),
    ("__import__('os')", "x0 == 1", "unexpected"),
    ("x0x1", "x0 = 1", "unexpected .= 1. at character 3"),
    ("x0x1", "x0 == ", "ended too early"),
    ("x0x1", "x0 == 1 |", "ended too early"),
    ("x0x1", "x0 == 1 | x0 == -1", "holds everywhere"),
    ("x0x1", "x0*x0 == -1", "holds nowhere"),
    ("3", "x0 == 1", "no variables"),
])
def test_malformed_specs_name_the_problem(target, seen, message):
  with pytest.raises(B.TaskSpecError, match=message):
    B.custom_task(target, seen)


def test_walsh_and_degree_profile():
  x = BD.cube(4).astype(float)
  f = 2 * x[:, 0] * x[:, 2] - x[:, 3] + 0.5
  c = BA.walsh_coefficients(f)
  assert c[0b0101] == pytest.approx(2) and c[0b1000] == pytest.approx(-1) and c[0] == pytest.approx(0.5)
  np.testing.assert_allclose(BA.degree_profile(c), [0.25, 1, 4, 0, 0])


def test_seen_points_enumerates_exactly_the_seen_domain():
  task = B.TASKS["f2_2parity"]
  pts = BD.seen_points(task, np.random.default_rng(0))
  assert len(pts) == 3 * 2 ** 13 and len(np.unique(pts, axis=0)) == len(pts)
  assert task.is_seen(pts).all()


def test_reference_interpolants_on_f2_equal_hand_computed_values():
  """f2 = x0x1 seen where x0 = 1 or x1 = 1. On (+,+), (+,-), (-,+) the support monomials 1, x0, x1,
  x0x1 are orthogonal, so the minimum-norm fit is A^T y / 4 = (-1/4, 1/4, 1/4, 3/4), which is 0 at
  (-,-); the count lookup has count 2 -> 1, count 1 -> -1 and count 0 unconstrained (0 at minimum
  norm). Truth at (-,-) is 1, the MDI x0 + x1 - 1 gives -3: unseen MSE 1 for both references,
  1/16 of the MDI's."""
  from maskprior_jax.bench.boolean import mechanism as M
  task = B.TASKS["f2_2parity"]
  mdi = BA.minimum_degree_interpolator(task)
  pts = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]], np.int8)
  full = np.ones((4, task.n), np.int8)
  full[:, :2] = pts
  np.testing.assert_allclose(M.support_lsq(task)(full), [1, -1, -1, 0], atol=1e-12)
  np.testing.assert_allclose(M.count_lookup(task)(full), [1, -1, -1, 0], atol=1e-12)
  d = M.describe(task, mdi)
  assert d["by"] == "relevant" and d["groups"] == ["x0- x1-"] and d["size"] == [1]
  np.testing.assert_allclose([d["truth"][0], d["mdi"][0], d["support_lsq"][0], d["count_lookup"][0]], [1, -3, 0, 0],
                             atol=1e-12)
  assert d["support_lsq_unseen_mse"] == pytest.approx(1.0) and d["count_lookup_unseen_mse"] == pytest.approx(1.0)
  ids = M.group_ids(task, full, d["by"], M.unseen_groups(task)[1])
  assert ids.tolist() == [-1, -1, -1, 0]


def test_prior_variants_noself_and_layered():
  from maskprior_jax import priors
  m = priors.group_matrix([[1, 2, 3]], 5, num_heads=1, outside=-4.0, readers=[0], member_self=False)[0]
  assert m[1, 1] == -4 and m[1, 2] == 0 and m[2, 3] == 0 and m[4, 4] == 0 and m[0, 0] == 0 and m[0, 1] == 0
  from maskprior_jax.bench.boolean import run as R
  from maskprior_jax.bench.config import apply_overrides, builtin_config
  cfg = apply_overrides(builtin_config("boolean"), ["--config.prior.layers=layered", "--config.prior.token_rows=group"])
  task = B.TASKS["f2_2parity"]
  first, second = R.prior_pattern(task, cfg, 0), R.prior_pattern(task, cfg, 1)
  assert (first[:, 0, 1:] == -4).all() and (first[:, 1, 1:3] == 0).all()      # layer 0: CLS does not read yet
  assert (second[:, 0, 1:3] == 0).all() and (second[:, 1, 2] == -4).all()     # layer 1: CLS reads, tokens self


def test_unfit_runs_are_reported_as_such_and_not_scored():
  task = B.TASKS["f2_2parity"]
  from maskprior_jax.bench.boolean import mechanism as M
  mdi = BA.minimum_degree_interpolator(task)
  persistence = [{"step": 0, "attn_tv": [0.5, 0.5]}, {"step": 10, "attn_tv": [0.4, 0.4]}]

  def run(method, seed, seen, unseen, fitted):
    return {"method": method, "seed": seed, "seen_mse": seen, "fitted": fitted, "unseen_mse_true": unseen,
            "unseen_mse_mdi": 1.0, "unseen_group_means": [0.5], "degree_profile": None, "persistence": persistence}
  res = {"task": task.name, "n": task.n, "target": task.target, "seen": task.seen, "mdi": mdi.pretty(),
         "mdi_unseen_mse_true": 16.0, "fit_threshold_seen_mse": 0.01, "mechanism": M.describe(task, mdi),
         "truth_degree_profile": [0, 0, 1.0], "mdi_degree_profile": [1.0, 2.0, 0],
         "runs": [run("vanilla", 0, 0.5, 3.0, False), run("vanilla", 1, 0.6, 2.0, False),
                  run("mask", 0, 0.001, 0.8, True), run("mask", 1, 0.5, 16.0, False)]}
  from maskprior_jax.bench.boolean import report
  table = report.task_table(res)
  assert "| vanilla | 0/2 |" in table and "| mask | 1/2 |" in table
  assert "did not fit, did not fit" in table and "0.05, did not fit" in table
  assert "0.05 |" in table                                  # the mask's score is its fitted seed only
  head = report.headline_table([res])
  assert "did not fit (0/2)" in head and "0.05 (1/2)" in head and "| yes |" in head


def test_selection_rule_needs_more_than_the_seed_spread_and_a_fitting_variant():
  from maskprior_jax.bench.boolean import protocol as P
  base = {"t1": [0.5, 0.6, 0.4], "t2": [0.3, 0.3, 0.3]}
  close = {"t1": [0.45, 0.55, 0.4], "t2": [0.3, 0.3, 0.3]}      # better by less than the spread
  better = {"t1": [0.1, 0.1, 0.1], "t2": [0.1, 0.1, 0.1]}
  unfit = {"t1": [0.0, None, None], "t2": [0.0, None, None]}    # fits in 1/3 of runs
  assert P.select_default({"default": base, "close": close})[0] == "default"
  assert P.select_default({"default": base, "close": close, "better": better})[0] == "better"
  assert P.select_default({"default": base, "unfit": unfit})[0] == "default"
  assert P.score(unfit)[1] == pytest.approx(1 / 3)
  assert set(P.EXPLORATION_SEEDS).isdisjoint(P.CONFIRMATION_SEEDS)
  assert not set(P.EXPLORATION_TASKS) & set(B.TASKS) and P.SELECTED in P.VARIANTS


def test_shuffled_supports_have_the_true_sizes_and_not_the_true_variables():
  from maskprior_jax.bench.boolean import methods as BM
  for task in B.TASKS.values():
    true = [sorted(g) for g in task.groups]
    shuffled = BM.shuffled_groups(task.groups, task.n, seed=0)
    assert [len(g) for g in shuffled] == [len(g) for g in true]
    assert all(g not in true for g in shuffled)
    assert shuffled == BM.shuffled_groups(task.groups, task.n, seed=0)          # seeded
    used = {i for g in true for i in g}
    if task.n - len(used) >= max(len(g) for g in true):                         # room outside the supports
      assert not used & {i for g in shuffled for i in g}


def test_attribution_controls_change_one_thing_each():
  """mask_positions = the mask's prior with positions; mask_shuffled = the mask's settings with the
  shuffled supports' pattern; bias_zero starts at zero and learns; qk_nopos = qk's fit without
  positions."""
  import jax
  import jax.numpy as jnp
  import optax

  from maskprior_jax import MASK_PRIOR
  from maskprior_jax.bench.boolean import methods as BM
  from maskprior_jax.bench.boolean import run as R
  from maskprior_jax.bench.config import builtin_config
  cfg = builtin_config("boolean")
  task = B.TASKS["f2_2parity"]
  x = jnp.asarray(R.to_ids(1 - 2 * np.random.default_rng(0).integers(0, 2, (8, task.n))))
  init = {m: R.build_model(task, cfg, m).init(jax.random.key(0), x) for m in BM.METHODS}
  assert "pos_embedding" in init["mask_positions"]["params"]
  for m in ("mask", "mask_shuffled", "bias_zero", "qk_nopos"):
    assert "pos_embedding" not in init[m]["params"], m
  np.testing.assert_array_equal(init["mask_positions"][MASK_PRIOR]["block_0"]["attn"]["bias"],
                                init["mask"][MASK_PRIOR]["block_0"]["attn"]["bias"])
  shuffled = init["mask_shuffled"][MASK_PRIOR]["block_0"]["attn"]["bias"]
  np.testing.assert_array_equal(shuffled, R.prior_pattern(task, cfg, 0, BM.shuffled_groups(task.groups, task.n, 0)))
  assert not np.array_equal(shuffled, init["mask"][MASK_PRIOR]["block_0"]["attn"]["bias"])
  zero = init["bias_zero"]
  assert all(not np.any(b) for b in jax.tree.leaves(zero[MASK_PRIOR]))
  model = R.build_model(task, cfg, "bias_zero")
  y = jnp.asarray(task.f(1 - 2 * np.asarray(x)).astype(np.float32))
  grads = jax.grad(lambda v: jnp.mean((model.apply(v, x) - y) ** 2))(zero)
  moved = optax.apply_updates(zero, optax.adam(1e-2).update(grads, optax.adam(1e-2).init(zero), zero)[0])
  assert all(np.any(b) for b in jax.tree.leaves(moved[MASK_PRIOR]))            # it learns
  assert BM.init_method("qk_nopos") == "qk" and BM.init_method("mask_shuffled") == "mask_shuffled"


def test_the_task_generator_is_deterministic_and_gave_the_committed_tasks():
  from maskprior_jax.bench.boolean import algebra as BA2
  from maskprior_jax.bench.boolean import protocol as P
  assert len(P.GENERATED_TASKS) >= 8
  for seed in P.GENERATOR_SEEDS:
    t = P.generate_task(seed)
    assert t == P.generate_task(seed) == P.GENERATED_TASKS[t.name]
    assert 8 <= t.n <= 12 and 1 <= len(t.groups) <= 3 and all(2 <= len(g) <= 4 for g in t.groups)
    _, full = BD.relevant_points(t)
    assert 0.25 <= 1 - t.is_seen(full).mean() <= 0.5
    assert BA2.unseen_mse(t, BA2.minimum_degree_interpolator(t)) > 0
  assert P.generate_task(1) != P.generate_task(2)


@pytest.mark.slow   # CI's slow step
def test_reader_designs_depend_only_on_the_supports_and_unseen_counts_read_zero_in_d1_d2():
  """Each design's model and initial bias are the same for two targets with the same supports and
  different coefficients; readers attend to their support and themselves only; after training on
  points where one count never occurs, d1 and d2 read exactly 0 at that count."""
  import jax
  import jax.numpy as jnp
  import optax

  from maskprior_jax.bench.boolean import designs as BD2
  from maskprior_jax.bench.boolean import methods as BM
  from maskprior_jax.bench.boolean import run as R
  from maskprior_jax.bench.config import builtin_config
  cfg = builtin_config("boolean")
  a = B.Task("a", 6, "x0x1 + 2 x2x3x4", "x0 == 1 | x1 == 1")
  b = B.Task("b", 6, "-0.5 x0x1 + 0.25 x2x3x4", "x0 == 1 | x1 == 1")
  ids = jnp.asarray(R.to_ids(BD.cube(6)))
  for method in BM.DESIGN_METHODS:
    ma, mb = R.build_model(a, cfg, method), R.build_model(b, cfg, method)
    np.testing.assert_array_equal(ma.pattern, mb.pattern)
    va, vb = ma.init(jax.random.key(0), ids), mb.init(jax.random.key(0), ids)
    chex.assert_trees_all_equal(va, vb)
  allowed = BD2.reader_mask(6, a.groups, "p1")
  assert allowed[6].tolist() == [True, True, False, False, False, False, True, False]   # reader 0: x0, x1, itself
  assert not allowed[:6, 6:].any()                                                       # variables never read readers
  assert BD2.reader_mask(6, a.groups, "d1")[6].tolist() == [False] * 6 + [True, False]
  # Train d1 and d2 where support 0 = {x0, x1} never has count 0 (x0 = x1 = -1 is unseen).
  seen = ids[(ids[:, 0] == 1) | (ids[:, 1] == 1)]
  y = jnp.asarray(a.f(2 * np.asarray(seen) - 1).astype(np.float32))
  for method in ("reader_d1", "reader_d2"):
    model = R.build_model(a, cfg, method)
    v = model.init(jax.random.key(0), seen)
    tx = optax.adam(1e-2)
    state = tx.init(v)
    for _ in range(5):
      g = jax.grad(lambda v: jnp.mean((model.apply(v, seen) - y) ** 2))(v)
      upd, state = tx.update(g, state, v)
      v = optax.apply_updates(v, upd)
    _, inter = model.apply(v, ids, mutable=["intermediates"])
    readout = np.asarray(inter["intermediates"][BD2.READOUT][0])
    count0 = np.asarray(ids[:, 0] + ids[:, 1]) == 0
    assert np.all(readout[count0, 0] == 0) and np.any(readout[~count0, 0] != 0), method


def test_design_rule_keeps_the_mask_unless_a_design_wins_beyond_spread_and_margin():
  from maskprior_jax.bench.boolean import protocol as P
  mask = {"t1": [0.5, 0.6, 0.4], "t2": [0.3, 0.3, 0.3]}
  assert P.select_design({"mask": mask, "reader_d1": {"t1": [0.45, 0.55, 0.4], "t2": [0.3] * 3}})[0] == "mask"
  assert P.select_design({"mask": mask, "reader_d1": {"t1": [0.1] * 3, "t2": [0.1] * 3}})[0] == "reader_d1"
  zero = {"t1": [0.0] * 3}
  assert P.select_design({"mask": zero, "reader_p2": {"t1": [-1e-9] * 3}})[0] == "mask"   # a tie is no win
  kept, dropped = P.kept_tasks({"a": [0.1, None, 0.2, 0.3, 0.4], "b": [None, None, 0.1, 0.1, 0.1]})
  assert kept == ["a"] and dropped == ["b"]


def test_attention_only_designs_read_each_support_through_attention_alone():
  """a1 and a2 compute no feature from the input by hand: the variable tokens attend only to
  themselves, so a reader's readout changes only with its own support's bits, and (no positions)
  only with their count; a2's supports of one size share their reader."""
  import jax
  import jax.numpy as jnp

  from maskprior_jax.bench.boolean import designs as BD2
  from maskprior_jax.bench.boolean import run as R
  from maskprior_jax.bench.config import builtin_config
  task = B.Task("a", 6, "x0x1 + 2 x1x2 - x3x4x5", "x0 == 1 | x1 == 1")
  ids = jnp.asarray(R.to_ids(BD.cube(6)))
  x = np.asarray(ids)
  assert BD2.reader_mask(6, task.groups, "a1")[:6, :6].tolist() == np.eye(6, dtype=bool).tolist()
  for design in ("a1", "a2"):
    model = R.build_model(task, builtin_config("boolean"), f"reader_{design}")
    v = model.init(jax.random.key(0), ids)
    assert "count_embed" not in v["params"]
    readout = np.asarray(model.apply(v, ids, mutable=["intermediates"])[1]["intermediates"][BD2.READOUT][0])
    for k, support in enumerate(task.groups):
      key = x[:, list(support)].sum(-1)    # the support's count: all a reader may depend on
      for c in np.unique(key):
        vals = readout[key == c, k]
        np.testing.assert_allclose(vals, vals[0], atol=1e-5)
      assert len(np.unique(np.round(readout[:, k], 4))) > 1   # and it does depend on it
    if design == "a2":
      assert v["params"]["readers"].shape[0] == 2                # sizes 2 and 3
      pair = [k for k, s in enumerate(task.groups) if len(s) == 2]
      same = (x[:, [0, 1]].sum(-1) == x[:, [1, 2]].sum(-1))
      # two supports of one size with the same count read the same, up to their scales (1 at init)
      np.testing.assert_allclose(readout[same, pair[0]], readout[same, pair[1]], atol=1e-5)


def test_dropin_rule_passes_only_within_the_tolerance_on_every_task():
  from maskprior_jax.bench.boolean import protocol as P
  bounds = {"t1": 0.1, "t2": 0.0}
  good = {"t1": [0.12, 0.14, 0.5], "t2": [0.0, 0.01, 0.02]}
  near = {"t1": [0.11] * 3, "t2": [0.06] * 3}            # t2 excess 0.06: fails, but the lowest mean
  assert P.select_dropin({"a": good, "b": near}, bounds)[:2] == ("a", True)
  assert P.select_dropin({"b": near}, bounds)[:2] == ("b", False)
  unfit = {"t1": [0.1, None, 0.1], "t2": [0.0] * 3}      # median fine, but a run did not fit
  assert P.select_dropin({"u": unfit}, bounds)[:2] == ("u", False)
  assert P.dropin_excess([None, None, 0.2], 0.1) == 0.9


def test_the_corruption_rule_is_seeded_keeps_sizes_and_never_keeps_a_true_support_at_100_percent():
  from maskprior_jax.bench.boolean import methods as bm
  from maskprior_jax.bench.boolean import tasks as boolean
  for name in boolean.TASKS:
    task = boolean.get_task(name)
    true = [sorted(g) for g in task.groups]
    for seed in range(20):
      assert bm.corrupted_supports(task.groups, task.n, 0.0, seed) == true
      for fraction in (0.25, 0.5, 1.0):
        out = bm.corrupted_supports(task.groups, task.n, fraction, seed)
        assert out == bm.corrupted_supports(task.groups, task.n, fraction, seed)           # seeded
        assert [len(g) for g in out] == [len(g) for g in true]                               # sizes kept
        assert all(0 <= v < task.n and len(set(g)) == len(g) for g in out for v in g)
        changed = sum(a != b for a, b in zip(out, true))
        assert changed == round(fraction * len(true))                                        # that many replaced
        if fraction == 1.0:
          assert not any(g in true for g in out)                                             # no true support left
    draws = {tuple(map(tuple, bm.corrupted_supports(task.groups, task.n, 1.0, s))) for s in range(20)}
    assert len(draws) > 1                                                                    # per seed
  with pytest.raises(ValueError, match="in \\[0, 1\\]"):
    bm.corrupted_supports([[0, 1]], 4, 1.5, 0)


def test_the_evaluation_in_chunks_gives_the_one_call_values():
  """The training-time evaluation runs the model over its points in chunks (measure.apply_in_chunks):
  the same predictions as one call over them all, including a remainder chunk and pytree inputs."""
  import jax
  import jax.numpy as jnp

  from maskprior_jax import measure
  from maskprior_jax.bench import config as C
  from maskprior_jax.bench.boolean import run as BR
  bench = BR.BooleanTask(B.TASKS["f2_2parity"], C.builtin_config("boolean"))
  model = bench.model("mask")
  v = model.init(jax.random.key(0), bench.sample_input)
  ids = bench.ev[0][:1000]                                  # 1000 = 3 chunks of 300 and a rest of 100
  whole = np.asarray(jax.jit(lambda x: model.apply(v, x))(ids))
  chunked = np.asarray(jax.jit(lambda x: measure.apply_in_chunks(lambda c: model.apply(v, c), x, size=300))(ids))
  assert chunked.shape == whole.shape
  # per-example outputs: equal up to float32 rounding of a matmul tiled for another batch size
  np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())
  pair = measure.apply_in_chunks(lambda a, b: {"s": a + b, "d": a - b}, jnp.arange(7.0), jnp.ones(7), size=3)
  np.testing.assert_array_equal(pair["s"], np.arange(7.0) + 1)
  np.testing.assert_array_equal(pair["d"], np.arange(7.0) - 1)
  assert measure.apply_in_chunks(lambda a: a * 2, jnp.arange(3.0), size=0).tolist() == [0.0, 2.0, 4.0]


@pytest.mark.slow
def test_a_bfloat16_boolean_run_fits_its_seen_domain_with_float32_parameters(tmp_path):
  """`--config.model.dtype=bfloat16`: the Boolean default computes in bfloat16 (matrix products in
  bfloat16) with float32 parameters, mask prior and outputs, fits its seen domain as the float32
  default does (seen MSE under the fit threshold, 1% of f's variance there), and results.json records
  the dtype. The fit is the mask method's (vanilla's model is the mask's without its bias, and a
  second 2,000-step bfloat16 run emulated on a CPU costs a minute of CI); both models' programs are
  checked to compute in bfloat16."""
  import json
  import subprocess
  import sys

  import jax
  import jax.numpy as jnp

  from maskprior_jax.bench.boolean import run as BR
  from maskprior_jax.bench.config import apply_overrides, builtin_config
  cfg = apply_overrides(builtin_config("boolean"), ["--config.model.dtype=bfloat16"])
  bench = BR.BooleanTask(BR.headline_tasks(cfg)["f2_2parity"], cfg)
  for method in ("vanilla", "mask"):
    model = bench.model(method)
    v = model.init(jax.random.key(0), bench.sample_input)
    assert {a.dtype for a in jax.tree.leaves(v)} == {jnp.dtype(jnp.float32)}
    jaxpr = str(jax.make_jaxpr(lambda v: model.apply(v, bench.sample_input))(v))
    assert "bf16[" in jaxpr and model.apply(v, bench.sample_input).dtype == jnp.float32
  out = subprocess.run([sys.executable, "-m", "maskprior_jax.bench.cli", "boolean", "--task", "f2", "--methods",
                        "mask", "--seeds", "1", "--workdir", str(tmp_path / "run"),
                        "--config.model.dtype=bfloat16", "--config.eval.every_steps=2000"],   # evaluated at the end
                       capture_output=True, text=True, timeout=900, env={**os.environ, "XLA_FLAGS": xla_flags(flags=DEFAULT_XLA)})
  # (a fit, under the compiler settings users run: its 2000 steps take longer than its compiles)
  assert out.returncode == 0, out.stderr[-2000:]
  res = json.loads((tmp_path / "run" / "results.json").read_text())
  assert res["attention"]["dtype"] == "bfloat16"
  threshold = res["fit_threshold_seen_mse"]
  assert [(r["method"], r["fitted"]) for r in res["runs"]] == [("mask", True)]
  assert all(r["seen_mse"] <= threshold for r in res["runs"])


def _tiny_qk_config(*overrides):
  from maskprior_jax.bench.config import apply_overrides, builtin_config
  return apply_overrides(builtin_config("boolean"), [
      "--config.model.dim=16", "--config.model.depth=1", "--config.model.num_heads=2", "--config.model.head_dim=8",
      "--config.model.mlp_dim=16", "--config.train.steps=20", "--config.train.steps_per_call=10",
      "--config.eval.every_steps=10", "--config.checkpoint.every_steps=10", "--config.qk.fit_steps=10", *overrides])


def test_qk_fit_inputs_depend_on_the_seed_alone_not_on_the_evaluation():
  """With qk.fit_inputs > 0 the qk method's initial variables are the same whatever the evaluation's
  sample (eval.num_points, eval.probe_size) and differ between seeds; with 0 (the probe, as folders
  recorded before the key hold) the evaluation's sample moves them."""
  import jax

  from maskprior_jax.bench import runner
  from maskprior_jax.bench.boolean import run as BR
  task = B.custom_task("x0x1x2 + x2x3", "x0 == 1", n=8)

  def init(seed, *overrides):
    bench = BR.BooleanTask(task, _tiny_qk_config(*overrides))
    v, info = runner.initial_variables("qk", bench.model("qk"), bench, seed)
    return jax.tree.leaves(v), info

  own = ["--config.qk.fit_inputs=512", "--config.qk.fit_batch=128"]
  a, info = init(0, *own, "--config.eval.num_points=512")
  b, _ = init(0, *own, "--config.eval.num_points=1024", "--config.eval.probe_size=64")
  c, _ = init(1, *own, "--config.eval.num_points=512")
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  assert 0.0 <= info["qk_fit_tv"] < 1.0
  p, _ = init(0, "--config.qk.fit_inputs=0", "--config.eval.num_points=512")
  q, _ = init(0, "--config.qk.fit_inputs=0", "--config.eval.num_points=1024")
  assert not all(np.array_equal(x, y) for x, y in zip(p, q))
  points = BR.qk_fit_points(8, 300, seed=3)
  assert points.shape == (300, 8) and set(np.unique(points)) == {-1, 1}
  assert np.array_equal(points, BR.qk_fit_points(8, 300, seed=3)) and not np.array_equal(points, BR.qk_fit_points(8, 300, seed=3, draw=1))


def test_changing_the_evaluation_sample_leaves_a_qk_run_unchanged(tmp_path):
  """End to end: two qk runs whose configs differ only in eval.num_points end on the same
  state_sha256 (their curves are measured on other points)."""
  from maskprior_jax.bench.boolean import run as BR
  task = B.custom_task("x0x1x2 + x2x3", "x0 == 1", n=8)
  shas = []
  for points in (256, 768):
    cfg = _tiny_qk_config("--config.qk.fit_inputs=512", f"--config.eval.num_points={points}")
    res = BR.run_task(task, cfg, ["qk"], [0], tmp_path / str(points), log=lambda *a: None)
    shas.append(res["runs"][0]["state_sha256"])
  assert shas[0] == shas[1]


def test_the_batched_qk_fit_lowers_the_distance_and_a_whole_batch_is_the_old_fit():
  """baselines.fit_qk with batches: the attention moves toward the target (TV below the initial
  one); a batch as large as the inputs is the whole-batch fit, bit for bit."""
  import jax
  import jax.numpy as jnp

  from maskprior_jax import baselines, measure
  from maskprior_jax.bench.boolean import run as BR
  bench = BR.BooleanTask(B.custom_task("x0x1x2 + x2x3", "x0 == 1", n=8), _tiny_qk_config())
  model = bench.model("qk")
  v = model.init(jax.random.key(0), bench.sample_input)
  x = BR.to_ids(BR.qk_fit_points(8, 256, seed=0))
  target = jnp.asarray(bench.probe.target_attn)
  tv0 = float(np.mean([measure.total_variation(a, target) for a in measure.attention_maps(model.apply, v, x)]))
  fitted, tv = baselines.fit_qk(model.apply, v, x, target, steps=100, batch_size=64, seed=0)
  assert tv < tv0 - 0.05
  whole, tv_w = baselines.fit_qk(model.apply, v, x, target, steps=5)
  same, tv_s = baselines.fit_qk(model.apply, v, x, target, steps=5, batch_size=256, seed=7)
  assert tv_w == tv_s
  chex.assert_trees_all_equal(whole, same)


def test_the_qk_rerun_merge_replaces_only_the_rerun_method_and_refuses_other_config_changes(tmp_path):
  """experiments/boolean_qk_rerun.py --merge: per task, the rerun's qk runs and curves replace the
  headline's, every other run is kept as it is, the replaced runs go to superseded_runs.json, and a
  rerun whose config differs in anything but qk's keys is refused (nothing written)."""
  import copy
  import json
  import sys
  sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "experiments"))
  import boolean_qk_rerun as QR
  cfg = {"train": {"steps": 10}, "qk": {"fit_steps": 3, "fit_learning_rate": 0.01}}
  run = lambda m, s, sha: {"method": m, "seed": s, "state_sha256": sha, "unseen_mse_true": 1.0 if sha.islower() else 0.5,
                           "fitted": sha != "Q1"}
  old = {"benchmark": "boolean", "task": "t", "config_digest": "old", "mdi_unseen_mse_true": 2.0, "environment": {}, "wall_s": {"vanilla": 1.0, "qk": 2.0},
         "runs": [run("vanilla", 0, "v0"), run("qk", 0, "q0"), run("vanilla", 1, "v1"), run("qk", 1, "q1")],
         "curves": {"vanilla": {"step": [1]}, "qk": {"step": [1], "x": [0]}}}
  head, rerun = tmp_path / "head", tmp_path / "rerun"
  (head / "t").mkdir(parents=True)
  (rerun / "t").mkdir(parents=True)
  (head / "run_config.json").write_text(json.dumps({"config": cfg}))
  (head / "t" / "results.json").write_text(json.dumps(old))
  new = {**copy.deepcopy(old), "config_digest": "new", "environment": {"commit": "c"}, "wall_s": {"qk": 3.0},
         "runs": [run("qk", 0, "Q0"), run("qk", 1, "Q1")], "curves": {"qk": {"step": [1], "x": [5]}}}
  (rerun / "t" / "results.json").write_text(json.dumps(new))
  (rerun / "t" / "config.json").write_text(json.dumps({**cfg, "train": {"steps": 11}}))
  with pytest.raises(SystemExit, match="not only in qk's keys"):
    QR.merge(rerun, head, ["qk"])
  assert json.loads((head / "t" / "results.json").read_text()) == old
  (rerun / "t" / "config.json").write_text(json.dumps({**cfg, "qk": {**cfg["qk"], "fit_inputs": 256}}))
  QR.merge(rerun, head, ["qk"])
  merged = json.loads((head / "t" / "results.json").read_text())
  assert [(r["method"], r["seed"], r["state_sha256"]) for r in merged["runs"]] == [
      ("vanilla", 0, "v0"), ("vanilla", 1, "v1"), ("qk", 0, "Q0"), ("qk", 1, "Q1")]
  assert merged["curves"]["qk"]["x"] == [5] and merged["curves"]["vanilla"] == old["curves"]["vanilla"]
  assert merged["config_digest"] == "new" and merged["reruns"][0]["replaced_config_digest"] == "old"
  assert merged["reruns"][0]["config_changes"] == {"qk.fit_inputs": 256}
  gone = json.loads((head / "t" / "superseded_runs.json").read_text())
  assert [r["state_sha256"] for r in gone["runs"]] == ["q0", "q1"] and gone["config_digest"] == "old"
  with pytest.raises(SystemExit, match="merged already"):
    QR.merge(rerun, head, ["qk"])
  assert "| t | qk | 0.50, 0.50 | 0.5 ± 0 (2/2) | 0.25, 0.25* | 0.25 (1/2) |" in QR.markdown(head, ["qk"])
