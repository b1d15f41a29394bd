"""The native Flax NNX module and optimizer helper, used the way an NNX user would: the module
equals the Linen one given the same weights, and a model written here (not in the library) trains
with `nnx.mask_prior_optimizer`: the mask's own learning rate, freezing, and other variable types
left alone."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import maskprior_jax as mp
from maskprior_jax import nnx as mnnx
from maskprior_jax import priors


@pytest.mark.parametrize("kind,kw,length", [
    ("full", {}, 6), ("shared", {}, 6), ("relative_1d", {"max_len": 8}, 6),
    ("relative_2d", {"grid": (2, 3), "num_prefix": 1}, 7)])
def test_nnx_module_computes_what_the_linen_module_computes(kind, kw, length):
  init = (priors.locality_1d() if kind == "relative_1d" else priors.locality_2d(kw["grid"], num_prefix=1)
          if kind == "relative_2d" else lambda key, shape, dtype: jax.random.normal(key, shape, dtype))
  x = jax.random.normal(jax.random.key(1), (2, length, 16))
  linen = mp.MaskPriorAttention(num_heads=4, qkv_features=32, out_features=8, mask_init=init, mask_kind=kind, **kw)
  v = linen.init(jax.random.key(0), x)
  max_len = kw.get("max_len", length)
  mod = mnnx.MaskPriorAttention(4, 16, 32, 8, mask_init=init, mask_kind=kind, **{**kw, "max_len": max_len},
                                rngs=nnx.Rngs(3))
  for name in ("query", "key", "value", "out"):
    for p in ("kernel", "bias"):
      getattr(getattr(mod, name), p)[...] = v["params"][name][p]
  mod.mask_prior[...] = v[mp.MASK_PRIOR]["bias"]
  causal = jnp.tril(jnp.ones((length, length), bool))
  for mask in (None, causal):
    np.testing.assert_allclose(mod(x, mask=mask), linen.apply(v, x, mask=mask), rtol=1e-6, atol=1e-6)


def test_a_full_prior_serves_shorter_sequences_by_its_top_left_block():
  prior = np.random.default_rng(0).normal(size=(2, 8, 8)).astype(np.float32)
  mod = mnnx.MaskPriorAttention(2, 8, mask_init=prior, rngs=nnx.Rngs(0))
  assert mod.mask_prior[...].shape == (2, 8, 8)           # an array prior gives its own length
  np.testing.assert_array_equal(mod.dense_bias(5, 5), prior[:, :5, :5])
  with pytest.raises(ValueError, match="needs max_len"):
    mnnx.MaskPriorAttention(2, 8, mask_init=priors.locality_1d(), mask_kind="full", rngs=nnx.Rngs(0))


class Classifier(nnx.Module):
  """What a user writes: embeddings, one biased attention layer, batch norm, a linear head."""

  def __init__(self, prior, rngs):
    self.embed = nnx.Embed(2, 16, rngs=rngs)
    self.attn = mnnx.MaskPriorAttention(4, 16, mask_init=prior, max_len=6, rngs=rngs)
    self.norm = nnx.BatchNorm(16, rngs=rngs)
    self.head = nnx.Linear(16, 1, rngs=rngs)

  def __call__(self, ids):
    h = self.attn(self.embed(ids))
    return self.head(self.norm(h.mean(1), use_running_average=False))[:, 0]


def _step(lr_multiplier=1.0, freeze=False):
  prior = priors.from_matrix(priors.group_matrix([[0, 1], [2, 3, 4]], 6, num_heads=4))
  model = Classifier(prior, nnx.Rngs(0))
  initial = jax.tree.map(np.asarray, nnx.state(model, mnnx.MaskPrior))
  opt = mnnx.mask_prior_optimizer(model, 1e-3, name="adam", mask_lr_multiplier=lr_multiplier, freeze_mask=freeze)
  ids = jax.random.bernoulli(jax.random.key(1), 0.5, (8, 6)).astype(jnp.int32)
  y = ids[:, 0] * ids[:, 1] - 0.5

  def loss_fn(model):
    return jnp.mean((model(ids) - y) ** 2)
  # (under nnx.jit, as a training step is written: one XLA program each, not a compile per operation)
  grads = nnx.jit(lambda m: nnx.grad(loss_fn, argnums=nnx.DiffState(0, mnnx.WRT))(m))(model)
  before = {k: jax.tree.map(np.asarray, nnx.state(model, t)) for k, t in
            (("mask", mnnx.MaskPrior), ("params", nnx.All(nnx.Param, nnx.Not(mnnx.MaskPrior))), ("stats", nnx.BatchStat))}
  nnx.jit(lambda o, m, g: o.update(m, g))(opt, model, grads)
  after = {k: jax.tree.map(np.asarray, nnx.state(model, t)) for k, t in
           (("mask", mnnx.MaskPrior), ("params", nnx.All(nnx.Param, nnx.Not(mnnx.MaskPrior))), ("stats", nnx.BatchStat))}
  return prior, initial, before, after


def _moved(a, b):
  return max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_an_nnx_model_trains_the_mask_at_its_own_rate_and_freezing_keeps_it_bit_for_bit():
  prior, initial, before, after = _step(1.0)
  expected = np.asarray(prior(jax.random.key(0), (4, 6, 6), jnp.float32))
  np.testing.assert_array_equal(jax.tree.leaves(initial)[0], expected)     # the initial prior, before training
  one = _moved(before["mask"], after["mask"])
  _, _, before10, after10 = _step(10.0)
  ten = _moved(before10["mask"], after10["mask"])
  assert one > 0 and ten / one == pytest.approx(10.0, rel=1e-3)             # Adam's first step: lr x sign
  assert _moved(before["params"], after["params"]) == pytest.approx(_moved(before10["params"], after10["params"]))
  _, _, bf, af = _step(1.0, freeze=True)
  for a, b in zip(jax.tree.leaves(bf["mask"]), jax.tree.leaves(af["mask"])):
    assert a.tobytes() == b.tobytes()                                       # frozen: bit for bit
  assert _moved(bf["params"], af["params"]) > 0
  for run_before, run_after in ((before, after), (bf, af)):                 # BatchStat: the model's, not the optimizer's
    for a, b in zip(jax.tree.leaves(run_before["stats"]), jax.tree.leaves(run_after["stats"])):
      assert a.tobytes() == b.tobytes()


def test_flax_defaults_train_the_prior_it_is_a_param():
  """A user who trains with Flax's documented defaults (plain nnx.grad, nnx.Optimizer(wrt=nnx.Param))
  moves the prior at the base rate; the helper's own rate and freezing are tested above."""
  prior = priors.from_matrix(priors.group_matrix([[0, 1]], 6, num_heads=4))
  model = Classifier(prior, nnx.Rngs(0))
  ids = jax.random.bernoulli(jax.random.key(1), 0.5, (8, 6)).astype(jnp.int32)
  loss_fn = lambda m: jnp.mean((m(ids) - ids[:, 0]) ** 2)
  grads = nnx.grad(loss_fn)(model)
  assert jax.tree.leaves(nnx.state(grads, mnnx.MaskPrior))
  assert isinstance(model.attn.mask_prior, nnx.Param)
  before = jax.tree.map(np.array, nnx.state(model, mnnx.MaskPrior))
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  optimizer.update(model, grads)
  after = nnx.state(model, mnnx.MaskPrior)
  assert _moved(before, after) == pytest.approx(1e-2, rel=1e-3)           # Adam's first step: lr x sign
  others = nnx.state(model, nnx.All(nnx.Param, nnx.Not(mnnx.MaskPrior)))
  assert all(leaf.shape != (4, 6, 6) for leaf in jax.tree.leaves(others))


