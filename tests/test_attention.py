import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import maskprior_jax as mp
from maskprior_jax import priors


def _x(shape=(2, 6, 16), seed=0):
  return jax.random.normal(jax.random.key(seed), shape)


def test_zero_bias_equals_flax_attention():
  x = _x()
  ref = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=16)
  variables = ref.init(jax.random.key(1), x)
  ours = mp.MaskPriorAttention(num_heads=4, qkv_features=16, mask_init=nn.initializers.zeros)
  ours_vars = ours.init(jax.random.key(2), x)
  assert "params" in ours_vars and mp.MASK_PRIOR in ours_vars
  assert mp.MASK_PRIOR not in variables
  out = ours.apply({"params": variables["params"], mp.MASK_PRIOR: ours_vars[mp.MASK_PRIOR]}, x)
  np.testing.assert_allclose(out, ref.apply(variables, x), atol=1e-5)
  # With a causal mask too, and through the explicit (weights-sowing) path.
  causal = nn.make_causal_mask(jnp.ones(x.shape[:2]))
  out_w, _ = ours.apply({"params": variables["params"], mp.MASK_PRIOR: ours_vars[mp.MASK_PRIOR]}, x,
                        mask=causal, mutable=["intermediates"])
  np.testing.assert_allclose(out_w, ref.apply(variables, x, mask=causal), atol=1e-5)


def test_no_mask_init_means_no_collection():
  v = mp.MaskPriorAttention(num_heads=2).init(jax.random.key(0), _x())
  assert set(v) == {"params"}


def test_bias_changes_output_and_is_not_a_param():
  x = _x()
  m = mp.MaskPriorAttention(num_heads=4, mask_init=priors.interaction_groups([[0, 1], [2, 3, 4]]))
  v = m.init(jax.random.key(0), x)
  assert v[mp.MASK_PRIOR]["bias"].shape == (4, 6, 6)
  assert set(v["params"]) == {"query", "key", "value", "out"}          # the bias is no parameter
  assert all(k[-1] != "bias" or k[0] in ("query", "key", "value", "out")
             for k in flax.traverse_util.flatten_dict(v["params"]))
  zero = {"params": v["params"], mp.MASK_PRIOR: {"bias": jnp.zeros((4, 6, 6))}}
  assert not np.allclose(m.apply(v, x), m.apply(zero, x))


def test_gradients_reach_the_mask():
  x = _x()
  m = mp.MaskPriorAttention(num_heads=4, mask_init=priors.interaction_groups([[0, 1], [2, 3, 4]]))
  v = m.init(jax.random.key(0), x)
  g = jax.grad(lambda v: jnp.sum(m.apply(v, x) ** 2))(v)
  assert float(jnp.abs(g[mp.MASK_PRIOR]["bias"]).max()) > 0


def test_hard_mask_holds_whatever_the_bias_and_no_nan():
  x = _x()
  huge = priors.from_matrix(np.full((6, 6), 50.0))  # strongly favours everything
  m = mp.MaskPriorAttention(num_heads=2, mask_init=huge)
  v = m.init(jax.random.key(0), x)
  mask = np.ones((2, 1, 6, 6), bool)
  mask[:, :, :, 3] = False       # key 3 excluded everywhere
  mask[0, :, 2, :] = False       # query row 2 of example 0 fully masked
  _, inter = m.apply(v, x, mask=jnp.asarray(mask), mutable=["intermediates"])
  w = inter["intermediates"][mp.ATTENTION_WEIGHTS][0]
  assert float(jnp.abs(w[1, :, :, 3]).max()) == 0.0
  assert float(jnp.abs(w[0, :, [0, 1, 3, 4, 5], 3]).max()) == 0.0
  out_fused = m.apply(v, x, mask=jnp.asarray(mask))
  assert bool(jnp.all(jnp.isfinite(out_fused))) and bool(jnp.all(jnp.isfinite(w)))
  # changing the value of the masked key does not change any unmasked row
  x2 = x.at[:, 3].add(10.0)
  a = m.apply(v, x, mask=jnp.asarray(mask))
  b = m.apply(v, x2, mask=jnp.asarray(mask))
  rows = [0, 1, 2, 4, 5]  # row 3 is the changed token itself
  np.testing.assert_allclose(a[1, rows], b[1, rows], atol=1e-5)


