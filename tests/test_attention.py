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
  assert "bias" not in jax.tree_util.tree_structure(v["params"]).__repr__() or "query" in v["params"]
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
  params = nnx.state(model, nnx.Param)
  assert len(jax.tree.leaves(masks)) == 1
  assert jax.tree.leaves(masks)[0].shape == (2, 6, 6)
  assert all(leaf.shape != (2, 6, 6) for leaf in jax.tree.leaves(params))
  assert model(x).shape == x.shape
