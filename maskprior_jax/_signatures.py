"""Readable class signatures for `help()` and the API reference.

Flax NNX's metaclass hides `__init__` from `inspect.signature(cls)` (it shows `(*args, **kwargs)`),
and a Linen module's dataclass signature shows initializer defaults as `<function ... at 0x...>`.
`readable(cls)` sets `cls.__signature__` to the constructor's parameters without `self`, with such
defaults shown by name (`lecun_normal()`, `float32`)."""
from __future__ import annotations

import inspect

import numpy as np


class _Shown:
  """A default value shown as `text` (signatures only; never passed to the constructor)."""

  def __init__(self, text: str):
    self.text = text

  def __repr__(self) -> str:
    return self.text


def _shown(value):
  if value is inspect.Parameter.empty or value is None or isinstance(value, (bool, int, float, str, tuple)):
    return value
  if isinstance(value, type) and issubclass(value, np.generic):
    return _Shown(np.dtype(value).name)
  qualname = getattr(value, "__qualname__", "")
  if "<locals>" in qualname:   # an initializer made by a factory, e.g. lecun_normal()
    factory = qualname.split(".<locals>")[0].rsplit(".", 1)[-1]
    return _Shown({"variance_scaling": "lecun_normal()"}.get(factory, f"{factory}()"))
  return _Shown(getattr(value, "__name__", type(value).__name__))


def readable(cls, init=None):
  """Sets `cls.__signature__` from `init` (default `cls.__init__`), without `self`; returns `cls`."""
  sig = inspect.signature(init or cls.__init__)
  params = [p.replace(default=_shown(p.default)) for p in sig.parameters.values()][1:]
  cls.__signature__ = sig.replace(parameters=[p for p in params if p.name != "parent" and p.name != "name"]
                                  + [p for p in params if p.name in ("parent", "name")],
                                  return_annotation=inspect.Signature.empty)
  return cls
