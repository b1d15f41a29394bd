"""Boolean "generalization on the unseen" (GOTU) task specifications.

A task is a target f over x in {-1,+1}^n, a seen-domain condition, and the interaction
structure of f (the variable sets of its monomials). Targets and conditions are parsed
from text by a small recursive-descent parser (no eval):

  target:  sums of products with real coefficients and sign(...), e.g.
           "x0x1 - 1.25 x1*x2 + 1.5 x0x2", "sign(x0 + x1 + x2)"
  seen:    atoms "PRODUCT == +-1" joined by | and & (or "or"/"and"), with parentheses, e.g.
           "x0 == 1 | x1 == 1", "x0*x1*x2 == 1"

The cube and seen points are in `boolean.data`; the Fourier-Walsh analysis and the
minimum-degree interpolator in `boolean.algebra`.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Callable

import numpy as np

from maskprior_jax.bench.boolean.data import relevant_points


class TaskSpecError(ValueError):
  """A malformed target or seen-domain specification."""


# ----------------------------------------------------------------------------- parsing
_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.\d*|\.\d+|\d+(?:[eE][-+]?\d+)?)|(?P<var>x\d+)|(?P<name>sign|or|and)"
                    r"|(?P<op>==|[-+*()|&]))")


def _tokenize(text: str, what: str) -> list[tuple[str, str]]:
  tokens, pos, text = [], 0, text.strip()
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m or m.end() == pos:
      raise TaskSpecError(f"{what} {text!r}: unexpected {text[pos:].strip()[:12]!r} at character {pos}")
    kind = m.lastgroup
    tokens.append((kind, m.group(kind)))
    pos = m.end()
    while pos < len(text) and text[pos].isspace():
      pos += 1
  return tokens


@dataclasses.dataclass(frozen=True)
class Expr:
  """A parsed expression: a function of x (N, n) in {-1,+1}, and its interaction groups."""
  evaluate: Callable[[np.ndarray], np.ndarray]
  variables: frozenset[int]
  groups: tuple[frozenset[int], ...]   # variable sets of the top-level terms


class _Parser:
  def __init__(self, text: str, what: str):
    self.text, self.what = text, what
    self.tokens = _tokenize(text, what)
    self.i = 0

  def error(self, msg: str):
    raise TaskSpecError(f"{self.what} {self.text!r}: {msg}")

  def peek(self):
    return self.tokens[self.i] if self.i < len(self.tokens) else (None, None)

  def take(self, value=None):
    tok = self.peek()
    if tok[0] is None:
      self.error("ended too early" + (f", expected {value!r}" if value else ""))
    if value is not None and tok[1] != value:
      self.error(f"expected {value!r}, found {tok[1]!r}")
    self.i += 1
    return tok

  def done(self):
    if self.i != len(self.tokens):
      self.error(f"unexpected {self.tokens[self.i][1]!r}")

  # expr := ['+'|'-'] term (('+'|'-') term)*
  def expr(self) -> Expr:
    terms = []
    sign = 1.0
    if self.peek()[1] in ("+", "-"):
      sign = -1.0 if self.take()[1] == "-" else 1.0
    terms.append((sign, self.term()))
    while self.peek()[1] in ("+", "-"):
      sign = -1.0 if self.take()[1] == "-" else 1.0
      terms.append((sign, self.term()))

    def evaluate(x, terms=terms):
      return sum(s * t.evaluate(x) for s, t in terms)
    variables = frozenset().union(*(t.variables for _, t in terms))
    groups = tuple(t.variables for _, t in terms if t.variables)
    return Expr(evaluate, variables, groups)

  # term := factor (['*'] factor)*
  def term(self) -> Expr:
    factors = [self.factor()]
    while self.peek()[1] == "*" or self.peek()[0] in ("num", "var") or self.peek()[1] in ("sign", "("):
      if self.peek()[1] == "*":
        self.take()
      factors.append(self.factor())

    def evaluate(x, factors=factors):
      out = factors[0].evaluate(x)
      for f in factors[1:]:
        out = out * f.evaluate(x)
      return out
    variables = frozenset().union(*(f.variables for f in factors))
    return Expr(evaluate, variables, (variables,) if variables else ())

  def factor(self) -> Expr:
    kind, value = self.peek()
    if kind == "num":
      self.take()
      c = float(value)
      return Expr(lambda x, c=c: np.full(x.shape[0], c), frozenset(), ())
    if kind == "var":
      self.take()
      i = int(value[1:])
      return Expr(lambda x, i=i: x[:, i].astype(np.float64), frozenset([i]), ())
    if value == "sign":
      self.take()
      self.take("(")
      inner = self.expr()
      self.take(")")
      return Expr(lambda x, e=inner: np.sign(e.evaluate(x)), inner.variables, ())
    if value == "(":
      self.take()
      inner = self.expr()
      self.take(")")
      return inner
    if kind is None:
      self.error("ended too early, expected a number, a variable x<i>, sign(...) or '('")
    self.error(f"unexpected {value!r}, expected a number, a variable x<i>, sign(...) or '('")

  # cond := conj ('|' conj)* ; conj := atom ('&' atom)* ; atom := '(' cond ')' | expr '==' number
  def cond(self):
    parts = [self.conj()]
    while self.peek()[1] in ("|", "or"):
      self.take()
      parts.append(self.conj())
    return (lambda x: np.logical_or.reduce([p(x) for p in parts])), frozenset()

  def conj(self):
    parts = [self.atom()]
    while self.peek()[1] in ("&", "and"):
      self.take()
      parts.append(self.atom())
    return lambda x: np.logical_and.reduce([p(x) for p in parts])

  def atom(self):
    if self.peek()[1] == "(":
      save = self.i
      self.take()
      try:
        inner, _ = self.cond()
        self.take(")")
        if self.peek()[1] != "==":
          return inner
      except TaskSpecError:
        pass
      self.i = save
    lhs = self.expr()
    self.take("==")
    sign = -1.0 if self.peek()[1] == "-" else 1.0
    if self.peek()[1] in ("+", "-"):
      self.take()
    kind, value = self.take()
    if kind != "num":
      self.error(f"expected a number after '==', found {value!r}")
    rhs = sign * float(value)
    self.variables_seen.update(lhs.variables)
    return lambda x, e=lhs, r=rhs: np.isclose(e.evaluate(x), r)


def parse_target(text: str) -> Expr:
  p = _Parser(text, "target")
  if not p.tokens:
    raise TaskSpecError("target is empty")
  e = p.expr()
  p.done()
  if not e.variables:
    raise TaskSpecError(f"target {text!r} has no variables x<i>")
  return e


def parse_condition(text: str) -> tuple[Callable[[np.ndarray], np.ndarray], frozenset[int]]:
  """Returns (predicate over x (N, n) -> bool (N,), the variables it reads)."""
  p = _Parser(text, "seen condition")
  if not p.tokens:
    raise TaskSpecError("seen condition is empty")
  p.variables_seen = set()
  pred, _ = p.cond()
  p.done()
  return pred, frozenset(p.variables_seen)


# ----------------------------------------------------------------------------- tasks
@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  n: int
  target: str
  seen: str

  @functools.cached_property
  def expr(self) -> Expr:
    return parse_target(self.target)

  @functools.cached_property
  def _condition(self):
    return parse_condition(self.seen)

  @property
  def groups(self) -> tuple[tuple[int, ...], ...]:
    """Interaction structure: the variable sets of the target's terms (no coefficients)."""
    seen, out = set(), []
    for g in self.expr.groups:
      if g not in seen:
        seen.add(g)
        out.append(tuple(sorted(g)))
    return tuple(out)

  def f(self, x: np.ndarray) -> np.ndarray:
    return self.expr.evaluate(x)

  def is_seen(self, x: np.ndarray) -> np.ndarray:
    return self._condition[0](x)

  def relevant(self) -> tuple[int, ...]:
    return tuple(sorted(self.expr.variables | self._condition[1]))


