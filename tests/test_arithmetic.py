import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cli_args import ONE_DEVICE, SMALL_MODEL

from maskprior_jax.bench.arithmetic import tasks as A
from maskprior_jax.bench import cli


def _keys(a, b, base):
  return set((np.asarray(a) * base + np.asarray(b)).tolist())


@pytest.mark.parametrize("task", [A.ArithmeticTask("add", 3), A.ArithmeticTask("add", 6),
                                  A.ArithmeticTask("modadd", modulus=97)])
def test_splits_never_overlap_and_are_deterministic(task):
  sp = A.make_splits(task, 5000, [0, 1], test_size=2000)
  test = _keys(sp.test_a, sp.test_b, task.base)
  assert len(test) == 2000
  for s in (0, 1):
    train = _keys(sp.train_a[s], sp.train_b[s], task.base)
    assert len(train) == 5000 and not train & test
  again = A.make_splits(task, 5000, [0, 1], test_size=2000)
  np.testing.assert_array_equal(sp.train_a[1], again.train_a[1])
  assert not np.array_equal(sp.train_a[0], sp.train_a[1])


def test_too_many_pairs_is_an_error():
  with pytest.raises(A.DataError, match="distinct pairs"):
    A.make_splits(A.ArithmeticTask("modadd", modulus=11), 100, [0], test_size=50)


def _answer(task, targets):
  digits = targets[:, task.answer_rows]
  if task.reverse:
    digits = digits[:, ::-1]
  return np.asarray([int("".join(map(str, d))) for d in digits])


@pytest.mark.parametrize("reverse", [True, False])
def test_addition_encoding_reads_back_the_sum(reverse):
  task = A.ArithmeticTask("add", 4, reverse=reverse)
  a, b = np.array([1234, 9999, 5, 0]), np.array([8766, 9999, 70, 0])
  x, y = task.encode(a, b)
  assert x.shape == y.shape == (4, task.input_len) == (4, 14)
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])                       # next-token targets
  np.testing.assert_array_equal(_answer(task, y), a + b)
  assert list(x[0, :10]) == [1, 2, 3, 4, task.plus, 8, 7, 6, 6, task.equals]
  first = y[0, task.answer_rows]
  assert list(first) == ([0, 0, 0, 0, 1] if reverse else [1, 0, 0, 0, 0])  # 1234 + 8766 = 10000


def test_modadd_encoding():
  task = A.ArithmeticTask("modadd", modulus=97)
  x, y = task.encode(np.array([96, 3]), np.array([5, 4]))
  np.testing.assert_array_equal(x, [[96, 97, 5, 98], [3, 97, 4, 98]])
  np.testing.assert_array_equal(y[:, 3], [4, 7])


def test_addition_prior_marks_the_columns_and_the_carry():
  task = A.ArithmeticTask("add", 3, reverse=True)     # a2 a1 a0 + b2 b1 b0 = s0 s1 s2 s3
  m = task.prior_pattern(inside=0.0, outside=-4.0)
  assert m.shape == (11, 11)
  inside = {int(r): set(np.flatnonzero(m[r] == 0.0).tolist()) for r in task.answer_rows}
  # row 7 ('=') predicts s0: a0 (pos 2), b0 (pos 6); row 8 (holding s0) predicts s1: a1, b1, carry a0, b0.
  assert inside[7] == {2, 6, 7}
  assert inside[8] == {1, 5, 2, 6, 8}
  assert inside[9] == {0, 4, 1, 5, 9}
  assert inside[10] == {0, 4, 10}                         # s3 is the carry out of place 2
  assert np.all(m[:7] == 0.0)                              # rows without an answer carry no structure
  usual = A.ArithmeticTask("add", 3, reverse=False).prior_pattern()
  assert set(np.flatnonzero(usual[7] == 0.0).tolist()) == {0, 4, 7}   # usual order: s3 first


def test_modadd_prior():
  m = A.ArithmeticTask("modadd").prior_pattern(outside=-8.0)
  assert list(m[3]) == [0.0, -8.0, 0.0, 0.0] and np.all(m[:3] == 0)


