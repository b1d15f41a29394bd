"""The Flax-named classes are drop-ins for Flax's own: tested against the installed Flax's classes
with the same RNG keys and inputs (parameter trees, outputs with and without dropout, bfloat16 with
`force_fp32_for_softmax` both ways, decode caches, NNX keywords, sharding metadata), by
introspection of Flax's signatures, and in a Flax-style training loop that passes only `params`."""
import chex
import dataclasses
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import maskprior_jax as mp
from maskprior_jax import linen as mpl
from maskprior_jax import nnx as mpx
from maskprior_jax import priors

X = jax.random.normal(jax.random.key(1), (2, 6, 16))


def _tree_paths(tree):
  return [(jax.tree_util.keystr(p), np.shape(v)) for p, v in jax.tree_util.tree_leaves_with_path(tree)]


def _equal(a, b, dtype):
  tol = 0 if dtype == jnp.float32 else 0   # the same code on the same inputs: bit for bit
  np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


class LinenBlock(nn.Module):
  """A block as Flax code writes it: the attention class unnamed (auto-named), dropout on."""
  attention: type
  broadcast: bool = True
  dtype: object = jnp.float32
  fp32_softmax: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.LayerNorm(dtype=self.dtype)(x)
    y = self.attention(num_heads=4, dropout_rate=0.25, broadcast_dropout=self.broadcast, dtype=self.dtype,
                       force_fp32_for_softmax=self.fp32_softmax, decode=self.decode)(
        x, mask=None if self.decode else nn.make_causal_mask(x[..., 0]), deterministic=not train)
    return nn.Dense(3, dtype=self.dtype)(x + y)


@pytest.mark.parametrize("dtype,fp32", [(jnp.float32, False), (jnp.bfloat16, False), (jnp.bfloat16, True)])
@pytest.mark.parametrize("broadcast", [True, False])
def test_linen_same_parameters_outputs_and_dropout_as_flax(dtype, fp32, broadcast):
  ref, ours = (LinenBlock(cls, broadcast, dtype, fp32) for cls in (nn.MultiHeadDotProductAttention,
                                                                    mpl.MultiHeadDotProductAttention))
  x = X.astype(dtype)
  v_ref = ref.init(jax.random.key(0), x)
  v_ours = ours.init(jax.random.key(0), x)
  assert _tree_paths(v_ref) == _tree_paths(v_ours)                  # same auto-names, paths and shapes
  assert "MultiHeadDotProductAttention_0" in v_ref["params"]
  chex.assert_trees_all_equal(v_ref, v_ours)                         # same initial values
  _equal(ref.apply(v_ref, x), ours.apply(v_ref, x), dtype)           # Flax's checkpoint loads as is
  rngs = {"dropout": jax.random.key(7)}
  train_ref, train_ours = ref.apply(v_ref, x, True, rngs=rngs), ours.apply(v_ref, x, True, rngs=rngs)
  _equal(train_ref, train_ours, dtype)                               # the same dropout masks
  assert not np.allclose(np.asarray(train_ref, np.float32), np.asarray(ref.apply(v_ref, x), np.float32))


def test_linen_self_attention_and_sow_weights_as_flax():
  class Self(nn.Module):
    attention: type

    @nn.compact
    def __call__(self, x):
      return self.attention(num_heads=4)(x, sow_weights=True)
  ref, ours = Self(nn.SelfAttention), Self(mpl.SelfAttention)
  v = ref.init(jax.random.key(0), X)
  assert _tree_paths(v) == _tree_paths(ours.init(jax.random.key(0), X)) and "SelfAttention_0" in v["params"]
  y_ref, s_ref = ref.apply(v, X, mutable=["intermediates"])
  y_ours, s_ours = ours.apply(v, X, mutable=["intermediates"])
  np.testing.assert_array_equal(y_ref, y_ours)
  assert _tree_paths(s_ref) == _tree_paths(s_ours)


def test_linen_decode_cache_and_token_by_token_as_flax():
  ref, ours = (LinenBlock(cls, decode=True) for cls in (nn.MultiHeadDotProductAttention, mpl.MultiHeadDotProductAttention))
  v = ref.init(jax.random.key(0), X)
  assert _tree_paths(v) == _tree_paths(ours.init(jax.random.key(0), X))
  assert "cached_key" in v["cache"]["MultiHeadDotProductAttention_0"]
  cache_ref, cache_ours = v["cache"], v["cache"]
  for t in range(X.shape[1]):
    y_ref, m_ref = ref.apply({"params": v["params"], "cache": cache_ref}, X[:, t:t + 1], mutable=["cache"])
    y_ours, m_ours = ours.apply({"params": v["params"], "cache": cache_ours}, X[:, t:t + 1], mutable=["cache"])
    np.testing.assert_array_equal(y_ref, y_ours)
    cache_ref, cache_ours = m_ref["cache"], m_ours["cache"]
  chex.assert_trees_all_equal(cache_ref, cache_ours)