def test_weights_are_sowed_and_match_the_prior_when_content_is_zero():
  x = _x()
  groups = [[0, 1], [2, 3, 4]]
  m = mp.MaskPriorAttention(num_heads=2, mask_init=priors.interaction_groups(groups, outside=-30.0),
                            kernel_init=nn.initializers.zeros)
  v = m.init(jax.random.key(0), x)
  _, inter = m.apply(v, x, mutable=["intermediates"])
  w = np.asarray(inter["intermediates"][mp.ATTENTION_WEIGHTS][0])
  np.testing.assert_allclose(w[0, 0, 0], [0.5, 0.5, 0, 0, 0, 0], atol=1e-6)
  np.testing.assert_allclose(w[0, 1, 3], [0, 0, 1 / 3, 1 / 3, 1 / 3, 0], atol=1e-6)


@pytest.mark.parametrize("kind,extra,stored", [
    ("shared", {}, (6, 6)),
    ("relative_1d", {"max_len": 10}, (2, 19)),
])
def test_parameterizations(kind, extra, stored):
  x = _x()
  init = priors.locality_1d() if kind == "relative_1d" else priors.from_matrix(np.eye(6))
  m = mp.MaskPriorAttention(num_heads=2, mask_init=init, mask_kind=kind, **extra)
  v = m.init(jax.random.key(0), x)
  assert v[mp.MASK_PRIOR]["bias"].shape == stored
  assert m.apply(v, x).shape == x.shape


def test_relative_1d_serves_shorter_lengths_and_equals_dense_locality():
  m_rel = mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_1d(), mask_kind="relative_1d",
                                max_len=10)
  m_full = mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_1d())
  for length in (4, 10):
    x = _x((1, length, 16))
    v = m_rel.init(jax.random.key(0), _x((1, 10, 16)))
    vf = m_full.init(jax.random.key(0), x)
    vf = {"params": v["params"], mp.MASK_PRIOR: vf[mp.MASK_PRIOR]}
    np.testing.assert_allclose(m_rel.apply(v, x), m_full.apply(vf, x), atol=1e-5)


def test_relative_2d_with_cls_prefix_matches_dense_prior():
  grid = (3, 4)
  x = _x((2, 13, 16))
  init = priors.locality_2d(grid)
  rel = mp.MaskPriorAttention(num_heads=2, mask_init=init, mask_kind="relative_2d", grid=grid, num_prefix=1)
  full = mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_2d(grid, num_prefix=1))
  v = rel.init(jax.random.key(0), x)
  vf = {"params": v["params"], mp.MASK_PRIOR: full.init(jax.random.key(0), x)[mp.MASK_PRIOR]}
  assert v[mp.MASK_PRIOR]["bias"].shape == (2, 35)
  np.testing.assert_allclose(rel.apply(v, x), full.apply(vf, x), atol=1e-5)


def test_cross_attention_and_bf16():
  q, kv = _x((2, 3, 16)), _x((2, 7, 16), 1)
  m = mp.MaskPriorAttention(num_heads=4, mask_init=priors.from_matrix(np.zeros((3, 7))),
                            dtype=jnp.bfloat16)
  v = m.init(jax.random.key(0), q, kv)
  assert v[mp.MASK_PRIOR]["bias"].shape == (4, 3, 7)
  assert v[mp.MASK_PRIOR]["bias"].dtype == jnp.float32
  out = m.apply(v, q, kv)
  assert out.shape == (2, 3, 16) and out.dtype == jnp.bfloat16


