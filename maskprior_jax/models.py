"""A small pre-LayerNorm Transformer built on `MaskPriorAttention`.

One module covers the encoder (bidirectional, CLS or mean pooling) and the causal
decoder (per-token LM head). Inputs are token ids (vocab_size set) or continuous
vectors (vocab_size None). Positions can enter at the input (added to the token
embeddings, so they reach the values) or only where queries and keys are formed
("qk"), or not at all.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from maskprior_jax.attention import MaskPriorAttention, MaskSettings, dense_mask_bias


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
  """(length, dim) sinusoidal table of Vaswani et al."""
  pos = np.arange(length)[:, None]
  i = np.arange(dim // 2)[None]
  angle = pos / (10000 ** (2 * i / dim))
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)[:, : dim - dim // 2]
  return table


class Block(nn.Module):
  """Pre-LN block: x + Attn(LN(x)), then x + MLP(LN(x))."""
  num_heads: int
  head_dim: int
  mlp_dim: int
  mask: MaskSettings | None = None
  num_prefix: int = 0
  dtype: Any = None
  attention_implementation: str | None = None

  @nn.compact
  def __call__(self, x, *, qk_pos=None, mask=None, bias=None):
    h = nn.LayerNorm(dtype=self.dtype, name="ln_attn")(x)
    hqk = h if qk_pos is None else h + qk_pos
    mask_kwargs = self.mask.attention_kwargs(self.num_prefix) if self.mask is not None else {}
    attn = MaskPriorAttention(num_heads=self.num_heads, qkv_features=self.num_heads * self.head_dim,
                              dtype=self.dtype, implementation=self.attention_implementation, name="attn",
                              **mask_kwargs)
    x = x + attn(hqk, hqk, h, mask=mask, bias=bias)
    h = nn.LayerNorm(dtype=self.dtype, name="ln_mlp")(x)
    h = nn.Dense(self.mlp_dim, dtype=self.dtype, name="mlp_in")(h)
    h = nn.Dense(x.shape[-1], dtype=self.dtype, name="mlp_out")(nn.gelu(h))
    return x + h


class Transformer(nn.Module):
  """Encoder (causal=False) or decoder (causal=True) Transformer.

  Attributes:
    vocab_size: token vocabulary; None for continuous inputs of shape (batch, len, in_dim).
    dim, depth, num_heads, head_dim, mlp_dim: sizes (head_dim defaults to dim // num_heads).
    max_len: longest input (without CLS), for learned/sinusoidal positions.
    pos_embedding: "learned", "sinusoidal" or "none".
    pos_where: "input" (added to token embeddings) or "qk" (added to queries' and keys'
      inputs in every layer, never to the values).
    pooling: "cls" (a learned token prepended at position 0), "mean", or "none" (per token).
    num_outputs: output width; 1 with head="regression" gives a scalar per example.
    head: "regression", "classification" or "lm" (per-token logits, needs pooling="none").
    mask: the mask prior, as `MaskSettings` (the same for every layer, or one bias shared by
      all layers with `share_layers`), or a sequence with one `MaskSettings` or None per
      layer; None: vanilla.
    attention_implementation: None/"xla", "cudnn" or "auto" (see `attention.attention_implementation`).
    position_ids: one position id per token (CLS included), to share positions between tokens
      (e.g. position coupling for addition); default 0, 1, 2, ...
  Token positions inside the model count the CLS token (if any) as position 0.
  """
  vocab_size: int | None
  dim: int = 64
  depth: int = 2
  num_heads: int = 4
  head_dim: int | None = None
  mlp_dim: int = 256
  max_len: int = 512
  causal: bool = False
  pos_embedding: str = "learned"
  pos_where: str = "input"
  pooling: str = "cls"
  num_outputs: int = 1
  head: str = "regression"
  mask: MaskSettings | Sequence[MaskSettings | None] | None = None
  dtype: Any = None
  attention_implementation: str | None = None
  position_ids: tuple[int, ...] | None = None

  def _layer_masks(self) -> list[MaskSettings | None]:
    if self.mask is None or isinstance(self.mask, MaskSettings):
      return [self.mask] * self.depth
    masks = list(self.mask)
    if len(masks) != self.depth:
      raise ValueError(f"{len(masks)} mask settings for depth {self.depth}")
    if any(m is not None and m.share_layers for m in masks):
      raise ValueError("share_layers=True takes one MaskSettings, not one per layer")
    return masks

  @nn.compact
  def __call__(self, inputs: jax.Array, *, padding_mask: jax.Array | None = None,
               position_ids: jax.Array | None = None) -> jax.Array:
    """inputs: (batch, len) ids or (batch, len, in_dim); padding_mask: (batch, len) bool;
    position_ids: (batch, len) int, one id per token and example (e.g. coupled positions with a
    random offset in training), in place of the static `position_ids` attribute."""
    self._check_choices()
    x, padding_mask = self._embed(inputs, padding_mask)
    prefix = 1 if self.pooling == "cls" else 0
    x, qk_pos = self._add_positions(x, position_ids, prefix)
    mask = self._attention_mask(x.shape[0], x.shape[1], padding_mask)
    head_dim = self.head_dim or self.dim // self.num_heads
    shared_bias = None
    masks = self._layer_masks()
    if isinstance(self.mask, MaskSettings) and self.mask.share_layers:
      # One bias for every layer, held here (kind "full" or "shared") and added to each layer's logits.
      shared_bias = dense_mask_bias(self, self.mask, "shared_bias", self.num_heads, x.shape[1], x.shape[1])
      masks = [None] * self.depth
    for i, layer_mask in enumerate(masks):
      x = Block(num_heads=self.num_heads, head_dim=head_dim, mlp_dim=self.mlp_dim, mask=layer_mask,
                num_prefix=prefix, dtype=self.dtype, attention_implementation=self.attention_implementation,
                name=f"block_{i}")(x, qk_pos=qk_pos, mask=mask, bias=shared_bias)
    x = nn.LayerNorm(dtype=self.dtype, name="ln_final")(x)
    return self._readout(x, padding_mask)

  def _check_choices(self):
    if self.pos_embedding not in ("learned", "sinusoidal", "none"):
      raise ValueError(f"pos_embedding must be learned, sinusoidal or none, not {self.pos_embedding!r}")
    if self.pos_where not in ("input", "qk"):
      raise ValueError(f"pos_where must be input or qk, not {self.pos_where!r}")
    if self.pooling not in ("cls", "mean", "none"):
      raise ValueError(f"pooling must be cls, mean or none, not {self.pooling!r}")

  def _embed(self, inputs, padding_mask):
    """Token (or feature) embeddings, with the CLS token first where the model pools on it."""
    if self.vocab_size is not None:
      x = nn.Embed(self.vocab_size, self.dim, name="embed")(inputs)
    else:
      x = nn.Dense(self.dim, name="embed")(inputs)
    if self.dtype is not None:
      x = x.astype(self.dtype)
    batch, length = x.shape[0], x.shape[1]
    if length > self.max_len:
      raise ValueError(f"input length {length} exceeds max_len={self.max_len}")
    if self.pooling == "cls":
      cls = self.param("cls", nn.initializers.normal(0.02), (1, 1, self.dim))
      x = jnp.concatenate([jnp.broadcast_to(cls, (batch, 1, self.dim)).astype(x.dtype), x], axis=1)
      if padding_mask is not None:
        padding_mask = jnp.concatenate([jnp.ones((batch, 1), bool), padding_mask], axis=1)
    return x, padding_mask

  def _position_ids(self, batch: int, seq: int, prefix: int, position_ids):
    """(1 or batch, seq) position ids: the static attribute's, or the call's, or 0..seq-1."""
    ids = np.arange(seq)
    if self.position_ids is not None:
      ids = np.asarray(self.position_ids)
      if ids.shape != (seq,) or ids.min() < 0 or ids.max() >= self.max_len + prefix:
        raise ValueError(f"position_ids must be {seq} ids in 0..{self.max_len + prefix - 1}, got {ids.tolist()}")
    if position_ids is None:
      return ids[None]
    if prefix or jnp.shape(position_ids) != (batch, seq):
      raise ValueError(f"position_ids must be (batch, len) = {(batch, seq)} ids without a CLS token, "
                       f"got shape {jnp.shape(position_ids)}")
    return jnp.asarray(position_ids)

  def _add_positions(self, x, position_ids, prefix: int):
    """`x` with position embeddings added (pos_where="input"), and those for the queries and keys
    (pos_where="qk"), or None."""
    ids = self._position_ids(x.shape[0], x.shape[1], prefix, position_ids)
    if self.pos_embedding == "learned":
      pos = self.param("pos_embedding", nn.initializers.normal(0.02), (self.max_len + prefix, self.dim))[ids]
    elif self.pos_embedding == "sinusoidal":
      pos = jnp.asarray(sinusoidal_positions(self.max_len + prefix, self.dim))[ids]
    else:
      return x, None
    if self.pos_where == "input":
      return x + pos.astype(x.dtype), None
    return x, pos.astype(x.dtype)

  def _attention_mask(self, batch: int, seq: int, padding_mask):
    mask = None
    if self.causal:
      mask = nn.make_causal_mask(jnp.ones((batch, seq)))
    if padding_mask is not None:
      pad = nn.make_attention_mask(padding_mask, padding_mask)
      mask = pad if mask is None else nn.combine_masks(mask, pad)
    return mask

  def _readout(self, x, padding_mask):
    """The head: on the CLS token, the mean over tokens, or every token (head="lm")."""
    if self.head == "lm":
      if self.pooling != "none":
        raise ValueError("head='lm' needs pooling='none'")
    elif self.pooling == "cls":
      x = x[:, 0]
    elif self.pooling == "mean":
      if padding_mask is None:
        x = x.mean(axis=1)
      else:
        w = padding_mask[..., None].astype(x.dtype)
        x = (x * w).sum(1) / jnp.maximum(w.sum(1), 1)
    out_dtype = jnp.promote_types(jnp.float32, x.dtype)   # float32 outputs, even for a bf16 model
    out = nn.Dense(self.num_outputs, dtype=out_dtype, name="head")(x).astype(out_dtype)
    if self.head == "regression" and self.num_outputs == 1:
      out = out[..., 0]
    return out
