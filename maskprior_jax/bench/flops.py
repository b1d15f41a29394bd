"""FLOPs of a traced program, counted from its jaxpr (`count_flops`): what `maskprior compile`
reports for every target alike."""
from __future__ import annotations

import math

import jax

__all__ = ["count_flops"]


def _dot_flops(eqn) -> float:
  (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
  lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
  contract = math.prod(lhs[i] for i in lc)
  batch = math.prod(lhs[i] for i in lb)
  lfree = math.prod(d for i, d in enumerate(lhs) if i not in lc and i not in lb)
  rb = eqn.params["dimension_numbers"][1][1]
  rfree = math.prod(d for i, d in enumerate(rhs) if i not in rc and i not in rb)
  return 2.0 * batch * lfree * rfree * contract


def _attention_flops(eqn, backward: bool) -> float:
  """cuDNN's fused attention: q.k and p.v, 2*B*N*T*S*H each; the backward recomputes q.k and forms
  dp, dv, dq, dk (five products)."""
  q, k = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape   # (B, T, N, H), (B, S, N, H)
  b, t, n, h = q
  s = k[1]
  return (5 if backward else 2) * 2.0 * b * n * t * s * h


def _sub_jaxprs(eqn):
  for v in eqn.params.values():
    for item in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(item, jax.extend.core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jax.extend.core.Jaxpr):
        yield item


def count_flops(jaxpr, primitives: set | None = None) -> float:
  """Floating-point operations of a traced program's matrix products (dot_general, and cuDNN's fused
  attention by its formula), over the whole program: a scan's body counted `length` times, a cond's
  costliest branch, a shard_map's body once per device. Elementwise work is not counted (the
  convention of MFU figures). `primitives`, if given, collects the names of every primitive met."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if primitives is not None:
      primitives.add(name)
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name.startswith("dot_product_attention_fwd"):
      total += _attention_flops(eqn, backward=False)
    elif name.startswith("dot_product_attention_bwd"):
      total += _attention_flops(eqn, backward=True)
    elif name == "scan":
      total += eqn.params["length"] * count_flops(eqn.params["jaxpr"], primitives)
    elif name == "cond":
      total += max(count_flops(b, primitives) for b in eqn.params["branches"])
    elif name == "custom_vmap_call":   # the folded cuDNN call: its jaxpr is the unmapped call
      total += count_flops(eqn.params["call"], primitives)
    elif name == "shard_map":
      total += math.prod(eqn.params["mesh"].shape.values()) * count_flops(eqn.params["jaxpr"], primitives)
    else:
      total += sum(count_flops(j, primitives) for j in _sub_jaxprs(eqn))
  return total