def test_wrong_prior_shape_is_a_clear_error():
  m = mp.MaskPriorAttention(num_heads=2, mask_init=priors.from_matrix(np.zeros((5, 5))))
  with pytest.raises(ValueError, match="does not broadcast"):
    m.init(jax.random.key(0), _x())
  m = mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_1d(slopes=[1.0, 2.0, 3.0]))
  with pytest.raises(ValueError, match="3 slopes for 2 heads"):
    m.init(jax.random.key(0), _x())
  with pytest.raises(ValueError, match="outside"):
    priors.group_matrix([[0, 9]], 6)


def test_nnx_bridge_sees_mask_as_its_own_variable_type():
  from flax import nnx
  from maskprior_jax.nnx import MaskPrior
  x = _x()
  linen = mp.MaskPriorAttention(num_heads=2, mask_init=priors.interaction_groups([[0, 1]]))
  model = nnx.bridge.ToNNX(linen, rngs=nnx.Rngs(0))
  nnx.bridge.lazy_init(model, x)
  masks = nnx.state(model, MaskPrior)
  params = nnx.state(model, nnx.All(nnx.Param, nnx.Not(MaskPrior)))
  assert len(jax.tree.leaves(masks)) == 1
  assert jax.tree.leaves(masks)[0].shape == (2, 6, 6)
  assert all(leaf.shape != (2, 6, 6) for leaf in jax.tree.leaves(params))
  assert model(x).shape == x.shape


def test_drop_in_call_keywords_match_flax():
  """inputs_kv, deterministic and attention dropout behave as in Flax's module, with the same weights."""
  q, kv = _x((2, 3, 16)), _x((2, 7, 16), 1)
  ref = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=16, dropout_rate=0.5, broadcast_dropout=False)
  ours = mp.MaskPriorAttention(num_heads=4, qkv_features=16, dropout_rate=0.5, broadcast_dropout=False)
  v = ref.init(jax.random.key(0), q, inputs_kv=kv, deterministic=True)
  assert jax.tree.structure(v) == jax.tree.structure(ours.init(jax.random.key(0), q, inputs_kv=kv,
                                                               deterministic=True))
  np.testing.assert_allclose(ours.apply(v, q, inputs_kv=kv, deterministic=True),
                             ref.apply(v, q, inputs_kv=kv, deterministic=True), atol=1e-5)
  np.testing.assert_allclose(ours.apply(v, q, inputs_kv=kv, deterministic=True), ours.apply(v, q, kv, deterministic=True))
  a = ours.apply(v, q, inputs_kv=kv, deterministic=False, rngs={"dropout": jax.random.key(3)})
  b = ours.apply(v, q, inputs_kv=kv, deterministic=False, rngs={"dropout": jax.random.key(4)})
  assert not np.allclose(a, b)                                         # dropout is on and keyed
  with pytest.raises(Exception, match="deterministic"):                 # Flax's rule: say which mode
    ours.apply(v, q, inputs_kv=kv)
  with pytest.raises(ValueError, match="not both"):
    ours.apply(v, q, kv, inputs_kv=kv, deterministic=True)


def test_mask_init_accepts_an_array_and_refuses_a_prior_of_another_kind():
  x = _x()
  eye = np.eye(6, dtype=np.float32)
  v = mp.MaskPriorAttention(num_heads=2, mask_init=eye).init(jax.random.key(0), x)
  np.testing.assert_array_equal(v[mp.MASK_PRIOR]["bias"], np.broadcast_to(eye, (2, 6, 6)))
  with pytest.raises(ValueError, match="does not broadcast"):
    mp.MaskPriorAttention(num_heads=2, mask_init=np.zeros((5, 5))).init(jax.random.key(0), x)
  grid = (2, 3)
  wrong = mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_1d(), mask_kind="relative_2d", grid=grid)
  with pytest.raises(ValueError, match="built for mask_kind full or relative_1d, not 'relative_2d'"):
    wrong.init(jax.random.key(0), _x((1, 6, 16)))
  with pytest.raises(ValueError, match="not 'relative_1d'"):
    mp.MaskPriorAttention(num_heads=2, mask_init=priors.locality_2d(grid), mask_kind="relative_1d",
                          max_len=6).init(jax.random.key(0), _x((1, 6, 16)))