def test_linen_prior_decodes_token_by_token_as_the_causal_pass():
  prior = lambda k, s, d: jax.random.normal(k, s, d)
  full = mpl.MultiHeadDotProductAttention(num_heads=4, mask_init=prior)
  step = mpl.MultiHeadDotProductAttention(num_heads=4, mask_init=prior, decode=True)
  v = full.init(jax.random.key(0), X)
  expected = full.apply(v, X, mask=nn.make_causal_mask(X[..., 0]))
  cache = step.init(jax.random.key(0), X)["cache"]
  outs = []
  for t in range(X.shape[1]):
    y, mut = step.apply({**v, "cache": cache}, X[:, t:t + 1], mutable=["cache"])
    outs.append(y)
    cache = mut["cache"]
  np.testing.assert_allclose(jnp.concatenate(outs, 1), expected, rtol=1e-5, atol=1e-5)


def _nnx_pair(**kw):
  ref = nnx.MultiHeadAttention(4, 16, dropout_rate=0.25, decode=False, rngs=nnx.Rngs(0, dropout=3), **kw)
  ours = mpx.MultiHeadAttention(4, 16, dropout_rate=0.25, decode=False, rngs=nnx.Rngs(0, dropout=3), **kw)
  return ref, ours


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("broadcast", [True, False])
def test_nnx_same_state_outputs_rng_streams_and_keywords_as_flax(dtype, broadcast):
  ref, ours = _nnx_pair(broadcast_dropout=broadcast, dtype=dtype)
  s_ref, s_ours = nnx.state(ref), nnx.state(ours)
  assert _tree_paths(s_ref) == _tree_paths(s_ours)                  # weights and the dropout stream's state
  bits = lambda a: jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a
  chex.assert_trees_all_equal(jax.tree.map(bits, s_ref), jax.tree.map(bits, s_ours))
  x = X.astype(dtype)
  _equal(ref(x, deterministic=True), ours(x, deterministic=True), dtype)
  _equal(ref(x, deterministic=False), ours(x, deterministic=False), dtype)          # the stored stream
  _equal(ref(x, deterministic=False, rngs=nnx.Rngs(dropout=5).dropout),             # an RngStream
         ours(x, deterministic=False, rngs=nnx.Rngs(dropout=5).dropout), dtype)
  _equal(ref(x, deterministic=False, rngs=nnx.Rngs(dropout=5)),                     # an Rngs
         ours(x, deterministic=False, rngs=nnx.Rngs(dropout=5)), dtype)
  _equal(ref(x, deterministic=True, is_causal=True), ours(x, deterministic=True, is_causal=True), dtype)


def test_nnx_decode_cache_as_flax():
  ref = nnx.MultiHeadAttention(4, 16, decode=True, rngs=nnx.Rngs(0))
  ours = mpx.MultiHeadAttention(4, 16, decode=True, rngs=nnx.Rngs(0))
  ref.init_cache(X.shape)
  ours.init_cache(X.shape)
  for t in range(X.shape[1]):
    np.testing.assert_array_equal(ref(X[:, t:t + 1]), ours(X[:, t:t + 1]))
  c_ref, c_ours = nnx.state(ref, nnx.Cache), nnx.state(ours, nnx.Cache)
  assert _tree_paths(c_ref) == _tree_paths(c_ours)
  chex.assert_trees_all_equal(c_ref, c_ours)


def test_nnx_prior_trains_and_decodes_as_the_causal_pass():
  m = mpx.MultiHeadAttention(4, 16, mask_init=lambda k, s, d: jax.random.normal(k, s, d), max_len=6, decode=False,
                             rngs=nnx.Rngs(0))
  assert isinstance(m.mask_prior, mpx.MaskPrior)
  grads = nnx.grad(lambda m: jnp.sum(m(X) ** 2))(m)
  assert float(jnp.abs(grads.mask_prior[...]).sum()) > 0
  expected = m(X, is_causal=True)
  m.init_cache(X.shape)
  out = jnp.concatenate([m(X[:, t:t + 1], decode=True) for t in range(X.shape[1])], 1)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_nnx_kernel_metadata_shards_the_weights_as_flax():
  """As Flax's GPT tutorial annotates its attention: `kernel_metadata` under a 2-device mesh."""
  if len(jax.devices()) < 2:
    pytest.skip("needs 2 devices (XLA_FLAGS=--xla_force_host_platform_device_count=2 or more)")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("model",))
  spec = (None, "model", None)
  meta = {"sharding_names": spec}
  context = jax.set_mesh(mesh) if hasattr(jax, "set_mesh") else mesh
  with context:
    ref = nnx.MultiHeadAttention(4, 16, decode=False, kernel_metadata=meta, rngs=nnx.Rngs(0))
    ours = mpx.MultiHeadAttention(4, 16, decode=False, kernel_metadata=meta, rngs=nnx.Rngs(0),
                                  mask_init=priors.interaction_groups([[0, 1]]), max_len=6)
    for name in ("query", "key", "value"):
      a, b = getattr(ref, name).kernel, getattr(ours, name).kernel
      assert b.get_metadata() == a.get_metadata() and spec in b.get_metadata().values()   # the annotation, as Flax stores it
      assert b[...].sharding == a[...].sharding and b[...].sharding.spec == jax.sharding.PartitionSpec(*spec)
      np.testing.assert_array_equal(a[...], b[...])
    y = ours(X, deterministic=True)
  assert y.shape == X.shape


