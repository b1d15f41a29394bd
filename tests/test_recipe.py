"""The training recipe: warmup and cosine schedule values, gradient clipping, weight decay on
weight matrices only, and one treatment for the QK-initialised kernels and the mask prior."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from maskprior_jax import optim, priors
from maskprior_jax.attention import MaskSettings
from maskprior_jax.models import Transformer
from maskprior_jax.train import LoopSettings


def _settings(**kw):
  return LoopSettings(**{"steps": 1000, "batch_size": 8, "learning_rate": 1e-3, **kw})


def test_warmup_then_cosine_schedule_values():
  s = _settings(warmup_steps=100, schedule="cosine")
  assert s.learning_rate_at(0) == 0.0
  assert s.learning_rate_at(50) == pytest.approx(0.5e-3)
  assert s.learning_rate_at(100) == pytest.approx(1e-3)
  # cosine from 1e-3 at step 100 to 0 at step 1000: halfway (step 550) is half the peak
  assert s.learning_rate_at(550) == pytest.approx(0.5e-3, rel=1e-5)
  assert s.learning_rate_at(1000) == pytest.approx(0.0, abs=1e-12)
  const = _settings(warmup_steps=10)
  assert [const.learning_rate_at(t) for t in (0, 5, 10, 999)] == pytest.approx([0.0, 0.5e-3, 1e-3, 1e-3])
  assert _settings().learning_rate_schedule() == 1e-3   # the committed runs' constant rate: a float


def test_recipe_settings_are_checked():
  with pytest.raises(ValueError, match="train.schedule"):
    _settings(schedule="linear")
  with pytest.raises(ValueError, match="train.warmup_steps"):
    _settings(warmup_steps=1000)
  with pytest.raises(ValueError, match="train.qk_mask_decay"):
    _settings(qk_mask_decay="zero")


def _model_variables():
  model = Transformer(vocab_size=7, dim=16, depth=1, num_heads=2, head_dim=8, mlp_dim=32, max_len=5, causal=True,
                      pos_embedding="learned", pooling="none", head="lm", num_outputs=7,
                      mask=MaskSettings(priors.from_matrix(np.eye(5) * 2.0)))
  return jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 5), jnp.int32))


def _decay_step(settings, variables):
  """One step with zero gradients: the update is weight decay alone."""
  tx = settings.optimizer()
  zeros = jax.tree.map(jnp.zeros_like, variables)
  moved = jax.tree.map(lambda a: a + 0.5, variables)   # away from the initial values
  updates, _ = jax.jit(tx.update)(zeros, jax.jit(tx.init)(variables), moved)   # (one program, not one per operation)
  flat = jax.tree_util.tree_flatten_with_path(updates)[0]
  return {jax.tree_util.keystr(k): np.asarray(u) for k, u in flat}, moved


def test_weight_decay_reaches_weight_matrices_only():
  variables = _model_variables()
  updates, _ = _decay_step(_settings(weight_decay=0.1, decay_on="matrices"), variables)
  decayed = {k for k, u in updates.items() if np.any(u != 0)}
  assert decayed and all(k.endswith("['kernel']") for k in decayed)
  assert any("['query']" in k for k in decayed) and any("mlp" in k or "Dense" in k or "dense" in k for k in decayed)
  for k, u in updates.items():
    if "embed" in k or "LayerNorm" in k or "ln" in k.lower() or k.endswith("['bias']") or "mask_prior" in k:
      assert np.all(u == 0), k
  everything = _decay_step(_settings(weight_decay=0.1), variables)[0]
  assert any(np.any(u != 0) for k, u in everything.items() if k.endswith("['bias']"))   # "all" decays biases too


def test_qk_kernels_and_mask_get_one_treatment():
  variables = _model_variables()
  none, _ = _decay_step(_settings(weight_decay=0.1, decay_on="matrices", qk_mask_decay="none"), variables)
  for k, u in none.items():
    if "['query']" in k or "['key']" in k or "mask_prior" in k:
      assert np.all(u == 0), k
  assert any(np.any(u != 0) for k, u in none.items() if "['value']" in k)
  init, moved = _decay_step(_settings(weight_decay=0.1, decay_on="matrices", qk_mask_decay="init"), variables)
  lr, wd = 1e-3, 0.1
  for k, u in init.items():
    if ("['query']" in k or "['key']" in k) and k.endswith("['kernel']") or "mask_prior" in k:
      # toward the initial values: -lr * wd * (moved - init) = -lr * wd * 0.5
      np.testing.assert_allclose(u, -lr * wd * 0.5, rtol=1e-6, err_msg=k)
  value = [(k, u) for k, u in init.items() if "['value']" in k and k.endswith("['kernel']")][0]
  w = [np.asarray(a) for p, a in jax.tree_util.tree_flatten_with_path(moved)[0] if jax.tree_util.keystr(p) == value[0]][0]
  np.testing.assert_allclose(value[1], -lr * wd * w, rtol=1e-6)   # toward zero, as before


def test_clipping_bounds_the_update_direction():
  variables = _model_variables()
  grads = jax.tree.map(lambda a: jnp.full_like(a, 100.0), variables)
  tx = _settings(grad_clip_norm=1.0, optimizer_name="sgd").optimizer()
  updates, _ = jax.jit(tx.update)(grads, jax.jit(tx.init)(variables), variables)
  norm = optax.tree.norm(jax.tree.map(lambda u: u / 1e-3, updates["params"]))
  total = optax.tree.norm(jax.tree.map(lambda u: u / 1e-3, updates))
  assert total == pytest.approx(1.0, rel=1e-5) and norm <= total


def test_the_default_optimizer_is_the_committed_one_bit_for_bit():
  variables = _model_variables()
  grads = jax.tree.map(lambda a: jnp.sin(a * 3.0 + 1.0), variables)
  new = _settings(weight_decay=0.1).optimizer()
  old = optim.with_mask_transform(optax.adamw(1e-3, 0.9, 0.999, weight_decay=0.1), optax.adamw(1e-3, 0.9, 0.999, weight_decay=0.0))
  a, _ = new.update(grads, new.init(variables), variables)
  b, _ = old.update(grads, old.init(variables), variables)
  assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))
  assert jax.tree.structure(new.init(variables)) == jax.tree.structure(old.init(variables))


def test_a_run_folder_recorded_before_the_recipe_keys_existed_still_matches():
  """Keys added later (the recipe, the arithmetic validation split and coupling) are left out of the
  run record and the digest at the value that reproduces the earlier behaviour, so an earlier run
  folder resumes and pools; at another value they count (the arithmetic default's recipe does)."""
  from maskprior_jax.bench.config import LATER_KEYS, as_recorded, builtin_config, config_digest
  recorded = as_recorded(builtin_config("arithmetic"))
  assert recorded["train"]["schedule"] == "cosine" and recorded["task"]["coupling"] == "published"
  for name in ("boolean",):
    cfg = builtin_config(name)
    # The default steps a device's runs one at a time on a CPU (train.run_block=auto) and draws its
    # batches on the device (train.batches=auto): other bits and another stream than the earlier
    # folders' single vmapped block of host batches, so both are recorded and the digest differs.
    # Its curves during training use 2,048 points (the folders: 4,096; the probe is drawn after them).
    assert as_recorded(cfg)["train"]["run_block"] == "auto" and as_recorded(cfg)["train"]["batches"] == "auto"
    assert cfg.eval.num_points == 2048
    assert config_digest({"cfg": cfg.to_dict()}) != config_digest({"cfg": {**cfg.to_dict(), "train": {
        **cfg.to_dict()["train"], "batches": "host", "run_block": "all"}}})
    assert config_digest({"cfg": cfg.to_dict()}) != config_digest({"cfg": {**cfg.to_dict(), "eval": {
        **cfg.to_dict()["eval"], "num_points": 4096}}})
    # Its qk baseline is fitted on 1,024 inputs of its own (the folders: on the probe), recorded too.
    assert as_recorded(cfg)["qk"]["fit_inputs"] == 1024 and "fit_batch" not in as_recorded(cfg)["qk"]
    with cfg.unlocked():
      cfg.train.run_block = "all"
      cfg.train.batches = "host"
      cfg.eval.num_points = 4096
      cfg.qk.fit_inputs = 0
    earlier = cfg.to_dict()
    for key in LATER_KEYS:
      section, leaf = key.split(".")
      earlier.get(section, {}).pop(leaf, None)
    assert as_recorded(cfg) == earlier
    assert config_digest({"cfg": cfg.to_dict()}) == config_digest({"cfg": earlier})
    with cfg.unlocked():
      cfg.train.warmup_steps = 100
    assert as_recorded(cfg)["train"]["warmup_steps"] == 100
    assert config_digest({"cfg": cfg.to_dict()}) != config_digest({"cfg": earlier})


def test_the_committed_boolean_headline_folder_resumes_with_the_readme_overrides():
  """README Results: a committed Boolean folder is the default config plus
  `--config.train.batches=host --config.train.run_block=all --config.eval.num_points=4096`; without
  them the folder's digest differs (the folder would be refused, naming the keys)."""
  import json
  import pathlib

  from maskprior_jax.bench.boolean import run, tasks
  from maskprior_jax.bench.config import builtin_config
  folder = pathlib.Path(__file__).parent.parent / "experiments" / "results" / "boolean_headline" / "f2_2parity"
  recorded = json.loads((folder / "results.json").read_text())["config_digest"]
  cfg = builtin_config("boolean")
  assert run.BooleanTask(tasks.TASKS["f2_2parity"], cfg).digest() != recorded
  with cfg.unlocked():
    cfg.train.batches, cfg.train.run_block, cfg.eval.num_points = "host", "all", 4096
  assert run.BooleanTask(tasks.TASKS["f2_2parity"], cfg).digest() == recorded