def test_batch_stats_are_changed_by_the_model_never_by_the_optimizer():
  """A BatchNorm + MaskPriorAttention model: the optimizer leaves batch_stats alone (no update, no
  weight decay, no state); the training step takes them from the model's own update."""
  from maskprior_jax import train

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train_mode: bool):
      x = nn.BatchNorm(use_running_average=not train_mode, momentum=0.5)(x)
      x = mp.MaskPriorAttention(num_heads=2, mask_init=priors.interaction_groups([[0, 1], [2, 3]]))(x)
      return x.mean((-1, -2))

  net = Net()
  x = _x((8, 6, 16))
  y = jnp.arange(8.0)
  variables = jax.jit(net.init, static_argnames="train_mode")(jax.random.key(0), x, train_mode=False)
  assert set(variables) == {"params", mp.MASK_PRIOR, "batch_stats"}
  tx = mp.mask_prior_optimizer(0.1, name="adamw", weight_decay=0.5)
  # The helper: zero update on batch_stats even with a non-zero gradient and weight decay.
  # (jitted: one XLA program each, not a compile per operation)
  grads = jax.jit(jax.grad(lambda v: jnp.mean((net.apply(v, x, train_mode=False) - y) ** 2)))(variables)
  assert float(jnp.abs(grads["batch_stats"]["BatchNorm_0"]["mean"]).max()) > 0
  opt_state = jax.jit(tx.init)(variables)
  assert not jax.tree.leaves(opt_state.inner_states["untouched"])      # no moments for model state
  updates, _ = jax.jit(tx.update)(grads, opt_state, variables)
  assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree.leaves(updates["batch_stats"]))
  assert float(jnp.abs(updates["params"]["BatchNorm_0"]["scale"]).max()) > 0

  def loss_fn(v, batch, rng):
    del rng
    pred, new = net.apply(v, batch["x"], train_mode=True, mutable=["batch_stats"])
    return jnp.mean((pred - batch["y"]) ** 2), {train.UPDATED_COLLECTIONS: new}

  state = train.create_state(variables, tx, jax.random.key(0))
  step = train.make_train_step(loss_fn, tx, donate=False)
  model_update = jax.jit(lambda v, x: net.apply(v, x, train_mode=True, mutable=["batch_stats"])[1]["batch_stats"])
  for i in range(3):
    expected = model_update(state.variables, x + i)
    state, _ = step(state, {"x": x + i, "y": y})
    # The model's own update: the compiled step and this apply (another program) may round differently by a
    # few float32 ulps (eps = 1.2e-7); an optimizer step at lr 0.1 would move them by ~0.1.
    chex.assert_trees_all_close(state.variables["batch_stats"], expected, rtol=8 * np.finfo(np.float32).eps, atol=0)
  assert float(jnp.abs(state.variables["batch_stats"]["BatchNorm_0"]["mean"]).max()) > 0


