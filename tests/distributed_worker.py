"""One process of the two-process test (run by tests/test_distributed.py), or the reference.

usage: distributed_worker.py OUT.json [COORDINATOR NUM_PROCESSES PROCESS_ID]
Trains the library's Transformer for a few data-parallel steps over every device of every
process; each process feeds only its rows of each global batch. In float64 (the test sets
JAX_ENABLE_X64=1): one and two processes sum in different orders, and float64 keeps that
rounding noise far below the comparison's tolerance on any CPU.
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

if len(sys.argv) > 2:
  from maskprior_jax import distributed
  distributed.initialize(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
else:
  from maskprior_jax import distributed

import maskprior_jax as mp  # noqa: E402
from maskprior_jax import priors, train  # noqa: E402
from maskprior_jax.checkpoint import tree_sha256  # noqa: E402
from maskprior_jax.models import Transformer  # noqa: E402

model = Transformer(vocab_size=2, dim=16, depth=2, num_heads=2, mlp_dim=32, max_len=6,
                    mask=mp.MaskSettings(priors.interaction_groups([[1, 2], [3, 4, 5]], readers=[0])))


def loss_fn(v, batch, rng):
  del rng
  return jnp.mean((model.apply(v, batch["x"]) - batch["y"]) ** 2), {}


tx = mp.mask_prior_optimizer(0.1, name="sgd")
assert jax.config.jax_enable_x64, "run with JAX_ENABLE_X64=1"
variables = jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                         model.init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32)))
state = train.create_state(variables, tx, jax.random.key(0))
mesh = train.data_mesh()
state = jax.device_put(state, train.replicated(mesh))
step = train.make_train_step(loss_fn, tx, mesh=mesh)
losses = []
for i in range(4):
  rng = np.random.default_rng(i)
  x = rng.integers(0, 2, (32, 6)).astype(np.int32)
  y = (2.0 * x[:, 1] - 1) * (2.0 * x[:, 2] - 1)
  rows = distributed.process_slice(32)
  batch = distributed.global_batch({"x": x[rows], "y": y[rows]}, mesh)
  state, metrics = step(state, batch)
  losses.append(float(metrics["loss"]))
params = jax.tree.map(lambda a: np.asarray(jax.device_get(a.addressable_data(0))), state.variables)
assert all(a.dtype == np.float64 for a in jax.tree.leaves(params))
if distributed.is_main_process():
  with open(sys.argv[1], "w") as f:
    json.dump({"losses": losses, "processes": jax.process_count(), "devices": jax.device_count(),
               "leaves": [np.asarray(a).tolist() for a in jax.tree.leaves(params)],
               "sha": tree_sha256(params)}, f)
