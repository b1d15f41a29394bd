import numpy as np
import pytest

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
  mdi = B.minimum_degree_interpolator(task)
  got = {k: v for k, v in mdi.terms.items() if abs(v) > 1e-8}
  assert set(got) == set(terms)
  for k, v in terms.items():
    assert got[k] == pytest.approx(v, abs=1e-8)
  assert B.unseen_mse(task, mdi) == pytest.approx(mse, abs=1e-8)
  # the MDI agrees with f on the seen domain
  x = B.cube(len(task.relevant()))
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
    x = B.cube(15)
    assert (~B.TASKS[name].is_seen(x)).mean() == share


def test_parser_values_and_groups():
  e = B.parse_target("x0x1 - 1.25 x1*x2 + 1.5 x0x2 + 2")
  x = B.cube(3).astype(float)
  np.testing.assert_allclose(e.evaluate(x), x[:, 0] * x[:, 1] - 1.25 * x[:, 1] * x[:, 2] + 1.5 * x[:, 0] * x[:, 2] + 2)
  assert set(e.groups) == {frozenset({0, 1}), frozenset({1, 2}), frozenset({0, 2})}
  e = B.parse_target("sign(x0 + x1 + x2) - 0.5*(x3 - x4)")
  np.testing.assert_allclose(e.evaluate(B.cube(5).astype(float))[:4], [1, 1, 1, -1])
  pred, vars_ = B.parse_condition("x0 == 1 | (x1*x2 == -1 & x3 == 1)")
  x = B.cube(4)
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
  x = B.cube(4).astype(float)
  f = 2 * x[:, 0] * x[:, 2] - x[:, 3] + 0.5
  c = B.walsh_coefficients(f)
  assert c[0b0101] == pytest.approx(2) and c[0b1000] == pytest.approx(-1) and c[0] == pytest.approx(0.5)
  np.testing.assert_allclose(B.degree_profile(c), [0.25, 1, 4, 0, 0])


def test_seen_points_enumerates_exactly_the_seen_domain():
  task = B.TASKS["f2_2parity"]
  pts = B.seen_points(task, np.random.default_rng(0))
  assert len(pts) == 3 * 2 ** 13 and len(np.unique(pts, axis=0)) == len(pts)
  assert task.is_seen(pts).all()