def test_the_library_imports_no_benchmark_dependency():
  import subprocess
  import sys
  code = ("import sys, maskprior_jax, maskprior_jax.train, maskprior_jax.models, maskprior_jax.measure, "
          "maskprior_jax.baselines, maskprior_jax.checkpoint, maskprior_jax.distributed, maskprior_jax.nnx\n"
          "heavy = {'matplotlib', 'sklearn', 'tensorboardX', 'tensorflow_datasets', 'ml_collections'}\n"
          "print(sorted(heavy & set(sys.modules)) + sorted(m for m in sys.modules if m.startswith('maskprior_jax.bench')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


def test_attention_implementation_auto_falls_back_to_xla_where_cudnn_is_unsafe():
  from maskprior_jax.attention import attention_implementation as pick
  assert pick(None, jnp.float32, 1) == "xla" and pick("xla", jnp.bfloat16, 1, backend="gpu") == "xla"
  assert pick("auto", jnp.bfloat16, 1, backend="gpu") == "cudnn"
  assert pick("auto", jnp.float32, 1, backend="gpu") == "xla"          # float32 bias: reported NaNs
  assert pick("auto", jnp.bfloat16, 8, backend="gpu") == "xla"         # bias gradient needs batch 1
  assert pick("auto", jnp.bfloat16, 1, backend="cpu") == "xla"
  with pytest.raises(ValueError, match="implementation must be"):
    pick("flash", jnp.float32, 1)
  # On this CPU "auto" runs, and equals XLA, with the bias gradient.
  x = _x()
  out = {}
  for impl in ("xla", "auto"):
    m = mp.MaskPriorAttention(num_heads=4, mask_init=priors.interaction_groups([[0, 1], [2, 3, 4]]), implementation=impl)
    v = m.init(jax.random.key(0), x)
    out[impl] = jax.grad(lambda v: jnp.sum(m.apply(v, x) ** 2))(v)[mp.MASK_PRIOR]["bias"]
  np.testing.assert_array_equal(out["xla"], out["auto"])


def test_grouped_query_attention_and_the_attention_fn_hook():
  """num_kv_heads == num_heads is the module as before; fewer key/value heads group the query heads
  as `jax.nn.dot_product_attention` does; `attention_fn=flax.linen.dot_product_attention` receives the
  mask prior as its bias and gives the module's own output. The same for the NNX module."""
  import flax.linen as nn
  from flax import nnx

  from maskprior_jax import nnx as mnnx
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  prior = lambda k, s, d: jax.random.normal(k, s, d)
  base = mp.MaskPriorAttention(num_heads=4, mask_init=prior)
  v = base.init(jax.random.key(0), x)
  y = base.apply(v, x)
  np.testing.assert_array_equal(mp.MaskPriorAttention(num_heads=4, mask_init=prior, num_kv_heads=4).apply(v, x), y)
  hooked = mp.MaskPriorAttention(num_heads=4, mask_init=prior, attention_fn=nn.dot_product_attention)
  np.testing.assert_allclose(hooked.apply(v, x), y, rtol=1e-5, atol=1e-6)
  gqa = mp.MaskPriorAttention(num_heads=4, mask_init=prior, num_kv_heads=2)
  vg = gqa.init(jax.random.key(0), x)
  p = vg["params"]
  proj = lambda name: jnp.einsum("btd,dnh->btnh", x, p[name]["kernel"]) + p[name]["bias"]
  ref = jax.nn.dot_product_attention(proj("query"), proj("key"), proj("value"), bias=vg[mp.MASK_PRIOR]["bias"][None])
  expected = jnp.einsum("btnh,nhd->btd", ref, p["out"]["kernel"]) + p["out"]["bias"]
  np.testing.assert_allclose(gqa.apply(vg, x), expected, rtol=1e-5, atol=1e-5)
  m = mnnx.MaskPriorAttention(4, 16, mask_init=prior, max_len=6, num_kv_heads=2, rngs=nnx.Rngs(0))
  h = mnnx.MaskPriorAttention(4, 16, mask_init=prior, max_len=6, num_kv_heads=2, attention_fn=nn.dot_product_attention,
                              rngs=nnx.Rngs(0))
  np.testing.assert_allclose(h(x), m(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,kw", [("full", {}), ("shared", {}), ("relative_1d", {"max_len": 9})])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_decoding_token_by_token_equals_the_full_causal_pass(kind, kw, kv_heads):
  """decode=True: init with the full-length input makes the cache; each jitted step takes one token
  and uses its own row of a random (position-specific) prior; the outputs are the full pass's with a
  causal mask. With grouped-query attention and normalize_qk too."""
  length = 6
  x = _x((2, length, 16), seed=3)
  prior = lambda k, s, d: jax.random.normal(k, s, d)
  full = mp.MaskPriorAttention(num_heads=4, mask_init=prior, mask_kind=kind, num_kv_heads=kv_heads,
                               normalize_qk=True, **kw)
  v = full.init(jax.random.key(0), x)
  expected = full.apply(v, x, mask=nn.make_causal_mask(jnp.ones((2, length))))
  dec = full.clone(decode=True)
  cache = dec.init(jax.random.key(0), x)["cache"]
  assert cache["cached_key"].shape == (2, length, kv_heads, 4) and int(cache["cache_index"]) == 0
  step = jax.jit(lambda cache, tok: dec.apply({**v, "cache": cache}, tok, mutable=["cache"]))
  outs = []
  for t in range(length):
    y, mutated = step(cache, x[:, t:t + 1])
    cache = mutated["cache"]
    outs.append(y)
  assert int(cache["cache_index"]) == length
  np.testing.assert_allclose(jnp.concatenate(outs, 1), expected, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="one token at a time"):
    dec.apply({**v, "cache": cache}, x[:, :2], mutable=["cache"])


def test_normalize_qk_equals_flax():
  x = _x()
  ref = nn.MultiHeadDotProductAttention(num_heads=4, normalize_qk=True)
  variables = ref.init(jax.random.key(1), x)
  assert {"query_ln", "key_ln"} <= set(variables["params"])
  ours = mp.MaskPriorAttention(num_heads=4, normalize_qk=True)
  assert jax.tree.map(jnp.shape, ours.init(jax.random.key(2), x)) == jax.tree.map(jnp.shape, variables)
  variables = {"params": jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(4), p.shape),
                                      variables["params"])}
  np.testing.assert_allclose(ours.apply(variables, x), ref.apply(variables, x), rtol=1e-5, atol=1e-5)


def _x64():
  # jax.enable_x64 from JAX 0.7; the experimental spelling before (the floors job runs JAX 0.6)
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(True)
  from jax.experimental import enable_x64
  return enable_x64()


def test_heads_folded_attention_under_vmap_computes_what_vmap_of_the_call_does():
  """Several runs stacked by `jax.vmap`, each with its own bias (the runner's seed axis): the folded call
  (the run axis merged into the heads, one call for all runs; what the cuDNN path takes) equals vmap of
  `jax.nn.dot_product_attention`, forward and every gradient, also for a bias shared by the runs, a
  boolean mask, and nested maps. XLA's math inside, on float64 inputs: exact with current JAX; JAX 0.6
  (the floors job) computes some of it in float32, so the tolerance is a few float32 roundings of
  values of order 1."""
  from maskprior_jax.attention import heads_folded_attention
  with _x64():
    R, B, T, N, H = 3, 4, 6, 2, 8
    ks = jax.random.split(jax.random.key(0), 5)
    q, k, v = (jax.random.normal(kk, (R, B, T, N, H), jnp.float64) for kk in ks[:3])
    bias = jax.random.normal(ks[3], (R, N, T, T), jnp.float64)
    mask = jax.random.bernoulli(ks[4], 0.7, (B, 1, T, T)).at[..., 0].set(True)
    ref = lambda q, k, v, b, m=None: jax.nn.dot_product_attention(q, k, v, bias=b[None], mask=m, implementation="xla")
    fold = lambda q, k, v, b, m=None: heads_folded_attention(q, k, v, b[None], m, implementation="xla")
    loss = lambda f: lambda q, k, v, b: jnp.sum(jnp.sin(f(q, k, v, b)))
    eps32 = float(jnp.finfo(jnp.float32).eps)
    tol = dict(rtol=64 * eps32, atol=64 * eps32)
    # (each map jitted: one XLA program, not a compile per operation)
    for in_axes, b in (((0, 0, 0, 0), bias), ((0, 0, 0, None), bias[0])):
      np.testing.assert_allclose(jax.jit(jax.vmap(fold, in_axes))(q, k, v, b), jax.jit(jax.vmap(ref, in_axes))(q, k, v, b),
                                 **tol)
      grads = [jax.jit(jax.vmap(jax.grad(loss(f), argnums=(0, 1, 2, 3)), in_axes))(q, k, v, b) for f in (fold, ref)]
      for got, want in zip(*grads):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, **tol)
    masked = [jax.jit(jax.vmap(lambda q, k, v, b, f=f: f(q, k, v, b, mask)))(q, k, v, bias) for f in (fold, ref)]
    np.testing.assert_allclose(*masked, **tol)
    nested = [jax.jit(jax.vmap(jax.vmap(f)))(q[None], k[None], v[None], bias[None]) for f in (fold, ref)]
    np.testing.assert_allclose(*nested, **tol)


