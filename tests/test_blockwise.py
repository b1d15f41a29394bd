"""The blockwise attention path: the same output and gradients (query, key, value, bias) as XLA's
attention, the bias gradient at the bias's own size, less compiled memory, and the module and the
benchmarks' model.attention accept it."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import maskprior_jax as mp


def _x64():
  # jax.enable_x64 from JAX 0.7; the experimental spelling before (the floors job runs JAX 0.6)
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(True)
  from jax.experimental import enable_x64
  return enable_x64()


def _explicit(q, k, v, bias, mask):
  """The definition, written out: softmax(q.k/sqrt(H) + bias, where mask) . v."""
  s = jnp.einsum("btnh,bsnh->bnts", q, k) / jnp.sqrt(q.shape[-1]) + bias
  if mask is not None:
    s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
  return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, -1), v)


def _inputs(dtype, b=2, t=37, s=45, n=3, h=8):
  ks = jax.random.split(jax.random.key(0), 4)
  return (jax.random.normal(ks[0], (b, t, n, h), dtype), jax.random.normal(ks[1], (b, s, n, h), dtype),
          jax.random.normal(ks[2], (b, s, n, h), dtype), jax.random.normal(ks[3], (b, t, n, h), dtype))


@pytest.mark.parametrize("bias_shape", [(1, 3, 37, 45), (3, 37, 45), (2, 3, 37, 45), (1, 3, 1, 45)])
@pytest.mark.parametrize("masked", [False, True])
def test_blockwise_equals_the_definition_in_value_and_every_gradient(bias_shape, masked):
  """In float64 (so the comparison does not depend on summation order): output and the gradients
  with respect to query, key, value and bias, the bias gradient at the bias's own size; key
  length 45 is not a multiple of the block (16)."""
  with _x64():
    q, k, v, w = _inputs(jnp.float64)
    bias = jax.random.normal(jax.random.key(5), bias_shape, jnp.float64)
    mask = jnp.tril(jnp.ones((37, 45), bool), k=3)[None, None] if masked else None
    blockwise = lambda q, k, v, b: mp.dot_product_attention(q, k, v, b, mask, implementation="blockwise",
                                                            block_size=16)
    explicit = lambda q, k, v, b: _explicit(q, k, v, b, mask)
    np.testing.assert_allclose(blockwise(q, k, v, bias), explicit(q, k, v, bias), rtol=1e-10, atol=1e-12)
    grads = [jax.grad(lambda *a, f=f: jnp.sum(f(*a) * w), argnums=(0, 1, 2, 3))(q, k, v, bias)
             for f in (blockwise, explicit)]
    for a, c in zip(*grads):
      assert a.shape == c.shape
      np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-11)


def test_blockwise_matches_xlas_attention_in_float32():
  """Against `jax.nn.dot_product_attention` in float32: differences of a few float32 roundings."""
  q, k, v, w = _inputs(jnp.float32)
  bias = jax.random.normal(jax.random.key(5), (1, 3, 37, 45))
  outs = [mp.dot_product_attention(q, k, v, bias, implementation=i, block_size=16) for i in ("xla", "blockwise")]
  np.testing.assert_allclose(outs[1], outs[0], rtol=0, atol=64 * float(np.finfo(np.float32).eps) * float(jnp.abs(v).max()))


def test_blockwise_needs_less_compiled_memory_than_xla():
  b, t, n, h = 2, 512, 2, 16
  shapes = [jax.ShapeDtypeStruct((b, t, n, h), jnp.float32)] * 3 + [jax.ShapeDtypeStruct((1, n, t, t), jnp.float32)]

  def temp(impl):
    f = jax.grad(lambda q, k, v, bias: jnp.sum(mp.dot_product_attention(q, k, v, bias, implementation=impl,
                                                                        block_size=64) ** 2), argnums=(0, 1, 2, 3))
    return jax.jit(f).lower(*shapes).compile().memory_analysis().temp_size_in_bytes
  assert temp("blockwise") < 0.5 * temp("xla")


def test_the_module_takes_the_blockwise_path_and_its_mask_gets_the_same_gradient():
  x = jax.random.normal(jax.random.key(1), (2, 24, 16))
  prior = mp.priors.locality_1d()
  mods = {i: mp.MaskPriorAttention(num_heads=4, mask_init=prior, mask_kind="relative_1d", max_len=24,
                                   implementation=i) for i in ("xla", "blockwise")}
  v = mods["xla"].init(jax.random.key(0), x)
  with _x64():
    x, v = jnp.asarray(x, jnp.float64), jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), v)
    grads = {i: jax.grad(lambda v, m=m: jnp.sum(m.apply(v, x) ** 2))(v) for i, m in mods.items()}
  chex.assert_trees_all_close(grads["blockwise"], grads["xla"], rtol=1e-9, atol=1e-11)


def test_benchmark_configs_accept_blockwise():
  pytest.importorskip("ml_collections")   # the bench extra (absent in the floors job)
  from maskprior_jax.bench import config
  cfg = config.apply_overrides(config.builtin_config("boolean"), ["--config.model.attention=blockwise"])
  config.check(cfg)
  assert config.attention_record(cfg) == {"requested": "blockwise", "dtype": "float32", "training_path": "blockwise"}