def _defaults(params):
  return {p.name: p.default for p in params if p.name != "self"}


def test_every_flax_argument_is_accepted_with_flaxs_default():
  """A new Flax release that adds an argument fails here, not in a user's code."""
  for ours, flax_cls in ((mpl.MultiHeadDotProductAttention, nn.MultiHeadDotProductAttention),
                         (mpl.SelfAttention, nn.SelfAttention)):
    fields = {f.name: f.default for f in dataclasses.fields(ours)}
    for f in dataclasses.fields(flax_cls):
      assert f.name in fields and fields[f.name] is f.default, f.name
    flax_call = _defaults(inspect.signature(flax_cls.__call__).parameters.values())
    assert _defaults(inspect.signature(ours.__call__).parameters.values()) == flax_call
  ours_init = _defaults(inspect.signature(mpx.MultiHeadAttention.__init__).parameters.values())
  for name, default in _defaults(inspect.signature(nnx.MultiHeadAttention.__init__).parameters.values()).items():
    assert name in ours_init and ours_init[name] is default, name
  assert _defaults(inspect.signature(mpx.MultiHeadAttention.__call__).parameters.values()) == _defaults(
      inspect.signature(nnx.MultiHeadAttention.__call__).parameters.values())
  m = mpx.MultiHeadAttention(4, 16, decode=False, rngs=nnx.Rngs(0))
  for name in inspect.signature(nnx.MultiHeadAttention.__call__).parameters:
    if name not in ("self", "inputs_q", "inputs_k", "inputs_v"):
      assert name in inspect.signature(type(m).__mro__[1].__call__).parameters


# A complete Flax-style training loop, written once for a model and an optimizer, that passes only
# `params` (as Flax's examples do); it must not change for the prior to train.
def make_train_step(model, tx):
  @jax.jit
  def train_step(params, opt_state, batch):
    def loss_fn(params):
      pred = model.apply({"params": params}, batch["x"])
      return jnp.mean((pred - batch["y"]) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return train_step


class Regressor(nn.Module):
  @nn.compact
  def __call__(self, x):
    prior = priors.interaction_groups([[0, 1, 2], [3, 4]], outside=-4.0)
    x = x + mpl.MultiHeadDotProductAttention(num_heads=4, mask_init=prior, mask_collection="params")(x)
    return nn.Dense(1)(x.mean(1))


def _one_step(tx):
  model = Regressor()
  params = model.init(jax.random.key(0), X)["params"]
  assert set(model.init(jax.random.key(0), X)) == {"params"}        # the prior lives in params
  step = make_train_step(model, tx)
  new, _, _ = step(params, tx.init(params), {"x": X, "y": jnp.ones((2, 1))})
  path = ("MultiHeadDotProductAttention_0", "mask_prior")
  before, after = params[path[0]][path[1]], new[path[0]][path[1]]
  others = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new))]
  return np.asarray(before), np.asarray(after), others


def test_a_params_only_training_loop_trains_the_prior_at_its_own_rate_or_frozen():
  b0, b1, others1 = _one_step(mp.mask_prior_optimizer(1e-3, name="adam"))
  _, b10, others10 = _one_step(mp.mask_prior_optimizer(1e-3, name="adam", mask_lr_multiplier=10.0))
  one, ten = np.abs(b1 - b0).max(), np.abs(b10 - b0).max()
  assert one > 0 and ten / one == pytest.approx(10.0, rel=0.01)      # Adam's first step: lr x sign
  bf, bf1, others_f = _one_step(mp.mask_prior_optimizer(1e-3, name="adam", freeze_mask=True))
  assert bf.tobytes() == bf1.tobytes()                                # frozen: bit for bit
  assert max(others_f) > 0                                            # the other weights still train
