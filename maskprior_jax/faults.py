"""Crash points for the fault-injection tests.

With `MASKPRIOR_FAULT=NAME` (or `NAME:K`) in the environment, the first (or K-th) time the process
reaches the point NAME it kills itself with SIGKILL: a crash at a chosen moment, replayed by
tests/test_faults.py. Points: "compile" (before the first compiled call), "step" (after a compiled
call is dispatched), "eval" (after an evaluation), "save" (a checkpoint save started, not yet on
disk), "write" (a run-folder file written under its temporary name, not yet renamed).
`NAME:K:raise` raises `InjectedFault` there instead: an unexpected exception at a chosen moment.
Without the variable every point is a dictionary lookup and nothing else.
"""
from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def point(name: str) -> None:
  spec = os.environ.get("MASKPRIOR_FAULT")
  if not spec:
    return
  target, _, rest = spec.partition(":")
  if target != name:
    return
  count, _, how = rest.partition(":")
  _hits[name] = _hits.get(name, 0) + 1
  if _hits[name] == int(count or 1):
    if how == "raise":
      raise InjectedFault(f"injected fault at {name}:{_hits[name]}")
    os.kill(os.getpid(), signal.SIGKILL)


class InjectedFault(RuntimeError):
  """The exception `MASKPRIOR_FAULT=NAME:K:raise` raises: a stand-in for a bug in any process."""
