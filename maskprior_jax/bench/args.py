"""Command-line values shared by `maskprior` and the experiment scripts: method lists and seed
lists (a count, a range or a list), and the exploration scripts' refusal of confirmation seeds."""
from __future__ import annotations

from maskprior_jax.bench.config import UsageError, did_you_mean


def parse_list(text: str, allowed, what: str) -> list[str]:
  items = [t.strip() for t in text.split(",") if t.strip()]
  bad = [t for t in items if t not in allowed]
  if bad or not items:
    hint = did_you_mean(bad[0], allowed) if len(bad) == 1 else ""
    raise UsageError(f"unknown {what} {', '.join(bad) or repr(text)}{hint}; choose from {', '.join(allowed)}")
  return items


SEEDS_HELP = ("how many seeds, or which: N is a count (seeds 0..N-1; --seeds 1 is seed 0 alone), A-B a range "
              "(A to B inclusive; --seeds 1-2 is seeds 1 and 2), A,B,C a list (default: %(default)s)")


def parse_seeds(text: str) -> list[int]:
  """--seeds: a count K (seeds 0..K-1), a range "A-B" (A..B inclusive) or a list "A,B,C"."""
  text = text.strip()
  try:
    if "," in text:
      seeds = [int(t) for t in text.split(",") if t.strip()]
    elif "-" in text[1:]:
      lo, hi = (int(t) for t in text.split("-"))
      if hi < lo:
        raise ValueError
      seeds = list(range(lo, hi + 1))
    else:
      seeds = list(range(int(text)))
      if not seeds:
        raise UsageError("--seeds must be at least 1")
  except UsageError:
    raise
  except ValueError:
    raise UsageError(f"--seeds must be a count (5), a range (0-9) or a list (3,5,8), not {text!r}") from None
  if not seeds or min(seeds) < 0:
    raise UsageError(f"--seeds must name non-negative seeds, not {text!r}")
  if len(set(seeds)) != len(seeds):
    raise UsageError(f"--seeds names a seed twice: {text!r}")
  return seeds


def exploration_seeds(text: str, confirmation_seeds) -> list[int]:
  """--seeds of an exploration script: parsed as `parse_seeds`, and refused if any is a
  confirmation seed (those are run once, for the headline)."""
  seeds = parse_seeds(text)
  if set(seeds) & set(confirmation_seeds):
    raise UsageError(f"exploration may not use the confirmation seeds {tuple(confirmation_seeds)}")
  return seeds


def script_seeds(text: str, confirmation_seeds) -> list[int]:
  """`exploration_seeds` for an experiment script's --seeds: a refused value exits with its one line."""
  try:
    return exploration_seeds(text, confirmation_seeds)
  except UsageError as e:
    raise SystemExit(str(e)) from None


def script_tasks(text: str, known) -> list[str]:
  """An experiment script's comma-separated --tasks, each one of `known`: an unknown name exits
  with its one line."""
  tasks = text.split(",")
  unknown = [t for t in tasks if t not in known]
  if unknown:
    raise SystemExit(f"unknown generated task {unknown[0]!r}{did_you_mean(unknown[0], known)}; choose from "
                     f"{', '.join(known)}")
  return tasks