def test_short_end_to_end_run(tmp_path):
  work = tmp_path / "add"
  rc = cli.main(["arithmetic", "--task", "add", "--digits", "2", "--train-sizes", "100,400", "--methods",
                 "vanilla,qk,mask", "--seeds", "2", "--workdir", str(work), "--config.train.steps=25", "--config.train.warmup_steps=5",
                 "--config.eval.every_steps=25", "--config.train.steps_per_call=25", "--config.task.test_size=300", "--config.qk.fit_steps=10",
                 "--config.eval.probe_size=16", *SMALL_MODEL, *ONE_DEVICE])
  assert rc == 0
  res = json.loads((work / "results.json").read_text())
  assert len(res["runs"]) == 3 * 2 * 2
  for r in res["runs"]:
    assert {"method", "seed", "train_size", "exact_match", "digit_accuracy", "steps_to_99_train"} <= set(r)
    assert 0 <= r["exact_match"] <= r["digit_accuracy"] <= 1
    assert len(r["persistence"]) == 2   # at steps 0 and 25
    assert len(r["exact_by_carries"]) == 3   # 2 digits: 0, 1 or 2 carries
  assert sum(res["test_carries"]) == 300
  table = (work / "table.md").read_text()
  assert "Per seed (seeds 0, 1)" in table and "by carries in the pair" in table
  mask = [r for r in res["runs"] if r["method"] == "mask"]
  assert all(r["persistence"][-1]["mask_drift"] > 0 for r in mask)
  for f in ("table.md", "exact_match_vs_train_size.png", "persistence.png", "metrics.jsonl"):
    assert (work / f).exists()


