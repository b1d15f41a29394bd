"""Boolean extrapolation (GOTU) benchmark, small CPU default.

  maskprior boolean --workdir runs/boolean            # the headline: 5 tasks x 4 methods x 3 seeds
  maskprior boolean --task f2 --methods vanilla,mask --seeds 3 --workdir runs/f2
  maskprior boolean --target "x0x1x2 + x1x2" --seen "x0 == 1" --n 15 --workdir runs/custom
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = dict(dim=64, depth=2, num_heads=4, head_dim=16, mlp_dim=128,
                 pos_embedding="learned", pos_where="input")
  # The mask prior: per head one interaction group (a monomial's variables); the CLS token
  # reads its head's group, a variable token reads its groups (token_rows="group") or only
  # itself ("self"). Logit `inside` on the pattern, `outside` elsewhere. With fewer groups than
  # heads, spare heads repeat a group ("cycle") or take the union ("union").
  c.prior = dict(inside=0.0, outside=-4.0, per_head=True, token_rows="group", spare_heads="cycle",
                 mode="learned", mask_lr_multiplier=1.0, layers="all")
  # data_parallel: split every seed's batch over all devices (a mesh over jax.devices()).
  c.train = dict(steps=1500, batch_size=64, learning_rate=3e-4, learning_rate_by_task="",
                 optimizer="adam", weight_decay=0.0, steps_per_call=50, data_parallel=False)
  c.eval = dict(every_steps=250, num_points=4096, probe_size=256, full_cube_max_n=18)
  c.qk = dict(fit_steps=300, fit_learning_rate=1e-2)
  c.mimetic = dict(alpha=0.7, beta=0.7, alpha_v=0.4, beta_v=0.4)
  c.checkpoint = dict(every_steps=500, max_to_keep=2)
  return ml_collections.ConfigDict(c)