def test_attention_dropout_draws_from_the_modules_rngs_and_deterministic_turns_it_off():
  m = mnnx.MaskPriorAttention(2, 8, dropout_rate=0.5, mask_init=priors.locality_1d(), mask_kind="relative_1d",
                              max_len=5, rngs=nnx.Rngs(0, dropout=1))
  x = jax.random.normal(jax.random.key(0), (1, 5, 8))
  a, b = m(x, deterministic=False), m(x, deterministic=False)
  assert np.any(np.asarray(a) != np.asarray(b))                  # a new dropout mask each call
  np.testing.assert_array_equal(m(x, deterministic=True), m(x, deterministic=True))
  with pytest.raises(ValueError, match="needs deterministic"):
    m(x)


@pytest.mark.parametrize("kind,kw", [("full", {"max_len": 6}), ("relative_1d", {"max_len": 9})])
def test_nnx_decoding_token_by_token_equals_the_full_causal_pass(kind, kw):
  length = 6
  x = jax.random.normal(jax.random.key(1), (2, length, 16))
  mod = mnnx.MaskPriorAttention(4, 16, mask_init=lambda k, s, d: jax.random.normal(k, s, d), mask_kind=kind,
                                num_kv_heads=2, normalize_qk=True, rngs=nnx.Rngs(0), **kw)
  expected = mod(x, mask=jnp.tril(jnp.ones((length, length), bool)))
  with pytest.raises(ValueError, match="init_cache"):
    mod(x[:, :1], decode=True)
  mod.init_cache(x.shape)
  step = nnx.jit(lambda m, tok: m(tok, decode=True))
  out = jnp.concatenate([step(mod, x[:, t:t + 1]) for t in range(length)], 1)
  assert int(mod.cache_index[...]) == length
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