def test_auto_attention_resolves_for_the_target_platform_while_tracing():
  """`for_platform("gpu")` makes "auto" pick cuDNN for a bfloat16 call traced on this CPU (the program
  a GPU would run), and nothing outside the block changes."""
  from maskprior_jax.attention import for_platform, target_platform
  pick = mp.attention.attention_implementation
  assert target_platform() == jax.default_backend() == "cpu"
  with for_platform("gpu"):
    assert target_platform() == "gpu" and pick("auto", jnp.bfloat16, 1) == "cudnn"
    assert pick("auto", jnp.float32, 1) == "xla"   # (tests/test_compile.py traces and lowers it for CUDA)
  assert target_platform() == "cpu" and pick("auto", jnp.bfloat16, 1) == "xla"
  with pytest.raises(ValueError, match="platform must be"):
    with for_platform("cuda-ish"):
      pass


def test_auto_keeps_to_the_sizes_cudnn_supports_and_cudnn_names_the_size_it_refuses():
  """cuDNN's fused attention, as JAX calls it in training, refuses odd sequence lengths (the Boolean
  frozen-coordinate task's 18 tokens + CLS) and head dimensions off a multiple of 8: "auto" runs XLA
  there, an explicit "cudnn" says why in one line (found by compiling the benchmarks for an H100:
  `maskprior compile`)."""
  from maskprior_jax.attention import attention_implementation as pick, cudnn_unsupported
  assert pick("auto", jnp.bfloat16, 1, backend="gpu", shape=(16, 16, 64)) == "cudnn"
  assert pick("auto", jnp.bfloat16, 1, backend="gpu", shape=(19, 19, 64)) == "xla"
  assert pick("auto", jnp.bfloat16, None, backend="gpu", shape=(11, 11, 16)) == "xla"
  assert pick("auto", jnp.bfloat16, 1, backend="gpu", shape=(16, 16, 12)) == "xla"
  assert "even sequence lengths, not 19 x 19" in cudnn_unsupported(19, 19, 64)
  x = jnp.zeros((2, 19, 4, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match="implementation='cudnn': cuDNN's fused attention .trained. needs even"):
    mp.dot_product_attention(x, x, x, jnp.zeros((1, 4, 19, 19)), implementation="cudnn")


def test_attention_maps_come_in_layer_order_past_ten_layers():
  """measure.attention_maps lists layers in the order the model calls them (block_2 before block_10):
  each of 12 layers gets a prior that sends every query to its own key, so the maps say which is which."""
  from maskprior_jax import MaskSettings, measure, models
  depth, length = 12, 12
  tokens = length + 1   # the model's CLS token and the inputs
  masks = [MaskSettings(priors.from_matrix(np.where(np.arange(tokens)[None, :] == layer, 0.0, -50.0)
                                           * np.ones((tokens, 1)))) for layer in range(depth)]
  model = models.Transformer(vocab_size=2, dim=16, depth=depth, num_heads=2, head_dim=8, mlp_dim=16,
                             max_len=length, mask=masks)
  x = jnp.zeros((1, length), jnp.int32)
  maps = measure.attention_maps(model.apply, model.init(jax.random.key(0), x), x)
  assert [int(jnp.argmax(m[0, 0, 0])) for m in maps] == list(range(depth))