def test_bad_train_sizes_are_one_line_errors(tmp_path, capsys):
  assert cli.main(["arithmetic", "--train-sizes", "100,abc", "--workdir", str(tmp_path / "w")]) == 2
  assert cli.main(["arithmetic", "--task", "modadd", "--train-sizes", "9000", "--workdir", str(tmp_path / "w")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 2 and all(e.startswith("maskprior: error:") for e in err)
  assert "distinct pairs" in err[1]
  assert not (tmp_path / "w").exists()


def test_position_coupling_ids_equal_hand_written_ones():
  # 2 digits, answer reversed: inputs a1 a0 + b1 b0 = s0 s1 (the last answer token is only a target).
  # Operand digits of place p get id p+1, '+' 0; the row that predicts the answer digit of place p
  # ('=' predicts s0, s0 predicts s1, s1 predicts s2) gets p+1 as well.
  assert A.ArithmeticTask("add", 2).coupling_ids("rows") == (2, 1, 0, 2, 1, 1, 2, 3)
  # answer in the usual order: '=' predicts s2 (place 2), then s1, s0
  assert A.ArithmeticTask("add", 2, reverse=False).coupling_ids("rows") == (2, 1, 0, 2, 1, 3, 2, 1)
  with pytest.raises(A.DataError, match="addition"):
    A.ArithmeticTask("modadd").coupling_ids()


def test_published_coupling_ids_equal_hand_written_ones():
  """Cho et al.'s ids for 3 digits, start 1 (end = 5): inputs a2 a1 a0 + b2 b1 b0 = s0 s1 s2 (s3 is
  only a target). Digits of place p, in both operands and the answer (on the digit's own token),
  get 4 - p; '+' and '=' get 5; the answer's carry-out digit s3 would get 1."""
  task = A.ArithmeticTask("add", 3)
  assert task.coupling_ids("published") == (2, 3, 4, 5, 2, 3, 4, 5, 4, 3, 2)
  assert task.coupling_ids("published", start=4) == (5, 6, 7, 8, 5, 6, 7, 8, 7, 6, 5)
  # answer in the usual order: s3 s2 s1 (s0 only a target) carry places 3, 2, 1
  assert A.ArithmeticTask("add", 3, reverse=False).coupling_ids("published") == (2, 3, 4, 5, 2, 3, 4, 5, 1, 2, 3)
  with pytest.raises(A.DataError, match="coupling must be"):
    task.coupling_ids("cho")


def test_coupling_offset_is_drawn_in_training_and_absent_in_evaluation():
  from maskprior_jax.bench.arithmetic import run as arithmetic_run
  from maskprior_jax.bench.config import apply_overrides, builtin_config
  cfg = apply_overrides(builtin_config("arithmetic"), [
      "--config.task.coupling=published", "--config.task.coupling_max_position=12", "--config.task.train_sizes=100",
      "--config.task.test_size=100", "--config.task.val_size=50", *SMALL_MODEL])
  bench = arithmetic_run.Arithmetic(cfg, [0])
  task, base = bench.task, np.asarray(bench.task.coupling_ids("published"))
  batch = bench.host_batches(bench.runs([0]))(0, [0])
  pos = batch["pos"][0]                                            # (batch, input_len)
  starts = pos[:, 0] - base[0] + 1
  assert np.array_equal(pos, base[None] + starts[:, None] - 1)     # one offset per example, the pattern kept
  assert starts.min() >= 1 and starts.max() <= 12 - 3 - 1 and len(set(starts.tolist())) > 3
  assert pos.max() <= 12
  # the pairs drawn do not depend on the coupling: the same x as without it
  plain = arithmetic_run.Arithmetic(apply_overrides(cfg, ["--config.task.coupling=rows"]), [0])
  assert "pos" not in plain.host_batches(plain.runs([0]))(0, [0])
  np.testing.assert_array_equal(plain.host_batches(plain.runs([0]))(0, [0])["x"], batch["x"])
  # evaluation (and greedy decoding) read the model's static ids: start 1
  model = bench.model("coupling")
  assert model.position_ids == task.coupling_ids("published", start=1) and model.max_len == 13
  variables = jax.jit(model.init)(jax.random.key(0), bench.sample_input)
  x = jnp.asarray(bench.test_x[:4])
  apply = jax.jit(model.apply)   # (one program each, not an XLA compile per operation)
  np.testing.assert_array_equal(apply(variables, x), apply(variables, x, position_ids=jnp.broadcast_to(base, x.shape)))
  # training applies the drawn ids
  loss = jax.jit(bench.loss_fn(model))
  shifted = {**batch, "pos": jnp.asarray(batch["pos"][0]), "x": jnp.asarray(batch["x"][0]),
             "y": jnp.asarray(batch["y"][0])}
  fixed = {**shifted, "pos": jnp.broadcast_to(jnp.asarray(base), shifted["x"].shape)}
  assert float(loss(variables, shifted, None)[0]) != float(loss(variables, fixed, None)[0])


def test_validation_pairs_are_disjoint_from_test_and_training_pairs():
  task = A.ArithmeticTask("add", 2)
  sp = A.make_splits(task, 3000, [0, 1], test_size=2000, val_size=500)
  key = lambda a, b: set((np.asarray(a) * task.base + np.asarray(b)).tolist())
  val, test = key(sp.val_a, sp.val_b), key(sp.test_a, sp.test_b)
  assert len(val) == 500 and not val & test
  for s in (0, 1):
    assert not key(sp.train_a[s], sp.train_b[s]) & (val | test)
  # without a validation split, the training pairs are the first version's
  old, new = A.make_splits(task, 3000, [0], test_size=2000), A.make_splits(task, 3000, [0], test_size=2000, val_size=0)
  np.testing.assert_array_equal(old.train_a[0], new.train_a[0])


def test_selection_takes_the_best_validation_step_and_its_test_score():
  from maskprior_jax.bench.arithmetic.run import select_on_validation
  curve = [{"step": 0, "val_exact": 0.1, "test_exact": 0.1, "train_exact": 0.2},
           {"step": 50, "val_exact": 0.9, "test_exact": 0.8, "train_exact": 1.0},
           {"step": 100, "val_exact": 0.9, "test_exact": 0.85, "train_exact": 1.0},
           {"step": 150, "val_exact": 0.3, "test_exact": 0.2, "train_exact": 0.4}]
  assert select_on_validation(curve) == {"selected_step": 50, "selected_val_exact": 0.9, "selected_exact": 0.8,
                                         "selected_train_exact": 1.0}


def test_carry_prior_for_three_digits_equals_a_hand_written_matrix():
  # inputs: a2 a1 a0 + b2 b1 b0 = s0 s1 s2 (positions 0..10); rows 7..10 predict s0..s3.
  o = -4.0
  expected = np.zeros((11, 11), np.float32)
  expected[7] = [o, o, 0, o, o, o, 0, 0, o, o, o]          # place 0: a0, b0, itself
  expected[8] = [o, 0, 0, o, o, 0, 0, o, 0, o, o]          # place 1: a1 b1, a0 b0 (carry), itself
  expected[9] = [0, 0, -1, o, 0, 0, -1, o, o, 0, o]        # place 2: a2 b2, a1 b1, a0 b0 at -1
  expected[10] = [0, -1, -2, o, 0, -1, -2, o, o, o, 0]     # place 3 (the final carry): a2 b2, a1 b1 -1, a0 b0 -2
  np.testing.assert_array_equal(A.ArithmeticTask("add", 3).prior_pattern(kind="carry", decay=1.0), expected)
  window = A.ArithmeticTask("add", 3).prior_pattern()
  np.testing.assert_array_equal(window[9], [0, 0, o, o, 0, 0, o, o, o, 0, o])   # stops at place i-1


def test_priors_never_depend_on_the_operands(tmp_path):
  """The mask a model starts from is the same whatever data it will see (other data seeds, other
  training sets): it is built from positions alone."""
  from maskprior_jax.bench.arithmetic import run as R
  from maskprior_jax.bench.config import apply_overrides, builtin_config
  task = A.ArithmeticTask("add", 3)
  biases = []
  for data_seed, kind in ((0, "carry"), (7, "carry")):
    cfg = apply_overrides(builtin_config("arithmetic"), [f"--config.task.data_seed={data_seed}",
                                                         f"--config.prior.kind={kind}"])
    model = R.build_model(task, cfg, "mask_coupling")
    import jax
    import jax.numpy as jnp
    v = model.init(jax.random.key(data_seed), jnp.zeros((1, task.input_len), jnp.int32))
    biases.append(np.asarray(jax.tree.leaves(v["mask_prior"])[0]))
  np.testing.assert_array_equal(biases[0], biases[1])
  np.testing.assert_array_equal(biases[0][0], task.prior_pattern(kind="carry"))


def test_coupling_methods_run_and_modadd_refuses_them(tmp_path, capsys):
  work = tmp_path / "add"
  assert cli.main(["arithmetic", "--digits", "2", "--train-sizes", "100", "--methods", "coupling,mask_coupling",
                   "--seeds", "1", "--workdir", str(work), "--config.train.steps=50", "--config.train.warmup_steps=5", "--config.eval.every_steps=50",
                   "--config.task.test_size=200", "--config.eval.probe_size=16", "--config.checkpoint.every_steps=50",
                   "--config.prior.kind=carry", *SMALL_MODEL, *ONE_DEVICE]) == 0
  res = json.loads((work / "results.json").read_text())
  assert sorted(r["method"] for r in res["runs"]) == ["coupling", "mask_coupling"]
  assert "| train size | coupling | mask_coupling |" in (work / "table.md").read_text()
  assert cli.main(["arithmetic", "--task", "modadd", "--methods", "coupling", "--workdir", str(tmp_path / "m")]) == 2
  assert "position coupling" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_carry_counts_by_hand():
  from maskprior_jax.bench.arithmetic.tasks import ArithmeticTask
  t = ArithmeticTask("add", 3)
  a = np.array([999, 123, 15, 95, 500, 0])
  b = np.array([1, 456, 5, 5, 500, 0])
  assert t.carries(a, b).tolist() == [3, 0, 1, 2, 1, 0]
  assert ArithmeticTask("modadd").carries(a, b) is None


def test_recipe_rule_treats_every_method_alike_and_needs_fitted_runs():
  from maskprior_jax.bench.arithmetic import protocol
  def runs(val, fit=1.0, n=10):
    return [{"method": m, "train_size": 250, "selected_val_exact": v, "final_train_exact": fit}
            for m, v in zip(("vanilla", "mask"), val) for _ in range(n // 2)]
  cells = {(1e-3, 0.1): runs((0.5, 0.9)),                 # mean 0.7
           (2e-3, 0.1): runs((0.8, 0.8)),                 # mean 0.8: the best
           (5e-4, 1.0): runs((1.0, 1.0), fit=0.5)}        # best scores but half the runs collapse
  assert protocol.select_recipe(cells)[0] == (2e-3, 0.1)
  cells[(1e-3, 1.0)] = runs((0.798, 0.8))                 # within the tie margin: the smaller lr wins
  assert protocol.select_recipe(cells)[0] == (1e-3, 1.0)
  assert protocol.select_recipe({(1e-3, 0.1): runs((1, 1), fit=0.0)})[1].startswith("no setting")
  overrides = protocol.recipe_overrides(1e-3, 1.0)
  assert "--config.train.schedule=cosine" in overrides and "--config.train.warmup_steps=300" in overrides


def _script(name):
  import importlib.util
  import pathlib
  import sys
  here = pathlib.Path(__file__).resolve().parents[1] / "experiments"
  sys.path.insert(0, str(here))
  try:
    spec = importlib.util.spec_from_file_location(name, here / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(here))
  return module


@pytest.mark.slow   # CI's slow step
def test_methods_run_in_separate_folders_and_merged_equal_one_process(tmp_path):
  """experiments/arithmetic_curve.py --jobs: each method in its own process and folder, merged;
  every run's final state is bit for bit the one-process run's, and merging refuses mixed configs
  or repeated methods."""
  curve = _script("arithmetic_curve")
  common = ["--digits", "2", "--train-sizes", "60,100", "--seeds", "0-1", "--config.train.steps=50",
            "--config.train.warmup_steps=5", "--config.eval.every_steps=25", "--config.train.steps_per_call=25",
            "--config.task.test_size=100",
            "--config.task.val_size=40", "--config.eval.probe_size=16", "--config.checkpoint.every_steps=50", *SMALL_MODEL,
            *ONE_DEVICE]
  assert cli.main(["arithmetic", "--methods", "vanilla,mask_coupling", "--workdir", str(tmp_path / "one"), *common]) == 0
  failed = curve.run_parallel([(m, tmp_path / "parts" / m, ["arithmetic", "--methods", m, *common])
                               for m in ("vanilla", "mask_coupling")], max_jobs=2, log=lambda *a: None)
  assert failed == []
  merged = curve.merge([tmp_path / "parts" / "vanilla", tmp_path / "parts" / "mask_coupling"], tmp_path / "merged")
  one = json.loads((tmp_path / "one" / "results.json").read_text())
  key = lambda r: (r["method"], r["seed"], r["train_size"])
  assert {key(r): r["state_sha256"] for r in merged["runs"]} == {key(r): r["state_sha256"] for r in one["runs"]}
  assert merged["curves"] == one["curves"] and merged["config_digest"] == one["config_digest"]
  assert json.loads((tmp_path / "merged" / "results.json").read_text())["runs"] == merged["runs"]
  assert (tmp_path / "merged" / "table.md").exists() and (tmp_path / "merged" / "tensorboard" / "mask_coupling").is_dir()
  with pytest.raises(curve.MergeError, match="repeats a method"):
    curve.merge([tmp_path / "parts" / "vanilla", tmp_path / "one"], tmp_path / "bad")
  # A part run under another config (its digest differs): the merge refuses it.
  other = tmp_path / "other"
  shutil.copytree(tmp_path / "parts" / "mask_coupling", other)
  res = json.loads((other / "results.json").read_text())
  (other / "results.json").write_text(json.dumps({**res, "config_digest": "0" * len(res["config_digest"])}))
  with pytest.raises(curve.MergeError, match="another config"):
    curve.merge([tmp_path / "parts" / "vanilla", tmp_path / "other"], tmp_path / "bad")