def _cyclic(n: int) -> str:
  return " + ".join(f"x{i}x{(i + 1) % n}x{(i + 2) % n}" for i in range(n))


TASKS = {
    "f1_threesym": Task("f1_threesym", 15, "x0x1 - 1.25 x1x2 + 1.5 x0x2", "x0*x1*x2 == 1"),
    "f2_2parity": Task("f2_2parity", 15, "x0x1", "x0 == 1 | x1 == 1"),
    "f3_cyclic": Task("f3_cyclic", 15, _cyclic(15), "x0 == 1 | x1 == 1 | x2 == 1"),
    "f4_majority": Task("f4_majority", 15, "sign(x0 + x1 + x2)", "x0 == 1 | x1 == 1"),
    "frozen_coordinate": Task("frozen_coordinate", 18, "x0x1x2 + x0x3x4x5", "x0 == 1"),
}
ALIASES = {"f1": "f1_threesym", "threesym": "f1_threesym", "f2": "f2_2parity", "2parity": "f2_2parity",
           "f3": "f3_cyclic", "cyclic": "f3_cyclic", "f4": "f4_majority", "majority": "f4_majority",
           "frozen": "frozen_coordinate"}


def get_task(name: str) -> Task:
  key = ALIASES.get(name, name)
  if key not in TASKS:
    from maskprior_jax.bench.config import did_you_mean
    raise TaskSpecError(f"unknown task {name!r}{did_you_mean(name, [*TASKS, *ALIASES], ALIASES)}; choose from "
                        f"{', '.join(TASKS)} "
                        f"(or give --target and --seen)")
  return TASKS[key]


def resized(task: Task, n: int) -> Task:
  """A built-in task at another dimension n: f3's cyclic sum is rebuilt over n variables, every
  other target keeps its formula (the extra or fewer variables are irrelevant ones)."""
  if task.name == "f3_cyclic":
    if n < 3:
      raise TaskSpecError("f3_cyclic needs n >= 3")
    return Task(task.name, n, _cyclic(n), task.seen)
  needed = max(task.expr.variables | task._condition[1]) + 1
  if n < needed:
    raise TaskSpecError(f"{task.name} needs n >= {needed}, not {n}")
  return Task(task.name, n, task.target, task.seen)


MIN_SEEN_POINTS = 8


def custom_task(target: str, seen: str, n: int | None = None, name: str = "custom") -> Task:
  expr = parse_target(target)
  _, cvars = parse_condition(seen)
  needed = max(expr.variables | cvars) + 1
  if n is None:
    n = needed
  if n < needed:
    raise TaskSpecError(f"--n {n} is too small: the spec uses x{needed - 1}")
  task = Task(name, n, target, seen)
  seen_mask = task.is_seen(relevant_points(task)[1])
  if not seen_mask.any():
    raise TaskSpecError(f"seen condition {seen!r} holds nowhere on the cube")
  if seen_mask.all():
    raise TaskSpecError(f"seen condition {seen!r} holds everywhere: there is no unseen domain")
  num_seen = int(seen_mask.sum()) << (n - len(task.relevant()))
  if num_seen < MIN_SEEN_POINTS:
    raise TaskSpecError(f"seen condition {seen!r} holds on only {num_seen} points of the n = {n} cube; "
                        f"training needs at least {MIN_SEEN_POINTS} (raise --n or widen the condition)")
  return task
