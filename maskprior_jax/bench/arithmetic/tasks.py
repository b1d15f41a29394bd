"""Arithmetic tasks as token sequences for a causal decoder, their data splits and the
interaction prior of each task.

Multi-digit addition ("add"): `a + b = s` with D-digit operands written most significant
digit first and the D+1 answer digits least significant first (`reverse=True`, the order in
which small Transformers learn addition fastest) or in the usual order. Modular addition
("modadd"): `a + b = (a + b) mod p`, one token per residue.

The model reads the sequence without its last token and predicts the next token at every
position; only the answer positions count. Under teacher forcing an example is exactly
right iff greedy decoding gets every answer digit right, so exact match needs no decoding
loop; digit accuracy is measured by greedy decoding (`greedy_answers`).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

TASKS = ("add", "modadd")
COUPLINGS = ("published", "rows")


class DataError(ValueError):
  """Impossible data request (reported as one line)."""


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
  name: str = "add"
  digits: int = 3
  modulus: int = 97
  reverse: bool = True

  def __post_init__(self):
    if self.name not in TASKS:
      raise DataError(f"unknown arithmetic task {self.name!r}; choose add or modadd")
    if self.name == "add" and not 1 <= self.digits <= 9:
      raise DataError(f"--digits must be between 1 and 9, not {self.digits}")
    if self.name == "modadd" and self.modulus < 2:
      raise DataError(f"the modulus must be at least 2, not {self.modulus}")

  @property
  def base(self) -> int:
    """Number of distinct operand values."""
    return 10 ** self.digits if self.name == "add" else self.modulus

  @property
  def plus(self) -> int:
    return 10 if self.name == "add" else self.modulus

  @property
  def equals(self) -> int:
    return self.plus + 1

  @property
  def vocab_size(self) -> int:
    return self.equals + 1

  @property
  def answer_len(self) -> int:
    return self.digits + 1 if self.name == "add" else 1

  @property
  def input_len(self) -> int:
    """Tokens the model reads: the whole sequence but its last token."""
    return (2 * self.digits + 2 + self.answer_len - 1) if self.name == "add" else 4

  @property
  def answer_rows(self) -> np.ndarray:
    """Input positions whose next-token prediction is an answer token (the '=' and after)."""
    eq = 2 * self.digits + 1 if self.name == "add" else 3
    return np.arange(eq, eq + self.answer_len)

  def answer_place(self, k: int) -> int:
    """Place value (power of ten) of answer token k."""
    return k if self.reverse else self.digits - k

  def operand_position(self, operand: int, place: int) -> int:
    """Input position of an operand's digit of the given place (addition)."""
    d = self.digits
    return (d - 1 - place) if operand == 0 else (2 * d - place)

  def encode(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), both (N, input_len) int32; targets[:, answer_rows] are the answer."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if self.name == "modadd":
      seq = np.stack([a, np.full_like(a, self.plus), b, np.full_like(a, self.equals),
                      (a + b) % self.modulus], 1)
    else:
      d = self.digits
      digits = lambda x, n: (x[:, None] // 10 ** np.arange(n)[None]) % 10   # (N, n), place 0 first
      ans = digits(a + b, d + 1)
      if not self.reverse:
        ans = ans[:, ::-1]
      seq = np.concatenate([digits(a, d)[:, ::-1], np.full((len(a), 1), self.plus),
                            digits(b, d)[:, ::-1], np.full((len(a), 1), self.equals), ans], 1)
    return seq[:, :-1].astype(np.int32), seq[:, 1:].astype(np.int32)

  def carries(self, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Addition: how many places of a + b produce a carry, per pair (N,); None for modadd."""
    if self.name != "add":
      return None
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    count, carry = np.zeros(len(a), np.int64), np.zeros(len(a), np.int64)
    for place in range(self.digits):
      carry = ((a // 10 ** place) % 10 + (b // 10 ** place) % 10 + carry) >= 10
      count += carry
      carry = carry.astype(np.int64)
    return count

  def prior_pattern(self, *, inside: float = 0.0, outside: float = -4.0, kind: str = "window",
                    decay: float = 1.0) -> np.ndarray:
    """(input_len, input_len) logit bias from the task's structure (never from operand values).

    Addition, kind "window": the row predicting the answer digit of place i attends (logit
    `inside`) to digit i of both operands, to digit i-1 of both operands (the position that
    carries into place i) and to itself (the previous answer token, in reversed order); other
    keys on that row get `outside`. Kind "carry": the same, and every lower place p < i-1 too,
    at `inside - decay * (i-1-p)` (floored at `outside`), since a carry can come from any lower
    place. Modular addition: the '=' row attends to both operands and itself.
    Rows that predict no answer carry no structure and get 0 everywhere (causal masking is
    applied separately, as a hard mask).
    """
    if kind not in ("window", "carry"):
      raise DataError(f"prior kind must be window or carry, not {kind!r}")
    n = self.input_len
    m = np.zeros((n, n), np.float32)
    for k, row in enumerate(self.answer_rows):
      m[row] = outside
      m[row, row] = inside
      if self.name == "modadd":
        m[row, [0, 2]] = inside
        continue
      place = self.answer_place(k)
      lowest = 0 if kind == "carry" else place - 1
      for p in range(max(lowest, 0), min(place, self.digits - 1) + 1):
        logit = max(inside - decay * max(0, place - 1 - p), outside)
        m[row, [self.operand_position(0, p), self.operand_position(1, p)]] = logit
    return m

  def coupling_ids(self, variant: str = "published", start: int = 1) -> tuple[int, ...]:
    """Position coupling: one position id per input token, shared by tokens of equal significance.

    "published" (Cho et al., 2024, as in their code): with end = start + digits + 1, the operand
    digits of place p and the answer digit of place p (on its own token) get id end - 1 - p, the
    answer's top place (the carry out) gets `start`, and '+' and '=' both get `end` (each
    operand's id range runs one past its last digit). Training draws `start` at random per example
    (`coupling_offsets`); evaluation uses start = 1.
    "rows" (this benchmark's first version): the operand digits of place p and the row that
    predicts the answer digit of place p share id p + 1, '+' gets 0, no offset. Addition only."""
    if self.name != "add":
      raise DataError("position coupling is defined for addition (--task add)")
    if variant not in COUPLINGS:
      raise DataError(f"coupling must be {' or '.join(COUPLINGS)}, not {variant!r}")
    d, ids = self.digits, np.zeros(self.input_len, np.int64)
    if variant == "rows":
      for p in range(d):
        ids[self.operand_position(0, p)] = ids[self.operand_position(1, p)] = p + 1
      for k, row in enumerate(self.answer_rows):
        ids[row] = self.answer_place(k) + 1
      return tuple(int(i) for i in ids)
    end = start + d + 1
    for p in range(d):
      ids[self.operand_position(0, p)] = ids[self.operand_position(1, p)] = end - 1 - p
    ids[d] = ids[2 * d + 1] = end                      # '+' and '='
    for k in range(self.answer_len - 1):               # answer tokens in the input (all but the last)
      ids[2 * d + 2 + k] = end - 1 - self.answer_place(k)
    return tuple(int(i) for i in ids)

  def coupling_offsets(self, max_position: int) -> int:
    """How many starting ids training draws from (start = 1 .. this), so that every id stays
    within 1..max_position (Cho et al.: max_position >= digits + 2)."""
    if max_position < self.digits + 2:
      raise DataError(f"coupling max_position must be at least digits + 2 = {self.digits + 2}, not {max_position}")
    return max_position - self.digits - 1

  def coupled_positions(self, starts: np.ndarray) -> np.ndarray:
    """(N, input_len) published coupling ids for per-example starting ids `starts` (N,)."""
    base = np.asarray(self.coupling_ids("published", start=1), np.int64)
    return (base[None] + (np.asarray(starts, np.int64)[:, None] - 1)).astype(np.int32)


def _unique_in_order(keys: np.ndarray) -> np.ndarray:
  _, first = np.unique(keys, return_index=True)
  return keys[np.sort(first)]


def _draw_keys(total: int, count: int, rng: np.random.Generator, exclude: np.ndarray) -> np.ndarray:
  """`count` distinct keys in [0, total) not in `exclude`, in a random order."""
  if count + len(exclude) > total:
    raise DataError(f"asked for {count} examples besides {len(exclude)} test examples, "
                    f"but the task has only {total} distinct pairs; use smaller --train-sizes or test size")
  if total <= 20_000_000:
    perm = rng.permutation(total)
    return perm[~np.isin(perm, exclude)][:count]
  out = np.zeros(0, np.int64)
  while len(out) < count:
    draw = rng.integers(0, total, 2 * (count - len(out)) + 16)
    out = _unique_in_order(np.concatenate([out, draw]))
    out = out[~np.isin(out, exclude)]
  return out[:count]


@dataclasses.dataclass
class Splits:
  """test_a/test_b: (T,) the shared test set; val_a/val_b: (V,) the validation set (drawn like
  the training pairs, disjoint from the test set and from every training set); train_a/train_b:
  seed -> (max train size,) in order, so the training set of size N for a seed is its first N
  pairs (nested sets)."""
  test_a: np.ndarray
  test_b: np.ndarray
  train_a: dict
  train_b: dict
  val_a: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
  val_b: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))


def make_splits(task: ArithmeticTask, max_train: int, seeds: Sequence[int], *, test_size: int,
                data_seed: int = 0, val_size: int = 0) -> Splits:
  """Deterministic splits: the test set from `data_seed`, the validation set (if `val_size`)
  from (data_seed, 2^20 + 1), each seed's training pairs from (data_seed, seed), never
  overlapping the test or validation set (pairs (a, b) are distinct examples). With val_size 0
  the training pairs are those of the benchmark's first version."""
  total = task.base ** 2
  test = _draw_keys(total, test_size, np.random.default_rng([data_seed, 1 << 20]), np.zeros(0, np.int64))
  val = _draw_keys(total, val_size, np.random.default_rng([data_seed, (1 << 20) + 1]), test) if val_size \
      else np.zeros(0, np.int64)
  held_out = np.concatenate([test, val])
  train_a, train_b = {}, {}
  for s in seeds:
    keys = _draw_keys(total, max_train, np.random.default_rng([data_seed, int(s)]), held_out)
    train_a[s], train_b[s] = keys // task.base, keys % task.base
  return Splits(test // task.base, test % task.base, train_a, train_b, val // task.base, val % task.base)
